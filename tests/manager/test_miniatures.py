"""Miniature simulations: the same replay as the manager, and a tuner that follows the best."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv import CPUOffloadingManager
from numbakv.policies import LRUPolicy, SIEVEPolicy, SightingARCPolicy
from numbakv.policies.sarc.miniatures import (
    FORGET,
    LARGEST,
    SAMPLING,
    SMALLEST,
    MiniatureTuner,
    SightingMiniature,
    sample_point,
    sampling_for,
)
from numbakv.policies.sarc.policy import LRU, SETTINGS, SIGHTING_MEMORY, Setting
from tests.support.miniature import Miniature
from tests.support.replaying import replay_into


def random_chains(seed: int, requests: int = 300) -> list[list[int]]:
    """Chains that share prefixes: each extends an earlier one or starts afresh, and now and then
    names a block twice (the manager takes that too)."""
    rng = random.Random(seed)
    fresh = iter(range(10**6))
    chains: list[list[int]] = []
    for _ in range(requests):
        base = rng.choice(chains)[: rng.randint(0, 6)] if chains and rng.random() < 0.7 else []
        chain = base + [next(fresh) for _ in range(rng.randint(1, 5))]
        if rng.random() < 0.1:
            chain.append(rng.choice(chain))
        chains.append(chain)
    return chains


def one_off_flood(requests: int = 400) -> list[list[int]]:
    """A hot prompt that comes back every 4th request between floods of one-off blocks."""
    fresh = iter(range(1000, 10**6))
    hot = list(range(8))
    return [hot if i % 4 == 0 else [next(fresh) for _ in range(12)] for i in range(requests)]


def chat(requests: int = 400, sessions: int = 6, turns: int = 3) -> list[list[int]]:
    """Sessions in turn, each re-sending its history for a few turns, then replaced by a new one:
    what was used most is already finished, only recency matters."""
    fresh = iter(range(1000, 10**6))
    histories: list[list[int]] = [[] for _ in range(sessions)]
    chains = []
    for i in range(requests):
        history = histories[i % sessions]
        if len(history) == 2 * turns:
            history.clear()
        history += [next(fresh), next(fresh)]
        chains.append(list(history))
    return chains


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("capacity", [3, 10, 40])
def test_a_miniature_hits_what_the_manager_hits(seed: int, capacity: int) -> None:
    chains = random_chains(seed)
    # SIEVE takes a request's touch before its store, in the replay as in a miniature
    manager = CPUOffloadingManager(1, capacity, "sieve")
    replay_into(manager, chains)
    miniature = Miniature(SIEVEPolicy(capacity, [0] * capacity))
    for chain in chains:
        miniature.request(chain)
    assert miniature.hits == manager.stats().hit_blocks > 0


def test_sampling_keeps_miniatures_big_enough_and_bounded() -> None:
    assert sampling_for(10) == 1
    assert sampling_for(SMALLEST * 4) == 4
    assert sampling_for(LARGEST * SAMPLING) == SAMPLING
    assert sampling_for(10**6) == 10**6 // LARGEST  # miniatures of LARGEST blocks


def test_the_tuner_samples_by_sample_point() -> None:
    """The tuner's inlined sampling and `sample_point` (the reuse classes' sampling) agree."""

    class Recorder:
        hits = 0.0

        def __init__(self) -> None:
            self.seen: list = []

        def request(self, chain, distinct: bool = False) -> int:
            self.seen += chain
            return 0

    recorder = Recorder()
    chain = ["block-3", *range(100, 140), *(bytes([i]) * 36 for i in range(40))]
    MiniatureTuner([recorder], sampling=4).observe(chain)
    assert recorder.seen == [h for h in chain if sample_point(h) % 4 == 0] != []


CHAINS = st.lists(
    st.lists(st.integers(0, 40), min_size=1, max_size=7).map(sorted), min_size=1, max_size=60
)


@settings(max_examples=150, deadline=None)
@given(chains=CHAINS, size=st.integers(1, 12), setting=st.sampled_from(SETTINGS))
def test_the_lean_miniature_decides_as_the_policy_with_that_setting(chains, size, setting) -> None:
    """SightingMiniature against Miniature(SightingARCPolicy(setting)): the same hits on every
    request, and the same lists, in order, after each."""
    lean = SightingMiniature(size, setting.bound, setting.returns_to_t2, SIGHTING_MEMORY)
    full = Miniature(SightingARCPolicy(size, [0] * size, setting))
    policy = full.policy
    for chain in chains:
        chain = chain + chain[:1] if len(chain) % 3 == 0 else chain  # now and then a repeat
        assert lean.request(chain, len(set(chain)) == len(chain)) == full.request(chain)
        assert list(lean.t1) == policy.t1
        assert list(lean.t2) == policy.t2
        assert list(lean.b1) == list(policy.b1)
        assert list(lean.b2) == list(policy.b2)
    assert lean.hits == full.hits


@pytest.mark.parametrize("setting", SETTINGS)
def test_a_request_may_evict_its_hits_but_not_its_tail(setting) -> None:
    """[1, 9, 2] on a full cache of 1 and 2: both were just touched, the newest of all; the
    store of 9 must evict 1 (a hit, not named in the store) and keep 2 (in the stored tail)."""
    lean = SightingMiniature(2, setting.bound, setting.returns_to_t2, SIGHTING_MEMORY)
    full = Miniature(SightingARCPolicy(2, [0] * 2, setting))
    for chain in ([1, 2], [1, 9, 2]):
        assert lean.request(chain, distinct=True) == full.request(chain)
    assert sorted([*lean.t1, *lean.t2]) == sorted([*full.policy.t1, *full.policy.t2]) == [2, 9]


def tuner_for(capacity: int) -> MiniatureTuner:
    settings = (Setting(1.0, True), Setting(0.0, True))
    miniatures = [
        SightingMiniature(capacity, setting.bound, setting.returns_to_t2, SIGHTING_MEMORY)
        for setting in settings
    ]
    return MiniatureTuner(miniatures, sampling=1)


def test_the_tuner_follows_the_candidate_that_hits_most() -> None:
    flooded, chatty = tuner_for(16), tuner_for(16)
    for chain in one_off_flood():
        flooded.observe(chain)
    for chain in chat():
        chatty.observe(chain)
    lru_like, admitting = (miniature.hits for miniature in flooded.miniatures)
    assert admitting > lru_like and flooded.leader == 1
    lru_like, admitting = (miniature.hits for miniature in chatty.miniatures)
    assert lru_like > admitting and chatty.leader == 0


def tuner_with_scores(*scores: float, default: int, undecided: int) -> MiniatureTuner:
    tuner = MiniatureTuner(
        [Miniature(LRUPolicy(4, [0] * 4)) for _ in scores],
        sampling=1,
        default=default,
        undecided=undecided,
    )
    for miniature, score in zip(tuner.miniatures, scores):
        miniature.hits = score
    return tuner


@pytest.mark.parametrize(
    ("scores", "leader"),
    [
        ((5, 5, 5, 5), 2),  # nothing told apart yet: undecided
        ((5, 7, 7, 3), 2),  # the leader is among the best: it stays
        ((5, 7, 7, 7), 2),  # even against the default
        ((9, 7, 7, 7), 0),  # the best
        ((5, 7, 3, 5), 1),
        ((5, 7, 3, 7), 3),  # the default first among equals
    ],
)
def test_tuner_tie_rules(scores: tuple[float, ...], leader: int) -> None:
    tuner = tuner_with_scores(*scores, default=3, undecided=2)
    assert tuner.leader == 2
    assert tuner.observe([100]) == leader  # a miss everywhere: scores unchanged


@pytest.mark.parametrize(("spread", "leader"), [(9.0, 2), (3.0, 0)])
def test_a_lead_within_noise_keeps_the_leader(spread: float, leader: int) -> None:
    tuner = tuner_with_scores(9, 7, 7, 7, default=3, undecided=2)
    tuner.spread[0][2] = tuner.spread[2][0] = spread  # a lead of 2 hits; 1 sd is 3 or 1.7 hits
    assert tuner.observe([100]) == leader


def test_spread_sums_squared_differences_per_request() -> None:
    tuner = MiniatureTuner(
        [Miniature(LRUPolicy(4, [0] * 4)), Miniature(LRUPolicy(1, [0]))], sampling=1
    )
    for chain in ([1, 2], [1, 2], [1, 2]):  # hits: 0 and 0, then 2 and 0, then 2 and 0
        tuner.observe(chain)
    assert tuner.spread == [[0, 8], [8, 0]]


def test_scores_are_halved_past_forget() -> None:
    hot = list(range(100))
    tuner = MiniatureTuner([Miniature(LRUPolicy(100, [0] * 100))], sampling=1)
    for _ in range(FORGET // 100 + 2):
        tuner.observe(hot)
    assert FORGET / 2 < tuner.miniatures[0].hits <= FORGET


def test_sarc_takes_its_bound_from_the_tuner() -> None:
    for chains, expected in ((one_off_flood(), SETTINGS[0]), (chat(), SETTINGS[LRU])):
        manager = CPUOffloadingManager(1, 16, "sarc")
        replay_into(manager, chains)
        assert manager._policy.p == expected.bound * 16
        assert manager._policy.returns_to_t2 == expected.returns_to_t2


def test_a_fixed_setting_runs_no_miniatures() -> None:
    policy = SightingARCPolicy(100, [0] * 100, Setting(0.25, True))
    policy.touch([1, 2, 3])
    assert policy.p == 25
    assert policy.chain_ends is None
    assert policy.reuse is None


def test_sarc_keeps_part_of_a_loop_larger_than_the_cache() -> None:
    """Documents read round-robin (and every fifth read at random), twice as many blocks as the
    cache: LRU evicts each one just before the loop comes back to it; keeping what was hit while
    cached holds part of the loop."""
    rng = random.Random(0)
    documents = [list(range(start, start + 4)) for start in range(0, 80, 4)]
    loop = [documents[i % 20] if i % 5 else rng.choice(documents) for i in range(600)]
    hits = {}
    for policy in ("lru", "arc", "sarc"):
        manager = CPUOffloadingManager(1, 40, policy)
        replay_into(manager, loop)
        hits[policy] = manager.stats().hit_blocks
    assert hits["sarc"] > 1.5 * max(hits["lru"], hits["arc"])
    assert manager._policy.returns_to_t2 is False


SAMPLED_REPLAY = """
import hashlib
from numbakv.policies.sarc.miniatures import MiniatureTuner
from numbakv.policies import LRUPolicy
from tests.support.miniature import Miniature
from tests.manager.test_miniatures import random_chains

tuner = MiniatureTuner([Miniature(LRUPolicy(8, [0] * 8))], sampling=4)
for chain in random_chains(0):
    tuner.observe([hashlib.sha256(str(h).encode()).digest() + bytes(4) for h in chain])
    tuner.observe([f"block-{h}" for h in chain])
print(tuner.miniatures[0].hits)
"""


def test_the_sample_is_the_same_in_every_process() -> None:
    """bytes and str hashes (vLLM's keys are bytes) are sampled alike whatever Python's per-process
    hash salt, so a deployment's hits do not change from run to run."""
    hits = {
        subprocess.run(
            [sys.executable, "-c", SAMPLED_REPLAY],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(hits) == 1 and float(hits.pop()) > 0
