"""The sidecar's FastAPI application: read-only endpoints over the background reads of the directory.

Only the background thread touches the directory; a request serves the last read, rendered once
per format, so no endpoint waits on the disk, and /healthz answers in the same microseconds whatever
the directory holds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import Response
from numbakv.service import __version__
from numbakv.service.metrics_dir import DirectoryState, MetricsDirectory, Reading
from numbakv.service.models import Health, Stats
from numbakv.service.settings import Settings
from numbakv.service.stats import MAX_WINDOW_S, RateWindow, Totals, summarize, totals_from
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

logger = logging.getLogger(__name__)

FIRST_READ_WAIT_S = 5.0
"""Startup waits this long for the first read; a slower one is served when it finishes."""
STOP_WAIT_S = 2.0
"""Shutdown waits this long for the refresh thread (a daemon: it never holds the process)."""

_TEXT = choose_encoder(None)[1]
_OPENMETRICS = {
    choose_encoder(accept)[1]
    for accept in ("application/openmetrics-text", "application/openmetrics-text; version=1.0.0")
}


@dataclass(frozen=True)
class Snapshot:
    """One read as served: the metrics in both formats, and the totals ``/stats`` needs."""

    reading: Reading
    totals: Totals
    taken_at: float
    """``time.monotonic()`` when the read finished."""

    def collect(self) -> Iterator[Metric]:
        return iter(self.reading.metrics)


class Sidecar:
    """What the endpoints share: the last read and the thread that replaces it every ``cache_s``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.directory = MetricsDirectory(settings.metrics_dir)
        self.window = RateWindow()
        self.stale_after_s = max(10.0, 20 * settings.cache_s)
        now = time.monotonic()
        starting = DirectoryState(
            settings.metrics_dir, exists=None, error="starting: the first read has not finished"
        )
        self.snapshot = Snapshot(Reading.of([], starting), Totals(at=now), now)
        self.refresh_error: str | None = None
        self._lock = threading.Lock()
        self._rendered: tuple[Snapshot, dict[str, bytes]] = (self.snapshot, {})
        self._first_read = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._refresh_loop, name="numbakv-sidecar-refresh", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    async def first_read(self, timeout_s: float = FIRST_READ_WAIT_S) -> None:
        await asyncio.to_thread(self._first_read.wait, timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(STOP_WAIT_S)

    def refresh(self) -> Snapshot:
        """Read the directory now and serve the result; samples the rate window when due."""
        with self._lock:
            reading = self.directory.read()
            if reading is None:  # a writer is compacting the directory: the last read stands
                return self.snapshot
            taken_at = time.monotonic()
            snapshot = Snapshot(reading, totals_from(reading.metrics, taken_at), taken_at)
            before, after = self.snapshot.reading.state.problems, reading.state.problems
            if after and after != before:
                logger.warning("%s: %s", self.settings.metrics_dir, "; ".join(after))
            elif before and not after and self._first_read.is_set():
                logger.info("%s: every file read again", self.settings.metrics_dir)
            self.snapshot = snapshot
            latest = self.window.latest()
            if latest is None or taken_at - latest.at >= self.settings.sample_interval_s:
                self.window.add(snapshot.totals)
            return snapshot

    def _refresh_loop(self) -> None:
        while True:
            try:
                self.refresh()
                self.refresh_error = None
            except Exception as exc:  # the thread must live on: report it, serve the last read
                self.refresh_error = f"{type(exc).__name__}: {exc}"
                logger.exception(
                    "reading %s failed; serving the last read", self.settings.metrics_dir
                )
            self._first_read.set()
            if self._stop.wait(self.settings.cache_s):
                return

    def health(self) -> Health:
        snapshot = self.snapshot
        state = snapshot.reading.state
        age = time.monotonic() - snapshot.taken_at
        problems = state.problems
        if self.refresh_error is not None:
            problems.append(f"the last refresh failed ({self.refresh_error})")
        if age > self.stale_after_s:
            problems.append(f"the last read finished {age:.1f} s ago")
        return Health(
            status="degraded" if problems else "ok",
            metrics_dir=state.path,
            dir_exists=state.exists,
            files=state.files,
            skipped_files=state.skipped,
            dead_writers=state.dead_writers,
            read_age_seconds=round(age, 3),
            detail="; ".join(problems) or None,
        )

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics in the format ``accept`` asks for; the common two are rendered already."""
        encoder, content_type = choose_encoder(accept)
        snapshot = self.snapshot
        if content_type == _TEXT:
            return snapshot.reading.text, content_type
        any_escaping = content_type.partition("; escaping=")[0] in _OPENMETRICS
        if content_type in _OPENMETRICS or (any_escaping and snapshot.reading.legacy_names):
            return snapshot.reading.openmetrics, content_type
        rendered_for, rendered = self._rendered
        if rendered_for is not snapshot:
            rendered = {}
            self._rendered = (snapshot, rendered)
        if content_type not in rendered:
            try:
                rendered[content_type] = encoder(snapshot)
            except Exception:  # every family rendered in the two common formats: serve one
                logger.exception("rendering for %r failed; serving %s", accept, _TEXT)
                return snapshot.reading.text, _TEXT
        return rendered[content_type], content_type


async def get_sidecar(request: Request) -> Sidecar:
    """Dependency: the app's shared state (async: no thread-pool hop per request)."""
    return request.app.state.sidecar


SidecarDep = Annotated[Sidecar, Depends(get_sidecar)]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the directory is read in the background from startup to shutdown."""
    sidecar = Sidecar(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sidecar.start()
        await sidecar.first_read()
        yield
        sidecar.stop()

    app = FastAPI(
        title="numbakv sidecar",
        summary="Serves the metrics an engine's processes wrote to a prometheus-client multiprocess directory.",
        version=__version__,
        lifespan=lifespan,
    )
    app.state.sidecar = sidecar

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def metrics(side: SidecarDep, accept: Annotated[str | None, Header()] = None) -> Response:
        """All processes' metrics merged: Prometheus text format, or OpenMetrics when the Accept header asks."""
        body, content_type = side.exposition(accept)
        return Response(body, media_type=content_type)

    @app.get("/healthz")
    async def healthz(side: SidecarDep) -> Health:
        """Always 200 while the sidecar runs; ``status`` is "degraded" when what it serves is not whole or fresh."""
        return side.health()

    @app.get("/stats")
    async def stats(
        side: SidecarDep,
        window_s: Annotated[
            float, Query(gt=0, le=MAX_WINDOW_S, description="span of the rates, seconds")
        ] = 60.0,
    ) -> Stats:
        """Hit ratio, occupancy, GB/s per direction and evictions/s over the last ``window_s`` seconds."""
        now = side.snapshot.totals
        return summarize(now, side.window.oldest_within(window_s, now.at))

    return app
