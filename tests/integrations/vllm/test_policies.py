"""numbakv's policies as vLLM `CachePolicy`s, driven by vLLM 0.32's own CPU manager and specs."""

from __future__ import annotations

import dataclasses
import functools
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.vllm_support import offloading_config, require_vllm

require_vllm()

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

from numbakv import POLICIES
from numbakv import CPUOffloadingManager as NumbaKVManager
from numbakv.integrations.vllm import policies
from numbakv.integrations.vllm.compat import FAILED_STORE_EVENTS
from numbakv.integrations.vllm.config import ConfigError, Settings
from numbakv.integrations.vllm.policies import (
    NumbaKVCachePolicy,
    S3FIFOCachePolicy,
    SIEVECachePolicy,
    SightingARCCachePolicy,
)
from numbakv.tools.replay.core import replay
from numbakv.tools.traces import read_hash_chains
from numbakv.tools.workloads.core import multi_turn_chat
from tests.support.imports import loaded_after
from tests.support.vllm_replay import BENCH, prefix_sharing_chains

MODULE = "numbakv.integrations.vllm.policies"
CLASSES = {"sarc": SightingARCCachePolicy, "s3fifo": S3FIFOCachePolicy, "sieve": SIEVECachePolicy}
NAMES = sorted(CLASSES)

# numbakv's LRU and ARC behind the same adapter, for the comparison with numbakv's manager (vLLM's
# factory takes its own "lru" and "arc" first, so numbakv's module binds only the other three).
numbakv_lru = type(
    "NumbaKVLRUCachePolicy", (NumbaKVCachePolicy,), {"numbakv_policy": POLICIES["lru"]}
)
numbakv_arc = type(
    "NumbaKVARCCachePolicy", (NumbaKVCachePolicy,), {"numbakv_policy": POLICIES["arc"]}
)
ADAPTED = {"lru": ("numbakv_lru", __name__), "arc": ("numbakv_arc", __name__)}
ADAPTED.update((name, (name, MODULE)) for name in NAMES)


def key(block: int) -> bytes:
    return make_offload_key(block.to_bytes(32, "big"), 0)


def keys(*blocks: int) -> list[bytes]:
    return [key(block) for block in blocks]


def vllm_manager(policy: str, capacity: int = 4, **options) -> CPUOffloadingManager:
    """vLLM's own manager with numbakv's `policy`, configured as a vLLM deployment names it."""
    name, module = ADAPTED[policy]
    return CPUOffloadingManager(
        num_chunks=capacity, cache_policy=name, cache_policy_module_path=module, **options
    )


def request(manager: CPUOffloadingManager, *blocks: int, finish: bool = True) -> list[bytes]:
    """One request that stores `blocks` (completing the store) and, unless told, finishes."""
    context = ReqContext(req_id=f"store {blocks}")
    output = manager.prepare_store(keys(*blocks), context)
    manager.complete_store(output.keys_to_store, context)
    if finish:
        manager.on_request_finished(context)
    return output.evicted_keys


def states(manager: CPUOffloadingManager, *blocks: int) -> list[LookupResult]:
    return [manager.lookup(k, ReqContext(req_id="look")) for k in keys(*blocks)]


def calls(adapter: NumbaKVCachePolicy, monkeypatch) -> list[tuple]:
    """The adapter's calls of numbakv's policy (touch, insert, evict), recorded as they pass."""
    log: list[tuple] = []
    inner = adapter._policy
    for method in ("touch", "insert", "evict"):
        real = getattr(inner, method)

        def spy(*args, real=real, method=method):
            log.append((method, list(args[0]) if method != "evict" else args[0]))
            return real(*args)

        monkeypatch.setattr(inner, method, spy)
    return log


def test_vllms_factory_finds_numbakvs_policies_by_name():
    for name, cls in CLASSES.items():
        assert (
            CachePolicyFactory.get_cache_policy_cls(name, MODULE) is cls is getattr(policies, name)
        )
        assert issubclass(cls, CachePolicy) and cls.numbakv_policy is POLICIES[name]
        assert isinstance(vllm_manager(name)._policy._policy, POLICIES[name])
    # vLLM's own names stay vLLM's: its registry is read before the module
    assert CachePolicyFactory.get_cache_policy_cls("lru", MODULE) is LRUCachePolicy


@pytest.mark.parametrize("policy", NAMES)
def test_stores_loads_and_lookups(policy):
    manager = vllm_manager(policy)
    context = ReqContext(req_id="a")
    output = manager.prepare_store(keys(1, 2, 3), context)
    assert output.keys_to_store == keys(1, 2, 3) and output.evicted_keys == []
    assert list(output.store_spec.chunk_ids) == [0, 1, 2]
    assert states(manager, 1, 4) == [LookupResult.HIT_PENDING, LookupResult.MISS]
    manager.complete_store(keys(1, 2, 3), context)
    manager.on_request_finished(context)
    assert states(manager, 1, 2, 3) == [LookupResult.HIT] * 3
    reader = ReqContext(req_id="b")
    assert list(manager.prepare_load(keys(3, 1), reader).chunk_ids) == [2, 0]
    manager.complete_load(keys(3, 1), reader)
    assert manager.prepare_store(keys(3, 4), reader).keys_to_store == keys(4)


@pytest.mark.parametrize("policy", NAMES)
def test_eviction_never_takes_a_pinned_or_protected_chunk_and_fails_atomically(policy):
    manager, twin = vllm_manager(policy, 3), vllm_manager(policy, 3)
    for each in (manager, twin):
        for block in (1, 2, 3):
            request(each, block)
        each.prepare_load(keys(1), ReqContext(req_id="reader"))  # 1 is being read
    # 2 is named by the store: with 1 read, only 3 may go, and two chunks are wanted
    assert manager.prepare_store(keys(2, 4, 5), ReqContext(req_id="x")) is None
    assert states(manager, 1, 2, 3, 4, 5) == [LookupResult.HIT] * 3 + [LookupResult.MISS] * 2
    # the failed call changed nothing: the manager goes on as its twin, which never made it
    after = [
        [request(each, 2, 4), request(each, 6), request(each, 7, 8)] for each in (manager, twin)
    ]
    assert after[0] == after[1] and after[0][0] == keys(3)
    assert states(manager, *range(1, 9)) == states(twin, *range(1, 9))
    assert states(manager, 1) == [LookupResult.HIT]  # read all along


@pytest.mark.parametrize("policy", NAMES)
def test_a_failed_store_frees_its_chunks_and_a_reset_forgets_everything(policy):
    manager = vllm_manager(policy, 2, enable_events=True)
    context = ReqContext(req_id="a")
    output = manager.prepare_store(keys(1, 2), context)
    manager.complete_store(output.keys_to_store, context, success=False)
    assert states(manager, 1, 2) == [LookupResult.MISS] * 2
    assert request(manager, 3, 4) == []  # their chunks were free again
    announced = [(keys(1, 2), True)] if FAILED_STORE_EVENTS else []  # vLLM 0.33: metadata only
    assert [(event.keys, event.removed) for event in manager.take_events()] == [
        *announced,
        (keys(3, 4), False),
    ]
    manager.prepare_load(keys(3), ReqContext(req_id="reader"))
    manager.reset_cache()
    assert states(manager, 3, 4) == [LookupResult.MISS] * 2
    assert request(manager, 5, 6) == []  # an empty cache, read pins and all


def test_a_request_is_touched_once_when_it_finishes_then_its_new_chunks_go_in(monkeypatch):
    manager = vllm_manager("sarc")
    log = calls(manager._policy, monkeypatch)
    request(manager, 1, 2)
    context = ReqContext(req_id="b")
    manager.prepare_load(keys(1, 2), context)
    manager.complete_load(keys(1, 2), context)
    output = manager.prepare_store(keys(3, 4), context)  # on_store_miss: no touch
    manager.complete_store(output.keys_to_store, context)
    assert log == [("touch", keys(1, 2)), ("insert", keys(1, 2))]
    manager.on_request_finished(context)
    manager.on_request_finished(context)  # vLLM finishes a request once: the second is ignored
    assert log[2:] == [("touch", keys(1, 2, 3, 4)), ("insert", keys(3, 4))]


def test_an_explicit_touch_ranks_the_waiting_chunks_first(monkeypatch):
    manager = vllm_manager("sarc")
    log = calls(manager._policy, monkeypatch)
    request(manager, 1, 2, finish=False)
    manager.touch(keys(2), ReqContext(req_id="t"))
    assert log == [("insert", keys(1, 2)), ("touch", keys(2))]


@pytest.mark.parametrize("policy", NAMES)
def test_chunks_of_unfinished_requests_are_evicted_last_oldest_first(policy):
    manager = vllm_manager(policy)
    request(manager, 1, 2)
    request(manager, 3, 4, finish=False)  # waiting for its request to finish
    [ranked] = request(manager, 5, finish=False)
    assert ranked in keys(1, 2)
    [other] = set(keys(1, 2)) - {ranked}
    assert request(manager, 6, 7) == [other, key(3)]


def test_evict_says_none_without_asking_the_policy_when_the_chunks_are_not_there(monkeypatch):
    manager = vllm_manager("sarc", 3)
    for block in (1, 2, 3):
        request(manager, block)
    adapter = manager._policy
    log = calls(adapter, monkeypatch)
    manager.prepare_load(keys(1, 2), ReqContext(req_id="reader"))
    assert adapter.evict(1, set(keys(3))) is None
    assert adapter.evict(2, set()) is None
    assert log == []
    [(evicted, chunk)] = adapter.evict(1, set(keys(1)))
    assert evicted == key(3) and chunk.ref_cnt == 0 and log == [("evict", 1)]


def same_calls(policy: str, capacity: int, chains, pin=lambda: False) -> int:
    """Replays the chains through vLLM's manager with the adapter and through numbakv's manager,
    the same calls in the same order (docs/MANAGER.md's replay, loads pinned where `pin()` says,
    released a request later), asserting the same hits, stores and evictions; returns the hits.

    The semantics coincide there: each request is touched before it stores, and its stores
    succeed. A store that fails before its request's touch never reaches numbakv's policy here,
    where numbakv's manager inserts and removes it (sarc, S3-FIFO and ARC forget a ghost on
    insertion); and vLLM's connector touches at the end of a request (docs/VLLM.md).
    """
    vllm, numbakv = vllm_manager(policy, capacity), NumbaKVManager(1, capacity, policy)
    total, held = 0, []  # held: loads still pinned
    for number, chain in enumerate(chains):
        context = ReqContext(req_id=str(number))
        hits = numbakv.lookup(chain)
        looked_up = [vllm.lookup(k, context) for k in chain[: hits + 1]]
        assert looked_up == [LookupResult.HIT] * hits + [LookupResult.MISS] * (hits < len(chain))
        vllm.touch(chain, context)
        numbakv.touch(chain)
        released, held = held, []
        if hits and pin():
            vllm.prepare_load(chain[:hits], context)
            numbakv.prepare_load(chain[:hits])
            held.append(chain[:hits])
        plan = numbakv.prepare_store(chain[hits:])
        output = vllm.prepare_store(chain[hits:], context)
        assert (output is None) == (plan is None)
        if plan is not None:
            assert output.keys_to_store == plan.block_hashes_to_store
            assert output.evicted_keys == plan.block_hashes_evicted
            vllm.complete_store(output.keys_to_store, context)
            numbakv.complete_store(plan.block_hashes_to_store)
        for pinned in released:
            vllm.complete_load(pinned, context)
            numbakv.complete_load(pinned)
        total += hits
    return total


@settings(max_examples=80, deadline=None)
@given(prefix_sharing_chains(), st.sampled_from(sorted(ADAPTED)), st.integers(1, 10), st.data())
def test_same_calls_same_hits_and_evictions_as_numbakvs_manager(chains, policy, capacity, data):
    same_calls(policy, capacity, BENCH.offload_chains(chains), lambda: data.draw(st.booleans()))


def assert_books_hold(adapter: NumbaKVCachePolicy) -> None:
    """The adapter's counts and ref-count list agree with vLLM's chunks."""
    chunks, waiting = adapter._chunks, adapter._waiting
    assert adapter._idle == sum(chunk.ref_cnt == 0 for chunk in chunks.values())
    assert adapter._idle_waiting == sum(chunks[key].ref_cnt == 0 for key in waiting)
    assert len(adapter._policy) + len(waiting) == len(chunks)
    for chunk in chunks.values():
        assert adapter._ref_counts[chunk.chunk_id] == min(chunk.ref_cnt, 1)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NAMES), st.integers(1, 8), st.data())
def test_interleaved_requests_never_evict_a_chunk_in_use_and_fail_only_when_they_must(
    policy, capacity, data
):
    """Three requests at a time, as vLLM's scheduler interleaves them: stores completed late or
    failed, loads held, requests finishing or not, resets. A store is refused exactly when the
    chunks it lacks exceed the free ones and the idle ones it does not name."""
    manager = vllm_manager(policy, capacity)
    adapter = manager._policy
    contexts = [ReqContext(req_id=str(number)) for number in range(3)]
    loads: list[tuple] = []  # (context, keys) being read
    stores: list[tuple] = []  # (context, keys) being written
    operations = ("store", "complete", "load", "release", "finish", "reset")
    for step in range(data.draw(st.integers(1, 40))):
        operation = data.draw(st.sampled_from(operations))
        number = data.draw(st.integers(0, 2))
        context, chunks = contexts[number], adapter._chunks
        if operation == "store":
            offered = keys(
                *data.draw(st.lists(st.integers(0, 12), min_size=1, max_size=4, unique=True))
            )
            lacking = sum(k not in chunks for k in offered) - (capacity - len(chunks))
            idle = {k for k, chunk in chunks.items() if chunk.ref_cnt == 0 and k not in offered}
            output = manager.prepare_store(offered, context)
            assert (output is None) == (lacking > len(idle))
            if output is not None:
                assert set(output.evicted_keys) <= idle
                assert len(output.evicted_keys) == max(0, lacking)
                stores.append((context, output.keys_to_store))
        elif operation == "complete" and stores:
            done, stored = stores.pop(data.draw(st.integers(0, len(stores) - 1)))
            manager.complete_store(stored, done, success=data.draw(st.booleans()))
        elif operation == "load":
            ready = [k for k, chunk in chunks.items() if chunk.ref_cnt >= 0]
            if ready:
                read = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True))
                manager.prepare_load(read, context)
                loads.append((context, read))
        elif operation == "release" and loads:
            manager.complete_load(*reversed(loads.pop(0)))
        elif operation == "finish":
            manager.on_request_finished(context)
            contexts[number] = ReqContext(req_id=f"{number}.{step}")
        elif operation == "reset":
            manager.reset_cache()
            loads.clear()
            stores.clear()
        assert_books_hold(adapter)


@pytest.mark.parametrize("policy", NAMES)
def test_the_replay_through_vllms_manager_hits_as_numbakvs_replay(policy):
    chains = BENCH.offload_chains([r.hash_ids for r in multi_turn_chat(sessions=300, seed=1)])
    for capacity in (200, 2_000):
        expected = replay(chains, policy=policy, capacity=capacity).hits
        assert same_calls(policy, capacity, chains) == expected


@functools.cache
def conversation() -> list[list[bytes]]:
    return BENCH.offload_chains(read_hash_chains("mooncake_conversation"))


@pytest.mark.parametrize("capacity", [2_000, 10_000, 40_000])
def test_sarc_in_vllms_connector_pattern_hits_within_a_tenth_of_a_point_of_numbakvs_spec(capacity):
    """Issue 37: the conversation trace, driven as vLLM 0.32's connector drives a manager."""
    chains = conversation()
    inside = BENCH.connector_replay(vllm_manager("sarc", capacity), chains).hits
    through = BENCH.connector_replay(BENCH.numbakv_manager("sarc", capacity), chains).hits
    assert abs(inside - through) / sum(map(len, chains)) <= 0.001


def _spec_config(spec_name: str) -> object:
    extra = {
        "spec_name": spec_name,
        "cpu_bytes_to_use": 8 * 4096,
        "eviction_policy": "sarc",
        "cache_policy_module_path": MODULE,
    }
    return dataclasses.replace(offloading_config(extra), engine_id=f"numbakv-{uuid.uuid4().hex}")


def test_vllms_cpu_spec_runs_sarc_from_its_configuration():
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    manager = CPUOffloadingSpec(_spec_config("CPUOffloadingSpec")).get_manager()
    assert isinstance(manager._policy, SightingARCCachePolicy)
    assert manager._policy.cache_capacity == 8


def test_vllms_tiering_spec_runs_sarc_as_its_primary_tiers_policy():
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    manager = TieringOffloadingSpec(_spec_config("TieringOffloadingSpec")).get_manager()
    try:
        primary = manager.primary_tier
        assert isinstance(primary._policy, SightingARCCachePolicy)
        assert primary._policy.cache_capacity == 8
        assert request(primary, 1, 2) == [] and states(primary, 1, 2) == [LookupResult.HIT] * 2
    finally:
        manager.shutdown()


def test_numbakvs_spec_refuses_a_vllm_cache_policy_and_says_how_to_run_one():
    for extra, name in (
        (
            {"cache_policy_module_path": MODULE, "eviction_policy": "sarc"},
            "cache_policy_module_path",
        ),
        ({"eviction_policy": "SightingARCCachePolicy"}, "eviction_policy"),
    ):
        with pytest.raises(ConfigError) as raised:
            Settings.from_extra_config({"cpu_bytes_to_use": 1 << 20, **extra})
        assert raised.value.key == name
        assert "CPUOffloadingSpec" in str(raised.value) and MODULE in str(raised.value)


def test_the_policies_module_never_loads_the_data_path():
    loaded = loaded_after(f"import {MODULE}")
    assert not {"numbakv.datapath", "numbakv.integrations.vllm.worker", "numba.cuda"} & loaded
