"""uvicorn's server, stopped by SIGINT or SIGTERM as a service is: gracefully, with exit status 0."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

import uvicorn


class Server(uvicorn.Server):
    """``uvicorn.Server`` that does not raise the stop signal again once it has shut down.

    uvicorn does (since 0.29), so SIGTERM, a container's stop, ended the process with status 143,
    and Ctrl-C with a ``KeyboardInterrupt`` traceback.
    """

    stopped_by: str | None = None
    """The name of the first stop signal received."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopped_by = self.stopped_by or signal.Signals(sig).name
        super().handle_exit(sig, frame)
