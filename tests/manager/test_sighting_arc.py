"""Sighting ARC's chain-end rule: a prompt's last block is demoted only when it rarely comes back."""

from __future__ import annotations

import itertools

from numbakv import CPUOffloadingManager
from numbakv.policies.sarc.chain_ends import EVIDENCE, ChainEndWatch
from tests.support.replaying import replay_into

SESSIONS = 6
TURNS = 12


def conversation(partial_ends: bool) -> list[list[int]]:
    """Interleaved sessions; each turn re-sends the previous prompt and adds two blocks.

    With `partial_ends` the previous prompt's last block is not re-sent (it was partial: its hash
    changes once the turn's answer fills it), as in the Mooncake conversation trace.
    """
    fresh = itertools.count(1000)
    prompts = [[session] for session in range(SESSIONS)]  # a distinct first block per session
    chains = []
    for _turn, session in itertools.product(range(TURNS), range(SESSIONS)):
        prompt = prompts[session]
        if partial_ends and len(prompt) > 1:
            del prompt[-1]
        prompt += [next(fresh), next(fresh)]
        chains.append(list(prompt))
    return chains


def test_watch_demotes_ends_that_do_not_come_back() -> None:
    manager = CPUOffloadingManager(1, 1000, "sarc")
    replay_into(manager, conversation(partial_ends=True))
    watch = manager._policy.chain_ends
    assert watch._reused_count[1] >= EVIDENCE
    assert watch._reused_count[0] == 0
    assert watch.demote


def test_watch_keeps_ends_that_come_back() -> None:
    manager = CPUOffloadingManager(1, 1000, "sarc")
    replay_into(manager, conversation(partial_ends=False))
    watch = manager._policy.chain_ends
    assert watch._reused_count[0] >= EVIDENCE
    assert not watch.demote


def test_watch_waits_for_evidence() -> None:
    watch = ChainEndWatch(size=100)
    for turn in range(EVIDENCE):
        watch.watch(end=-turn - 1, sibling=turn)
        watch.seen([turn])  # every sibling comes back, no end does
        assert watch.demote == (turn + 1 >= EVIDENCE)
    watch.seen([-1, -2, -3])  # ends now come back at 3/16 of the siblings' rate: over 1/8
    assert not watch.demote


def test_watch_forgets_the_oldest_beyond_capacity() -> None:
    watch = ChainEndWatch(size=4)
    for end in range(10):
        watch.watch(end, None)
    assert list(watch._watched) == [6, 7, 8, 9]


def test_a_demoted_chain_end_is_the_first_victim() -> None:
    chains = conversation(partial_ends=True)
    distinct = len({block for chain in chains for block in chain})
    manager = CPUOffloadingManager(1, distinct, "sarc")
    replay_into(manager, chains)  # fills the cache exactly: nothing evicted yet
    assert manager._policy.chain_ends.demote
    newest = chains[-1]
    old_block = chains[0][0]
    output = manager.prepare_store([-1])
    assert output.block_hashes_evicted == [newest[-1]]
    assert manager.lookup([old_block]) == 1


def test_without_partial_ends_the_chain_end_keeps_its_rank() -> None:
    chains = conversation(partial_ends=False)
    distinct = len({block for chain in chains for block in chain})
    manager = CPUOffloadingManager(1, distinct, "sarc")
    replay_into(manager, chains)
    assert not manager._policy.chain_ends.demote
    evicted = manager.prepare_store([-1, -2, -3]).block_hashes_evicted
    assert chains[-1][-1] not in evicted
