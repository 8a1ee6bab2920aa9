"""Every registered policy keeps the manager's invariants under random traffic (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from numbakv import POLICIES, CPUOffloadingManager

HASHES = st.lists(st.integers(0, 11), max_size=6)


def machine_for(policy: str) -> type[RuleBasedStateMachine]:
    class ManagerMachine(RuleBasedStateMachine):
        """Drives a small manager and mirrors, per hash, what the spec says its state must be."""

        def __init__(self) -> None:
            super().__init__()
            self.num_blocks = 4
            self.manager = CPUOffloadingManager(1, self.num_blocks, policy, enable_events=True)
            self.ref_cnt: dict[int, int] = {}  # the model: cached hash -> ref_cnt (-1 not ready)
            self.loads: list[list[int]] = []
            self.pending_events: list[tuple[tuple, bool]] = []

        def block_id(self, block_hash: int) -> int | None:
            return self.manager._policy.get(block_hash)

        @rule(hashes=HASHES)
        def lookup(self, hashes: list[int]) -> None:
            expected = 0
            for block_hash in hashes:
                if self.ref_cnt.get(block_hash, -1) < 0:
                    break
                expected += 1
            assert self.manager.lookup(hashes) == expected

        @rule(hashes=HASHES)
        def touch(self, hashes: list[int]) -> None:
            self.manager.touch(hashes)

        @rule(hashes=HASHES)
        def prepare_store(self, hashes: list[int]) -> None:
            before = dict(self.ref_cnt)
            before_stats = self.manager.stats()
            output = self.manager.prepare_store(hashes)
            new = [h for h in dict.fromkeys(hashes) if h not in before]
            if output is None:  # only the refused blocks are counted
                refused = before_stats.refused_store_blocks + len(new)
                assert self.manager.stats() == replace(before_stats, refused_store_blocks=refused)
                assert {h: self.block_id(h) is not None for h in range(12)} == {
                    h: h in before for h in range(12)
                }
                evictable = sum(1 for h, count in before.items() if count == 0 and h not in hashes)
                assert len(new) - (self.num_blocks - len(before)) > evictable
                return
            assert output.block_hashes_to_store == new
            assert len(output.store_spec.block_ids) == len(new)
            for victim in output.block_hashes_evicted:
                assert before.get(victim) == 0, "evicted a block not ready, or being loaded"
                assert victim not in hashes, "evicted a block named in this prepare_store"
                del self.ref_cnt[victim]
            assert len(output.block_hashes_evicted) == max(
                0, len(new) - (self.num_blocks - len(before))
            )
            for block_hash in new:
                self.ref_cnt[block_hash] = -1
            if output.block_hashes_evicted:
                self.pending_events.append((tuple(output.block_hashes_evicted), True))

        @rule(data=st.data(), success=st.booleans())
        def complete_store(self, data, success: bool) -> None:
            # Mostly the blocks being stored (so that blocks become ready), plus any others.
            pending = sorted(h for h, count in self.ref_cnt.items() if count == -1)
            named = st.lists(st.sampled_from(pending), max_size=6) if pending else st.just([])
            hashes = data.draw(named) + data.draw(st.lists(st.integers(0, 11), max_size=2))
            completed = [h for h in dict.fromkeys(hashes) if self.ref_cnt.get(h) == -1]
            self.manager.complete_store(hashes, success=success)
            for block_hash in completed:
                if success:
                    self.ref_cnt[block_hash] = 0
                else:
                    del self.ref_cnt[block_hash]
            if success and completed:
                self.pending_events.append((tuple(completed), False))

        @rule(data=st.data())
        def prepare_load(self, data) -> None:
            ready = sorted(h for h, count in self.ref_cnt.items() if count >= 0)
            if not ready:
                return
            hashes = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=4))
            spec = self.manager.prepare_load(hashes)
            assert list(spec.block_ids) == [self.block_id(h) for h in hashes]
            for block_hash in hashes:
                self.ref_cnt[block_hash] += 1
            self.loads.append(hashes)

        @rule(data=st.data())
        def complete_load(self, data) -> None:
            if not self.loads:
                return
            hashes = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
            self.manager.complete_load(hashes)
            for block_hash in hashes:
                self.ref_cnt[block_hash] -= 1

        @rule()
        def take_events(self) -> None:
            events = [(tuple(e.block_hashes), e.removed) for e in self.manager.take_events()]
            assert events == self.pending_events
            self.pending_events = []

        @invariant()
        def matches_the_model(self) -> None:
            stats = self.manager.stats()
            assert len(self.manager._policy) == len(self.ref_cnt) <= self.num_blocks
            assert stats.used + stats.free == self.num_blocks
            assert stats.used == len(self.ref_cnt)
            block_ids = []
            for block_hash in range(12):
                block_id = self.block_id(block_hash)
                if block_hash not in self.ref_cnt:
                    assert block_id is None
                    continue
                assert self.manager._ref_counts[block_id] == self.ref_cnt[block_hash] >= -1
                block_ids.append(block_id)
            assert len(set(block_ids)) == len(block_ids)
            assert all(0 <= block_id < self.num_blocks for block_id in block_ids)

    ManagerMachine.__name__ = f"ManagerMachine_{policy}"
    return ManagerMachine


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_keeps_manager_invariants(policy: str) -> None:
    run_state_machine_as_test(
        machine_for(policy),
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_reset_forgets_everything(policy: str) -> None:
    manager = CPUOffloadingManager(1, 3, policy)
    for chain in ([1, 2, 3], [1, 4, 5], [6, 7], [1, 2, 8]):
        hits = manager.lookup(chain)
        manager.touch(chain)
        output = manager.prepare_store(chain[hits:])
        if output is not None:
            manager.complete_store(output.block_hashes_to_store)
    manager.reset_cache()
    assert len(manager._policy) == 0
    assert manager.stats().free == 3
    assert manager.lookup([1, 2, 3]) == 0
