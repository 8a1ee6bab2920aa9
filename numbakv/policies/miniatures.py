"""Miniature simulations: run candidate settings of a policy on a sample of the traffic and follow
the one that hits most (after Waldspurger et al., "Cache Modeling and Optimization using
Miniature Simulations", USENIX ATC 2017)."""

from __future__ import annotations

from collections.abc import Sequence

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash

SAMPLING = 16  # one hash in SAMPLING is simulated ...
SMALLEST = 256  # ... unless that leaves a miniature below SMALLEST blocks
# Scores are halved whenever the best passes FORGET hits, so recent traffic counts more.
FORGET = 4000
# The leader gives way only to a challenger ahead of it by more than CONFIDENCE standard deviations
# of their per-request hit differences: close settings otherwise swap the lead on noise.
CONFIDENCE = 1.0


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

    def request(self, chain: Sequence[BlockHash]) -> int:
        """Replay one request; returns its hits."""
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
            return hits
        shortfall = len(missing) - len(self._free_ids)
        if shortfall > 0:
            victims = policy.evict(shortfall, tail.keys())
            self._free_ids += (block_id for _, block_id in victims)
        policy.insert(missing, [self._free_ids.pop() for _ in missing])
        return hits


class MiniatureTuner:
    """Replays a 1-in-`sampling` sample of the hashes through one miniature per candidate and
    names the candidate whose miniature has hit clearly most lately.

    `undecided` leads until the miniatures' scores differ. Then the challenger is the best
    (`default` first among equals, else the first of them), and it takes the lead only when its
    lead is beyond noise (`CONFIDENCE`): a sample tells close settings apart slowly, and following
    each swap of two near-equal miniatures loses hits at full size.
    """

    def __init__(
        self, candidates: Sequence[CachePolicy], sampling: int, default: int = 0, undecided: int = 0
    ) -> None:
        self.miniatures = [Miniature(policy) for policy in candidates]
        self.sampling = sampling
        self.default = default
        self.undecided = undecided
        self.leader = undecided
        # spread[i][j]: decayed sum over requests of (hits of i - hits of j) squared
        self.spread = [[0.0] * len(candidates) for _ in candidates]

    def observe(self, chain: Sequence[BlockHash]) -> int:
        """Feed one request's chain; returns the index of the leading candidate."""
        sampling = self.sampling
        sampled = [block_hash for block_hash in chain if hash(block_hash) % sampling == 0]
        if not sampled:
            return self.leader
        miniatures = self.miniatures
        self._add_spread([miniature.request(sampled) for miniature in miniatures])
        scores = [miniature.hits for miniature in miniatures]
        best = max(scores)
        if min(scores) == best:
            self.leader = self.undecided
        else:
            challenger = self.default if scores[self.default] == best else scores.index(best)
            lead = scores[challenger] - scores[self.leader]
            if (
                lead > 0
                and lead * lead > CONFIDENCE * CONFIDENCE * self.spread[challenger][self.leader]
            ):
                self.leader = challenger
        if best > FORGET:
            for miniature in miniatures:
                miniature.hits /= 2
            # A halved hit count has a quarter of the variance.
            self.spread = [[spread / 4 for spread in row] for row in self.spread]
        return self.leader

    def _add_spread(self, hits: list[int]) -> None:
        """Account one request's hit differences between every two miniatures."""
        if min(hits) == max(hits):
            return
        for i, row in enumerate(self.spread):
            for j, other in enumerate(hits):
                row[j] += (hits[i] - other) ** 2
