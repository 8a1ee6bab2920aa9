"""Multi-process export: what changed since the last sync, written into the shared directory's
metrics, one prometheus-client metric per definition of :mod:`numbakv.metrics.definitions`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from numbakv.metrics import liveness
from numbakv.metrics.definitions import (
    DIRECTIONS,
    DURATION_BUCKETS_SECONDS,
    TIER,
    TIER_OCCUPANCY,
    TRANSFERS,
    Definition,
    ManagerLike,
    Source,
    TierLike,
    manager_definitions,
    occupied_tiers,
)
from numbakv.metrics.recording import TransferRecorder, TransferTotals

_NO_JOBS = TransferTotals()
"""What a histogram of transfer jobs starts from."""
_MANAGER_SOURCES = (Source.STATS, Source.POLICY)
"""The manager's sources, read once per sync; a series finds its own by index (an enum's hash is
Python code: a dict keyed by source cost a microsecond per sync)."""


class MultiprocessWriter:
    """Multi-process export: copies what changed since the last :meth:`sync` into shared-directory metrics.

    The metric objects are registered nowhere: in multiprocess mode their values live in the
    directory's files, which the sidecar reads. Gauges use ``livesum``: a process stops counting
    when it dies, however it dies (see :mod:`numbakv.metrics.liveness`).
    """

    def __init__(
        self,
        manager: ManagerLike | None,
        transfers: TransferRecorder,
        instance: str,
        path: str,
        tiers: Mapping[str, TierLike] | None = None,
    ) -> None:
        self._path = path
        self._manager = manager
        self._transfers = transfers
        self._lock = threading.Lock()
        # Each series as [child, ..., value last written]: a counter's starts at 0, a gauge's at
        # None (it is written at the first sync). The manager's: [child, index of its source in
        # _MANAGER_SOURCES, reader, is a counter, value last written].
        self._manager_series: list[list] = []
        if manager is not None:
            labels = (manager.policy_name, instance)
            for definition, metric, extra, read in _series(
                manager_definitions(manager.policy_name)
            ):
                child = metric.labels(*labels, *extra)
                counter = definition.type == "counter"
                source = _MANAGER_SOURCES.index(definition.source)
                self._manager_series.append([child, source, read, counter, 0 if counter else None])
        # Each direction's: [child, reader, is a histogram, value last written]; and its jobs
        # last synced.
        self._transfer_series: dict[str, list[list]] = {}
        self._synced_jobs = dict.fromkeys(DIRECTIONS, 0)
        series = _series(TRANSFERS)
        for direction in DIRECTIONS:
            self._transfer_series[direction] = []
            for definition, metric, extra, read in series:
                child = metric.labels(direction, instance, *extra)
                histogram = definition.type == "histogram"
                last = read(_NO_JOBS) if histogram else 0
                self._transfer_series[direction].append([child, read, histogram, last])
        # Each tier's sources: (what reads it, [[child, reader, type, value last written], ...]):
        # its counters, and its occupancy where it knows it (a child is created only then: in
        # the directory, creating one writes a 0).
        self._tier_series: list[tuple[Callable[[], Any], list[list]]] = []
        tiers = tiers or {}
        occupied = occupied_tiers(tiers)
        tier_series = _series(TIER) if tiers else []
        occupancy_series = _series(TIER_OCCUPANCY) if occupied else []
        for name, tier in tiers.items():
            self._tier_series.append(
                (lambda t=tier: t.counters, _rows(tier_series, name, instance))
            )
            if name in occupied:
                self._tier_series.append((tier.occupancy, _rows(occupancy_series, name, instance)))

    def sync(self) -> None:
        """Write the deltas since the last call; a few microseconds per changed value."""
        with self._lock:
            if liveness.forked:  # a forked child writes files of its own PID: it joins under it
                liveness.join(self._path)
            if self._manager is not None:
                self._sync_manager()
            self._sync_transfers()
            self._sync_tiers()

    def _sync_manager(self) -> None:
        """Counters are increased by what they moved; gauges are set when they changed (each
        write to the shared file costs about a microsecond)."""
        values = (self._manager.stats(), self._manager.policy_stats())  # as _MANAGER_SOURCES
        for series in self._manager_series:
            child, source, read, counter, last = series
            value = read(values[source])
            if value != last:
                if counter:
                    child.inc(value - last)
                else:
                    child.set(value)
                series[4] = value

    def _sync_transfers(self) -> None:
        """Counters and histograms are increased by what they moved, read from the recorder's
        live totals: each series by what it wrote. A job counts in ``jobs`` first, so a direction
        without new jobs is skipped; a job being recorded may be written in part, its rest with
        the next job."""
        for direction, totals in self._transfers.totals.items():
            jobs = totals.jobs
            if jobs == self._synced_jobs[direction]:
                continue
            self._synced_jobs[direction] = jobs
            for series in self._transfer_series[direction]:
                child, read, histogram, last = series
                value = read(totals)
                if histogram:
                    value = counts, seconds = list(value[0]), value[1]
                    deltas = [n - l for n, l in zip(counts, last[0])]
                    _add_to_histogram(child, deltas, seconds - last[1])
                elif value != last:
                    child.inc(value - last)
                else:
                    continue
                series[3] = value

    def _sync_tiers(self) -> None:
        """Counters and histograms increased by what they moved, gauges set when they changed."""
        for source, rows in self._tier_series:
            values = source()
            for row in rows:
                child, read, kind, last = row
                value = read(values)
                if kind == "histogram":
                    value = counts, seconds = list(value[0]), value[1]
                    if counts == last[0]:
                        continue
                    _add_to_histogram(
                        child, [n - l for n, l in zip(counts, last[0])], seconds - last[1]
                    )
                elif value == last:
                    continue
                elif kind == "counter":
                    child.inc(value - last)
                else:
                    child.set(value)
                row[3] = value


_NO_TIER_VALUE = {
    "counter": 0,
    "gauge": None,
    "histogram": ([0] * (len(DURATION_BUCKETS_SECONDS) + 1), 0.0),
}
"""What a tier's series starts from, by type: a gauge is written at the first sync."""


def _rows(series: list, name: str, instance: str) -> list[list]:
    """One tier's rows of ``series``: [child, reader, type, value last written]."""
    return [
        [
            metric.labels(name, instance, *extra),
            read,
            definition.type,
            _NO_TIER_VALUE[definition.type],
        ]
        for definition, metric, extra, read in series
    ]


def _series(
    definitions: Iterable[Definition],
) -> list[tuple[Definition, MetricWrapperBase, tuple[str, ...], Callable[[Any], Any]]]:
    """Each series of the definitions: its definition, its metric, the label values it adds to
    its source's and the reader of its value."""
    out = []
    for definition in definitions:
        metric = _metric(definition)
        out.extend((definition, metric, extra, read) for extra, read in definition.series())
    return out


def _metric(definition: Definition) -> MetricWrapperBase:
    """The definition's metric, registered nowhere."""
    args = (definition.name, definition.help, definition.labels)
    if definition.type == "counter":
        return Counter(*args, registry=None)
    if definition.type == "gauge":
        return Gauge(*args, registry=None, multiprocess_mode="livesum")
    return Histogram(*args, registry=None, buckets=definition.bounds)


def _add_to_histogram(child, bucket_deltas: list[int], seconds: float) -> None:
    """Add many observations at once. prometheus-client's public API adds one per ``observe()``
    (about 3 us each in multiprocess mode); its per-bucket values are what ``observe()`` itself writes."""
    for value, delta in zip(child._buckets, bucket_deltas):
        if delta:
            value.inc(delta)
    child._sum.inc(seconds)
