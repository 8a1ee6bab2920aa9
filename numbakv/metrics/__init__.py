"""Prometheus metrics of the offloading tier: manager counters, host-pool gauges, transfer jobs.

Nothing here is paid per block, and nothing on the hot path touches prometheus-client:

- The manager already keeps monotonic counters (``manager.stats()``, O(1)); they are read, never
  incremented a second time.
- Transfer jobs are recorded by :meth:`OffloadMetrics.on_job_done` into plain Python ints (about
  200 ns a call); prometheus-client sees them only when they are exported.

Export has two modes, picked by prometheus-client's own switch, ``PROMETHEUS_MULTIPROC_DIR``:

- **in-process** (unset): a collector registered in a registry reads the manager and the transfer
  totals at scrape time; serve it with ``prometheus_client.start_http_server(port, addr="127.0.0.1")``.
- **multi-process** (set, before prometheus-client is first imported): :meth:`OffloadMetrics.sync`
  writes what changed since its last call into the directory's memory-mapped files, where the
  sidecar (``service``) aggregates every process. Call it once per engine step, or let
  :meth:`OffloadMetrics.start_sync_thread` call it every second. A process joins the directory
  first (:mod:`numbakv.metrics.liveness`): it folds what dead processes left
  (:mod:`numbakv.metrics.compaction`) and holds a lock that tells readers it is alive.

Imports prometheus-client and the standard library only: the sidecar's image has no NumPy or Numba.
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from numbakv.metrics import liveness

DIRECTIONS = ("store", "load")
"""Transfer directions: ``store`` is GPU to host, ``load`` host to GPU."""

DURATION_BUCKETS_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
"""Upper bounds of the transfer-duration histogram (a job moves a batch of blocks: 100 us to seconds)."""

ENABLED_ENV = "NUMBAKV_METRICS"
"""Set to ``0`` (or ``false``/``off``) to turn metrics off process-wide."""

MANAGER_LABELS = ("policy", "instance")
TRANSFER_LABELS = ("direction", "instance")

# (ManagerStats field, metric name, help). Counter names are given without "_total"; the
# exposition adds it.
MANAGER_COUNTERS = (
    ("lookups", "numbakv_lookups", "Lookup calls answered by the offloading manager."),
    ("hit_blocks", "numbakv_hit_blocks", "Blocks that lookups found in host memory."),
    ("missed_blocks", "numbakv_missed_blocks", "Blocks that lookups did not find in host memory."),
    ("evicted_blocks", "numbakv_evicted_blocks", "Blocks evicted from host memory by the policy."),
    ("stored_blocks", "numbakv_stored_blocks", "Blocks whose store to host memory completed."),
    (
        "failed_store_blocks",
        "numbakv_failed_store_blocks",
        "Blocks whose store to host memory failed.",
    ),
    ("loaded_blocks", "numbakv_loaded_blocks", "Blocks loaded from host memory back to the GPU."),
    (
        "stores_skipped",
        "numbakv_stores_skipped",
        "Blocks not stored because of the store threshold.",
    ),
)
HOST_GAUGES = (
    ("capacity", "numbakv_host_capacity_blocks", "Block slots in the host pool."),
    ("used", "numbakv_host_used_blocks", "Host pool slots holding a block."),
    ("free", "numbakv_host_free_blocks", "Host pool slots free for new blocks."),
    ("being_stored", "numbakv_host_being_stored_blocks", "Host slots a store is writing now."),
    ("being_read", "numbakv_host_being_loaded_blocks", "Host slots a load is reading now."),
)
ARC_TARGET = ("p", "numbakv_arc_p_blocks", "ARC's adaptive target size p of its recency list T1.")
ARC_LISTS = ("t1", "t2", "b1", "b2")
ARC_LISTS_METRIC = (
    "numbakv_arc_list_blocks",
    "Entries in each ARC list (T1, T2 and ghosts B1, B2).",
)
TRANSFER_JOBS = ("numbakv_transfer_jobs", "Transfer jobs finished, successful or not.")
TRANSFER_FAILED_JOBS = ("numbakv_transfer_failed_jobs", "Transfer jobs that failed.")
TRANSFER_BYTES = ("numbakv_transfer_bytes", "Bytes moved by successful transfer jobs.")
TRANSFER_DURATION = (
    "numbakv_transfer_duration_seconds",
    "Wall time of transfer jobs, submit to completion.",
)


class ManagerLike(Protocol):
    """What the metrics read from ``numbakv.manager.CPUOffloadingManager``."""

    policy_name: str

    def stats(self): ...  # -> ManagerStats, a frozen dataclass of ints

    def policy_stats(self) -> dict[str, float]: ...


def metrics_enabled() -> bool:
    """Whether ``NUMBAKV_METRICS`` leaves metrics on (the default)."""
    return os.environ.get(ENABLED_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def multiprocess_mode() -> bool:
    """Whether prometheus-client writes to a shared directory (``PROMETHEUS_MULTIPROC_DIR``)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


@dataclass(slots=True)
class TransferTotals:
    """Running totals of one direction's transfer jobs; ``buckets`` are per-bucket (not cumulative) counts."""

    jobs: int = 0
    failed_jobs: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS_SECONDS) + 1))

    def copy(self) -> TransferTotals:
        return TransferTotals(
            self.jobs, self.failed_jobs, self.nbytes, self.seconds, list(self.buckets)
        )


class TransferRecorder:
    """Accumulates finished transfer jobs in plain ints: the engine's ``on_job_done`` callback.

    Calls must come from one thread at a time (the engine's completion loop); readers may run
    concurrently and may miss the job being recorded, which the next read includes.
    """

    def __init__(self) -> None:
        self.totals = {direction: TransferTotals() for direction in DIRECTIONS}

    def on_job_done(
        self, job_id: int, direction: str, nbytes: int, seconds: float, success: bool
    ) -> None:
        t = self.totals[direction]
        t.jobs += 1
        t.seconds += seconds
        t.buckets[bisect.bisect_left(DURATION_BUCKETS_SECONDS, seconds)] += 1
        if success:
            t.nbytes += nbytes
        else:
            t.failed_jobs += 1


def _cumulative(buckets: list[int]) -> list[tuple[str, float]]:
    out, acc = [], 0
    for bound, count in zip((*DURATION_BUCKETS_SECONDS, float("inf")), buckets):
        acc += count
        out.append((floatToGoString(bound), acc))
    return out


class ScrapeCollector(Collector):
    """In-process export: reads the manager and the transfer totals when Prometheus scrapes."""

    def __init__(
        self, manager: ManagerLike | None, transfers: TransferRecorder, instance: str
    ) -> None:
        self._manager = manager
        self._transfers = transfers
        self._instance = instance

    def collect(self) -> Iterator:
        if self._manager is not None:
            yield from self._manager_families()
        yield from self._transfer_families()

    def _manager_families(self) -> Iterable:
        stats = self._manager.stats()
        labels = [self._manager.policy_name, self._instance]
        for attr, name, doc in MANAGER_COUNTERS:
            family = CounterMetricFamily(name, doc, labels=MANAGER_LABELS)
            family.add_metric(labels, getattr(stats, attr))
            yield family
        for attr, name, doc in HOST_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=MANAGER_LABELS)
            family.add_metric(labels, getattr(stats, attr))
            yield family
        policy = self._manager.policy_stats()
        if ARC_TARGET[0] in policy:
            target = GaugeMetricFamily(ARC_TARGET[1], ARC_TARGET[2], labels=MANAGER_LABELS)
            target.add_metric(labels, policy[ARC_TARGET[0]])
            lists = GaugeMetricFamily(*ARC_LISTS_METRIC, labels=(*MANAGER_LABELS, "list"))
            for name in ARC_LISTS:
                lists.add_metric([*labels, name], policy.get(name, 0.0))
            yield target
            yield lists

    def _transfer_families(self) -> Iterable:
        jobs = CounterMetricFamily(*TRANSFER_JOBS, labels=TRANSFER_LABELS)
        failed = CounterMetricFamily(*TRANSFER_FAILED_JOBS, labels=TRANSFER_LABELS)
        nbytes = CounterMetricFamily(*TRANSFER_BYTES, labels=TRANSFER_LABELS)
        duration = HistogramMetricFamily(*TRANSFER_DURATION, labels=TRANSFER_LABELS)
        for direction, t in self._transfers.totals.items():
            t = t.copy()
            labels = [direction, self._instance]
            jobs.add_metric(labels, t.jobs)
            failed.add_metric(labels, t.failed_jobs)
            nbytes.add_metric(labels, t.nbytes)
            duration.add_metric(labels, _cumulative(t.buckets), t.seconds)
        yield from (jobs, failed, nbytes, duration)


class MultiprocessWriter:
    """Multi-process export: copies what changed since the last :meth:`sync` into shared-directory metrics.

    The metric objects are registered nowhere: in multiprocess mode their values live in the
    directory's files, which the sidecar reads. Gauges use ``livesum``: a process stops counting
    when it dies, however it dies (see :mod:`numbakv.metrics.liveness`).
    """

    def __init__(
        self, manager: ManagerLike | None, transfers: TransferRecorder, instance: str, path: str
    ) -> None:
        self._path = path
        self._manager = manager
        self._transfers = transfers
        self._lock = threading.Lock()
        self._synced_stats: dict[str, int] = {attr: 0 for attr, _, _ in MANAGER_COUNTERS}
        self._synced_transfers = {d: TransferTotals() for d in DIRECTIONS}
        self._counters = {}
        self._gauges = {}
        self._gauge_values: dict[Gauge, float] = {}
        if manager is not None:
            labels = (manager.policy_name, instance)
            for attr, name, doc in MANAGER_COUNTERS:
                self._counters[attr] = Counter(name, doc, MANAGER_LABELS, registry=None).labels(
                    *labels
                )
            for attr, name, doc in HOST_GAUGES:
                self._gauges[attr] = _gauge(name, doc, MANAGER_LABELS).labels(*labels)
            self._arc_target = _gauge(ARC_TARGET[1], ARC_TARGET[2], MANAGER_LABELS).labels(*labels)
            arc_lists = _gauge(*ARC_LISTS_METRIC, (*MANAGER_LABELS, "list"))
            self._arc_lists = {name: arc_lists.labels(*labels, name) for name in ARC_LISTS}
        jobs = Counter(*TRANSFER_JOBS, TRANSFER_LABELS, registry=None)
        failed = Counter(*TRANSFER_FAILED_JOBS, TRANSFER_LABELS, registry=None)
        nbytes = Counter(*TRANSFER_BYTES, TRANSFER_LABELS, registry=None)
        duration = Histogram(
            *TRANSFER_DURATION, TRANSFER_LABELS, registry=None, buckets=DURATION_BUCKETS_SECONDS
        )
        self._transfer_children = {
            d: (
                jobs.labels(d, instance),
                failed.labels(d, instance),
                nbytes.labels(d, instance),
                duration.labels(d, instance),
            )
            for d in DIRECTIONS
        }

    def sync(self) -> None:
        """Write the deltas since the last call; a few microseconds per changed value."""
        with self._lock:
            if liveness.forked:  # a forked child writes files of its own PID: it joins under it
                liveness.join(self._path)
            if self._manager is not None:
                self._sync_manager()
            self._sync_transfers()

    def _sync_manager(self) -> None:
        stats = self._manager.stats()
        for attr, child in self._counters.items():
            value = getattr(stats, attr)
            if value != self._synced_stats[attr]:
                child.inc(value - self._synced_stats[attr])
                self._synced_stats[attr] = value
        for attr, child in self._gauges.items():
            self._set(child, getattr(stats, attr))
        policy = self._manager.policy_stats()
        if ARC_TARGET[0] in policy:
            self._set(self._arc_target, policy[ARC_TARGET[0]])
            for name, child in self._arc_lists.items():
                self._set(child, policy.get(name, 0.0))

    def _set(self, child, value: float) -> None:
        """Set a gauge only when it changed: each write to the shared file costs about a microsecond."""
        if self._gauge_values.get(child) != value:
            child.set(value)
            self._gauge_values[child] = value

    def _sync_transfers(self) -> None:
        for direction, current in self._transfers.totals.items():
            now, last = current.copy(), self._synced_transfers[direction]
            if now.jobs == last.jobs:
                continue
            jobs, failed, nbytes, duration = self._transfer_children[direction]
            jobs.inc(now.jobs - last.jobs)
            if now.failed_jobs != last.failed_jobs:
                failed.inc(now.failed_jobs - last.failed_jobs)
            if now.nbytes != last.nbytes:
                nbytes.inc(now.nbytes - last.nbytes)
            _add_to_histogram(
                duration,
                [n - l for n, l in zip(now.buckets, last.buckets)],
                now.seconds - last.seconds,
            )
            self._synced_transfers[direction] = now


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> Gauge:
    return Gauge(name, doc, labels, registry=None, multiprocess_mode="livesum")


def _add_to_histogram(child, bucket_deltas: list[int], seconds: float) -> None:
    """Add many observations at once. prometheus-client's public API adds one per ``observe()``
    (about 3 us each in multiprocess mode); its per-bucket values are what ``observe()`` itself writes."""
    for value, delta in zip(child._buckets, bucket_deltas):
        if delta:
            value.inc(delta)
    child._sum.inc(seconds)


class OffloadMetrics:
    """One process's metrics: pass ``on_job_done`` to the transfer engine, the manager at construction.

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
    ) -> None:
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
            self._writer = MultiprocessWriter(manager, self._transfers, instance, path)
            atexit.register(self.close)
        elif registry is not None:
            self._collector = ScrapeCollector(manager, self._transfers, instance)
            registry.register(self._collector)
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
                self.sync()

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
            self._registry.unregister(self._collector)
            self._collector = None


def _ignore_job(job_id: int, direction: str, nbytes: int, seconds: float, success: bool) -> None:
    """The ``on_job_done`` of disabled metrics."""
