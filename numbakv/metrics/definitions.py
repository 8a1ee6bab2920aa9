"""The table of numbakv's metrics: each one's name, type, help, labels and where its value is read.

Both exporters build their families from it (:class:`~numbakv.metrics.collector.ScrapeCollector`
in-process, :class:`~numbakv.metrics.writer.MultiprocessWriter` into the shared directory), and the
sidecar's ``/stats`` finds its names in it, so that a metric is defined in one place:

- :data:`MANAGER`: the manager's counters and host-pool gauges, read from ``manager.stats()``;
- :data:`POLICY_STATE`: each policy's own gauges, read from ``manager.policy_stats()``, under the
  policy's own names, keyed by the manager's ``policy_name`` (the policy registry's name: a policy
  loaded by import path exports no policy state);
- :data:`TRANSFERS`: transfer jobs, read from the totals of each direction
  (:class:`~numbakv.metrics.recording.TransferTotals`);
- :data:`TIER`: each tier below host memory (Redis, a disk), read from its
  ``numbakv.tiers.TierCounters``, one series per tier name;
- :data:`TIER_OCCUPANCY`: the chunks a tier holds and may hold, read from its ``occupancy()``,
  only for the tiers that know them (a disk; not Redis, whose server bounds it).
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from numbakv.checks import SettingTypeError
from numbakv.jobs import Direction

DIRECTIONS = tuple(direction.value for direction in Direction)
"""Transfer directions, as labels: ``store`` is GPU to host, ``load`` host to GPU."""

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
"""Upper bounds of the duration histograms, of transfer jobs and of a tier's calls (a job moves a
batch of blocks: 100 us to seconds)."""


def no_durations() -> list[int]:
    """The counts of a duration histogram before its first observation: one per bucket of
    :data:`DURATION_BUCKETS_SECONDS` and one past every bound (per bucket, not cumulative)."""
    return [0] * (len(DURATION_BUCKETS_SECONDS) + 1)


MANAGER_LABELS = ("policy", "instance")
TRANSFER_LABELS = ("direction", "instance")
TIER_LABELS = ("tier", "instance")


class ManagerLike(Protocol):
    """What the metrics read from ``numbakv.manager.CPUOffloadingManager``."""

    policy_name: str

    def stats(self): ...  # -> ManagerStats, a frozen dataclass of ints

    def policy_stats(self) -> dict[str, float]: ...


class TierLike(Protocol):
    """What the metrics read from a ``numbakv.tiers.ChunkTier``."""

    counters: Any  # TierCounters: ints, and Latency histograms (buckets, seconds)

    def occupancy(self) -> Any: ...  # -> Occupancy(used, capacity), or None: not known


class Source(enum.Enum):
    """Where a metric's values are read, once per export; the labels of its series follow."""

    STATS = "manager.stats()"
    """A field of the manager's ``ManagerStats``; labels ``policy``, ``instance``."""
    POLICY = "manager.policy_stats()"
    """A key of the policy's gauges, 0 when absent; labels ``policy``, ``instance``."""
    TRANSFERS = "TransferTotals"
    """A field of one direction's transfer totals; labels ``direction``, ``instance``."""
    TIER = "TierCounters"
    """A field (or dotted path) of a tier's counters; labels ``tier``, ``instance``."""
    OCCUPANCY = "tier.occupancy()"
    """A field of a tier's ``Occupancy``, for the tiers that know it; labels ``tier``, ``instance``."""

    @property
    def labels(self) -> tuple[str, ...]:
        return {
            Source.TRANSFERS: TRANSFER_LABELS,
            Source.TIER: TIER_LABELS,
            Source.OCCUPANCY: TIER_LABELS,
        }.get(self, MANAGER_LABELS)

    def reader(self, *fields: str) -> Callable[[Any], Any]:
        """Reads ``fields`` from what this source gives: one value, or a tuple of them (a policy's
        gauges are read one key at a time). C-level callables: exports read them at every sync."""
        if self is Source.POLICY:
            (key,) = fields
            return operator.methodcaller("get", key, 0.0)
        return operator.attrgetter(*fields)


MetricType = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class Definition:
    """One metric family."""

    name: str
    """A counter's without ``_total``: the exposition adds it."""
    type: MetricType
    help: str
    source: Source
    fields: tuple[str, ...]
    """What it reads of its source: a counter's or gauge's field, or with ``label`` one field per
    series; a histogram's per-bucket (not cumulative) counts and sum."""
    label: str | None = None
    """The label that tells apart the series of one label set of the source: each one's value is
    the field it reads."""
    bounds: tuple[float, ...] = ()
    """A histogram's bucket upper bounds, without +Inf."""
    label_values: tuple[str, ...] = ()
    """With ``label``: each field's series' label value, where it is not the field's name."""

    @property
    def labels(self) -> tuple[str, ...]:
        return self.source.labels if self.label is None else (*self.source.labels, self.label)

    @property
    def sample(self) -> str:
        """The name of a counter's or gauge's samples."""
        return f"{self.name}_total" if self.type == "counter" else self.name

    def series(self) -> tuple[tuple[tuple[str, ...], Callable[[Any], Any]], ...]:
        """Each series of one label set of the source: the values it adds to those labels (its
        ``label``'s, or none) and the reader of its value (a histogram's: (counts, sum))."""
        if self.label is None:
            return (((), self.source.reader(*self.fields)),)
        values = self.label_values or self.fields
        return tuple(
            ((value,), self.source.reader(field)) for field, value in zip(self.fields, values)
        )


def _stat(field: str, name: str, kind: MetricType, help: str) -> Definition:
    return Definition(name, kind, help, Source.STATS, (field,))


def _transfers(field: str, name: str, help: str) -> Definition:
    return Definition(name, "counter", help, Source.TRANSFERS, (field,))


def _arc_state(prefix: str, policy: str) -> tuple[Definition, ...]:
    """The target and list sizes of an ARC (ARC itself, Sighting ARC)."""
    target = f"{policy}'s adaptive target size p of its recency list T1."
    lists = f"Entries in each {policy} list (T1, T2 and ghosts B1, B2)."
    return (
        Definition(f"numbakv_{prefix}_p_blocks", "gauge", target, Source.POLICY, ("p",)),
        Definition(
            f"numbakv_{prefix}_list_blocks",
            "gauge",
            lists,
            Source.POLICY,
            ("t1", "t2", "b1", "b2"),
            label="list",
        ),
    )


MANAGER: tuple[Definition, ...] = (
    _stat(
        "lookups", "numbakv_lookups", "counter", "Lookup calls answered by the offloading manager."
    ),
    _stat(
        "hit_blocks", "numbakv_hit_blocks", "counter", "Blocks that lookups found in host memory."
    ),
    _stat(
        "missed_blocks",
        "numbakv_missed_blocks",
        "counter",
        "Blocks that lookups did not find in host memory.",
    ),
    _stat(
        "evicted_blocks",
        "numbakv_evicted_blocks",
        "counter",
        "Blocks evicted from host memory by the policy.",
    ),
    _stat(
        "stored_blocks",
        "numbakv_stored_blocks",
        "counter",
        "Blocks whose store to host memory completed.",
    ),
    _stat(
        "failed_store_blocks",
        "numbakv_failed_store_blocks",
        "counter",
        "Blocks whose store to host memory failed.",
    ),
    _stat(
        "refused_store_blocks",
        "numbakv_refused_store_blocks",
        "counter",
        "Blocks a store was refused for: no room in host memory, every other block being "
        "loaded or stored.",
    ),
    _stat(
        "loaded_blocks",
        "numbakv_loaded_blocks",
        "counter",
        "Blocks loaded from host memory back to the GPU.",
    ),
    _stat(
        "stores_skipped",
        "numbakv_stores_skipped",
        "counter",
        "Blocks not stored because of the store threshold.",
    ),
    _stat("capacity", "numbakv_host_capacity_blocks", "gauge", "Block slots in the host pool."),
    _stat("used", "numbakv_host_used_blocks", "gauge", "Host pool slots holding a block."),
    _stat("free", "numbakv_host_free_blocks", "gauge", "Host pool slots free for new blocks."),
    _stat(
        "being_stored",
        "numbakv_host_being_stored_blocks",
        "gauge",
        "Host slots a store is writing now.",
    ),
    _stat(
        "being_read",
        "numbakv_host_being_loaded_blocks",
        "gauge",
        "Host slots a load is reading now.",
    ),
)
"""The manager's counters and host-pool gauges, in the order they are exported."""

POLICY_STATE: dict[str, tuple[Definition, ...]] = {
    "lru": (),
    "arc": _arc_state("arc", "ARC"),
    "s3fifo": (
        Definition(
            "numbakv_s3fifo_queue_blocks",
            "gauge",
            "Entries in each S3-FIFO queue (small, main, and ghost: hashes of evicted blocks).",
            Source.POLICY,
            ("small", "main", "ghost"),
            label="queue",
        ),
    ),
    "sieve": (),
    "sarc": _arc_state("sarc", "Sighting ARC"),
}
"""Each registered policy's gauges, by its registry name, exported after :data:`MANAGER`."""

TRANSFERS: tuple[Definition, ...] = (
    _transfers("jobs", "numbakv_transfer_jobs", "Transfer jobs finished, successful or not."),
    _transfers("failed_jobs", "numbakv_transfer_failed_jobs", "Transfer jobs that failed."),
    _transfers("nbytes", "numbakv_transfer_bytes", "Bytes moved by successful transfer jobs."),
    Definition(
        "numbakv_transfer_duration_seconds",
        "histogram",
        "Wall time of transfer jobs, submit to completion.",
        Source.TRANSFERS,
        ("buckets", "seconds"),
        bounds=DURATION_BUCKETS_SECONDS,
    ),
)
"""Transfer jobs' metrics, one series per direction."""


def _tier(field: str, name: str, kind: MetricType, help: str) -> Definition:
    return Definition(name, kind, help, Source.TIER, (field,))


def _tier_latency(what: str, name: str, help: str) -> Definition:
    fields = (f"{what}.buckets", f"{what}.seconds")
    return Definition(name, "histogram", help, Source.TIER, fields, bounds=DURATION_BUCKETS_SECONDS)


TIER: tuple[Definition, ...] = (
    _tier("lookups", "numbakv_tier_lookups", "counter", "Chunks looked up in a tier."),
    _tier("lookup_hits", "numbakv_tier_lookup_hits", "counter", "Chunks a tier's lookups found."),
    _tier(
        "late_lookups",
        "numbakv_tier_late_lookups",
        "counter",
        "Batched lookups answered as misses at the tier's deadline.",
    ),
    Definition(
        "numbakv_tier_loaded_chunks",
        "counter",
        "Chunks loaded from a tier into host memory, by whose write: this engine's or another's.",
        Source.TIER,
        ("loaded_own", "loaded_other"),
        label="writer",
        label_values=("own", "other"),
    ),
    _tier("loaded_bytes", "numbakv_tier_loaded_bytes", "counter", "Bytes loaded from a tier."),
    _tier("stored", "numbakv_tier_stored_chunks", "counter", "Chunks stored in a tier."),
    _tier("stored_bytes", "numbakv_tier_stored_bytes", "counter", "Bytes stored in a tier."),
    _tier(
        "dropped_stores",
        "numbakv_tier_dropped_stores",
        "counter",
        "Chunks not stored: refused by the store (full) or unreachable.",
    ),
    _tier(
        "integrity_failures",
        "numbakv_tier_integrity_failures",
        "counter",
        "Stored chunks whose header or checksum did not match: deleted, never loaded.",
    ),
    _tier(
        "unavailable",
        "numbakv_tier_unavailable_calls",
        "counter",
        "Calls that found the store unreachable or were skipped while the breaker was open.",
    ),
    _tier(
        "breaker_opens",
        "numbakv_tier_breaker_opens",
        "counter",
        "Times the tier's circuit breaker opened (the store found unreachable).",
    ),
    _tier(
        "breaker_open",
        "numbakv_tier_breaker_open",
        "gauge",
        "1 while the tier has stopped calling its store, found unreachable.",
    ),
    _tier_latency(
        "lookup_latency",
        "numbakv_tier_lookup_duration_seconds",
        "Wall time of a tier's batched lookups at the store (one round trip).",
    ),
    _tier_latency(
        "load_latency", "numbakv_tier_load_duration_seconds", "Wall time of a tier's load jobs."
    ),
    _tier_latency(
        "store_latency", "numbakv_tier_store_duration_seconds", "Wall time of a tier's store jobs."
    ),
)
"""A tier's metrics below host memory, one series per tier."""

TIER_OCCUPANCY: tuple[Definition, ...] = (
    Definition(
        "numbakv_tier_used_chunks",
        "gauge",
        "Chunks a tier holds now (tiers that bound themselves, as a disk; not Redis).",
        Source.OCCUPANCY,
        ("used",),
    ),
    Definition(
        "numbakv_tier_capacity_chunks",
        "gauge",
        "Chunks a tier may hold (tiers that bound themselves, as a disk; not Redis).",
        Source.OCCUPANCY,
        ("capacity",),
    ),
)
"""A tier's occupancy, one series per tier that knows it: a tier whose store is bounded by something
else (a Redis server's ``maxmemory``) exports none, rather than NaN, which would spread through
every sum and ratio that meets it."""


def labelled_tiers(owner: str, instance: object, tiers: object) -> dict[str, TierLike]:
    """``tiers`` as a dict, once ``instance`` and every tier's name are strings. Both are label
    values, which prometheus-client takes as given and fails on only at a scrape (of the whole
    registry): refused here, by ``owner``'s name, instead."""
    if not isinstance(instance, str):
        raise SettingTypeError(
            f"{owner} instance must be a string such as 'gpu0', got {instance!r}"
        )
    if tiers is None:
        return {}
    if not isinstance(tiers, Mapping):
        raise SettingTypeError(
            f"{owner} tiers must be a mapping of names to tiers, {{'redis': tier}}, got {tiers!r}"
        )
    for name in tiers:
        if not isinstance(name, str):
            raise SettingTypeError(
                f"{owner} tiers must be named by strings such as 'redis', got the name {name!r}"
            )
    return dict(tiers)


def occupied_tiers(tiers: Mapping[str, TierLike]) -> dict[str, TierLike]:
    """The tiers, by name, that export :data:`TIER_OCCUPANCY`: those whose ``occupancy()`` answers
    (asked once: a tier knows it always or never)."""
    return {name: tier for name, tier in tiers.items() if tier.occupancy() is not None}


def manager_definitions(policy_name: str) -> tuple[Definition, ...]:
    """What a manager with this policy exports: :data:`MANAGER`, then its policy's state, if any."""
    return MANAGER + POLICY_STATE.get(policy_name, ())


def definition_of(source: Source, field: str) -> Definition:
    """The manager's, transfers' or tiers' metric that reads ``field`` of ``source``."""
    return next(
        d
        for d in (*MANAGER, *TRANSFERS, *TIER, *TIER_OCCUPANCY)
        if d.source is source and field in d.fields
    )
