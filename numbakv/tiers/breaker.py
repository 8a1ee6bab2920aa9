"""A circuit breaker: after a store is found unreachable, stop calling it for a while.

A store that is down costs every call a connect timeout; the engine's step must not pay that on
every lookup and transfer. Open, the breaker answers "unavailable" at once; after `cooldown_s` it
lets one call through (a probe): its success closes the breaker, its failure keeps it open for
another cooldown. It logs one line when it opens and one when it closes.
"""

from __future__ import annotations

import logging
import threading
import time

from numbakv.checks import positive

logger = logging.getLogger("numbakv.tiers")


class CircuitBreaker:
    """Open/closed state of one store, shared by every thread that calls it."""

    def __init__(self, cooldown_s: float, name: str) -> None:
        self.cooldown_s = positive("breaker_cooldown_s", cooldown_s, unit="seconds")
        self.opened = 0  # times it opened since start
        self._name = name
        self._lock = threading.Lock()
        self._open_until: float | None = None  # None: closed
        self._probing = False

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def refusing(self) -> bool:
        """Whether a call would be refused now (open, no probe due), without claiming a probe."""
        with self._lock:
            return self._open_until is not None and (
                self._probing or time.monotonic() < self._open_until
            )

    def allow(self) -> bool:
        """Whether a call may go to the store now: always when closed, one probe per cooldown when open."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or time.monotonic() < self._open_until:
                return False
            self._probing = True
            return True

    def undecided(self) -> None:
        """A call ended without saying whether the store is reachable (it raised something else):
        a probe under way is given back, so the next call may probe again."""
        with self._lock:
            self._probing = False

    def succeeded(self) -> None:
        with self._lock:
            was_open = self._open_until is not None
            self._open_until, self._probing = None, False
        if was_open:
            logger.warning("numbakv tier %s: store reachable again, breaker closed", self._name)

    def failed(self, error: BaseException) -> None:
        with self._lock:
            was_open = self._open_until is not None
            self._open_until = time.monotonic() + self.cooldown_s
            self._probing = False
            if not was_open:
                self.opened += 1
        if not was_open:
            logger.warning(
                "numbakv tier %s: store unreachable (%s), breaker open: no calls for %.1f s at a time",
                self._name,
                error,
                self.cooldown_s,
            )
