"""``numbakv-sidecar``: run the sidecar under uvicorn, with its connection limits."""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Sequence

from numbakv.service import __version__
from numbakv.service.settings import Settings, parse_settings

logger = logging.getLogger(__name__)

SHUTDOWN_WAIT_S = 2
"""On SIGTERM, requests in flight get this long to finish before they are cancelled."""
FILE_RESERVE = 32
"""File descriptors kept from connections: the listening socket, the directory's files, logs."""


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    try:
        import uvicorn
        from numbakv.service.app import create_app
        from numbakv.service.connections import guarded_h11
    except ModuleNotFoundError as exc:
        print(
            f"numbakv-sidecar: the module {exc.name!r} is missing; the service extra installs "
            "what the sidecar needs: pip install 'numbakv[service]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    _log_to_stderr()
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        http=guarded_h11(_within_file_limit(settings), settings.request_timeout_s),
        ws="none",
        lifespan="on",
        timeout_keep_alive=settings.request_timeout_s,
        timeout_graceful_shutdown=SHUTDOWN_WAIT_S,
    )
    sock = config.bind_socket()
    host, port = sock.getsockname()[:2]
    address = f"[{host}]" if ":" in host else host
    logger.info(
        "numbakv-sidecar %s serving http://%s:%d from the metrics directory %s",
        __version__,
        address,
        port,
        settings.metrics_dir,
    )
    uvicorn.Server(config).run(sockets=[sock])


def _log_to_stderr() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("numbakv",):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)


def _within_file_limit(settings: Settings) -> int:
    """``max_connections``, lowered to fit the process's file descriptor limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or settings.max_connections <= soft - FILE_RESERVE:
        return settings.max_connections
    fitted = max(1, soft - FILE_RESERVE)
    logger.warning(
        "--max-connections %d lowered to %d: the process may open %d files",
        settings.max_connections,
        fitted,
        soft,
    )
    return fitted
