"""The sidecar's FastAPI application: read-only endpoints over the metrics directory."""

from __future__ import annotations

import threading
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.responses import Response
from prometheus_client.exposition import choose_encoder

from service.metrics_dir import MetricsDirectory, Snapshot
from service.models import Health, Stats
from service.settings import Settings
from service.stats import MAX_WINDOW_S, RateWindow, Totals, summarize, totals_from


class Sidecar:
    """Everything the endpoints share: the directory, its renderings, the rate window, and the
    background thread that re-reads the directory every ``cache_s`` and samples the window."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Twice the refresh period: a late refresh makes a request read, not serve stale data.
        self.directory = MetricsDirectory(settings.metrics_dir, max_age_s=2 * settings.cache_s)
        self.window = RateWindow()
        self._lock = threading.Lock()
        self._rendered: dict[str, tuple[Snapshot, bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._refresh_loop, name="numbakv-sidecar-refresh", daemon=True
        )

    def start(self) -> None:
        self.window.add(self.read_totals())
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def read_totals(self) -> Totals:
        """The totals ``/stats`` needs, stamped with the time of the read they come from."""
        snapshot = self.directory.snapshot()
        return totals_from(snapshot.metrics, snapshot.taken_at)

    def _refresh_loop(self) -> None:
        period = self.settings.cache_s or self.settings.sample_interval_s
        while not self._stop.wait(period):
            snapshot = self.directory.refresh()
            latest = self.window.latest()
            if latest is None or snapshot.taken_at - latest.at >= self.settings.sample_interval_s:
                self.window.add(totals_from(snapshot.metrics, snapshot.taken_at))

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics in the format ``accept`` asks for, rendered once per snapshot and format."""
        encoder, content_type = choose_encoder(accept)
        snapshot = self.directory.snapshot()
        with self._lock:
            cached = self._rendered.get(content_type)
            if cached is None or cached[0] is not snapshot:
                cached = self._rendered[content_type] = (snapshot, encoder(snapshot))
            return cached[1], content_type


async def get_sidecar(request: Request) -> Sidecar:
    """Dependency: the app's shared state (async: no thread-pool hop per request)."""
    return request.app.state.sidecar


SidecarDep = Annotated[Sidecar, Depends(get_sidecar)]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the rate window samples from startup to shutdown.

    Handlers are async (no thread hop per request); they serve the background thread's last read.
    """
    sidecar = Sidecar(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sidecar.start()
        yield
        sidecar.stop()

    app = FastAPI(
        title="numbakv sidecar",
        summary="Serves the metrics an engine's processes wrote to a prometheus-client multiprocess directory.",
        version="0.1.0",
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
        """Always 200 while the sidecar runs; ``status`` is "degraded" when there is nothing (good) to read."""
        state = side.directory.snapshot().state
        return Health(
            status="ok" if state.problem is None else "degraded",
            metrics_dir=state.path,
            dir_exists=state.exists,
            files=state.files,
            unreadable_files=list(state.unreadable),
            detail=state.problem,
        )

    @app.get("/stats")
    async def stats(
        side: SidecarDep,
        window_s: Annotated[
            float, Query(gt=0, le=MAX_WINDOW_S, description="span of the rates, seconds")
        ] = 60.0,
    ) -> Stats:
        """Hit ratio, occupancy, GB/s per direction and evictions/s over the last ``window_s`` seconds."""
        now = side.read_totals()
        return summarize(now, side.window.oldest_within(window_s, now.at))

    return app
