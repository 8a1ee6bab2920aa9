"""Reuse classes: blocks seen once leave sooner when their kind of request rarely comes back."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv import CPUOffloadingManager
from numbakv.policies.reuse_classes import HALVE_AFTER, PRIOR, ReuseClasses, block_class
from tests.replaying import replay_into

FIRST, OTHER = block_class(0, 1, 0), block_class(4, 8, 5)


def test_classes_bucket_prefix_tail_and_position() -> None:
    assert block_class(0, 1, 0) == (0, 0, 0)
    assert block_class(1, 2, 1) == (1, 1, 1)
    assert block_class(3, 7, 3) == (3, 2, 2)
    assert block_class(100, 100, 99) == (6, 6, 6)
    assert block_class(2, 5, 3) is block_class(2, 6, 2)  # one tuple per class, not per block


def test_rates_start_equal_and_follow_what_comes_back() -> None:
    classes = ReuseClasses(capacity=1000, memory=1000)
    for block in range(10):
        classes.add(block, FIRST)
        classes.add(100 + block, OTHER)
    slowness = classes._slowness()
    assert slowness(FIRST) == slowness(OTHER) == 1.0  # nothing came back yet
    classes.seen(list(range(10)) * 2)  # every FIRST block comes back, counted once
    mean, slowness = 10 / 20, classes._slowness()
    assert 1 / slowness(FIRST) == pytest.approx((10 + PRIOR * mean) / (10 + PRIOR))
    assert 1 / slowness(OTHER) == pytest.approx(PRIOR * mean / (10 + PRIOR))


def test_a_forgotten_block_coming_back_is_not_counted() -> None:
    classes = ReuseClasses(capacity=1000, memory=3)
    for block in range(4):
        classes.add(block, FIRST if block else OTHER)
    classes.seen([0, 1])  # 0 (OTHER) is beyond the memory of 3 blocks
    assert classes._reused[OTHER] == 0
    assert classes._reused[FIRST] == 1


def test_counts_halve_so_recent_traffic_counts_more() -> None:
    classes = ReuseClasses(capacity=10, memory=1000)
    for block in range(HALVE_AFTER * 10 + 1):
        classes.add(block, FIRST)
    assert classes._stored[FIRST] == (HALVE_AFTER * 10 + 1) / 2


def test_victims_come_by_age_over_rate_and_skip_what_may_not_leave() -> None:
    classes = ReuseClasses(capacity=1000, memory=1000)
    returning, lost = range(200), range(200, 400)
    for block in returning:
        classes.add(block, FIRST)
    for block in lost:
        classes.add(block, OTHER)
    classes.seen(list(returning))  # FIRST comes back five times as often as OTHER, after PRIOR
    for block in [*returning[:-2], *lost[2:]]:
        classes.leave(block)  # queued now: 198, 199 (FIRST); 200, 201 (OTHER)
    last_used = {198: 0, 199: 10, 200: 50, 201: 60}
    # ages over rates at 100: 120 and 108 (FIRST, rate 5/6); 300 and 240 (OTHER, rate 1/6)
    assert list(classes.victims(100, last_used, lambda block: True)) == [200, 201, 198, 199]
    assert list(classes.victims(100, last_used, lambda block: block != 200)) == [201, 198, 199]
    classes.demote(201)  # the oldest of OTHER now, whatever its age
    assert list(classes.victims(100, last_used, lambda block: True)) == [201, 200, 198, 199]
    assert list(classes.victims(100, last_used, lambda block: False)) == []
    for block in (198, 199):
        classes.leave(block)
    assert list(classes.queues) == [OTHER]  # an emptied class is dropped


@given(
    blocks=st.lists(
        st.tuples(st.sampled_from([FIRST, OTHER, block_class(1, 1, 0)]), st.integers(0, 50)),
        min_size=1,
        max_size=30,
    ),
    returning=st.sets(st.integers(0, 29)),
    demoted=st.sets(st.integers(0, 29)),
    stuck=st.sets(st.integers(0, 29)),
)
def test_victims_merge_the_class_queues_by_weighted_age(blocks, returning, demoted, stuck) -> None:
    """Against a slow reference: every evictable queued block once, each class in queue order,
    the next always the class head of largest age / rate (ties to the smaller class)."""
    classes = ReuseClasses(capacity=1000, memory=1000)
    last_used = {}
    for block, (kind, tick) in enumerate(blocks):
        classes.add(block, kind)
        last_used[block] = tick  # not in queue order: a touch may stamp a pending block
    classes.seen(sorted(returning))
    for block in sorted(demoted & set(last_used)):
        classes.demote(block)
    now, slowness = 100, classes._slowness()  # 1 / rate, rounded exactly as victims rounds it
    queues = {c: [b for b in queue if b not in stuck] for c, queue in classes.queues.items()}
    expected = []
    while any(queues.values()):
        heads = [(c, queue[0]) for c, queue in queues.items() if queue]
        kind, _ = min(
            heads, key=lambda item: ((last_used[item[1]] - now) * slowness(item[0]), item[0])
        )
        expected.append(queues[kind].pop(0))
    assert list(classes.victims(now, last_used, lambda block: block not in stuck)) == expected


def test_sarc_evicts_the_class_that_does_not_come_back_before_an_older_block() -> None:
    """Over its bound, sarc sends a block of a class that never returned before an older block of
    a class that does (least recent first, the miniatures' way, would take the older one)."""
    singles = [[block] for block in range(11)]  # one-block requests
    longs = [list(range(start, start + 8)) for start in range(100, 180, 8)]  # never come back
    chains = singles + singles[:10] + longs  # of the singles, block 10 alone is not used again
    manager = CPUOffloadingManager(1, 100, "sarc")
    replay_into(manager, chains)  # 91 blocks: nothing evicted, the miniatures tie, p = 50
    policy = manager._policy
    assert policy.p == 50
    assert next(iter(policy.t1)) == 10  # the least recent block seen once
    evicted = manager.prepare_store(list(range(1000, 1010))).block_hashes_evicted
    assert len(evicted) == 1 and evicted[0] in range(100, 108)
    assert manager.lookup([10]) == 1


def test_queued_blocks_are_the_blocks_seen_once() -> None:
    """Whatever the traffic (loads in flight, failed stores), the class queues hold exactly T1,
    once the blocks stored since the last touch are ranked."""
    rng = random.Random(0)
    manager = CPUOffloadingManager(1, 64, "sarc")
    policy = manager._policy
    for _ in range(400):
        chain = [rng.randrange(8)] + [rng.randrange(200) for _ in range(rng.randrange(1, 6))]
        hits = manager.lookup(chain)
        manager.touch(chain)
        loading = chain[:hits]
        if loading:
            manager.prepare_load(loading)
        output = manager.prepare_store(chain[hits:])
        if output is not None:
            manager.complete_store(output.block_hashes_to_store, success=rng.random() < 0.8)
        if loading:
            manager.complete_load(loading)
        policy._rank_just_stored()
        assert set(policy.reuse._queued) == set(policy.t1)
        assert sum(map(len, policy.reuse.queues.values())) == len(policy.t1)
