"""Random sequences of every manager method, checked against the plain reference model after each step."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from numbakv import CPUOffloadingManager
from tests.support.reference import ReferenceManager

HASHES = st.integers(0, 11)
HASH_LISTS = st.lists(HASHES, max_size=6)


def resident_blocks(manager: CPUOffloadingManager) -> dict:
    """hash -> (block id, ref count) of every cached block, whatever the policy keeps them in."""
    policy = manager._policy
    blocks = policy._where if manager.policy_name == "lru" else {**policy.t1, **policy.t2}
    return {h: (block_id, manager._ref_counts[block_id]) for h, block_id in blocks.items()}


def policy_state(manager: CPUOffloadingManager):
    policy = manager._policy
    if manager.policy_name == "lru":
        return list(policy._where)
    return (list(policy.t1), list(policy.t2), list(policy.b1), list(policy.b2), policy.p)


def free_slots(manager: CPUOffloadingManager) -> list[int]:
    """The slots freed since their last use, then those never handed out."""
    return manager._free_slots + list(range(manager._fresh, manager.num_blocks))


def snapshot(manager: CPUOffloadingManager):
    """What a refused call must leave as it was (a store offer is counted even then, as in vLLM)."""
    return (
        resident_blocks(manager),
        policy_state(manager),
        sorted(free_slots(manager)),
        replace(manager.stats(), stores_skipped=0, refused_store_blocks=0),
    )


class ManagerMachine(RuleBasedStateMachine):
    """Drives the real manager and the reference model with the same calls."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight_stores: list[list] = []
        self.in_flight_loads: list[list] = []

    @initialize(
        policy=st.sampled_from(["lru", "arc"]),
        capacity=st.integers(1, 6),
        threshold=st.sampled_from([1, 1, 2]),
        tracker=st.integers(2, 8),
        events=st.booleans(),
    )
    def setup(self, policy, capacity, threshold, tracker, events):
        self.events_on = events
        self.real = CPUOffloadingManager(
            block_size=16,
            num_blocks=capacity,
            cache_policy=policy,
            enable_events=events,
            store_threshold=threshold,
            max_tracker_size=tracker,
        )
        self.model = ReferenceManager(capacity, policy, threshold, tracker)

    @rule(hashes=HASH_LISTS)
    def lookup(self, hashes):
        assert self.real.lookup(hashes) == self.model.lookup(hashes)

    @rule(hashes=HASH_LISTS)
    def touch(self, hashes):
        self.real.touch(hashes)
        self.model.touch(hashes)

    @rule(hashes=HASH_LISTS)
    def prepare_store(self, hashes):
        before = snapshot(self.real)
        loading = {h for batch in self.in_flight_loads for h in batch}
        resident = resident_blocks(self.real)
        not_ready = {h for h, (_, ref) in resident.items() if ref < 0}
        output = self.real.prepare_store(hashes)
        expected = self.model.prepare_store(hashes)
        if expected is None:
            assert output is None
            assert snapshot(self.real) == before, "a failed prepare_store changed state"
            return
        to_store, evicted = expected
        assert output.block_hashes_to_store == to_store
        assert output.block_hashes_evicted == evicted
        assert output.evicted_block_ids.block_ids.tolist() == [resident[h][0] for h in evicted]
        assert not set(evicted) & (loading | not_ready | set(hashes))
        ids = output.store_spec.block_ids
        assert ids.dtype.name == "int64" and len(ids) == len(to_store)
        assert [resident_blocks(self.real)[h][0] for h in to_store] == ids.tolist()
        if to_store:
            self.in_flight_stores.append(to_store)

    @precondition(lambda self: self.in_flight_stores)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data, success):
        batch = self.in_flight_stores.pop(data.draw(st.integers(0, len(self.in_flight_stores) - 1)))
        self.real.complete_store(batch, success=success)
        self.model.complete_store(batch, success)

    @rule(hashes=HASH_LISTS, success=st.booleans())
    def complete_store_arbitrary(self, hashes, success):
        self.real.complete_store(hashes, success=success)
        self.model.complete_store(hashes, success)

    @rule(hashes=HASH_LISTS)
    def prepare_load(self, hashes):
        before = snapshot(self.real)
        try:
            self.model.prepare_load(hashes)
        except (KeyError, ValueError) as expected:
            with pytest.raises(type(expected)):
                self.real.prepare_load(hashes)
            assert snapshot(self.real) == before, "a refused prepare_load changed state"
            return
        spec = self.real.prepare_load(hashes)
        blocks = resident_blocks(self.real)
        assert spec.block_ids.tolist() == [blocks[h][0] for h in hashes]
        if hashes:
            self.in_flight_loads.append(hashes)

    @precondition(lambda self: self.in_flight_loads)
    @rule(data=st.data())
    def complete_load(self, data):
        batch = self.in_flight_loads.pop(data.draw(st.integers(0, len(self.in_flight_loads) - 1)))
        self.real.complete_load(batch)
        self.model.complete_load(batch)

    @rule(hashes=HASH_LISTS)
    def complete_load_arbitrary(self, hashes):
        before = snapshot(self.real)
        try:
            self.model.complete_load(hashes)
        except (KeyError, ValueError) as expected:
            with pytest.raises(type(expected)):
                self.real.complete_load(hashes)
            assert snapshot(self.real) == before, "a refused complete_load changed state"
            return
        self.real.complete_load(hashes)
        # It released pins some in-flight load holds: forget those loads in our bookkeeping.
        for h in hashes:
            for batch in self.in_flight_loads:
                if h in batch:
                    batch.remove(h)
                    break
        self.in_flight_loads = [batch for batch in self.in_flight_loads if batch]

    @rule()
    def take_events(self):
        taken = [(e.block_hashes, e.removed) for e in self.real.take_events()]
        if self.events_on:
            assert taken == self.model.events
        else:
            assert taken == []
        self.model.events = []

    @precondition(lambda self: not self.in_flight_loads and not self.in_flight_stores)
    @rule()
    def reset_cache(self):
        self.real.reset_cache()
        self.model.reset()

    @invariant()
    def agrees_with_model_and_keeps_invariants(self):
        blocks = resident_blocks(self.real)
        capacity = self.real.num_blocks
        assert len(blocks) <= capacity
        ids = [block_id for block_id, _ in blocks.values()]
        assert len(set(ids)) == len(ids), "a host id is owned by two hashes"
        assert all(0 <= i < capacity for i in ids)
        free = free_slots(self.real)
        assert not set(ids) & set(free)
        assert len(free) + len(blocks) == capacity
        refs = [ref for _, ref in blocks.values()]
        assert min(refs, default=0) >= -1
        assert {h: ref for h, (_, ref) in blocks.items()} == self.model.ref
        free_refs = {self.real._ref_counts[slot] for slot in free}
        assert free_refs <= {-1}, "a free slot must hold NOT_READY"
        assert policy_state(self.real) == self.model.policy.state()
        stats = self.real.stats()
        assert stats.used + stats.free == capacity == stats.capacity
        assert stats.being_stored == refs.count(-1)
        assert stats.being_read == sum(r > 0 for r in refs)
        assert self.real._num_idle == refs.count(0)
        assert stats.stores_skipped == self.model.stores_skipped


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(
    max_examples=600,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
