"""Each manager method and each of its error paths."""

import pickle
from dataclasses import replace
from typing import ClassVar

import numpy as np
import pytest

from numbakv import (
    POLICIES,
    BlockEvent,
    CachePolicy,
    CPUOffloadingManager,
    HostBlocks,
    StorePlan,
)


def stored(manager, hashes):
    output = manager.prepare_store(hashes)
    manager.complete_store(output.block_hashes_to_store)
    return output


@pytest.fixture(params=sorted(POLICIES))
def manager(request):
    return CPUOffloadingManager(
        block_size=16, num_blocks=4, cache_policy=request.param, enable_events=True
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "word"),
    [
        ({"block_size": 0, "num_blocks": 4}, ValueError, "block_size"),
        ({"block_size": 16, "num_blocks": 0}, ValueError, "num_blocks"),
        ({"block_size": 16, "num_blocks": 4.0}, TypeError, "num_blocks"),
        ({"block_size": True, "num_blocks": 4}, TypeError, "block_size"),
        ({"block_size": 16, "num_blocks": 4, "store_threshold": 0}, ValueError, "store_threshold"),
        (
            {"block_size": 16, "num_blocks": 4, "max_tracker_size": -1},
            ValueError,
            "max_tracker_size",
        ),
        ({"block_size": 16, "num_blocks": 4, "cache_policy": "mru"}, ValueError, "'arc', 'lru'"),
        (
            {"block_size": 16, "num_blocks": 4, "cache_policy": "no.such.module:X"},
            ValueError,
            "no.such",
        ),
        (
            {"block_size": 16, "num_blocks": 4, "cache_policy": "numbakv.specs:HostBlocks"},
            TypeError,
            "CachePolicy",
        ),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, word):
    with pytest.raises(error, match=word):
        CPUOffloadingManager(**kwargs)


def test_store_then_lookup_counts_the_ready_prefix(manager):
    output = manager.prepare_store([1, 2, 3])
    assert output.block_hashes_to_store == [1, 2, 3]
    assert output.store_spec.block_ids.dtype == np.int64
    assert sorted(output.store_spec.block_ids.tolist()) == [0, 1, 2]
    assert manager.lookup([1, 2, 3]) == 0, "blocks being stored are not hits"
    manager.complete_store([1, 2])
    assert manager.lookup([1, 2, 3]) == 2
    assert manager.lookup([2, 1]) == 2
    assert manager.lookup([9, 1]) == 0
    assert manager.lookup([]) == 0


def test_a_hash_is_being_stored_from_prepare_to_complete(manager):
    manager.prepare_store([1, 2])
    assert manager.is_being_stored(1) and manager.is_being_stored(2)
    assert not manager.is_being_stored(9)
    manager.complete_store([1])
    manager.complete_store([2], success=False)
    assert not manager.is_being_stored(1) and not manager.is_being_stored(2)
    assert manager.stats().lookups == 0


def test_prepare_store_skips_cached_and_duplicate_hashes(manager):
    stored(manager, [1, 2])
    output = manager.prepare_store([1, 3, 3, 2, 4])
    assert output.block_hashes_to_store == [3, 4]
    assert len(output.store_spec) == 2
    assert manager.prepare_store([1, 2]) == StorePlan([], HostBlocks(), [])


def test_eviction_frees_exactly_the_shortfall_and_reports_it_first(manager):
    stored(manager, [1, 2, 3, 4])
    list(manager.take_events())
    output = manager.prepare_store([5, 6])
    assert len(output.block_hashes_evicted) == 2
    assert set(output.block_hashes_evicted) <= {1, 2, 3, 4}
    manager.complete_store([5, 6])
    events = list(manager.take_events())
    assert events == [
        BlockEvent(output.block_hashes_evicted, 16, "CPU", True),
        BlockEvent([5, 6], 16, "CPU", False),
    ]
    assert list(manager.take_events()) == []


def test_lru_evicts_least_recent_and_touch_makes_the_first_hash_most_recent():
    manager = CPUOffloadingManager(16, 3, cache_policy="lru")
    stored(manager, [1, 2, 3])
    manager.touch([2, 1])  # order now 3, 1, 2 (least recent first)
    assert manager.prepare_store([4]).block_hashes_evicted == [3]
    manager.complete_store([4])
    assert manager.prepare_store([5]).block_hashes_evicted == [1]


def test_blocks_being_read_stored_or_named_are_never_evicted(manager):
    stored(manager, [1, 2])
    manager.prepare_store([3])  # not ready
    manager.prepare_load([1])  # pinned
    output = manager.prepare_store([2, 5, 6])  # 2 is named; only one slot free, nothing evictable
    assert output is None
    output = manager.prepare_store([5])
    assert output.block_hashes_evicted == []  # the free slot suffices
    manager.complete_store([5])
    output = manager.prepare_store([6])
    assert output.block_hashes_evicted in ([2], [5])


def test_failed_prepare_store_changes_nothing(manager):
    stored(manager, [1, 2, 3, 4])
    manager.prepare_load([1, 2, 3])
    before = (manager.stats(), manager.policy_stats(), list(manager.take_events()))
    assert manager.prepare_store([5, 6]) is None
    after = manager.stats()
    assert after.refused_store_blocks == 2  # counted: vLLM's metrics observe what it asked for
    assert (replace(after, refused_store_blocks=0), manager.policy_stats()) == before[:2]
    assert list(manager.take_events()) == []
    assert manager.lookup([1, 2, 3, 4]) == 4


def test_prepare_load_pins_and_complete_load_releases(manager):
    stored(manager, [1, 2, 3, 4])
    spec = manager.prepare_load([2, 2, 4])
    assert spec.block_ids.dtype == np.int64 and len(spec) == 3
    assert spec.block_ids[0] == spec.block_ids[1]
    assert manager.stats().being_read == 2
    assert manager.prepare_store([5, 6, 7]) is None  # only 1 and 3 are evictable
    manager.complete_load([2, 4])
    assert manager.stats().being_read == 1
    manager.complete_load([2])
    assert manager.stats().being_read == 0


def test_prepare_load_errors_change_nothing(manager):
    stored(manager, [1, 2])
    manager.prepare_store([3])
    with pytest.raises(KeyError, match="9"):
        manager.prepare_load([1, 9])
    with pytest.raises(ValueError, match="being stored"):
        manager.prepare_load([1, 3])
    assert manager.stats().being_read == 0
    assert manager.stats().loaded_blocks == 0
    assert manager.remove([1, 2]) == [1, 2]  # neither pinned: a pin left behind would keep it


def test_complete_load_errors_change_nothing(manager):
    stored(manager, [1, 2])
    manager.prepare_load([1, 2])
    with pytest.raises(KeyError, match="not cached"):
        manager.complete_load([1, 9])
    with pytest.raises(ValueError, match="not being loaded"):
        manager.complete_load([1, 1])  # only one load of 1 is in flight
    assert manager.stats().being_read == 2
    manager.complete_load([1, 2])
    with pytest.raises(ValueError, match="not being loaded"):
        manager.complete_load([1])


def test_failed_store_frees_slots_and_announces_nothing(manager):
    stored(manager, [1])
    output = manager.prepare_store([2, 3])
    manager.complete_store([1, 2, 3, 99], success=False)  # ready 1 and unknown 99 untouched
    assert manager.lookup([1]) == 1 and manager.lookup([2]) == 0
    stats = manager.stats()
    assert (stats.used, stats.free, stats.failed_store_blocks, stats.being_stored) == (1, 3, 2, 0)
    assert [e.removed for e in manager.take_events()] == [False]
    assert len(output.store_spec) == 2


def test_remove_forgets_idle_ready_blocks_and_frees_their_slots(manager):
    stored(manager, [1, 2, 3])
    manager.prepare_load([2])
    manager.prepare_store([4])
    list(manager.take_events())
    # 2 is being read, 4 being stored, 99 unknown: all left as they are.
    assert manager.remove([1, 2, 4, 99, 1]) == [1]
    assert [(e.block_hashes, e.removed) for e in manager.take_events()] == [([1], True)]
    assert manager.lookup([1]) == 0 and manager.lookup([2, 3]) == 2
    assert manager.is_being_stored(4)
    stats = manager.stats()
    assert (stats.used, stats.free, stats.being_read, stats.evicted_blocks) == (3, 1, 1, 0)
    manager.complete_load([2])
    assert manager.remove([2]) == [2]
    # The freed slots are handed out again and the policy evicts only what is left.
    manager.complete_store([4])
    assert stored(manager, [5, 6]).block_hashes_evicted == []
    assert stored(manager, [7]).block_hashes_evicted != []


def test_complete_store_ignores_unknown_and_ready_hashes(manager):
    stored(manager, [1])
    manager.complete_store([1, 42])
    assert manager.stats().stored_blocks == 1


@pytest.mark.parametrize(
    "method", ["lookup", "touch", "prepare_load", "complete_load", "prepare_store", "remove"]
)
@pytest.mark.parametrize("bad", [b"\x01\x02", "ab", 7])
def test_a_lone_hash_instead_of_a_list_is_refused(manager, method, bad):
    with pytest.raises(TypeError, match="block_hashes"):
        getattr(manager, method)(bad)


def test_generators_and_tuples_are_accepted(manager):
    output = manager.prepare_store(h for h in (b"a", b"b"))
    manager.complete_store(iter(output.block_hashes_to_store))
    assert manager.lookup((b"a", b"b")) == 2


def test_events_disabled_yield_nothing():
    manager = CPUOffloadingManager(16, 4)
    stored(manager, [1, 2, 3])
    assert list(manager.take_events()) == []


def test_reset_cache_makes_the_manager_as_new(manager):
    stored(manager, [1, 2, 3, 4])
    manager.touch([9])
    manager.reset_cache()
    assert manager.lookup([1]) == 0
    assert list(manager.take_events()) == []
    stats = manager.stats()
    assert (stats.used, stats.free, stats.being_stored, stats.being_read) == (0, 4, 0, 0)
    assert stats.stored_blocks == 4, "counters are monotonic across resets"
    assert manager.prepare_store([5, 6]).store_spec.block_ids.tolist() == [0, 1]
    fresh = CPUOffloadingManager(16, 4, cache_policy=manager.policy_name)
    fresh.prepare_store([5, 6])
    assert manager.policy_stats() == fresh.policy_stats()


def test_store_threshold_admits_on_the_nth_offer():
    """vLLM 0.32's rule: prepare_store counts offers, lookups count nothing, and a failed store
    is counted too (the connector offers it again)."""
    manager = CPUOffloadingManager(16, 8, store_threshold=2, max_tracker_size=3)
    assert manager.lookup([1, 2, 3]) == 0
    assert manager.prepare_store([1, 2, 3]).block_hashes_to_store == []
    assert manager.stats().stores_skipped == 3
    plan = manager.prepare_store([1, 2])
    assert plan.block_hashes_to_store == [1, 2]  # the whole run at once, not up to a miss
    manager.complete_store([1, 2])
    # 3 counts again and is spared; 10 and 11 take the places of 1 and 2, offered before 3
    assert manager.prepare_store([3, 10, 11]).block_hashes_to_store == [3]
    assert manager.prepare_store([1, 12]).block_hashes_to_store == []  # 1 is cached, 12 new
    assert manager.stats().stores_skipped == 3 + 2 + 1


def test_store_threshold_counts_a_refused_offer():
    manager = CPUOffloadingManager(16, 1, store_threshold=2)
    manager.prepare_store([1])
    manager.complete_store(manager.prepare_store([1]).block_hashes_to_store)
    manager.prepare_load([1])  # pinned: nothing can be evicted
    assert manager.prepare_store([2]).block_hashes_to_store == []
    assert manager.prepare_store([2]) is None  # admitted, but no room
    manager.complete_load([1])
    assert manager.prepare_store([2]).block_hashes_to_store == [2]


def test_slots_are_handed_out_as_vllm_does():
    """Never-used slots first, in ascending order, then freed ones, the last freed first."""
    manager = CPUOffloadingManager(16, 4)
    for hashes in ([1, 2], [3]):
        manager.complete_store(manager.prepare_store(hashes).block_hashes_to_store)
    manager.touch([1])
    plan = manager.prepare_store([2, 5, 6, 7])
    assert plan.block_hashes_evicted == [3, 1]  # 2 is named; 3 and 1 free slots 2 and 0
    assert plan.block_hashes_to_store == [5, 6, 7]
    assert plan.store_spec.block_ids.tolist() == [3, 0, 2]


def test_stats_counts_lookups_hits_and_misses(manager):
    stored(manager, [1, 2])
    manager.lookup([1, 2, 3, 4])
    manager.lookup([5])
    stats = manager.stats()
    assert (stats.lookups, stats.hit_blocks, stats.missed_blocks) == (2, 2, 3)
    assert (stats.stored_blocks, stats.evicted_blocks, stats.used) == (2, 0, 2)


def test_specs_and_events_are_picklable(manager):
    output = stored(manager, [1, 2])
    assert (
        pickle.loads(pickle.dumps(output)).store_spec.block_ids.tolist()
        == output.store_spec.block_ids.tolist()
    )
    event = next(manager.take_events())
    assert pickle.loads(pickle.dumps(event)) == event


class MostRecentFirst(CachePolicy):
    """A policy from outside numbakv, loaded by import path."""

    def __init__(self, capacity, ref_counts):
        super().__init__(capacity, ref_counts)
        self.blocks = {}

    def get(self, block_hash):
        return self.blocks.get(block_hash)

    def insert(self, block_hashes, block_ids):
        self.blocks.update(zip(block_hashes, block_ids))

    def remove(self, block_hash):
        del self.blocks[block_hash]

    def touch(self, block_hashes):
        pass

    def evict(self, n, protected):
        newest_first = reversed(self.blocks.items())
        victims = [
            (h, b) for h, b in newest_first if self.ref_counts[b] == 0 and h not in protected
        ]
        for h, _ in victims[:n]:
            del self.blocks[h]
        return victims[:n]

    def clear(self):
        self.blocks.clear()

    def __len__(self):
        return len(self.blocks)


def test_policy_loaded_by_import_path():
    manager = CPUOffloadingManager(16, 2, cache_policy="tests.manager.test_methods:MostRecentFirst")
    stored(manager, [1, 2])
    assert manager.prepare_store([3]).block_hashes_evicted == [2]


class ShownStoreMisses(MostRecentFirst):
    """Notes the new blocks each call of `on_store_miss` shows it (in a list all its kind share)."""

    reads_store_misses = True
    shown: ClassVar[list] = []

    def on_store_miss(self, block_hashes):
        self.shown.append(list(block_hashes))


class IgnoresStoreMisses(ShownStoreMisses):
    reads_store_misses = False
    shown: ClassVar[list] = []


@pytest.mark.parametrize(
    "policy, shown", [(ShownStoreMisses, [[1, 2], [3]]), (IgnoresStoreMisses, [])]
)
def test_a_requests_new_blocks_are_shown_once_only_to_a_policy_that_reads_them(policy, shown):
    policy.shown.clear()
    manager = CPUOffloadingManager(
        16, 4, cache_policy=f"tests.manager.test_methods:{policy.__name__}"
    )
    request = manager.begin_request()
    manager.prepare_store([1, 2], request)
    manager.prepare_store([1, 2, 3], request)  # 1 and 2 are being stored: only 3 is new
    assert policy.shown == shown
    assert request.store_misses == {h for blocks in shown for h in blocks}
    assert [name for name, p in POLICIES.items() if p.reads_store_misses] == ["arc"]


def test_lru_ranks_a_running_requests_blocks_by_position_tails_first_where_it_knows_them():
    """vLLM 0.33's order: while a request runs, the blocks it names rank together where it first
    came, the tail the first to go; when it finishes they become recent, head first."""
    manager = CPUOffloadingManager(block_size=16, num_blocks=4)
    positions = {"head": 16, "middle": 32, "tail": 48}
    running = manager.begin_request(positions.get)
    for block in ("head", "tail", "middle"):  # stored out of order, as a backfill does
        plan = manager.prepare_store([block], running)
        manager.complete_store(plan.block_hashes_to_store)
    stored(manager, ["other"])  # a later block, ranked after the running request
    assert stored(manager, ["new"]).block_hashes_evicted == ["tail"]
    manager.finish_request(running)  # head, middle: now the most recent, head first
    assert stored(manager, ["newer"]).block_hashes_evicted == ["other"]
    assert stored(manager, ["newest"]).block_hashes_evicted == ["new"]
    assert stored(manager, ["last"]).block_hashes_evicted == ["middle"]


def test_spared_blocks_are_never_evicted_and_room_leaves_them_out(manager):
    stored(manager, [1, 2, 3])
    manager.prepare_load([3])  # being read: neither room nor a victim
    assert manager.room() == 3  # a free slot, 1 and 2 idle
    assert manager.room(spared=[1, 3, 9]) == 2  # 3 pinned already, 9 unknown
    plan = manager.prepare_store([4, 5], spared=[1])
    assert plan.block_hashes_evicted == [2]
    assert manager.room(spared=[1]) == 0
    assert manager.prepare_store([6], spared=[1]) is None  # only 1 could go
    assert manager.lookup([1]) == 1


def test_spared_blocks_are_not_offered():
    manager = CPUOffloadingManager(block_size=16, num_blocks=4, store_threshold=2)
    stored(manager, [1]), stored(manager, [1])  # offered twice: admitted
    manager.prepare_store([2], spared=[1])
    assert list(manager._offers.items()) == [(1, 2), (2, 1)]  # the offer tracker, oldest first


@pytest.mark.parametrize("method", ["room", "prepare_store"])
def test_an_unhashable_spared_hash_is_named(manager, method):
    call = manager.room if method == "room" else lambda **kw: manager.prepare_store([1], **kw)
    with pytest.raises(TypeError, match=rf"{method}: spared\[1\] is a list"):
        call(spared=[2, [3]])
    assert manager.stats().being_stored == 0
