"""vLLM's scheduler side: its `OffloadingManager` interface over numbakv's `CPUOffloadingManager`.

Keys are vLLM's `OffloadKey`s (bytes), used as numbakv block hashes as they are. Recency follows
vLLM 0.32's request order: a request's loads and stores are recorded (numbakv's `RequestAccess`,
kept in its `ReqContext`) and reach the policy once, when it finishes, in prefix order, head the
most recent. numbakv's results become vLLM's types in `.convert`. Never imports the data path: it
runs in vLLM's scheduler.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics
from vllm.v1.kv_offload.cpu.policies.base import order_request_keys
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from numbakv.integrations.vllm import convert
from numbakv.integrations.vllm.compat import RANKS_BY_POSITION
from numbakv.integrations.vllm.host_spec import HostChunksSpec
from numbakv.manager import CPUOffloadingManager
from numbakv.metrics import OffloadMetrics
from numbakv.metrics.reported import ReportedSeries
from numbakv.request_access import RequestAccess


class NumbaKVOffloadingManager(OffloadingManager):
    """Answers vLLM's connector with numbakv's manager: lookups, ref-counted loads, atomic stores."""

    def __init__(
        self,
        manager: CPUOffloadingManager,
        metrics: OffloadMetrics | None = None,
        *,
        config_info: Mapping[str, Any] | None = None,
        failed_store_events: bool = False,
    ) -> None:
        """`config_info`: the labels of vLLM 0.33's `vllm:kv_offload_config_info`;
        `failed_store_events`: announce failed stores as `metadata_only` removals (vLLM 0.33)."""
        self.manager = manager
        self.metrics = metrics
        self.medium = Medium.CPU  # what vLLM's CPU manager says its events' medium is
        self._config_info = dict(config_info or {})
        self._failed_store_events = failed_store_events
        # Events taken from numbakv's manager ahead of a failed store's, in order (vLLM 0.33).
        self._events: list[OffloadingEvent] = []
        self._failures_pending = False  # whether _events holds a failed store's announcement
        self._lookup = manager.lookup
        self._allocation_sizes: list[int] = []  # chunks each store asked for, since get_stats
        self._stores_skipped = ReportedSeries(attrgetter("stores_skipped"), "counter")
        self._refused_store_blocks = manager.stats().refused_store_blocks  # as of the last refusal

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._request(req_context)
        return RequestOffloadingContext()

    def _request(self, req_context: ReqContext) -> RequestAccess:
        """The request's record in numbakv's manager, begun afresh after a reset."""
        request = req_context.get_state(RequestAccess)
        if request is None or not self.manager.is_current(request):
            request = self.manager.begin_request(
                req_context.get_offload_key_position if RANKS_BY_POSITION else None
            )
            req_context.set_state(request)
        return request

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._lookup((key,)):
            return LookupResult.HIT
        if self.manager.is_being_stored(key):
            return LookupResult.HIT_PENDING
        return LookupResult.MISS

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> HostChunksSpec:
        return convert.host_chunks_spec(self.manager.prepare_load(keys, self._request(req_context)))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.manager.touch(keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.manager.complete_load(keys)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Allocate chunks for the keys not stored yet; None when no room can be made. Either
        way the chunks asked for are observed, as vLLM's manager observes them."""
        plan = self.manager.prepare_store(keys, self._request(req_context))
        if plan is None:
            refused = self.manager.stats().refused_store_blocks
            self._allocation_sizes.append(refused - self._refused_store_blocks)
            self._refused_store_blocks = refused
            return None
        if self._failures_pending and plan.block_hashes_to_store:
            self._reowned(plan.block_hashes_to_store)
        if plan.block_hashes_to_store:
            self._allocation_sizes.append(len(plan.block_hashes_to_store))
        return convert.prepare_store_output(plan)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Make the chunks loadable; on failure drop them, so nothing half-written is ever loaded."""
        if success or not self._failed_store_events:
            self.manager.complete_store(keys, success=success)
            return
        dropped = list(filter(self.manager.is_being_stored, dict.fromkeys(keys)))
        self.manager.complete_store(dropped, success=False)
        if dropped:
            self._events += map(convert.offloading_event, self.manager.take_events())
            self._events.append(convert.failed_store_event(dropped))
            self._failures_pending = True

    def _reowned(self, keys: list[OffloadKey]) -> None:
        """A retry stores these keys again: a pending failure no longer announces them."""
        stored = set(keys)
        for event in self._events:
            if event.metadata_only:
                event.keys = [key for key in event.keys if key not in stored]

    def on_request_finished(self, req_context: ReqContext) -> None:
        """The request's accesses reach the policy, in vLLM's prefix order (`_prefix_order`)."""
        request = req_context.get_state(RequestAccess)
        if request is not None and self.manager.is_current(request) and not request.finished:
            self.manager.finish_request(request, _prefix_order(request.blocks, req_context))

    def take_events(self) -> Iterator[OffloadingEvent]:
        """The events in order, all taken at the first step: a drain stopped early loses the
        rest, as vLLM's does (a failed store's announcement must not come back after a retry)."""
        events = [*self._events, *map(convert.offloading_event, self.manager.take_events())]
        self._events.clear()
        self._failures_pending = False
        yield from (event for event in events if event.keys)

    def config_info(self) -> Sequence[Mapping[str, Any]]:
        """vLLM 0.33's `vllm:kv_offload_config_info` labels: the host tier's sizes."""
        return [self._config_info]

    def get_stats(self) -> OffloadingConnectorStats:
        """vLLM's own CPU-tier metrics, as its CPU manager reports them: the share of chunks a
        store or a load pins, the chunks each store asked for (a refused one too), and stores
        skipped by the threshold."""
        stats = self.manager.stats()
        result = OffloadingConnectorStats()
        for name, chunks in (
            (CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, stats.being_stored + stats.being_read),
            (CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, stats.being_stored),
            (CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, stats.being_read),
        ):
            result.set_gauge(name, chunks / stats.capacity)
        for size in self._allocation_sizes:
            result.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self._allocation_sizes.clear()
        if self.manager.store_threshold >= 2:  # vLLM reports none skipped too
            skipped = self._stores_skipped.change(stats) or 0
            result.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, skipped)
        return result

    def reset_cache(self) -> None:
        self.manager.reset_cache()
        self._events.clear()  # numbakv's manager forgets its pending events too
        self._failures_pending = False

    def shutdown(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def _prefix_order(keys: Collection[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
    """A request's keys head first, as vLLM 0.32's manager orders them: by KV cache group, each
    group by token position when every key of it has one, then across groups by position when
    every key has one (`order_request_keys`); otherwise in the order first seen."""
    groups: dict[int, list[OffloadKey]] = {}
    for key in keys:
        groups.setdefault(get_offload_group_idx(key), []).append(key)
    key_groups = []
    for group in sorted(groups):
        group_keys = groups[group]
        positions = {key: req_context.get_offload_key_position(key) for key in group_keys}
        if None not in positions.values():
            group_keys.sort(key=positions.__getitem__)
        key_groups.append(group_keys)
    return order_request_keys(key_groups, req_context)
