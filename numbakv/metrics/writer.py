"""Multi-process export: what changed since the last sync, written into the shared directory's
metrics, one prometheus-client metric per definition of :mod:`numbakv.metrics.definitions`."""

from __future__ import annotations

import operator
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from numbakv.metrics import liveness
from numbakv.metrics.definitions import (
    TIER,
    TIER_OCCUPANCY,
    TRANSFERS,
    Definition,
    ManagerLike,
    Source,
    TierLike,
    labelled_tiers,
    manager_definitions,
    occupied_tiers,
)
from numbakv.metrics.recording import TransferRecorder
from numbakv.metrics.reported import ReportedSeries

Row = tuple[Callable[[Any], None], ReportedSeries]
"""A series and what writes its change into its child: ``inc``, ``set`` or a histogram's add."""


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
        tiers = labelled_tiers("MultiprocessWriter", instance, tiers)
        self._path = path
        self._lock = threading.Lock()
        _WRITERS.add(self)
        # What each sync reads, once, and the rows of the series read from it. A child is
        # created only for a series exported (in the directory, creating one writes a 0).
        self._sources: list[tuple[Callable[[], Any], list[Row]]] = []
        if manager is not None:
            labels = (manager.policy_name, instance)
            series = _series(manager_definitions(manager.policy_name))
            for source, read in (
                (Source.STATS, manager.stats),
                (Source.POLICY, manager.policy_stats),
            ):
                of_source = [s for s in series if s[0].source is source]
                self._sources.append((read, _rows(of_source, labels)))
        series = _series(TRANSFERS)
        for direction in transfers.totals:
            totals = partial(operator.getitem, transfers.totals, direction)
            self._sources.append((totals, _rows(series, (direction, instance))))
        # Each tier's counters, and its occupancy where it knows it.
        occupied = occupied_tiers(tiers)
        series = _series(TIER) if tiers else []
        occupancy = _series(TIER_OCCUPANCY) if occupied else []
        for name, tier in tiers.items():
            self._sources.append(
                (partial(getattr, tier, "counters"), _rows(series, (name, instance)))
            )
            if name in occupied:
                self._sources.append((tier.occupancy, _rows(occupancy, (name, instance))))

    def sync(self) -> None:
        """Write the deltas since the last call: counters and histograms are increased by what
        they moved, gauges set when they changed; a few microseconds per changed value (each
        write to the shared file costs about a microsecond). A transfer job being recorded may
        be written in part, its rest at the next sync."""
        with self._lock:
            if liveness.forked:  # a forked child writes files of its own PID: it joins under it
                liveness.join(self._path)
            for read, rows in self._sources:
                source = read()
                for write, series in rows:
                    change = series.change(source)
                    if change is not None:
                        write(change)

    def _start_over_in_child(self) -> None:
        """In a forked child: report only what changes from now on. The child's copies of the
        running totals still hold what the parent had not yet synced, which the parent reports
        itself; the lock is new, as another thread may have held the parent's at the fork."""
        self._lock = threading.Lock()
        for read, rows in self._sources:
            source = read()
            for _, series in rows:
                series.start_from(source)


_WRITERS: weakref.WeakSet[MultiprocessWriter] = weakref.WeakSet()
"""Every writer of this process, started over in a forked child."""


def _after_fork_in_child() -> None:
    for writer in list(_WRITERS):
        writer._start_over_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _rows(series: list, labels: tuple[str, ...]) -> list[Row]:
    """The rows of ``series`` for one label set of their source, nothing reported yet."""
    rows = []
    for definition, metric, extra, read in series:
        child = metric.labels(*labels, *extra)
        if definition.type == "counter":
            write = child.inc
        elif definition.type == "gauge":
            write = child.set
        else:
            write = partial(_add_to_histogram, child)
        rows.append((write, ReportedSeries(read, definition.type)))
    return rows


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


def _add_to_histogram(child, change: tuple[list[int], float]) -> None:
    """Add many observations at once: ``change`` is their count per bucket and their sum.
    prometheus-client's public API adds one per ``observe()`` (about 3 us each in multiprocess
    mode); its per-bucket values are what ``observe()`` itself writes."""
    bucket_deltas, seconds = change
    for value, delta in zip(child._buckets, bucket_deltas):
        if delta:
            value.inc(delta)
    child._sum.inc(seconds)
