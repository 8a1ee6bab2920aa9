"""Miniature simulations: run candidate settings of a policy on a sample of the traffic and follow
the one that hits most (after Waldspurger et al., "Cache Modeling and Optimization using
Miniature Simulations", USENIX ATC 2017)."""

from __future__ import annotations

from collections.abc import Sequence

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash

SAMPLING = 16  # one hash in SAMPLING is simulated ...
SMALLEST = 256  # ... unless that leaves a miniature below SMALLEST blocks
# Scores are halved whenever the leader's passes FORGET hits, so recent traffic counts more.
FORGET = 4000


def sampling_for(capacity: int) -> int:
    """1 in how many hashes a miniature of a `capacity`-block cache sees."""
    return max(1, min(SAMPLING, capacity // SMALLEST))


class Miniature:
    """A policy instance of capacity/sampling blocks fed the sampled hashes of every request,
    with the replay semantics of the real cache: hits are the leading cached run, then a touch,
    then the missing blocks are stored (instantly ready). Hashes only: no bytes, no manager."""

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy
        self.hits = 0.0
        self._free_ids = list(range(policy.capacity))

    def request(self, chain: Sequence[BlockHash]) -> None:
        policy = self.policy
        hits = 0
        for block_hash in chain:
            if policy.get(block_hash) is None:
                break
            hits += 1
        self.hits += hits
        policy.touch(chain)
        tail = dict.fromkeys(chain[hits:])  # in order, without repeats
        missing = [block_hash for block_hash in tail if policy.get(block_hash) is None]
        # Like the manager: all or nothing, and never evict a block the request names.
        if not missing or len(missing) > policy.capacity - (len(tail) - len(missing)):
            return
        shortfall = len(missing) - len(self._free_ids)
        if shortfall > 0:
            victims = policy.evict(shortfall, tail.keys())
            self._free_ids += (block_id for _, block_id in victims)
        policy.insert(missing, [self._free_ids.pop() for _ in missing])


class MiniatureTuner:
    """Replays a 1-in-`sampling` sample of the hashes through one miniature per candidate and
    names the candidate whose miniature has hit most lately.

    Ties are common (a sample tells close settings apart slowly), so they have rules: while every
    miniature has hit the same, `undecided` leads; `default` leads whenever it is among the best;
    otherwise the first of the best.
    """

    def __init__(
        self, candidates: Sequence[CachePolicy], sampling: int, default: int = 0, undecided: int = 0
    ) -> None:
        self.miniatures = [Miniature(policy) for policy in candidates]
        self.sampling = sampling
        self.default = default
        self.undecided = undecided
        self.leader = undecided

    def observe(self, chain: Sequence[BlockHash]) -> int:
        """Feed one request's chain; returns the index of the leading candidate."""
        sampling = self.sampling
        sampled = [block_hash for block_hash in chain if hash(block_hash) % sampling == 0]
        if not sampled:
            return self.leader
        miniatures = self.miniatures
        for miniature in miniatures:
            miniature.request(sampled)
        scores = [miniature.hits for miniature in miniatures]
        best = max(scores)
        if min(scores) == best:
            self.leader = self.undecided
        elif scores[self.default] == best:
            self.leader = self.default
        else:
            self.leader = scores.index(best)
        if best > FORGET:
            for miniature in miniatures:
                miniature.hits /= 2
        return self.leader
