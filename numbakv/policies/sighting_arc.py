"""Sighting ARC: ARC's lists, a long memory of blocks seen once, and a bound on them chosen by
miniature simulations of itself."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import count
from typing import NamedTuple

from numbakv.policies.arc import ARCPolicy
from numbakv.policies.base import idle_entries, retire_to_ghosts
from numbakv.policies.chain_ends import ChainEndWatch
from numbakv.policies.miniatures import MiniatureTuner, sampling_for
from numbakv.policies.reuse_classes import ReuseClasses, block_class
from numbakv.specs import BlockHash

SIGHTING_MEMORY = 4  # hashes of once-seen evicted blocks remembered, in cache capacities
WATCHED = 4  # chain ends and siblings remembered: capacity / WATCHED hashes (results flat to 16)


class Setting(NamedTuple):
    """What the miniatures choose among."""

    bound: float  # on blocks seen once, x capacity
    returns_to_t2: bool  # a block whose hash is a ghost is stored into T2 (else into T1)


SETTINGS = (
    Setting(0.0, True),  # admit on the second sighting
    Setting(0.125, True),
    Setting(0.25, True),
    Setting(0.5, True),
    Setting(1.0, True),  # LRU
    Setting(0.0, False),  # keep what was hit while cached: survives loops larger than the cache
)
LRU = SETTINGS.index(Setting(1.0, True))  # the challenger whenever it ties for the most hits
UNDECIDED = SETTINGS.index(Setting(0.5, True))  # leads while all miniatures tie: the middle bound


class SightingARCPolicy(ARCPolicy):
    """Chooses online between LRU and "admit on the second sighting"; no knob.

    Most KV blocks are never used again, and those that are come back after a long gap (the next
    turn of a conversation). Like ARC (Megiddo & Modha, FAST 2003) it keeps T1 (blocks seen once),
    T2 (seen again), ghost lists B1 and B2 of evicted hashes, and a bound p on T1. Differences:

    - a block whose hash is a ghost is stored straight into T2, as in the paper (vLLM puts it back
      into T1, where the next burst of one-off blocks pushes it out again);
    - B1 remembers `SIGHTING_MEMORY` capacities of hashes, so a second sighting is recognised even
      when the gap is longer than the cache;
    - while T1 is within p, victims are the least recent blocks of either list (LRU); beyond p,
      once-seen blocks go first;
    - p is not moved by ghost hits but chosen among `SETTINGS`: miniature copies of this policy,
      one per setting, replay a sample of the traffic, and p follows the one that hits most once
      its lead is beyond noise (half the capacity until they differ);
    - one setting stores returning ghosts into T1 instead, so that T2 holds only blocks hit while
      cached: on a loop larger than the cache that part stays put and hits, where LRU hits nothing;
    - blocks stored since the last touch are ranked like a touched chain, the first the most recent:
      a hit on any of them needs the ones before it;
    - a chain's last block is ranked below every other block while it comes back far less often
      than the block before it (`ChainEndWatch`);
    - when T1 is over p, its victim is not simply the least recent: a block of a class of requests
      whose blocks come back less often goes sooner (`ReuseClasses`).

    `setting` fixes p and where ghosts return, and turns the last three rules off: that is what the
    miniatures run.
    """

    def __init__(
        self, capacity: int, ref_counts: Sequence[int], setting: Setting | None = None
    ) -> None:
        super().__init__(capacity, ref_counts)
        self.setting = setting
        self.last_used: dict[BlockHash, int] = {}  # a clock tick per resident block
        self._just_stored: dict[BlockHash, None] = {}  # in store order
        self._touched_length = 0  # blocks in the last touched chain
        self._start()

    def _start(self) -> None:
        """Fresh clock, setting, and (when self-tuned) miniatures and chain-end watch."""
        self._clock = count()
        if self.setting is not None:
            self._follow(self.setting)
            self._tuner = self.chain_ends = self.reuse = None
            return
        self._follow(SETTINGS[UNDECIDED])
        sampling = sampling_for(self.capacity)
        size = max(1, self.capacity // sampling)
        candidates = [SightingARCPolicy(size, [0] * size, setting) for setting in SETTINGS]
        self._tuner = MiniatureTuner(candidates, sampling, default=LRU, undecided=UNDECIDED)
        self.chain_ends = ChainEndWatch(max(1, self.capacity // WATCHED))
        self.reuse = ReuseClasses(self.capacity, (SIGHTING_MEMORY + 1) * self.capacity)

    def _follow(self, setting: Setting) -> None:
        self.p = setting.bound * self.capacity
        self.returns_to_t2 = setting.returns_to_t2

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        for block_hash, block_id in zip(block_hashes, block_ids):
            seen_before = block_hash in self.b1 or block_hash in self.b2
            self.b1.pop(block_hash, None)
            self.b2.pop(block_hash, None)
            (self.t2 if seen_before and self.returns_to_t2 else self.t1)[block_hash] = block_id
            self._just_stored[block_hash] = None

    def _rank_just_stored(self) -> None:
        """Reorder the blocks stored since the last call (still the newest of their lists) so that
        the first of them ends the most recent, as a touch would; a chain end that rarely comes
        back goes to the old end instead. Blocks seen once join their reuse class, taken from the
        last touched chain, whose tail they are."""
        just_stored = self._just_stored
        if not just_stored:
            return
        reuse, t1 = self.reuse, self.t1
        tail = len(just_stored)
        prefix = self._touched_length - tail
        for position, block_hash in zip(range(tail - 1, -1, -1), reversed(just_stored)):
            if block_hash in t1:
                t1.move_to_end(block_hash)
                if reuse is not None:
                    reuse.add(block_hash, block_class(prefix, tail, position))
            else:
                self.t2.move_to_end(block_hash)
            self.last_used[block_hash] = next(self._clock)
        newest = reversed(just_stored)
        end, sibling = next(newest), next(newest, None)
        just_stored.clear()
        chain_ends = self.chain_ends
        if chain_ends is not None and end == chain_ends.last_touched:
            chain_ends.watch(end, sibling)
            if chain_ends.demote:
                if end in t1:
                    t1.move_to_end(end, last=False)
                    reuse.demote(end)
                else:
                    self.t2.move_to_end(end, last=False)
                self.last_used[end] = -1

    def remove(self, block_hash: BlockHash) -> None:
        super().remove(block_hash)
        self.last_used.pop(block_hash, None)
        self._just_stored.pop(block_hash, None)
        if self.reuse is not None:
            self.reuse.leave(block_hash)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        self._rank_just_stored()
        self._touched_length = len(block_hashes)
        reuse = self.reuse
        if self._tuner is not None:
            self._follow(SETTINGS[self._tuner.observe(block_hashes)])
            self.chain_ends.seen(block_hashes)
            reuse.seen(block_hashes)
        super().touch(block_hashes)  # ARC's promotion; its ghost hits leave p alone (below)
        t1, t2, last_used = self.t1, self.t2, self.last_used
        now = next(self._clock)
        for block_hash in block_hashes:
            if block_hash in t2:
                last_used[block_hash] = now
                if reuse is not None:
                    reuse.leave(block_hash)  # promoted from T1, if it was there
            elif block_hash in t1:
                last_used[block_hash] = now

    def _adapt_to_ghost(self, in_b1: bool) -> None:
        """p comes from the setting (or the miniatures), not from ghost hits."""

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        # One victim at a time, as if the earlier ones were gone: while T1 is over p, T1's victim
        # (by reuse class when self-tuned, else its least recent); otherwise the least recent of
        # the two lists.
        self._rank_just_stored()
        t1, ref_counts, last_used, reuse = self.t1, self.ref_counts, self.last_used, self.reuse
        taken: set[BlockHash] = set()

        def evictable(block_hash: BlockHash) -> bool:
            return (
                block_hash not in taken
                and block_hash not in protected
                and ref_counts[t1[block_hash]] == 0
            )

        oldest_t1 = idle_entries(t1.items(), ref_counts, protected)
        from_t2 = idle_entries(self.t2.items(), ref_counts, protected)
        head_t1, head_t2 = next(oldest_t1, None), next(from_t2, None)
        remaining_t1 = len(t1)
        by_class = None if reuse is None else reuse.victims(next(self._clock), last_used, evictable)
        chosen_t1: list[tuple[BlockHash, int]] = []
        chosen_t2: list[tuple[BlockHash, int]] = []
        for _ in range(n):
            while head_t1 is not None and head_t1[0] in taken:
                head_t1 = next(oldest_t1, None)
            over_bound = remaining_t1 > self.p
            candidate = head_t1
            if over_bound and by_class is not None and head_t1 is not None:
                block_hash = next(by_class)  # T1 is all queued: one is left while head_t1 is
                candidate = (block_hash, t1[block_hash])
            if head_t2 is None or (
                candidate is not None
                and (over_bound or last_used[candidate[0]] <= last_used[head_t2[0]])
            ):
                chosen_t1.append(candidate)
                taken.add(candidate[0])
                remaining_t1 -= 1
            else:
                chosen_t2.append(head_t2)
                head_t2 = next(from_t2, None)
        # Lists change only now: the generators above walk them.
        for block_hash, _ in chosen_t1 + chosen_t2:
            del last_used[block_hash]
        if reuse is not None:
            for block_hash, _ in chosen_t1:
                reuse.leave(block_hash)
        retire_to_ghosts(chosen_t1, t1, self.b1, SIGHTING_MEMORY * self.capacity)
        retire_to_ghosts(chosen_t2, self.t2, self.b2, self.capacity)
        return chosen_t1 + chosen_t2

    def clear(self) -> None:
        super().clear()
        self.last_used.clear()
        self._just_stored.clear()
        self._start()
