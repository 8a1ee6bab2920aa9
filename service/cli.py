"""``numbakv-sidecar``: run the sidecar under uvicorn, with its connection limits."""

from __future__ import annotations

import errno
import logging
import resource
import socket
from collections.abc import Sequence

from numbakv.service import __version__
from numbakv.service.settings import HOST_ENV, PORT_ENV, Settings, fail, parse_settings

logger = logging.getLogger(__name__)

SHUTDOWN_WAIT_S = 2
"""On SIGTERM, requests in flight get this long to finish before they are cancelled."""
FILE_RESERVE = 32
"""File descriptors kept from connections: the listening socket, the directory's files, logs."""


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then exit 0; a bad start is one line and exit status 2."""
    settings = parse_settings(argv)
    try:
        import uvicorn
        from numbakv.service.app import create_app
        from numbakv.service.connections import guarded_h11
        from numbakv.service.server import Server
    except ModuleNotFoundError as exc:
        fail(
            f"the module {exc.name!r} is missing; the service extra installs what the sidecar "
            "needs: pip install -e '.[service]' in numbakv's repository"
        )
    sock = _listen(settings)
    _log_to_stderr()
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # its loggers log through the sidecar's handler (_log_to_stderr)
        log_level="warning",
        http=guarded_h11(_within_file_limit(settings), settings.request_timeout_s),
        ws="none",
        lifespan="on",
        timeout_keep_alive=settings.request_timeout_s,
        timeout_graceful_shutdown=SHUTDOWN_WAIT_S,
    )
    host, port = sock.getsockname()[:2]
    served = f"http://{_address(host, port)} from the metrics directory {settings.metrics_dir}"
    logger.info("numbakv-sidecar %s serving %s", __version__, served)
    server = Server(config)
    server.run(sockets=[sock])
    logger.info("numbakv-sidecar stopped on %s; it served %s", server.stopped_by, served)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen(settings: Settings) -> socket.socket:
    """The socket bound to ``settings``' address, as uvicorn binds it, or one line on what is wrong."""
    sock = socket.socket(socket.AF_INET6 if ":" in settings.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        address = _address(settings.host, settings.port)
        if exc.errno == errno.EADDRINUSE:
            fail(f"{address} is in use (another sidecar?); choose another --port or {PORT_ENV}")
        fail(
            f"cannot listen on {address}: {exc.strerror}; check --host and --port "
            f"(or {HOST_ENV} and {PORT_ENV})"
        )
    return sock


class _NoWebSocketHint(logging.Filter):
    """Drops uvicorn's advice to install a WebSocket library: the sidecar turns WebSockets off."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No supported WebSocket library detected")


def _log_to_stderr() -> None:
    """numbakv's and uvicorn's records in one format (uvicorn's at the level its Config sets)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_NoWebSocketHint())
    for name in ("numbakv", "uvicorn"):
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("numbakv").setLevel(logging.INFO)


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
