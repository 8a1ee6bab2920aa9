"""Sighting ARC: ARC that starts as LRU, remembers blocks seen once far back, and admits them into
its frequent side on their second sighting."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import count

from numbakv.policies.arc import ARCPolicy
from numbakv.policies.base import idle_entries, retire_to_ghosts
from numbakv.specs import BlockHash

SIGHTING_MEMORY = 4  # hashes of once-seen evicted blocks remembered, in cache capacities
EVIDENCE = 16  # re-used siblings seen before chain ends are judged against them
RARELY = 8  # chain ends are demoted when re-used less than 1/RARELY as often as their siblings
WATCHED = 4  # chain ends and siblings remembered: capacity / WATCHED hashes (results flat to 16)


class SightingARCPolicy(ARCPolicy):
    """Adapts online between LRU and "admit on the second sighting"; no knob.

    Most KV blocks are never used again, and those that are come back after a long gap (the next
    turn of a conversation). Like ARC (Megiddo & Modha, FAST 2003) it keeps T1 (blocks seen once),
    T2 (seen again), ghost lists B1 and B2 of evicted hashes, and a bound p on T1 moved by ghost
    hits. It differs from vLLM's ARC in five ways:

    - a block whose hash is a ghost is stored straight into T2, as in the paper (vLLM puts it back
      into T1, where the next burst of one-off blocks pushes it out again);
    - B1 remembers `SIGHTING_MEMORY` capacities of hashes, so a second sighting is recognised even
      when the gap is longer than the cache;
    - p starts at the capacity and, while T1 is within p, victims are the least recent blocks of
      either list: the policy is LRU until B2 hits (re-used blocks evicted too early) shrink p,
      and from then on once-seen blocks beyond p go first;
    - blocks stored since the last touch are ranked like a touched chain, the first the most recent:
      a hit on any of them needs the ones before it;
    - a chain's last block is ranked below every other block while it comes back far less often
      (under 1/`RARELY`) than the block before it: a prompt's last block is usually partial, so
      its hash changes when the conversation goes on. `ChainEndWatch` measures both rates online.
    """

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self.p = float(capacity)
        self.last_used: dict[BlockHash, int] = {}  # a clock tick per resident block
        self._clock = count()
        self._just_stored: dict[BlockHash, None] = {}  # in store order
        self.chain_ends = ChainEndWatch(max(1, capacity // WATCHED))

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        for block_hash, block_id in zip(block_hashes, block_ids):
            seen_before = block_hash in self.b1 or block_hash in self.b2
            self.b1.pop(block_hash, None)
            self.b2.pop(block_hash, None)
            (self.t2 if seen_before else self.t1)[block_hash] = block_id
            self._just_stored[block_hash] = None

    def _rank_just_stored(self) -> None:
        """Reorder the blocks stored since the last call (still the newest of their lists) so that
        the first of them ends the most recent, as a touch would; a chain end that is rarely
        re-used goes to the old end instead."""
        just_stored = self._just_stored
        if not just_stored:
            return
        for block_hash in reversed(just_stored):
            resident = self.t1 if block_hash in self.t1 else self.t2
            resident.move_to_end(block_hash)
            self.last_used[block_hash] = next(self._clock)
        stored = list(just_stored)
        just_stored.clear()
        if stored[-1] == self.chain_ends.last_touched:
            self.chain_ends.watch(stored[-1], stored[-2] if len(stored) > 1 else None)
            if self.chain_ends.demote:
                resident = self.t1 if stored[-1] in self.t1 else self.t2
                resident.move_to_end(stored[-1], last=False)
                self.last_used[stored[-1]] = -1

    def remove(self, block_hash: BlockHash) -> None:
        super().remove(block_hash)
        self.last_used.pop(block_hash, None)
        self._just_stored.pop(block_hash, None)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        self._rank_just_stored()
        self.chain_ends.seen(block_hashes)
        super().touch(block_hashes)  # ARC's promotion and ghost-driven p
        now = next(self._clock)
        for block_hash in block_hashes:
            if block_hash in self.t1 or block_hash in self.t2:
                self.last_used[block_hash] = now

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        # One victim at a time, as if the earlier ones were gone: T1's least recent while T1 is
        # over p, else the least recent of the two lists.
        self._rank_just_stored()
        last_used = self.last_used
        from_t1 = idle_entries(self.t1.items(), self.ref_counts, protected)
        from_t2 = idle_entries(self.t2.items(), self.ref_counts, protected)
        head_t1, head_t2 = next(from_t1, None), next(from_t2, None)
        remaining_t1 = len(self.t1)
        chosen_t1: list[tuple[BlockHash, int]] = []
        chosen_t2: list[tuple[BlockHash, int]] = []
        for _ in range(n):
            if head_t2 is None or (
                head_t1 is not None
                and (remaining_t1 > self.p or last_used[head_t1[0]] <= last_used[head_t2[0]])
            ):
                chosen_t1.append(head_t1)
                head_t1 = next(from_t1, None)
                remaining_t1 -= 1
            else:
                chosen_t2.append(head_t2)
                head_t2 = next(from_t2, None)
        # Lists change only now: the generators above walk them.
        for block_hash, _ in chosen_t1 + chosen_t2:
            del self.last_used[block_hash]
        retire_to_ghosts(chosen_t1, self.t1, self.b1, SIGHTING_MEMORY * self.capacity)
        retire_to_ghosts(chosen_t2, self.t2, self.b2, self.capacity)
        return chosen_t1 + chosen_t2

    def clear(self) -> None:
        super().clear()
        self.p = float(self.capacity)
        self.last_used.clear()
        self._just_stored.clear()
        self._clock = count()
        self.chain_ends = ChainEndWatch(max(1, self.capacity // WATCHED))


class ChainEndWatch:
    """How often stored chain ends come back, against the block stored just before each.

    Remembers the last `size` ends and siblings (hashes only, resident or not) and counts
    those a later touch names. Ends are demoted once siblings have come back `EVIDENCE` times
    and ends at under 1/`RARELY` of their rate.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.last_touched: BlockHash | None = None
        self._watched: dict[BlockHash, int] = {}  # hash -> 0 (chain end) or 1 (sibling)
        self._watched_count = [0, 0]
        self._reused_count = [0, 0]
        self.demote = False

    def seen(self, block_hashes: Sequence[BlockHash]) -> None:
        if not block_hashes:
            return
        self.last_touched = block_hashes[-1]
        watched = self._watched
        for block_hash in watched.keys() & block_hashes:
            self._reused_count[watched.pop(block_hash)] += 1
        ends, siblings = self._reused_count
        watched_ends, watched_siblings = self._watched_count
        self.demote = (
            siblings >= EVIDENCE and RARELY * ends * watched_siblings < siblings * watched_ends
        )

    def watch(self, end: BlockHash, sibling: BlockHash | None) -> None:
        watched = self._watched
        watched[end] = 0
        self._watched_count[0] += 1
        if sibling is not None:
            watched[sibling] = 1
            self._watched_count[1] += 1
        while len(watched) > self.size:
            del watched[next(iter(watched))]
