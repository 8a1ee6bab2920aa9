"""The sidecar's app in this process (FastAPI's TestClient) over a metrics directory, reading
often, so the tests see a change to the directory at once."""

from __future__ import annotations

from fastapi.testclient import TestClient
from numbakv.service.app import create_app
from numbakv.service.settings import Settings


def client(directory) -> TestClient:
    return TestClient(
        create_app(Settings(metrics_dir=str(directory), cache_s=0.05, sample_interval_s=0.05))
    )


def reread(c: TestClient) -> None:
    """Have the background thread's read happen now (the tests change the directory under it)."""
    c.app.state.sidecar.refresh()
