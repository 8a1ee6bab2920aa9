"""In-process export: a collector that reads the manager, the transfer totals and the tiers below
host memory when Prometheus scrapes, one family per definition of :mod:`numbakv.metrics.definitions`."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

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

FAMILIES = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
}

Series = tuple[tuple[tuple[str, ...], Callable[[Any], Any]], ...]


class ScrapeCollector(Collector):
    """In-process export: reads the manager, the transfer totals and the tiers (by name) when
    Prometheus scrapes."""

    def __init__(
        self,
        manager: ManagerLike | None,
        transfers: TransferRecorder,
        instance: str,
        tiers: Mapping[str, TierLike] | None = None,
    ) -> None:
        self._tiers = labelled_tiers("ScrapeCollector", instance, tiers)
        self._manager = manager
        self._transfers = transfers
        self.instance = instance
        self._manager_families = (
            () if manager is None else _with_series(manager_definitions(manager.policy_name))
        )
        self._transfer_families = _with_series(TRANSFERS)
        self._tier_families = _with_series(TIER) if self._tiers else ()
        self._occupied = occupied_tiers(self._tiers)
        self._occupancy_families = _with_series(TIER_OCCUPANCY) if self._occupied else ()

    def collect(self) -> Iterator[Metric]:
        if self._manager is not None:
            values = {
                Source.STATS: self._manager.stats(),
                Source.POLICY: self._manager.policy_stats(),
            }
            labels = (self._manager.policy_name, self.instance)
            for definition, series in self._manager_families:
                yield _family(definition, series, [(labels, values[definition.source])])
        # One copy per direction: every family shows the same jobs.
        totals = [((d, self.instance), t.copy()) for d, t in self._transfers.totals.items()]
        for definition, series in self._transfer_families:
            yield _family(definition, series, totals)
        tiers = [((name, self.instance), tier.counters) for name, tier in self._tiers.items()]
        for definition, series in self._tier_families:
            yield _family(definition, series, tiers)
        occupancy = [((name, self.instance), t.occupancy()) for name, t in self._occupied.items()]
        for definition, series in self._occupancy_families:
            yield _family(definition, series, occupancy)


class RegistryCollector(Collector):
    """Every :class:`ScrapeCollector` of one registry, their families merged by name: two
    collectors giving one family are refused by a registry that checks (its default), and written
    twice, which Prometheus refuses, by one that does not. Made by :func:`join`."""

    def __init__(self) -> None:
        self.members: dict[str, ScrapeCollector] = {}

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for member in list(self.members.values()):
            for family in member.collect():
                kept = merged.setdefault(family.name, family)
                if kept is not family:
                    kept.samples.extend(family.samples)
        yield from merged.values()


_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, RegistryCollector] = (
    weakref.WeakKeyDictionary()
)
_REGISTERING = threading.Lock()


def join(registry: CollectorRegistry, collector: ScrapeCollector) -> None:
    """Export `collector` in `registry`, beside the others there; an instance exported there
    already is refused by name (its series would be written twice)."""
    with _REGISTERING:
        shared = _REGISTERED.get(registry)
        if shared is None:
            shared = _REGISTERED[registry] = RegistryCollector()
            registry.register(shared)
        if collector.instance in shared.members:
            raise ValueError(
                f"OffloadMetrics instance {collector.instance!r} is exported in this registry "
                "already; give each its own instance"
            )
        shared.members[collector.instance] = collector


def leave(registry: CollectorRegistry, collector: ScrapeCollector) -> None:
    """Stop exporting `collector`; the registry's collector goes with its last member."""
    with _REGISTERING:
        shared = _REGISTERED[registry]
        del shared.members[collector.instance]
        if not shared.members:
            registry.unregister(shared)
            del _REGISTERED[registry]


def _with_series(definitions: Sequence[Definition]) -> tuple[tuple[Definition, Series], ...]:
    return tuple((definition, definition.series()) for definition in definitions)


def _family(
    definition: Definition, series: Series, sources: list[tuple[tuple[str, ...], Any]]
) -> Metric:
    """The definition's family: its series for each (label values, what its source gave)."""
    family = FAMILIES[definition.type](definition.name, definition.help, labels=definition.labels)
    for labels, source in sources:
        for extra, read in series:
            value = read(source)
            if definition.type == "histogram":
                counts, total = value
                family.add_metric([*labels, *extra], _cumulative(counts, definition.bounds), total)
            else:
                family.add_metric([*labels, *extra], value)
    return family


def _cumulative(counts: list[int], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    out, acc = [], 0
    for bound, count in zip((*bounds, float("inf")), counts):
        acc += count
        out.append((floatToGoString(bound), acc))
    return out
