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

The modules, one responsibility each: :mod:`~numbakv.metrics.definitions` (the table of metrics
that drives both exporters), :mod:`~numbakv.metrics.recording` (transfer jobs),
:mod:`~numbakv.metrics.collector` (in-process export), :mod:`~numbakv.metrics.writer`
(multi-process export), :mod:`~numbakv.metrics.reported` (what a series last reported: the
writer's and the vLLM adapters' deltas), :mod:`~numbakv.metrics.offload` (:class:`OffloadMetrics`,
which picks one), and the directory's :mod:`~numbakv.metrics.directory`,
:mod:`~numbakv.metrics.liveness` and :mod:`~numbakv.metrics.compaction`.

Imports prometheus-client, the standard library, the job vocabulary (`numbakv.jobs`) and the
settings check (`numbakv.checks`) only: the sidecar's image has no NumPy or Numba.
"""

from numbakv.metrics.collector import ScrapeCollector
from numbakv.metrics.definitions import (
    DIRECTIONS,
    DURATION_BUCKETS_SECONDS,
    MANAGER,
    MANAGER_LABELS,
    POLICY_STATE,
    TIER,
    TIER_LABELS,
    TIER_OCCUPANCY,
    TRANSFER_LABELS,
    TRANSFERS,
    Definition,
    ManagerLike,
    Source,
    TierLike,
    manager_definitions,
)
from numbakv.metrics.offload import (
    ENABLED_ENV,
    OffloadMetrics,
    metrics_enabled,
    multiprocess_mode,
    shared_metrics,
)
from numbakv.metrics.recording import TransferRecorder, TransferTotals
from numbakv.metrics.reported import ReportedSeries
from numbakv.metrics.writer import MultiprocessWriter

__all__ = [
    "DIRECTIONS",
    "DURATION_BUCKETS_SECONDS",
    "ENABLED_ENV",
    "MANAGER",
    "MANAGER_LABELS",
    "POLICY_STATE",
    "TIER",
    "TIER_LABELS",
    "TIER_OCCUPANCY",
    "TRANSFERS",
    "TRANSFER_LABELS",
    "Definition",
    "ManagerLike",
    "MultiprocessWriter",
    "OffloadMetrics",
    "ReportedSeries",
    "ScrapeCollector",
    "Source",
    "TierLike",
    "TransferRecorder",
    "TransferTotals",
    "manager_definitions",
    "metrics_enabled",
    "multiprocess_mode",
    "shared_metrics",
]
