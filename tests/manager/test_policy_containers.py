"""The policies' containers against plain lists: ghost lists and lists threaded through block ids."""

from __future__ import annotations

from collections import OrderedDict
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from numbakv.policies.block_lists import BlockLists
from numbakv.policies.sarc.ghosts import AT_ONCE, COMPACT_RATE, GhostList

HASHES = st.integers(0, 15)
GHOST_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(HASHES, max_size=4)),
        st.tuples(st.just("refresh"), HASHES),
        st.tuples(st.just("remove"), HASHES),
    ),
    max_size=80,
)


@given(
    limit=st.integers(1, 6), rate=st.integers(2, 5), at_once=st.integers(0, 8), steps=GHOST_STEPS
)
def test_a_ghost_list_is_a_bounded_fifo(limit: int, rate: int, at_once: int, steps) -> None:
    """Against an OrderedDict trimmed to the limit after every step: same members, same order,
    however many stale places refreshes and removals leave behind, and at every point of a
    compaction (`rate`, `at_once`: compactions spread over few calls or many)."""
    with (
        patch("numbakv.policies.sarc.ghosts.COMPACT_RATE", rate),
        patch("numbakv.policies.sarc.ghosts.AT_ONCE", at_once),
    ):
        replay_ghost_steps(limit, steps)


def replay_ghost_steps(limit: int, steps) -> None:
    ghosts, model = GhostList(limit), OrderedDict()
    for action, argument in steps:
        if action == "add":
            fresh = [h for h in dict.fromkeys(argument) if h not in model]
            ghosts.add_all(fresh)
            for block_hash in fresh:
                model[block_hash] = None
                while len(model) > limit:
                    model.popitem(last=False)
        elif argument in model:
            if action == "refresh":
                ghosts.refresh(argument)
                model.move_to_end(argument)
            else:
                ghosts.remove(argument)
                del model[argument]
        assert list(ghosts) == list(model)
        assert len(ghosts) == len(model)
        assert all((h in ghosts) == (h in model) for h in range(16))
        assert ghosts.places == len(model) + sum(ghosts._stale.values())
        assert ghosts.places <= len(model) + 2 * limit + 2  # stale places stay bounded


def test_a_ghost_list_that_never_fills_is_compacted() -> None:
    ghosts = GhostList(limit=100)
    ghosts.add_all(list(range(10)))
    for _ in range(1000):
        ghosts.refresh(3)
    assert list(ghosts) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 3]
    assert ghosts.places <= 10 + 2 * 100 + 2


def test_a_compaction_is_spread_over_calls() -> None:
    """No call pays for a large list: each visits a few places per place it adds."""
    size = 2 * AT_ONCE
    ghosts = GhostList(limit=size)
    ghosts.add_all(list(range(size)))
    while not ghosts._compacting:
        ghosts.refresh(0)
    to_visit = ghosts.places
    ghosts.refresh(0)
    assert ghosts.places >= to_visit - COMPACT_RATE
    while ghosts._compacting:
        ghosts.refresh(size - 1)
    assert ghosts.places == size + ghosts._stale.get(size - 1, 0)
    assert list(ghosts)[-2:] == [0, size - 1]


@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["newest", "oldest", "after", "unlink"]),
            st.integers(0, 7),
            st.integers(0, 2),
            st.integers(0, 7),
        ),
        max_size=60,
    )
)
def test_block_lists_move_blocks_as_plain_lists_do(steps) -> None:
    lists, model = BlockLists(blocks=8, lists=3), [[], [], []]

    def home(block: int) -> list | None:
        return next((blocks for blocks in model if block in blocks), None)

    for action, block, index, anchor in steps:
        if action == "unlink":
            if home(block) is not None:
                lists.unlink(block)
                home(block).remove(block)
        elif home(block) is not None:
            pass  # a block is in one list at a time
        elif action == "newest":
            lists.push_newest(block, lists.sentinel(index))
            model[index].append(block)
        elif action == "oldest":
            lists.push_oldest(block, lists.sentinel(index))
            model[index].insert(0, block)
        elif home(anchor) is not None:
            lists.link_newer_all((block,), anchor)
            blocks = home(anchor)
            blocks.insert(blocks.index(anchor) + 1, block)
        for number, blocks in enumerate(model):
            assert list(lists.oldest_first(lists.sentinel(number))) == blocks
    lists.clear()
    assert all(list(lists.oldest_first(lists.sentinel(i))) == [] for i in range(3))


BATCHES = st.lists(
    st.tuples(
        st.sampled_from(["push", "link", "unlink"]),
        st.lists(st.integers(0, 7), max_size=4, unique=True),
        st.integers(0, 10),  # a block to link after, if linked, else list `target % 3`
    ),
    max_size=40,
)


@given(batches=BATCHES)
def test_a_batch_call_moves_blocks_as_one_call_per_block_does(batches) -> None:
    batched, single = BlockLists(blocks=8, lists=3), BlockLists(blocks=8, lists=3)
    linked: set[int] = set()
    for action, nodes, target in batches:
        if action == "unlink":
            nodes = [node for node in nodes if node in linked]
            batched.unlink_all(nodes)
            for node in nodes:
                single.unlink(node)
            linked.difference_update(nodes)
        else:
            nodes = [node for node in nodes if node not in linked]
            sentinel = batched.sentinel(target % 3)
            if action == "push":
                batched.push_newest_all(nodes, sentinel)
                for node in nodes:
                    single.push_newest(node, sentinel)
            else:
                anchor = target if target in linked else sentinel
                batched.link_newer_all(nodes, anchor)
                for node in nodes:  # each just newer than the one before
                    single.link_newer_all((node,), anchor)
                    anchor = node
            linked.update(nodes)
        for index in range(3):
            sentinel = batched.sentinel(index)
            assert list(batched.oldest_first(sentinel)) == list(single.oldest_first(sentinel))
