"""uvicorn's HTTP/1.1 protocol with the two connection limits it lacks, so that idle or slow
clients cannot take the sockets and file descriptors that the health check and Prometheus need.

- A deadline: a connection that has not sent its next request and been answered within
  ``deadline_s`` of opening, or of its previous response, is aborted. uvicorn's keep-alive timeout
  starts only after a response, a byte now and then keeps it from firing, and its close waits for a
  client that never reads.
- A cap: past ``max_connections`` open connections, the oldest one is aborted to make room. Refusing
  the newest instead (uvicorn's ``limit_concurrency`` answers 503) would let a few hundred idle
  sockets shut out every health check. HTTP/1.1 serves one request at a time per connection, so the
  cap also bounds the requests in flight.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable

from uvicorn.protocols.http.h11_impl import H11Protocol


class GuardedH11Protocol(H11Protocol):
    """``H11Protocol`` with a per-request deadline and a cap on open connections."""

    def __init__(self, *args, max_connections: int, deadline_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = max_connections
        self.deadline_s = deadline_s
        self.opened_at = 0.0
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # asyncio turns Nagle off only on sockets of protocol IPPROTO_TCP, which a socket bound
        # beforehand (cli.py's, as uvicorn binds one) is not: a keep-alive request would then wait
        # 40 ms for the client's delayed ACK of the response's first half.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened_at = self.loop.time()
        self._start_deadline()
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_) > self.max_connections:
            min(open_, key=lambda c: getattr(c, "opened_at", 0.0)).transport.abort()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._start_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _start_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.deadline_s, self.transport.abort)


def guarded_h11(max_connections: int, deadline_s: float) -> Callable[..., GuardedH11Protocol]:
    """The protocol factory to pass as uvicorn's ``http``."""
    return functools.partial(
        GuardedH11Protocol, max_connections=max_connections, deadline_s=deadline_s
    )
