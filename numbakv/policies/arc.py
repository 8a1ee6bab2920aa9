"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), with vLLM's touch-driven promotion."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from itertools import islice

from numbakv.policies.base import CachePolicy, idle_entries
from numbakv.specs import BlockHash


class ARCPolicy(CachePolicy):
    """Splits the cache between blocks seen once recently (T1) and blocks seen again (T2).

    Ghost lists B1 and B2 remember hashes recently evicted from T1 and T2. A touch that finds a
    ghost shows which side was evicted too eagerly and moves the target size `p` of T1 towards it,
    so the split adapts to the workload without a knob.
    """

    touches_before_storing = False  # vLLM's order: see request_finished
    reads_store_misses = True  # a ghost among a request's new blocks moves p

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self.p = 0.0
        self.t1: OrderedDict[BlockHash, int] = OrderedDict()
        self.t2: OrderedDict[BlockHash, int] = OrderedDict()
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()

    def get(self, block_hash: BlockHash) -> int | None:
        block_id = self.t1.get(block_hash)
        return block_id if block_id is not None else self.t2.get(block_hash)

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        self.t1.update(zip(block_hashes, block_ids))
        for block_hash in block_hashes:
            self.b1.pop(block_hash, None)
            self.b2.pop(block_hash, None)

    def remove(self, block_hash: BlockHash) -> None:
        if self.t1.pop(block_hash, None) is None:
            del self.t2[block_hash]

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        t1, t2 = self.t1, self.t2
        for block_hash in reversed(block_hashes):
            block_id = t1.pop(block_hash, None)
            if block_id is not None:
                # A block whose store is still in flight has not really been seen twice.
                ready = self.ref_counts[block_id] >= 0
                (t2 if ready else t1)[block_hash] = block_id
            elif block_hash in t2:
                t2.move_to_end(block_hash)
            else:
                self._adapt_to_ghost(block_hash)

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> None:
        """A request's new blocks, once per request: a ghost among them moves p (vLLM's rule)."""
        for block_hash in reversed(block_hashes):
            self._adapt_to_ghost(block_hash)

    def request_finished(
        self,
        block_hashes: Sequence[BlockHash],
        inserted: AbstractSet[BlockHash],
        reused: AbstractSet[BlockHash],
    ) -> None:
        """vLLM's ARC: a re-used block is one more access (T1 -> T2, or T2's newest); a block
        the request only stored keeps its list and becomes its newest; head first."""
        t1, t2 = self.t1, self.t2
        for block_hash in reversed(block_hashes):
            if block_hash in inserted:
                if block_hash in t1:
                    t1.move_to_end(block_hash)
                elif block_hash in t2:
                    t2.move_to_end(block_hash)
            elif block_hash in reused:
                block_id = t1.pop(block_hash, None)
                if block_id is not None:
                    t2[block_hash] = block_id
                elif block_hash in t2:
                    t2.move_to_end(block_hash)

    def _adapt_to_ghost(self, block_hash: BlockHash) -> None:
        """If the hash is a ghost, move p towards its side (T1 was evicted too early if it is in
        B1, T2 if in B2) and make it its ghost list's newest."""
        b1, b2 = self.b1, self.b2
        if block_hash in b1:
            self.p = min(self.p + max(1.0, len(b2) / len(b1)), self.capacity)
            b1.move_to_end(block_hash)
        elif block_hash in b2:
            self.p = max(self.p - max(1.0, len(b1) / len(b2)), 0.0)
            b2.move_to_end(block_hash)

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        # Victims come one at a time, as if the earlier ones were gone: from T1 while what remains
        # of it is at least floor(p), so the first len(T1) - floor(p) + 1 may come from T1; the
        # rest from T2, and from T1 again if T2 runs short.
        t1_first = max(0, min(n, len(self.t1) - int(self.p) + 1))
        t1_side = idle_entries(self.t1.items(), self.ref_counts, protected)
        from_t1 = list(islice(t1_side, t1_first))
        from_t2 = list(
            islice(idle_entries(self.t2.items(), self.ref_counts, protected), n - len(from_t1))
        )
        from_t1 += islice(t1_side, n - len(from_t1) - len(from_t2))
        retire_to_ghosts(from_t1, self.t1, self.b1, self.capacity)
        retire_to_ghosts(from_t2, self.t2, self.b2, self.capacity)
        return from_t1[:t1_first] + from_t2 + from_t1[t1_first:]

    def clear(self) -> None:
        self.p = 0.0
        for entries in (self.t1, self.t2, self.b1, self.b2):
            entries.clear()

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


def retire_to_ghosts(
    victims: Iterable[tuple[BlockHash, int]],
    resident: OrderedDict[BlockHash, int],
    ghosts: OrderedDict[BlockHash, None],
    ghost_limit: int,
) -> None:
    """Move evicted blocks from a resident list to the newest end of a ghost list, keeping at most
    `ghost_limit` ghosts (the oldest go)."""
    for block_hash, _ in victims:
        del resident[block_hash]
        ghosts[block_hash] = None
    for _ in range(len(ghosts) - ghost_limit):
        ghosts.popitem(last=False)
