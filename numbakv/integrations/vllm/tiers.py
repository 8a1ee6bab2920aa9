"""A numbakv tier below host memory as one of vLLM's secondary tiers (`SecondaryTierManager`).

vLLM's `TieringOffloadingSpec` keeps its own CPU tier first and cascades stored chunks to each
secondary tier, promoting them back on a lookup hit. `ChunkTierManager` is that contract over a
`numbakv.tiers.ChunkTier`, the same for every backend; a subclass only opens its backend from its
settings (`NumbaKVRedisTier`: integrations/vllm/redis_tier.py). Everything here runs on vLLM's
scheduler thread and returns at once: lookups are batched once per step by vLLM's own
`AsyncLookupManager` (RETRY until answered, the answer bounded by the tier's deadline), transfers
run on the tier's threads and come back through `get_finished_jobs`.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from vllm.config import get_current_vllm_config_or_none
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager, LookupPhase
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from numbakv.integrations.vllm.process_metrics import start_process_metrics
from numbakv.jobs import Direction
from numbakv.metrics.definitions import Definition, Source, definition_of
from numbakv.metrics.reported import ReportedSeries
from numbakv.tiers import ChunkTier, Namespace, open_tier

if TYPE_CHECKING:
    from vllm.v1.kv_offload.backpressure import BackpressureDetector
    from vllm.v1.kv_offload.base import OffloadingSpec

logger = logging.getLogger("numbakv.tiers")

# numbakv's own figures of a tier, beside vLLM's tiering metrics (which count its lookups, hits,
# bytes and times like any tier's): these of numbakv's tier metrics, under vLLM's `numbakv:` names.
VLLM_TIER_METRICS = tuple(
    definition_of(Source.TIER, field)
    for field in (
        "loaded_own",
        "dropped_stores",
        "integrity_failures",
        "late_lookups",
        "breaker_open",
    )
)


def vllm_name(definition: Definition) -> str:
    return definition.name.replace("numbakv_", "numbakv:", 1)


class _Lookups(AsyncLookupManager):
    """vLLM's per-step batched lookups, answered by the tier within its deadline."""

    def __init__(self, tier: ChunkTier, tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier.contains(keys)

    def mark_miss(self, keys: Collection[OffloadKey]) -> None:
        """A failed load's chunks are misses from now on. A newer probe of one, still under way,
        is left to its own answer (a miss: the tier finds no failed chunk until it is stored
        anew), as vLLM 0.33 does; 0.32 resolved it too, and the step's flush then failed its
        phase assertion."""
        resolved = []
        for key in keys:
            state = self._lookup_state.get(key)
            if state is not None and state.phase is LookupPhase.RESOLVED:
                resolved.append(key)
        super().mark_miss(resolved)


CONFIG_INFO_KEYS = ("numbakv_namespace", "numbakv_chunk_bytes", "numbakv_capacity_chunks")


class ChunkTierManager(SecondaryTierManager):
    """vLLM's secondary-tier contract over a `ChunkTier` that `numbakv.tiers.open_tier` opens from
    the URL `tier_url` makes of the tier's settings.

    Settings, beside the backend's own: `lookup_deadline_s` (a batched lookup not answered by
    then is misses), `io_threads`, `breaker_cooldown_s` (how long a store found unreachable is
    left alone), `enable_kv_events` (vLLM KV events for stored chunks) and `locality`.
    """

    medium: ClassVar[Medium] = Medium.STORAGE
    default_locality: ClassVar[Locality | None] = None  # where `locality` is not set

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        *,
        enable_kv_events: bool = False,
        locality: str | None = None,
        **backend_settings: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if locality is not None and locality not in Locality._value2member_map_:
            raise ValueError(f"{tier_type} locality must be LOCAL or REMOTE, got {locality!r}")
        self.locality = Locality(locality) if locality is not None else self.default_locality
        rows, row_bytes = len(primary_kv_view), primary_kv_view.strides[0]
        self.namespace = namespace_of(offloading_spec, row_bytes)
        host_pool = np.frombuffer(primary_kv_view, dtype=np.uint8).reshape(rows, row_bytes)
        emit = enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
        url, backend_settings = self.tier_url(backend_settings, removal_events=emit)
        self.tier = open_tier(url, host_pool, self.namespace, **backend_settings)
        try:  # a start that fails leaves no connection, thread or view of the host pool behind
            # numbakv's tier metrics for numbakv-sidecar (vLLM's tiering metrics count it either way).
            self._metrics = start_process_metrics(
                offloading_spec.config.parallel, "scheduler", tiers={self.tier_type: self.tier}
            )
        except BaseException:
            self.tier.close()
            raise
        self._lookups = _Lookups(self.tier, tier_type)
        self._job_keys: dict[int, list[OffloadKey]] = {}  # jobs in flight
        self._refused: list[tuple[Direction, TransferJob]] = []  # refused, not yet reported
        self._events: list[OffloadingEvent] | None = [] if emit else None
        # What get_stats reports: each series' vLLM name, labels, and what it last reported.
        self._reported = [
            (vllm_name(definition), (tier_type, *extra), ReportedSeries(read, definition.type))
            for definition in VLLM_TIER_METRICS
            for extra, read in definition.series()
        ]

    @classmethod
    @abstractmethod
    def tier_url(
        cls, settings: Mapping[str, Any], *, removal_events: bool
    ) -> tuple[str, dict[str, Any]]:
        """The URL `open_tier` opens, and the settings it is given beside it, from the tier's own
        settings (those not the generic adapter's); `open_tier` names a bad or unknown key.

        `removal_events` says whether vLLM's KV events are on, for a backend that removes chunks
        itself (the disk tier evicts) to report them.
        """

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        """vLLM 0.33's `vllm:kv_offload_config_info` labels of this tier (0.32 never asks)."""
        return CONFIG_INFO_KEYS

    def config_info(self) -> dict[str, str | int]:
        """What the tier's chunks are and how many it may hold ("None" where the store decides)."""
        occupancy = self.tier.occupancy()
        return {
            "numbakv_namespace": self.namespace.digest.hex(),
            "numbakv_chunk_bytes": self.tier.chunk_bytes,
            "numbakv_capacity_chunks": "None" if occupancy is None else occupancy.capacity,
        }

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(Direction.STORE, job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(Direction.LOAD, job_metadata)

    def _submit(self, direction: Direction, job: TransferJob) -> None:
        """Hand the job to the tier. One it refuses (chunk ids out of range or repeated, a tier
        closed) is a failed job, reported by the next `get_finished_jobs` as vLLM's own tiers
        report it: vLLM has pinned its chunks already, and releases them only on a result."""
        keys = list(job.keys)
        submit = self.tier.submit_load if direction is Direction.LOAD else self.tier.submit_store
        try:
            submit(job.job_id, keys, job.chunk_ids)
        except (ValueError, TypeError, RuntimeError) as error:
            logger.warning("numbakv %s: job %s refused: %s", self.tier_type, job.job_id, error)
            self._refused.append((direction, job))
            return
        self._job_keys[job.job_id] = keys  # reported on this thread, never before this

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Finished jobs; a failed load names the chunks it did move, and its failed chunks are
        misses from now on (vLLM asks again after a failed promotion)."""
        results = []
        for direction, refused in self._refused:
            if direction is Direction.LOAD:  # a miss from now on, as a failed load's chunks
                self._lookups.mark_miss(refused.keys)
            results.append(JobResult(job_id=refused.job_id, success=False))
        self._refused.clear()
        for job in self.tier.take_finished():
            keys = self._job_keys.pop(job.job_id)
            failed = set(job.failed_keys)
            moved = tuple(key for key in keys if key not in failed)
            if job.direction is Direction.LOAD and failed:
                self._lookups.mark_miss(failed)
            elif job.direction is Direction.STORE and self._events is not None and job.success:
                # a store that failed in part announces nothing, as vLLM's own tiers do
                self._events.append(
                    OffloadingEvent(
                        keys=keys, medium=self.medium, removed=False, locality=self.locality
                    )
                )
            partial = job.direction is Direction.LOAD and failed and moved
            results.append(
                JobResult(
                    job_id=job.job_id,
                    success=job.success,
                    successful_keys=moved if partial else None,
                    transfer_time=job.seconds,
                    transfer_bytes=job.nbytes,
                )
            )
        return results

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.tier.touch(list(keys))

    def has_pending_work(self) -> bool:
        return bool(self._job_keys or self._refused)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events:
            events, self._events = self._events, []
            yield from events

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        self.tier.drain()

    def shutdown(self) -> None:
        """Stop: jobs not yet started are dropped, as vLLM's own tiers drop theirs."""
        self._lookups.shutdown()
        self.tier.close(discard_pending=True)
        if self._metrics is not None:
            self._metrics.close()

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        definitions: dict[str, OffloadingMetricMetadata] = {}
        for definition in VLLM_TIER_METRICS:
            kind = (
                OffloadingCounterMetadata
                if definition.type == "counter"
                else OffloadingGaugeMetadata
            )
            definitions[vllm_name(definition)] = kind(
                documentation=definition.help,
                labelnames=("tier", definition.label) if definition.label else ("tier",),
            )
        return definitions

    def get_stats(self) -> OffloadingConnectorStats:
        """numbakv's counters since the last call, and the breaker's state."""
        stats = OffloadingConnectorStats()
        counters = self.tier.counters
        for name, labels, series in self._reported:
            if series.type == "gauge":  # set in every report, changed or not
                stats.set_gauge(name, series.read(counters), labels)
            elif (delta := series.change(counters)) is not None:
                stats.increase_counter(name, delta, labels)
        return stats


def namespace_of(offloading_spec: OffloadingSpec, row_bytes: int) -> Namespace:
    """What the primary tier's rows (`row_bytes` each) mean, from vLLM's offloading config and,
    inside an engine, its model config (heads, head size and revision: 1, 1 and "" outside one,
    as in tests). The row's size is named too: how many copies of a chunk a row holds (one per
    rank, or one for all where vLLM replicates), and its padding, are the engine's choice, and
    engines whose rows differ must never read each other's chunks (each would fail the other's
    length check and delete it)."""
    config = offloading_spec.config
    layers = sum(len(group.layer_names) for group in config.groups)
    vllm_config = get_current_vllm_config_or_none()
    model = None if vllm_config is None else vllm_config.model_config
    if model is None:
        heads, head_size, revision = 1, 1, ""
    else:
        heads = model.get_num_kv_heads(vllm_config.parallel_config)
        head_size, revision = model.get_head_size(), model.revision or ""
    parallel = config.parallel
    layout = "-".join(
        (
            f"vllm:{config.kv_cache_layout or 'default'}",
            "canonical" if config.canonical_layout else "direct",
            "groups" + ",".join(str(g.tokens_per_block) for g in config.groups),
            f"pp{parallel.pp_size}pcp{parallel.pcp_size}dcp{parallel.dcp_size}",
            f"row{row_bytes}",
        )
    )
    return Namespace(
        model=config.model.name,
        revision=revision,
        dtype=str(config.model.dtype),
        tokens_per_block=config.groups[0].tokens_per_block if config.groups else 1,
        blocks_per_chunk=config.cache.blocks_per_chunk,
        num_layers=max(layers, 1),
        num_kv_heads=heads,
        head_size=head_size,
        page_bytes=max(config.worker_kv_bytes_per_block // max(layers, 1), 1),
        layout=layout,
        tensor_parallel_size=parallel.tp_size,
        tensor_parallel_rank=0,  # the scheduler's rows hold every rank's pages
    )
