"""Miniature simulations: run candidate settings of a policy on a sample of the traffic and follow
the one that hits most (after Waldspurger et al., "Cache Modeling and Optimization using
Miniature Simulations", USENIX ATC 2017)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol
from zlib import crc32

from numbakv.policies.sarc.ghosts import GhostList
from numbakv.specs import BlockHash

SAMPLING = 16  # one hash in SAMPLING is simulated ...
SMALLEST = 256  # ... unless that leaves a miniature below SMALLEST blocks,
LARGEST = 2_500  # ... or above LARGEST, their size at 40,000 blocks (memory stays bounded)
# Scores are halved whenever the best passes FORGET hits, so recent traffic counts more.
FORGET = 4000
# The leader gives way only to a challenger ahead of it by more than CONFIDENCE standard deviations
# of their per-request hit differences: close settings otherwise swap the lead on noise.
CONFIDENCE = 1.0


class Replaying(Protocol):
    """What the tuner needs of a miniature."""

    hits: float

    def request(self, chain: Sequence[BlockHash], distinct: bool = False) -> int: ...


def sampling_for(capacity: int) -> int:
    """1 in how many hashes a miniature of a `capacity`-block cache sees."""
    return max(1, min(SAMPLING, capacity // SMALLEST), capacity // LARGEST)


def sample_point(block_hash: BlockHash) -> int:
    """A number fixed per hash, to sample hashes by (`sample_point(h) % n == 0`: 1 in n).

    Python salts the hash() of bytes and str per process (vLLM's keys are bytes): those are
    sampled by CRC-32 instead, so that a deployment decides the same in every run."""
    if type(block_hash) is bytes:
        return crc32(block_hash)
    if type(block_hash) is str:
        return crc32(block_hash.encode())
    return hash(block_hash)


class SightingMiniature:
    """One fixed setting of Sighting ARC (`bound` x size on blocks seen once, where returning
    ghosts go) replayed on hashes alone, with the replay semantics of the real cache: hits are
    the leading cached run, then a touch, then the missing blocks are stored (instantly ready).

    Everything a miniature never meets is left out: block ids, ref counts, chain ends, reuse
    classes, stores that stay in flight. T1 and T2 map each hash to its clock tick, in recency
    order; stored blocks are ranked as they are stored (the first of a request the most recent).
    It hits, ranks and evicts exactly as `SightingARCPolicy(size, ..., setting)` does under that
    replay (tests/manager/test_miniatures.py replays both, the policy through
    tests/support/miniature.py).
    """

    def __init__(self, size: int, bound: float, returns_to_t2: bool, ghost_memory: int) -> None:
        self.size = size
        self.p = bound * size
        self.returns_to_t2 = returns_to_t2
        self.hits = 0.0
        self.t1: OrderedDict[BlockHash, int] = OrderedDict()
        self.t2: OrderedDict[BlockHash, int] = OrderedDict()
        self.b1 = GhostList(ghost_memory * size)
        self.b2 = GhostList(size)
        self._clock = 0  # the next tick

    def request(self, chain: Sequence[BlockHash], distinct: bool = False) -> int:
        """Replay one request (`distinct`: no hash appears twice in it); returns its hits."""
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        in_b1, in_b2 = b1.members, b2.members
        now = self._clock
        self._clock = now + 1
        # One pass does the touch (from the last hash to the first, so that the first ends the
        # most recent) and finds the hits (the cached run before the first miss: a touch keeps
        # every cached block cached) and the misses, last first: the order they are stored in.
        hits = len(chain)
        misses: list[BlockHash] = []
        ghosts: list[BlockHash] = []
        for position in range(hits - 1, -1, -1):
            block_hash = chain[position]
            if block_hash in t1:
                del t1[block_hash]
                t2[block_hash] = now
            elif block_hash in t2:
                t2.move_to_end(block_hash)
                t2[block_hash] = now
            else:
                hits = position
                misses.append(block_hash)
                if block_hash in in_b1:
                    b1.refresh(block_hash)
                    ghosts.append(block_hash)
                elif block_hash in in_b2:
                    b2.refresh(block_hash)
                    ghosts.append(block_hash)
        self.hits += hits
        if not misses:
            return hits
        if not distinct and len(misses) > 1:
            misses = list(dict.fromkeys(misses[::-1]))[::-1]  # each hash where it first appears
        size = self.size
        # All or nothing, like the manager: the request's new tail must fit.
        if len(chain) - hits > size and len(dict.fromkeys(chain[hits:])) > size:
            return hits
        shortfall = len(misses) - (size - len(t1) - len(t2))
        if shortfall > 0:
            self._evict(shortfall, now, chain[hits:])
        tick = self._clock
        self._clock = tick + len(misses)
        if not ghosts:
            for block_hash in misses:
                t1[block_hash] = tick
                tick += 1
            return hits
        # An eviction may have pushed a returning ghost out of its list: ask again.
        to_t2 = t2 if self.returns_to_t2 else t1
        for block_hash in misses:
            if block_hash in in_b1:
                b1.remove(block_hash)
                to_t2[block_hash] = tick
            elif block_hash in in_b2:
                b2.remove(block_hash)
                to_t2[block_hash] = tick
            else:
                t1[block_hash] = tick
            tick += 1
        return hits

    def _evict(self, n: int, now: int, tail: Sequence[BlockHash]) -> None:
        """Sighting ARC's victims, one at a time: T1's oldest while T1 is over p, else the older
        of the two lists' oldest; none of them in the request's `tail`.

        The touch moved every cached block of the request to T2 with tick `now`, and both lists
        are in tick order: all of T1 may leave, and all of T2 up to its first block of tick
        `now`; of those after it, the request's cached head (its hits) may still leave."""
        t1, t2 = self.t1, self.t2
        from_t1: list[BlockHash] = []
        while n and len(t1) > self.p:
            from_t1.append(t1.popitem(last=False)[0])
            n -= 1
        if n:
            # At or under the bound: merge the two lists' oldest by tick (T1 first on a tie),
            # popping each list's head (hash, tick) and putting back what is left unused.
            held: list[tuple[BlockHash, int]] = []  # T2's front blocks the request names
            head_t1 = t1.popitem(last=False) if t1 else None
            head_t2 = t2.popitem(last=False) if t2 else None
            while head_t2 is not None and head_t2[1] == now and head_t2[0] in tail:
                held.append(head_t2)
                head_t2 = t2.popitem(last=False) if t2 else None
            from_t2: list[BlockHash] = []
            for _ in range(n):
                if head_t2 is None or (head_t1 is not None and head_t1[1] <= head_t2[1]):
                    from_t1.append(head_t1[0])
                    head_t1 = t1.popitem(last=False) if t1 else None
                else:
                    from_t2.append(head_t2[0])
                    head_t2 = t2.popitem(last=False) if t2 else None
                    while head_t2 is not None and head_t2[1] == now and head_t2[0] in tail:
                        held.append(head_t2)
                        head_t2 = t2.popitem(last=False) if t2 else None
            for resident, front in ((t1, [head_t1]), (t2, [*held, head_t2])):
                for head in reversed(front):
                    if head is not None:
                        resident[head[0]] = head[1]
                        resident.move_to_end(head[0], last=False)
            if from_t2:
                self.b2.add_all(from_t2)
        if from_t1:
            self.b1.add_all(from_t1)


class MiniatureTuner:
    """Replays a 1-in-`sampling` sample of the hashes through one miniature per candidate and
    names the candidate whose miniature has hit clearly most lately.

    `undecided` leads until the miniatures' scores differ. Then the challenger is the best
    (`default` first among equals, else the first of them), and it takes the lead only when its
    lead is beyond noise (`CONFIDENCE`): a sample tells close settings apart slowly, and following
    each swap of two near-equal miniatures loses hits at full size.
    """

    def __init__(
        self, miniatures: Sequence[Replaying], sampling: int, default: int = 0, undecided: int = 0
    ) -> None:
        self.miniatures = list(miniatures)
        self.sampling = sampling
        self.default = default
        self.undecided = undecided
        self.leader = undecided
        # spread[i][j]: decayed sum over requests of (hits of i - hits of j) squared
        self.spread = [[0.0] * len(miniatures) for _ in miniatures]

    def observe(self, chain: Sequence[BlockHash]) -> int:
        """Feed one request's chain; returns the index of the leading candidate."""
        sampling = self.sampling
        sampled = [  # sample_point(block_hash) % sampling == 0, inlined: a call per hash costs 1%
            block_hash
            for block_hash in chain
            if (
                crc32(block_hash)
                if type(block_hash) is bytes
                else hash(block_hash)
                if type(block_hash) is not str
                else crc32(block_hash.encode())
            )
            % sampling
            == 0
        ]
        if not sampled:
            return self.leader
        distinct = len(sampled) < 2 or len(set(sampled)) == len(sampled)
        miniatures = self.miniatures
        self._add_spread([miniature.request(sampled, distinct) for miniature in miniatures])
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
