"""``numbakv-sidecar``: run the sidecar under uvicorn."""

from __future__ import annotations

from collections.abc import Sequence

import uvicorn

from service.app import create_app
from service.settings import parse_settings


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")
