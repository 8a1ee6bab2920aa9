"""One process's metrics: :class:`OffloadMetrics` records transfer jobs and exports them with the
manager's state, in-process or into the multiprocess directory, or not at all."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, values

from numbakv.checks import SettingTypeError
from numbakv.metrics import collector, liveness
from numbakv.metrics.collector import ScrapeCollector
from numbakv.metrics.definitions import ManagerLike, TierLike, labelled_tiers
from numbakv.metrics.recording import TransferRecorder
from numbakv.metrics.writer import MultiprocessWriter

if TYPE_CHECKING:  # the sidecar's image holds numbakv/metrics/ alone
    from numbakv.jobs import FinishedJob


logger = logging.getLogger("numbakv.metrics")

ENABLED_ENV = "NUMBAKV_METRICS"
"""Set to ``0`` (or ``false``/``off``) to turn metrics off process-wide."""


def metrics_enabled() -> bool:
    """Whether ``NUMBAKV_METRICS`` leaves metrics on (the default)."""
    return os.environ.get(ENABLED_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def multiprocess_mode() -> bool:
    """Whether prometheus-client writes to a shared directory (``PROMETHEUS_MULTIPROC_DIR``).

    prometheus-client reads the variable once, when it is imported: set only later, its values stay
    in this process's memory, so numbakv exports in-process and says why, once.
    """
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return False
    if values.ValueClass is values.MutexValue:
        _warn_directory_set_late()
        return False
    return True


@functools.cache
def _warn_directory_set_late() -> None:
    logger.warning(
        "numbakv metrics: PROMETHEUS_MULTIPROC_DIR was set after prometheus_client was imported, "
        "which then keeps its values in this process's memory: nothing is written to %s (set the "
        "variable before the process starts)",
        os.environ["PROMETHEUS_MULTIPROC_DIR"],
    )


class OffloadMetrics:
    """One process's metrics: pass ``on_job_done`` to the transfer engine, the manager (and the
    tiers below host memory, by name) at construction.

    ``enabled=False`` (or ``NUMBAKV_METRICS=0``) makes every method a no-op and registers nothing.
    In multiprocess mode, call :meth:`sync` per engine step or :meth:`start_sync_thread` once;
    in-process, the registry's collector reads everything at scrape time and ``sync`` does nothing.
    """

    def __init__(
        self,
        manager: ManagerLike | None = None,
        *,
        instance: str = "default",
        registry: CollectorRegistry | None = REGISTRY,
        enabled: bool | None = None,
        tiers: Mapping[str, TierLike] | None = None,
    ) -> None:
        if enabled is not None and not isinstance(enabled, bool):
            raise SettingTypeError(
                f"OffloadMetrics enabled must be True, False or None (NUMBAKV_METRICS decides), "
                f"got {enabled!r}"
            )
        tiers = labelled_tiers("OffloadMetrics", instance, tiers)
        self.enabled = metrics_enabled() if enabled is None else enabled
        self.instance = instance
        self._transfers = TransferRecorder()
        self._writer: MultiprocessWriter | None = None
        self._collector: ScrapeCollector | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.enabled:
            self.on_job_done = _ignore_job
            return
        self.on_job_done = self._transfers.on_job_done
        if multiprocess_mode():
            # Joining first: compaction runs before this process has files, and the exit hook
            # that drops its live gauges is registered before (so runs after) every close().
            path = os.environ["PROMETHEUS_MULTIPROC_DIR"]
            liveness.join(path)
            self._writer = MultiprocessWriter(manager, self._transfers, instance, path, tiers)
            atexit.register(self.close)
        elif registry is not None:
            self._collector = ScrapeCollector(manager, self._transfers, instance, tiers)
            collector.join(registry, self._collector)
        self._registry = registry

    def sync(self) -> None:
        """Multiprocess mode: publish what changed since the last call. Otherwise nothing to do."""
        if self._writer is not None:
            self._writer.sync()

    def start_sync_thread(self, interval_s: float = 1.0) -> None:
        """Call :meth:`sync` every ``interval_s`` seconds from a daemon thread, until :meth:`close`."""
        if self._writer is None or self._thread is not None:
            return

        def run() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.sync()
                except Exception:  # the thread lives on: metrics freezing would go unseen
                    logger.exception(
                        "numbakv metrics: sync failed; trying again in %s s", interval_s
                    )

        self._thread = threading.Thread(target=run, name="numbakv-metrics-sync", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the sync thread and publish a last time (multiprocess), or unregister the collector."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._writer is not None:
            self._writer.sync()
            self._writer = None
            atexit.unregister(self.close)
        if self._collector is not None:
            collector.leave(self._registry, self._collector)
            self._collector = None


def shared_metrics(
    instance: str,
    *,
    manager: ManagerLike | None = None,
    tiers: Mapping[str, TierLike] | None = None,
) -> OffloadMetrics | None:
    """This process's metrics written to ``PROMETHEUS_MULTIPROC_DIR`` once a second, under
    ``instance`` (an engine's own exporter and numbakv-sidecar read them there); None where metrics
    are off or that directory is unset."""
    if not metrics_enabled() or not multiprocess_mode():
        return None
    metrics = OffloadMetrics(manager, instance=instance, registry=None, tiers=tiers)
    metrics.start_sync_thread(1.0)
    return metrics


def _ignore_job(job: FinishedJob) -> None:
    """The ``on_job_done`` of disabled metrics."""
