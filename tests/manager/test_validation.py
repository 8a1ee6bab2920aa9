"""A call the manager refuses changes nothing: it is checked whole before any state moves."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numbakv import POLICIES, CPUOffloadingManager
from numbakv.tools.replay.core import replay_request

UNHASHABLE = [[1, 2], {3: 4}, {5}, bytearray(b"ab")]
METHODS = ["lookup", "touch", "prepare_store", "complete_store", "prepare_load", "complete_load"]
CHAINS = st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=5), max_size=25)


def prepared(policy: str, capacity: int, chains: list[list[int]], loading: bool = False):
    """A manager after a replay of `chains` (and, with `loading`, a load begun on up to three
    ready blocks); the same arguments give the same state (every policy is deterministic)."""
    manager = CPUOffloadingManager(1, capacity, policy, enable_events=True)
    observed(manager, chains)
    ready = [h for h in range(16) if manager.lookup([h])][:3]
    if loading and ready:
        manager.prepare_load(ready)
    return manager, ready


def observed(manager: CPUOffloadingManager, chains: list[list[int]]) -> list:
    """What a manager answers to a replay, then its counters, gauges and policy gauges."""
    answers = [replay_request(manager, chain) for chain in chains]
    return [answers, list(manager.take_events()), manager.stats(), manager.policy_stats()]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    before=CHAINS,
    after=CHAINS,
    method=st.sampled_from(METHODS),
    bad=st.sampled_from(UNHASHABLE),
    call=st.lists(st.integers(0, 15), min_size=1, max_size=6),
    position=st.integers(0, 6),
)
def test_a_call_with_an_unhashable_hash_changes_nothing(
    policy, before, after, method, bad, call, position
):
    """Wherever the bad hash sits (before or after hashes the call would act on), the call
    raises a TypeError that names it, and the manager then behaves exactly as a copy taken
    before the call: same hits and stores, events, counters and policy state."""
    loading = method == "complete_load"
    manager, ready = prepared(policy, 6, before, loading)
    twin, _ = prepared(policy, 6, before, loading)
    if loading:
        call = ready or [0]
    position = min(position, len(call))
    with pytest.raises(TypeError, match=rf"block_hashes\[{position}\].*{type(bad).__name__}"):
        getattr(manager, method)([*call[:position], bad, *call[position:]])
    assert observed(manager, after) == observed(twin, after)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_touch_with_an_unhashable_hash_leaves_the_order_alone(policy):
    """The case that was broken: LRU, ARC, S3-FIFO and SIEVE applied the hashes they met before
    the bad one (sarc noted the chain's length), so later evictions differed."""
    manager, _ = prepared(policy, 3, [[1], [2], [3]])
    twin, _ = prepared(policy, 3, [[1], [2], [3]])
    with pytest.raises(TypeError, match=r"block_hashes\[1\]"):
        manager.touch([1, [4], 2, 3])
    after = [[9], [10], [2], [3], [1]]  # which of 1, 2, 3 survive shows their order
    assert observed(manager, after) == observed(twin, after)


@pytest.mark.parametrize(
    ("argument", "value"),
    [("num_blocks", 2**70), ("num_blocks", 2**40), ("block_size", 2**70)],
)
def test_an_absurd_size_is_refused_by_name(argument, value):
    kwargs = {"block_size": 16, "num_blocks": 4, argument: value}
    with pytest.raises(ValueError, match=rf"{argument} must be at most"):
        CPUOffloadingManager(**kwargs)


def test_the_largest_capacity_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"2\*\*31"):
        CPUOffloadingManager(1, 2**40)


def test_a_type_error_not_about_hashing_passes_through_as_it_is():
    """Every hash is hashable here; their comparison fails. That error is not reworded as an
    unhashable hash."""

    class Incomparable:
        def __hash__(self) -> int:
            return 1

        def __eq__(self, other: object) -> bool:
            raise TypeError("cannot compare")

    manager = CPUOffloadingManager(1, 4)
    with pytest.raises(TypeError, match="^cannot compare$"):
        manager.prepare_store([Incomparable(), Incomparable()])
    assert manager.stats().used == 0


@pytest.mark.parametrize("method", ["prepare_load", "prepare_store"])
@pytest.mark.parametrize("request_given", ["req-42", 42, object()])
def test_a_request_that_is_no_request_is_refused_before_anything_moves(method, request_given):
    """An engine's own request id where the manager's record belongs: nothing pinned, nothing
    stored, no offer counted (store_threshold 2 would admit the next offer otherwise)."""
    manager = CPUOffloadingManager(1, 4, store_threshold=2)
    for _ in range(2):
        plan = manager.prepare_store([1, 2])
    manager.complete_store(plan.block_hashes_to_store)
    before = manager.stats()
    with pytest.raises(
        TypeError, match=rf"{method}: request must be a RequestAccess from begin_request, got"
    ):
        getattr(manager, method)([1, 2] if method == "prepare_load" else [3], request_given)
    assert manager.stats() == before
    assert manager.prepare_store([3]).block_hashes_to_store == []  # its first offer only


def test_a_request_of_another_manager_is_refused_by_name():
    manager, other = CPUOffloadingManager(1, 4), CPUOffloadingManager(1, 4)
    with pytest.raises(ValueError, match="request was begun by another CPUOffloadingManager"):
        manager.prepare_store([1], other.begin_request())
    with pytest.raises(TypeError, match="finish_request: request must be a RequestAccess"):
        manager.finish_request("req-42")


@pytest.mark.parametrize("answer", ["16", 16.0, True, [16]])
def test_a_positions_function_that_answers_no_position_leaves_no_slot_taken(answer):
    """A store's new blocks go in before the policy asks their positions again: a bad answer
    then left them being stored for good, with no plan for the caller to complete. Asked the
    first time (before the store), nothing moves; the second time, the store is undone."""
    asked = Counter()

    def positions(block_hash):
        asked[block_hash] += 1
        return 16 * block_hash if asked[block_hash] == 1 else answer

    manager = CPUOffloadingManager(16, 4)
    for request in (
        manager.begin_request(lambda block_hash: answer),
        manager.begin_request(positions),
    ):
        with pytest.raises(TypeError, match=r"positions\(1\) must be a token position"):
            manager.prepare_store([1, 2], request)
        assert manager.stats().used == 0 and not manager.is_being_stored(1)
    assert asked[1] == 2  # the second request failed after its blocks went in
    assert manager.prepare_store([1, 2]).block_hashes_to_store == [1, 2]
    manager.complete_store([1, 2])
    with pytest.raises(TypeError, match="positions"):
        manager.prepare_load([1], manager.begin_request(lambda block_hash: answer))
    assert manager.stats().being_read == 0  # no pin left behind


def test_numpy_positions_are_taken_as_ints():
    manager = CPUOffloadingManager(16, 4)
    request = manager.begin_request(lambda block_hash: np.int64(16 * block_hash))
    plan = manager.prepare_store([1, 2], request)
    assert plan.block_hashes_to_store == [1, 2]


@pytest.mark.parametrize("ordered", [b"ab", (h for h in [1, 2]), 3])
def test_finish_requests_order_is_checked_before_the_request_counts_as_finished(ordered):
    """A lone bytes would be iterated as its bytes, and a generator reached the policy after the
    request was marked finished: the retry then did nothing."""
    manager = CPUOffloadingManager(1, 4)
    request = manager.begin_request()
    plan = manager.prepare_store([1, 2], request)
    manager.complete_store(plan.block_hashes_to_store)
    if isinstance(ordered, (bytes, int)):
        with pytest.raises(TypeError, match="ordered must be"):
            manager.finish_request(request, ordered)
        assert not request.finished
    else:
        manager.finish_request(request, ordered)  # any iterable of hashes is fine
        assert request.finished


@pytest.mark.parametrize("flag", ["no", 1, None])
def test_events_are_turned_on_by_a_bool_only(flag):
    """enable_events="no" turned events on (a non-empty string is true)."""
    with pytest.raises(TypeError, match=f"enable_events must be True or False, got {flag!r}"):
        CPUOffloadingManager(1, 4, enable_events=flag)
    manager = CPUOffloadingManager(1, 4, enable_events=np.True_)
    manager.complete_store(manager.prepare_store([1]).block_hashes_to_store)
    assert [event.block_hashes for event in manager.take_events()] == [[1]]
