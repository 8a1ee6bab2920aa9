"""Sighting ARC: ARC that starts as LRU, remembers blocks seen once far back, and admits them into
its frequent side on their second sighting."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import count

from numbakv.policies.base import CachePolicy, idle_entries, retire_to_ghosts
from numbakv.specs import BlockHash

SIGHTING_MEMORY = 4  # hashes of once-seen evicted blocks remembered, in cache capacities


class SightingARCPolicy(CachePolicy):
    """Adapts online between LRU and "admit on the second sighting"; no knob.

    Most KV blocks are never used again, and those that are come back after a long gap (the next
    turn of a conversation). Like ARC (Megiddo & Modha, FAST 2003) it keeps T1 (blocks seen once),
    T2 (seen again), ghost lists B1 and B2 of evicted hashes, and a bound p on T1 moved by ghost
    hits. It differs from vLLM's ARC in four ways:

    - a block whose hash is a ghost is stored straight into T2, as in the paper (vLLM puts it back
      into T1, where the next burst of one-off blocks pushes it out again);
    - B1 remembers `SIGHTING_MEMORY` capacities of hashes, so a second sighting is recognised even
      when the gap is longer than the cache;
    - p starts at the capacity and, while T1 is within p, victims are the least recent blocks of
      either list: the policy is LRU until B2 hits (re-used blocks evicted too early) shrink p,
      and from then on once-seen blocks beyond p go first;
    - blocks stored since the last touch are ranked like a touched chain, the first the most recent:
      a hit on any of them needs the ones before it.
    """

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self.t1: OrderedDict[BlockHash, int] = OrderedDict()
        self.t2: OrderedDict[BlockHash, int] = OrderedDict()
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()
        self.last_used: dict[BlockHash, int] = {}
        self._clock = count()
        self._just_stored: dict[BlockHash, None] = {}  # in store order
        self.p = float(capacity)

    def get(self, block_hash: BlockHash) -> int | None:
        block_id = self.t1.get(block_hash)
        return block_id if block_id is not None else self.t2.get(block_hash)

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        for block_hash, block_id in zip(block_hashes, block_ids):
            seen_before = block_hash in self.b1 or block_hash in self.b2
            self.b1.pop(block_hash, None)
            self.b2.pop(block_hash, None)
            (self.t2 if seen_before else self.t1)[block_hash] = block_id
            self._just_stored[block_hash] = None

    def _rank_just_stored(self) -> None:
        """Reorder the blocks stored since the last call (still the newest of their lists) so that
        the first of them ends the most recent, as a touch would."""
        for block_hash in reversed(self._just_stored):
            resident = self.t1 if block_hash in self.t1 else self.t2
            resident.move_to_end(block_hash)
            self.last_used[block_hash] = next(self._clock)
        self._just_stored.clear()

    def remove(self, block_hash: BlockHash) -> None:
        if self.t1.pop(block_hash, None) is None:
            del self.t2[block_hash]
        self.last_used.pop(block_hash, None)
        self._just_stored.pop(block_hash, None)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        self._rank_just_stored()
        t1, t2, b1, b2, last_used = self.t1, self.t2, self.b1, self.b2, self.last_used
        now = next(self._clock)
        # From the last hash to the first, so that the chain's head ends the most recent.
        for block_hash in reversed(block_hashes):
            block_id = t1.pop(block_hash, None)
            if block_id is not None:
                # A block whose store is still in flight has not really been seen twice.
                ready = self.ref_counts[block_id] >= 0
                (t2 if ready else t1)[block_hash] = block_id
                last_used[block_hash] = now
            elif block_hash in t2:
                t2.move_to_end(block_hash)
                last_used[block_hash] = now
            elif block_hash in b1:
                self.p = min(self.p + max(1.0, len(b2) / len(b1)), self.capacity)
                b1.move_to_end(block_hash)
            elif block_hash in b2:
                self.p = max(self.p - max(1.0, len(b1) / len(b2)), 0.0)
                b2.move_to_end(block_hash)

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
        for entries in (self.t1, self.t2, self.b1, self.b2, self.last_used, self._just_stored):
            entries.clear()
        self._clock = count()
        self.p = float(self.capacity)

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def stats(self) -> dict[str, float]:
        return {
            "p": self.p,
            "t1": len(self.t1),
            "t2": len(self.t2),
            "b1": len(self.b1),
            "b2": len(self.b2),
        }
