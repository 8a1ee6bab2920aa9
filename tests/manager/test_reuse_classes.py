"""Reuse classes: blocks seen once leave sooner when their kind of request rarely comes back."""

from __future__ import annotations

import random
from bisect import bisect_right

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv import CPUOffloadingManager
from numbakv.policies.sarc.reuse_classes import (
    BUCKETS,
    CLASSES,
    HALVE_AFTER,
    POSITION_EDGES,
    PREFIX_EDGES,
    PRIOR,
    REMEMBERED,
    TAIL_EDGES,
    ReuseClasses,
    block_class,
    group_class,
    position_bucket,
    tail_classes,
)
from tests.support.replaying import replay_into

FIRST, OTHER = block_class(0, 1, 0), block_class(4, 8, 5)
NOTHING = frozenset()


def classes_of(
    capacity: int, memory: int, ticks=None, rerank_every: int = 0, pinned=None
) -> ReuseClasses:
    """Ranked afresh at every eviction unless `rerank_every` says otherwise; every block idle
    unless `pinned` says otherwise, and its hash its id."""
    ticks = [0] * capacity if ticks is None else ticks
    pinned = [0] * capacity if pinned is None else pinned
    return ReuseClasses(capacity, memory, ticks, pinned, list(range(capacity)), rerank_every)


def merged_by_weighted_age(classes: ReuseClasses, ticks, at: int, stuck=frozenset()) -> list[int]:
    """The slow reference: every queued block not `stuck` once, each class in queue order, the
    next always the first of the class of largest age at tick `at` / rate (ties to the smaller
    class)."""
    slowness = classes.slowness()
    queues = {c: [b for b in classes.queue(c) if b not in stuck] for c in classes.queued}
    merged = []
    while any(queues.values()):
        heads = [(c, queue[0]) for c, queue in queues.items() if queue]
        kind, _ = min(heads, key=lambda item: ((ticks[item[1]] - at) * slowness(item[0]), item[0]))
        merged.append(queues[kind].pop(0))
    return merged


def add(classes: ReuseClasses, blocks, block_class: int) -> None:
    """Blocks whose hash is their id, all of one class."""
    blocks = list(blocks)
    classes.add_all(blocks, blocks, [block_class] * len(blocks))


def test_classes_bucket_prefix_tail_and_position() -> None:
    assert block_class(0, 1, 0) == 0
    assert block_class(1, 2, 1) == (1 * BUCKETS + 1) * BUCKETS + 1
    assert block_class(100, 100, 99) == CLASSES - 1
    assert block_class(2, 5, 3) == block_class(2, 6, 2)  # the same buckets


@given(st.tuples(*[st.integers(0, 80)] * 3), st.tuples(*[st.integers(0, 80)] * 3))
def test_class_numbers_sort_as_their_bucket_tuples(one, other) -> None:
    """Ties between equally old and slow classes go to the smaller number, as they went to the
    smaller (prefix, tail, position) bucket tuple."""

    def buckets(prefix: int, tail: int, position: int) -> tuple[int, int, int]:
        return (
            bisect_right(PREFIX_EDGES, prefix),
            bisect_right(TAIL_EDGES, tail),
            bisect_right(POSITION_EDGES, position),
        )

    assert (block_class(*one) < block_class(*other)) == (buckets(*one) < buckets(*other))
    assert block_class(*one) == group_class(*one[:2]) + position_bucket(one[2])


@given(st.integers(0, 80), st.integers(0, 80))
def test_a_tails_classes_are_its_blocks_classes_last_first(prefix, tail) -> None:
    expected = [block_class(prefix, tail, position) for position in reversed(range(tail))]
    assert tail_classes(prefix, tail) == expected


def test_rates_start_equal_and_follow_what_comes_back() -> None:
    classes = classes_of(capacity=1000, memory=1000)
    add(classes, range(10), FIRST)
    add(classes, range(100, 110), OTHER)
    slowness = classes.slowness()
    assert slowness(FIRST) == slowness(OTHER) == 1.0  # nothing came back yet
    classes.seen(list(range(10)) * 2)  # every FIRST block comes back, counted once
    mean, slowness = 10 / 20, classes.slowness()
    assert 1 / slowness(FIRST) == pytest.approx((10 + PRIOR * mean) / (10 + PRIOR))
    assert 1 / slowness(OTHER) == pytest.approx(PRIOR * mean / (10 + PRIOR))


def test_a_forgotten_block_coming_back_is_not_counted() -> None:
    classes = classes_of(capacity=1000, memory=3)
    add(classes, [0], OTHER)
    add(classes, [1, 2, 3], FIRST)
    classes.seen([0, 1])  # 0 (OTHER) is beyond the memory of 3 blocks
    assert classes._reused[OTHER] == 0
    assert classes._reused[FIRST] == 1


def test_beyond_a_limit_a_sample_is_remembered_and_counts_for_all() -> None:
    """A large cache remembers 1 in `sampling` hashes (by sample point: an int is its own), each
    standing for `sampling` blocks, so the rates come out as if all were remembered."""
    classes = classes_of(capacity=1000, memory=4 * REMEMBERED)
    assert classes.sampling == 4
    add(classes, range(1000), FIRST)
    assert len(classes._remembered) == 250
    assert classes._stored[FIRST] == 1000
    classes.seen(list(range(500)))  # half come back: 125 of those remembered
    assert classes._reused[FIRST] == 500


def test_counts_halve_so_recent_traffic_counts_more() -> None:
    classes = classes_of(capacity=10, memory=1000)
    for block in range(HALVE_AFTER * 10 + 1):
        classes.add_all([block % 10], [block], [FIRST])
        classes.leave_all([block % 10])
    assert classes._stored[FIRST] == (HALVE_AFTER * 10 + 1) / 2


@pytest.mark.parametrize("sampling", [1, 3])
def test_a_store_that_passes_the_halving_point_counts_as_if_block_by_block(sampling) -> None:
    # 10 blocks a store of mixed classes; the counts pass the halving point within a store.
    by_store, by_block = (classes_of(capacity=10, memory=10_000) for _ in range(2))
    for classes in (by_store, by_block):
        classes.sampling = sampling
    kinds = [FIRST, OTHER, FIRST, FIRST, OTHER, OTHER, OTHER, FIRST, OTHER, FIRST]
    for store in range(HALVE_AFTER * 2 + 1):
        hashes = range(store * 10, store * 10 + 10)
        by_store.add_all(range(10), hashes, kinds)
        by_store.leave_all(range(10))
        for block, block_hash, kind in zip(range(10), hashes, kinds):
            by_block.add_all([block], [block_hash], [kind])
            by_block.leave_all([block])
    assert by_store._stored == by_block._stored
    assert by_store._total_stored == by_block._total_stored


def four_queued_blocks(pinned=None) -> tuple[ReuseClasses, list[int]]:
    """198 and 199 of FIRST, 200 and 201 of OTHER, FIRST coming back five times as often."""
    ticks = [0] * 400
    ticks[198], ticks[199], ticks[200], ticks[201] = 0, 10, 50, 60
    classes = classes_of(capacity=400, memory=1000, ticks=ticks, pinned=pinned)
    returning, lost = range(200), range(200, 400)
    add(classes, returning, FIRST)
    add(classes, lost, OTHER)
    classes.seen(list(returning))  # FIRST comes back five times as often as OTHER, after PRIOR
    classes.leave_all([*returning[:-2], *lost[2:]])
    return classes, ticks


def test_victims_come_by_age_over_rate_and_skip_what_may_not_leave() -> None:
    # ages over rates at 100: 120 and 108 (FIRST, rate 5/6); 300 and 240 (OTHER, rate 1/6)
    classes, _ = four_queued_blocks()
    assert classes.take_victims(4, 100, NOTHING) == [200, 201, 198, 199]
    assert classes.queued == {}  # taken blocks leave their classes; an emptied class is dropped
    classes, _ = four_queued_blocks()
    assert classes.take_victims(2, 100, NOTHING) == [200, 201]
    assert list(classes.queue(FIRST)) == [198, 199]
    classes, _ = four_queued_blocks()
    assert classes.take_victims(4, 100, {200}) == [201, 198, 199]
    assert list(classes.queue(OTHER)) == [200]
    pinned = [0] * 400
    pinned[198] = 1
    classes, _ = four_queued_blocks(pinned)
    assert classes.take_victims(4, 100, NOTHING) == [200, 201, 199]
    classes, ticks = four_queued_blocks()
    classes.demote(201)  # the oldest of OTHER now (the policy also gives it the oldest tick)
    ticks[201] = -1
    assert classes.take_victims(4, 100, NOTHING) == [201, 200, 198, 199]
    classes, _ = four_queued_blocks([1] * 400)
    assert classes.take_victims(4, 100, NOTHING) == []


def test_a_renewed_block_becomes_the_newest_of_its_class() -> None:
    ticks = list(range(10))
    classes = classes_of(capacity=10, memory=100, ticks=ticks)
    add(classes, range(4), FIRST)
    ticks[0] = 20  # touched while its store is in flight
    classes.renew(0)
    assert list(classes.queue(FIRST)) == [1, 2, 3, 0]
    assert classes.take_victims(4, 30, NOTHING) == [1, 2, 3, 0]


@given(
    blocks=st.lists(
        st.tuples(st.sampled_from([FIRST, OTHER, block_class(1, 1, 0)]), st.integers(0, 5)),
        min_size=1,
        max_size=30,
    ),
    returning=st.sets(st.integers(0, 29)),
    demoted=st.sets(st.integers(0, 29)),
    stuck=st.sets(st.integers(0, 29)),
)
def test_victims_merge_the_class_queues_by_weighted_age(blocks, returning, demoted, stuck) -> None:
    """Against a slow reference: every evictable queued block once, each class in queue order,
    the next always the first evictable block of the class of largest age / rate (ties to the
    smaller class). Ticks grow in the order blocks are queued, as the policy ranks them; a
    demoted block is the oldest."""
    ticks = [0] * 30
    pinned = [int(block in stuck) for block in range(30)]
    classes = classes_of(capacity=30, memory=1000, ticks=ticks, pinned=pinned)
    clock = 0
    for block, (kind, gap) in enumerate(blocks):
        clock += gap
        ticks[block] = clock
        classes.add_all([block], [block], [kind])
    classes.seen(sorted(returning))
    for block in sorted(demoted & set(range(len(blocks)))):
        classes.demote(block)
        ticks[block] = -1
    now = clock + 1
    expected = merged_by_weighted_age(classes, ticks, now, stuck)
    taken = classes.take_victims(len(blocks), now, NOTHING)
    assert taken == expected


@given(
    blocks=st.lists(
        st.tuples(st.sampled_from([FIRST, OTHER, block_class(1, 1, 0)]), st.integers(0, 5)),
        min_size=1,
        max_size=30,
    ),
    first=st.integers(0, 30),
    stuck_first=st.sets(st.integers(0, 29)),
    changes=st.lists(st.tuples(st.sampled_from(["leave", "demote", "renew"]), st.integers(0, 29))),
    stuck=st.sets(st.integers(0, 29)),
)
def test_a_ranking_serves_until_the_next_as_if_made_afresh(
    blocks, first, stuck_first, changes, stuck
) -> None:
    """Between rankings, blocks that leave, are demoted, renewed or were skipped as stuck by an
    earlier eviction leave the ranking's entries stale: evictions still merge exactly by age at
    the ranking's tick (rates are those of the ranking: nothing here moves them)."""
    ticks = [0] * 30
    pinned = [int(block in stuck_first) for block in range(30)]
    classes = classes_of(capacity=30, memory=1000, ticks=ticks, rerank_every=1000, pinned=pinned)
    clock = 0
    for block, (kind, gap) in enumerate(blocks):
        clock += gap
        ticks[block] = clock
        classes.add_all([block], [block], [kind])
    classes.seen(list(range(0, len(blocks), 3)))
    at = clock + 1000
    expected = merged_by_weighted_age(classes, ticks, at, stuck_first)[:first]
    assert classes.take_victims(first, clock, NOTHING) == expected
    for change, block in changes:
        if classes._class_of[block] < 0:
            continue
        if change == "leave":
            classes.leave_all([block])
        elif change == "demote":
            classes.demote(block)
            ticks[block] = -1
        else:
            clock += 1
            ticks[block] = clock
            classes.renew(block)
    expected = merged_by_weighted_age(classes, ticks, at, stuck)
    pinned[:] = [int(block in stuck) for block in range(30)]
    assert classes.take_victims(30, clock + 1, NOTHING) == expected


def test_a_ranking_is_renewed_once_its_tick_is_reached() -> None:
    """Keys are ages at the tick the next ranking is due: a later eviction ranks afresh."""
    ticks = [0] * 400
    ticks[198], ticks[199], ticks[200], ticks[201] = 0, 10, 50, 60
    classes = classes_of(capacity=400, memory=1000, ticks=ticks, rerank_every=40)
    add(classes, range(200), FIRST)
    add(classes, range(200, 400), OTHER)
    classes.seen(list(range(200)))
    classes.leave_all([*range(198), *range(202, 400)])
    assert classes.take_victims(1, 100, NOTHING) == [200]
    assert classes._ranked_at == 140
    classes.take_victims(1, 139, NOTHING)
    assert classes._ranked_at == 140  # not due yet: the ranking is kept
    classes.take_victims(1, 140, NOTHING)
    assert classes._ranked_at == 180


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
    """Whatever the traffic (loads in flight, failed stores, stores between touches), the class
    queues hold exactly T1's blocks, each class in tick order, with its head on record."""
    rng = random.Random(0)
    manager = CPUOffloadingManager(1, 64, "sarc")
    policy = manager._policy
    reuse = policy.reuse
    for _ in range(400):
        chain = [rng.randrange(8)] + [rng.randrange(200) for _ in range(rng.randrange(1, 6))]
        hits = manager.lookup(chain)
        if rng.random() < 0.8:
            manager.touch(chain)
        loading = chain[:hits]
        if loading:
            manager.prepare_load(loading)
        output = manager.prepare_store(chain[hits:])
        if output is not None:
            manager.complete_store(output.block_hashes_to_store, success=rng.random() < 0.8)
        if loading:
            manager.complete_load(loading)
        t1_ids = {policy.get(block_hash) for block_hash in policy.t1}
        queues = {c: list(reuse.queue(c)) for c in reuse.queued}
        assert {block for queue in queues.values() for block in queue} == t1_ids
        assert {c: len(queue) for c, queue in queues.items()} == reuse.queued
        assert {c: queue[0] for c, queue in queues.items()} == reuse._heads
        for queue in queues.values():
            ticks = [policy._tick[block] for block in queue]
            assert ticks == sorted(ticks)
