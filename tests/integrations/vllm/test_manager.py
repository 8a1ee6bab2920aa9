"""numbakv's scheduler-side adapter under vLLM 0.32's OffloadingManager contract."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.vllm_support import require_vllm

require_vllm()

from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    ReqContext,
    make_offload_key,
)

from numbakv import POLICIES, CPUOffloadingManager
from numbakv.integrations.vllm.compat import FAILED_STORE_EVENTS
from numbakv.integrations.vllm.host_spec import HostChunksSpec
from numbakv.integrations.vllm.scheduler import NumbaKVOffloadingManager
from numbakv.tools.replay.core import replay
from numbakv.tools.workloads.core import multi_turn_chat
from tests.support.vllm_replay import BENCH, prefix_sharing_chains


def key(block: int, group: int = 0) -> bytes:
    return make_offload_key(block.to_bytes(32, "big"), group)


def keys(*blocks: int) -> list[bytes]:
    return [key(block) for block in blocks]


def adapter(capacity: int = 4, policy: str = "lru", **options) -> NumbaKVOffloadingManager:
    return NumbaKVOffloadingManager(
        CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy=policy, **options)
    )


def stored(manager: NumbaKVOffloadingManager, *blocks: int) -> HostChunksSpec:
    context = ReqContext(req_id="store")
    output = manager.prepare_store(keys(*blocks), context)
    manager.complete_store(set(output.keys_to_store), context)  # vLLM passes a set
    return output.store_spec


def test_lookup_says_hit_pending_or_miss_one_key_at_a_time():
    manager = adapter()
    context = ReqContext(req_id="a")
    stored(manager, 1)
    manager.prepare_store(keys(2), context)
    assert manager.lookup(key(1), context) is LookupResult.HIT
    assert manager.lookup(key(2), context) is LookupResult.HIT_PENDING
    assert manager.lookup(key(3), context) is LookupResult.MISS
    manager.complete_store(keys(2), context, success=False)
    assert manager.lookup(key(2), context) is LookupResult.MISS


def test_stores_skip_stored_keys_and_hand_out_int64_host_chunks():
    manager = adapter()
    context = ReqContext(req_id="a")
    first = manager.prepare_store(keys(1, 2), context)
    assert first.keys_to_store == keys(1, 2) and first.evicted_keys == []
    assert isinstance(first.store_spec, HostChunksSpec)
    assert first.store_spec.chunk_ids.dtype == np.int64
    again = manager.prepare_store(keys(1, 2, 3), context)  # 1 and 2 are still being stored
    assert again.keys_to_store == keys(3)
    manager.complete_store(keys(1, 2, 3), context)
    assert manager.prepare_store(keys(1, 2, 3), context).keys_to_store == []


def test_loads_pin_their_chunks_until_complete_load():
    manager = adapter(capacity=2)
    context = ReqContext(req_id="a")
    chunks = stored(manager, 1, 2).chunk_ids
    spec = manager.prepare_load(keys(2, 1), context)
    np.testing.assert_array_equal(spec.chunk_ids, chunks[::-1])
    assert manager.prepare_store(keys(3), context) is None  # nothing evictable
    manager.complete_load(set(keys(1, 2)), context)
    assert manager.prepare_store(keys(3), context).evicted_keys == keys(1)


def test_a_failed_store_frees_its_chunks_and_loads_nothing_half_written():
    manager = adapter(capacity=2, enable_events=True)
    context = ReqContext(req_id="a")
    output = manager.prepare_store(keys(1, 2), context)
    manager.complete_store(output.keys_to_store, context, success=False)
    assert [manager.lookup(k, context) for k in keys(1, 2)] == [LookupResult.MISS] * 2
    assert list(manager.take_events()) == []
    retry = manager.prepare_store(keys(1, 2), context)
    assert retry.evicted_keys == []  # the failed store's slots were free again
    assert manager.manager.stats().failed_store_blocks == 2


def test_events_are_vllm_offloading_events():
    manager = adapter(capacity=1, enable_events=True)
    stored(manager, 1)
    stored(manager, 2)
    events = list(manager.take_events())
    assert [(e.keys, e.medium, e.removed) for e in events] == [
        (keys(1), Medium.CPU, False),
        (keys(1), Medium.CPU, True),
        (keys(2), Medium.CPU, False),
    ]
    assert list(manager.take_events()) == []


def _event_log(manager) -> list[tuple]:
    """Each key's announcements, whichever events carried them: (key, removed, metadata only)."""
    return sorted(
        (key, event.removed, getattr(event, "metadata_only", False))
        for event in manager.take_events()
        for key in event.keys
    )


@pytest.mark.parametrize("retry", [False, True])
def test_a_failed_store_is_announced_as_the_running_vllms_cpu_tier_announces_it(retry):
    """vLLM 0.33 announces the keys of a failed store as a `metadata_only` removal, less those a
    retry owns again by the time events are taken; vLLM 0.32 announces nothing."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager

    from numbakv.integrations.vllm import NumbaKVOffloadingSpec
    from tests.support.vllm_support import offloading_config

    ours = NumbaKVOffloadingSpec(
        offloading_config({"cpu_bytes_to_use": 4 * 4096}, events=True)
    ).get_manager()
    theirs = VLLMManager(num_chunks=4, enable_events=True)
    for manager in (ours, theirs):
        context = ReqContext(req_id="a")
        manager.prepare_store(keys(1, 2, 3), context)
        manager.complete_store(keys(1, 2), context)
        manager.complete_store(keys(3), context, success=False)
        first = manager.prepare_store(keys(4, 5), context)
        manager.complete_store(first.keys_to_store, context, success=False)
        if retry:
            manager.prepare_store(keys(5), context)
    announced = _event_log(theirs)
    assert _event_log(ours) == announced
    assert (key(3), True, True) in announced or not FAILED_STORE_EVENTS
    assert _event_log(ours) == []  # announced once


def test_a_finished_request_makes_its_chain_recent_head_first():
    """vLLM 0.32's order: a request's chunks become recent when it finishes, the head the most
    recent, so LRU evicts a chain from its tail; until then its loads count for nothing."""
    manager = adapter(capacity=5)
    BENCH.replay_request(manager, keys(1, 2, 3), "first")
    BENCH.replay_request(manager, keys(9), "other")  # 9 is the most recent, 3 the least
    assert BENCH.replay_request(manager, keys(1, 2, 3, 4, 5), "reader") == (3, 2)
    # Its store evicted 3, its own loaded tail, before its finish made 1 and 2 recent.
    context = ReqContext(req_id="check")
    hits = [manager.lookup(k, context) is LookupResult.HIT for k in keys(1, 2, 3, 4, 5, 9)]
    assert hits == [True, True, False, True, True, True]
    assert manager.prepare_store(keys(6), context).evicted_keys == keys(9)
    assert manager.prepare_store(keys(7), context).evicted_keys == keys(5)  # the tail goes first


def test_a_request_that_only_loads_is_touched_when_it_finishes():
    manager = adapter(capacity=2)
    stored(manager, 1)
    stored(manager, 2)
    context = ReqContext(req_id="reader")
    manager.on_new_request(context)
    manager.prepare_load(keys(1), context)
    manager.complete_load(keys(1), context)
    manager.on_request_finished(context)  # 1 is now more recent than 2
    assert manager.prepare_store(keys(3), ReqContext(req_id="w")).evicted_keys == keys(2)


def test_reset_cache_forgets_everything_even_loads_recorded_before_it():
    manager = adapter(capacity=2)
    stored(manager, 1)
    context = ReqContext(req_id="a")
    manager.prepare_load(keys(1), context)
    manager.prepare_store(keys(2), context)
    reader = ReqContext(req_id="reader")
    manager.prepare_load(keys(1), reader)
    manager.reset_cache()
    assert manager.lookup(key(2), context) is LookupResult.MISS  # not HIT_PENDING any more
    assert manager.manager.stats().used == 0
    stored(manager, 1)
    stored(manager, 2)  # 1 is the least recent of the new cache
    manager.on_request_finished(reader)  # its load belongs to the old cache: nothing to touch
    assert manager.prepare_store(keys(3), ReqContext(req_id="w")).evicted_keys == keys(1)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_replay_through_the_adapter_hits_as_numbakv_replay(policy):
    chains = BENCH.offload_chains([r.hash_ids for r in multi_turn_chat(sessions=300, seed=1)])
    for capacity in (200, 2_000):
        expected = replay(chains, policy=policy, capacity=capacity).hits
        assert BENCH.connector_replay(adapter(capacity, policy), chains).hits == expected


@settings(max_examples=60, deadline=None)
@given(
    prefix_sharing_chains(),
    st.sampled_from(sorted(POLICIES)),
    st.integers(1, 12),
    st.integers(1, 3),
)
def test_replay_through_the_adapter_hits_as_numbakv_replay_for_any_trace(
    chains, policy, capacity, store_threshold
):
    keyed = BENCH.offload_chains(chains)
    expected = replay(keyed, policy=policy, capacity=capacity, store_threshold=store_threshold)
    manager = adapter(capacity, policy, store_threshold=store_threshold)
    assert BENCH.connector_replay(manager, keyed).hits == expected.hits
    stats = manager.manager.stats()
    assert stats.being_stored == stats.being_read == 0


@settings(max_examples=80, deadline=None)
@given(
    prefix_sharing_chains(),
    st.sampled_from(["lru", "arc"]),
    st.integers(1, 12),
    st.integers(1, 3),
)
def test_lru_and_arc_through_the_spec_hit_and_store_as_vllms_own_manager(
    chains, policy, capacity, store_threshold
):
    """Issue 37: vLLM's policies, built by numbakv's spec, answer the connector's calls as
    vLLM's own manager does, `store_threshold` included (it stored less, counting lookups)."""
    keyed = BENCH.offload_chains(chains)
    vllm = BENCH.vllm_manager(policy, capacity, store_threshold)
    numbakv = BENCH.numbakv_manager(policy, capacity, store_threshold)
    assert BENCH.connector_replay(numbakv, keyed) == BENCH.connector_replay(vllm, keyed)


class _Pair:
    """vLLM's own CPU manager and numbakv's adapter, given the same calls, answers compared."""

    def __init__(self, capacity: int, policy: str) -> None:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMManager

        self.sides = (
            VLLMManager(num_chunks=capacity, cache_policy=policy),
            adapter(capacity, policy),
        )
        self.contexts: dict[int, tuple[ReqContext, ReqContext]] = {}

    def context(self, request: int, chain: list[bytes]) -> tuple[ReqContext, ReqContext]:
        """The request's context on each side, its keys' end-token positions set as vLLM's
        connector sets them (head first, 16 tokens a chunk)."""
        if request not in self.contexts:
            pair = (ReqContext(req_id=str(request)), ReqContext(req_id=str(request)))
            for context, side in zip(pair, self.sides):
                for position, block in enumerate(chain, 1):
                    context.set_offload_key_position(block, 16 * position)
                side.on_new_request(context)
            self.contexts[request] = pair
        return self.contexts[request]

    def same(self, call: str, *args, contexts: tuple[ReqContext, ReqContext], **options):
        """Make the call on both sides; their answers must agree."""
        answers = [
            getattr(side, call)(*args, context, **options)
            for side, context in zip(self.sides, contexts)
        ]
        if call == "prepare_store":
            answers = [
                None if out is None else (out.keys_to_store, set(out.evicted_keys))
                for out in answers
            ]
        elif call == "prepare_load":  # each side's own chunk ids
            answers = [None, None]
        assert answers[0] == answers[1], call
        return answers[0]


@settings(max_examples=150, deadline=None)
@given(prefix_sharing_chains(), st.integers(1, 10), st.data())
def test_lru_evicts_as_the_running_vllms_lru_for_interleaved_requests(chains, capacity, data):
    """Requests that load, store in parts, fail and finish interleaved: lookups and evictions
    as vLLM's own LRU, 0.32's or 0.33's (which ranks a running request's chunks by position)."""
    pair = _Pair(capacity, "lru")
    chains = [keys(*chain) for chain in chains[:6]]
    loading: list[tuple[list[bytes], tuple]] = []
    for _ in range(data.draw(st.integers(1, 40))):
        request = data.draw(st.integers(0, len(chains) - 1))
        chain = chains[request]
        contexts = pair.context(request, chain)
        action = data.draw(st.sampled_from(["load", "store", "complete", "finish"]))
        if action == "load":
            hits = 0
            while hits < len(chain):
                if pair.same("lookup", chain[hits], contexts=contexts) is not LookupResult.HIT:
                    break
                hits += 1
            if hits:
                pair.same("prepare_load", chain[:hits], contexts=contexts)
                loading.append((chain[:hits], contexts))
        elif action == "store":
            start = data.draw(st.integers(0, len(chain) - 1))
            part = chain[start : data.draw(st.integers(start + 1, len(chain)))]
            stored = pair.same("prepare_store", part, contexts=contexts)
            if stored is not None and stored[0]:
                success = data.draw(st.booleans())
                pair.same("complete_store", stored[0], contexts=contexts, success=success)
        elif action == "complete" and loading:
            loaded, load_contexts = loading.pop(data.draw(st.integers(0, len(loading) - 1)))
            pair.same("complete_load", loaded, contexts=load_contexts)
        elif action == "finish":
            for loaded, load_contexts in [load for load in loading if load[1] is contexts]:
                pair.same("complete_load", loaded, contexts=contexts)  # before it finishes
            loading = [load for load in loading if load[1] is not contexts]
            pair.same("on_request_finished", contexts=contexts)
            del pair.contexts[request]  # its next request is another
    probe = (ReqContext(req_id="probe"),) * 2
    for key in {key for chain in chains for key in chain}:
        pair.same("lookup", key, contexts=probe)


def test_the_spec_sizes_the_host_tier_as_vllms_cpu_tier_does():
    from numbakv.integrations.vllm import NumbaKVOffloadingSpec
    from tests.support.vllm_support import offloading_config

    # Two workers of 4096 bytes a block, chunks of two blocks: 16,384 bytes a chunk.
    config = offloading_config(
        {"cpu_bytes_to_use": 10 * 16_384 + 16_383, "blocks_per_chunk": 2, "store_threshold": 2},
        worker_kv_bytes_per_block=4096,
        world_size=2,
    )
    spec = NumbaKVOffloadingSpec(config)
    assert (spec.num_chunks, spec.kv_bytes_per_chunk) == (10, 16_384)
    manager = spec.get_manager().manager
    assert (manager.num_blocks, manager.store_threshold, manager.policy_name) == (10, 2, "lru")
    assert spec.get_manager() is spec.get_manager()


def _reduced(manager: NumbaKVOffloadingManager) -> dict:
    return manager.get_stats().reduce()


def test_vllms_own_cpu_tier_metrics_are_reported():
    """Issue 37: get_stats was None, so vLLM's kv_offload_cpu_* metrics vanished with numbakv."""
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics as M

    manager = adapter(capacity=4)
    context = ReqContext(req_id="r")
    output = manager.prepare_store(keys(1, 2), context)  # two chunks being written
    reduced = _reduced(manager)
    assert reduced[M.CPU_CACHE_WRITE_USAGE_PERC] == pytest.approx(0.5)
    assert reduced[M.CPU_CACHE_READ_USAGE_PERC] == pytest.approx(0.0)
    assert reduced[M.CPU_CACHE_USAGE_PERC] == pytest.approx(0.5)
    manager.complete_store(set(output.keys_to_store), context)
    manager.prepare_load(keys(1), context)  # one chunk being read
    reduced = _reduced(manager)
    assert reduced[M.CPU_CACHE_WRITE_USAGE_PERC] == pytest.approx(0.0)
    assert reduced[M.CPU_CACHE_READ_USAGE_PERC] == pytest.approx(0.25)
    assert reduced[M.CPU_CACHE_USAGE_PERC] == pytest.approx(0.25)
    assert M.STORES_SKIPPED not in reduced  # no threshold


def test_each_stores_allocation_is_observed_once():
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics as M

    manager = adapter(capacity=8)
    stored(manager, 1, 2, 3)
    stored(manager, 3, 4)  # only 4 is new
    reduced = _reduced(manager)
    assert (reduced[f"{M.CPU_ALLOCATION_SIZE}_count"], reduced[f"{M.CPU_ALLOCATION_SIZE}_sum"]) == (
        2,
        4,
    )
    assert f"{M.CPU_ALLOCATION_SIZE}_count" not in _reduced(manager)  # reported once


def test_a_store_refused_for_want_of_room_observes_what_it_asked_for():
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics as M

    manager = adapter(capacity=2)
    context = ReqContext(req_id="r")
    manager.prepare_store(keys(1, 2), context)  # both being stored: nothing can be evicted
    _reduced(manager)
    assert manager.prepare_store(keys(3, 4, 5), context) is None
    reduced = _reduced(manager)
    assert (reduced[f"{M.CPU_ALLOCATION_SIZE}_count"], reduced[f"{M.CPU_ALLOCATION_SIZE}_sum"]) == (
        1,
        3,
    )


def test_stores_skipped_by_the_threshold_are_counted_as_vllm_counts_them():
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics as M

    manager = adapter(capacity=8, store_threshold=2)
    context = ReqContext(req_id="r")
    manager.lookup(key(1), context)  # seen once: not stored yet
    manager.prepare_store(keys(1), context)
    assert _reduced(manager)[M.STORES_SKIPPED] == 1
    assert _reduced(manager)[M.STORES_SKIPPED] == 0  # each skip reported once


def test_the_spec_reports_its_sizes_on_vllms_config_info_metric_as_vllms_cpu_tier():
    """vLLM 0.33's `vllm:kv_offload_config_info`: the same labels and values as vLLM's CPU tier
    of the same size (vLLM 0.32 has no such metric)."""
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    from numbakv.integrations.vllm import NumbaKVOffloadingSpec
    from numbakv.integrations.vllm.compat import CPUOffloadingInfo
    from tests.support.vllm_support import offloading_config

    extra = {"cpu_bytes_to_use": 10 * 16_384 + 16_383, "blocks_per_chunk": 2}
    if CPUOffloadingInfo is None:
        assert NumbaKVOffloadingSpec.config_info_keys(extra) == ()
        return
    ours, theirs = (
        spec_class(offloading_config(dict(extra), worker_kv_bytes_per_block=4096, world_size=2))
        for spec_class in (NumbaKVOffloadingSpec, CPUOffloadingSpec)
    )
    assert type(ours).config_info_keys(extra) == type(theirs).config_info_keys(extra)
    info = ours.get_manager().config_info()
    assert info == theirs.get_manager().config_info()
    assert (info[0]["cpu_num_chunks"], info[0]["cpu_kv_cache_size_bytes"]) == (10, 10 * 16_384)


def test_the_spec_defines_vllms_cpu_tier_metrics():
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    from numbakv.integrations.vllm import NumbaKVOffloadingSpec

    for extra in ({}, {"store_threshold": 2}):
        assert NumbaKVOffloadingSpec.build_metric_definitions(
            extra
        ) == CPUOffloadingSpec.build_metric_definitions(extra)
