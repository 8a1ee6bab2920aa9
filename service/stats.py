"""The ``/stats`` summary: totals read from the merged metrics, rates over a sliding window of samples."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from numbakv.service.models import DirectionStats, Stats, TierStats
from prometheus_client.metrics_core import Metric

from numbakv.metrics.definitions import DIRECTIONS, Source, definition_of

MAX_WINDOW_S = 300.0


@dataclass(frozen=True)
class Totals:
    """Sums over every instance of the values ``/stats`` needs, at one moment."""

    at: float
    lookups: float = 0.0
    hit_blocks: float = 0.0
    missed_blocks: float = 0.0
    evicted_blocks: float = 0.0
    used_blocks: float = 0.0
    capacity_blocks: float = 0.0
    transfer_bytes: dict[str, float] = field(default_factory=dict)
    transfer_jobs: dict[str, float] = field(default_factory=dict)
    tiers: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per tier name, each of ``_PER_TIER``'s totals, and ``_TIER_OCCUPANCY``'s where exported."""
    instances: frozenset[str] = frozenset()


# The metrics /stats sums, by sample name: the ManagerStats field (or each direction's transfer
# total) each one's definition reads, to the Totals field it is added to.
_SCALARS = {
    definition_of(Source.STATS, field).sample: total
    for field, total in (
        ("lookups", "lookups"),
        ("hit_blocks", "hit_blocks"),
        ("missed_blocks", "missed_blocks"),
        ("evicted_blocks", "evicted_blocks"),
        ("used", "used_blocks"),
        ("capacity", "capacity_blocks"),
    )
}
_PER_DIRECTION = {
    definition_of(Source.TRANSFERS, field).sample: total
    for field, total in (("nbytes", "transfer_bytes"), ("jobs", "transfer_jobs"))
}


# Per tier: the TierCounters field (and writer label) each sample reads, to its total's name.
_PER_TIER = {
    (definition_of(Source.TIER, field).sample, writer): total
    for field, writer, total in (
        ("lookups", None, "lookups"),
        ("lookup_hits", None, "hits"),
        ("loaded_own", "own", "loaded_own"),
        ("loaded_other", "other", "loaded_other"),
        ("breaker_open", None, "breaker_open"),
    )
}


# Per tier, where it knows them: the Occupancy field each sample reads, to its total's name.
_TIER_OCCUPANCY = {
    definition_of(Source.OCCUPANCY, field).sample: total
    for field, total in (("used", "used_chunks"), ("capacity", "capacity_chunks"))
}


def totals_from(metrics: Iterable[Metric], at: float) -> Totals:
    """Add up the samples of the metrics ``/stats`` reports on."""
    values: dict = {name: 0.0 for name in _SCALARS.values()}
    values.update({name: {d: 0.0 for d in DIRECTIONS} for name in _PER_DIRECTION.values()})
    instances = set()
    tiers: dict[str, dict[str, float]] = {}
    for metric in metrics:
        for sample in metric.samples:
            tier_total = _PER_TIER.get((sample.name, sample.labels.get("writer")))
            tier_total = tier_total or _TIER_OCCUPANCY.get(sample.name)
            if tier_total is not None and "tier" in sample.labels:
                totals = tiers.setdefault(sample.labels["tier"], dict.fromkeys(_TIER_TOTALS, 0.0))
                totals[tier_total] = totals.get(tier_total, 0.0) + sample.value
            elif sample.name in _SCALARS:
                values[_SCALARS[sample.name]] += sample.value
            elif sample.name in _PER_DIRECTION and sample.labels.get("direction") in DIRECTIONS:
                values[_PER_DIRECTION[sample.name]][sample.labels["direction"]] += sample.value
            else:
                continue
            if "instance" in sample.labels:
                instances.add(sample.labels["instance"])
    return Totals(at=at, instances=frozenset(instances), tiers=tiers, **values)


_TIER_TOTALS = tuple(_PER_TIER.values())


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 and part >= 0 else None


def _whole(total: float | None) -> int | None:
    """A count as a whole number; None where there is none (or a gauge holds NaN or infinity)."""
    return None if total is None or not math.isfinite(total) else round(total)


def _tier_stats(now: Totals, then: Totals | None) -> dict[str, TierStats]:
    """Each tier's ratios over the window (none without an earlier sample), its breaker and
    occupancy now (none where the tier does not know it)."""
    stats = {}
    for name, totals in now.tiers.items():
        before = then.tiers.get(name) if then is not None else None
        delta = None if before is None else {k: totals[k] - before[k] for k in _TIER_TOTALS}
        loaded = None if delta is None else delta["loaded_own"] + delta["loaded_other"]
        stats[name] = TierStats(
            hit_ratio=None if delta is None else _share(delta["hits"], delta["lookups"]),
            loaded_from_others=None if delta is None else _share(delta["loaded_other"], loaded),
            breaker_open=totals["breaker_open"] > 0,
            used_chunks=_whole(totals.get("used_chunks")),
            capacity_chunks=_whole(totals.get("capacity_chunks")),
        )
    return stats


def _rate(now: float, then: float, seconds: float) -> float | None:
    # A counter that went down means a writer restarted without its files: no honest rate.
    return (now - then) / seconds if now >= then else None


def summarize(now: Totals, then: Totals | None) -> Stats:
    """The ``/stats`` answer for the span from ``then`` to ``now`` (no earlier sample: no rates)."""
    occupancy = now.used_blocks / now.capacity_blocks if now.capacity_blocks > 0 else None
    instances = sorted(now.instances)
    if then is None or now.at <= then.at:
        idle = DirectionStats(gigabytes_per_second=None, jobs_per_second=None)
        return Stats(
            window_seconds=0.0,
            instances=instances,
            hit_ratio=None,
            lookups_per_second=None,
            evictions_per_second=None,
            occupancy=occupancy,
            transfer={d: idle for d in DIRECTIONS},
            tiers=_tier_stats(now, None),
        )
    span = now.at - then.at
    hits, misses = now.hit_blocks - then.hit_blocks, now.missed_blocks - then.missed_blocks
    transfer = {}
    for d in DIRECTIONS:
        bytes_rate = _rate(now.transfer_bytes[d], then.transfer_bytes[d], span)
        transfer[d] = DirectionStats(
            gigabytes_per_second=None if bytes_rate is None else bytes_rate / 1e9,
            jobs_per_second=_rate(now.transfer_jobs[d], then.transfer_jobs[d], span),
        )
    return Stats(
        window_seconds=span,
        instances=instances,
        hit_ratio=hits / (hits + misses)
        if hits >= 0 and misses >= 0 and hits + misses > 0
        else None,
        lookups_per_second=_rate(now.lookups, then.lookups, span),
        evictions_per_second=_rate(now.evicted_blocks, then.evicted_blocks, span),
        occupancy=occupancy,
        transfer=transfer,
        tiers=_tier_stats(now, then),
    )


class RateWindow:
    """The totals sampled over the last ``MAX_WINDOW_S`` seconds, oldest first."""

    def __init__(self) -> None:
        self._samples: deque[Totals] = deque()
        self._lock = threading.Lock()

    def add(self, totals: Totals) -> None:
        with self._lock:
            self._samples.append(totals)
            while self._samples and self._samples[0].at < totals.at - MAX_WINDOW_S:
                self._samples.popleft()

    def latest(self) -> Totals | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    def oldest_within(self, window_s: float, now: float) -> Totals | None:
        """The earliest sample no older than ``window_s`` before ``now`` (and older than ``now``)."""
        with self._lock:
            return next((s for s in self._samples if now - window_s <= s.at < now), None)
