"""Adaptive Replacement Cache (Megiddo & Modha, FAST 2003), with vLLM's touch-driven promotion."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence

from numbakv.policies.base import BlockStatus, CachePolicy, idle_victims
from numbakv.specs import BlockHash


class ARCPolicy(CachePolicy):
    """Splits the cache between blocks seen once recently (T1) and blocks seen again (T2).

    Ghost lists B1 and B2 remember hashes recently evicted from T1 and T2. A touch that finds a
    ghost shows which side was evicted too eagerly and moves the target size `p` of T1 towards it,
    so the split adapts to the workload without a knob.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        self.t1: OrderedDict[BlockHash, BlockStatus] = OrderedDict()
        self.t2: OrderedDict[BlockHash, BlockStatus] = OrderedDict()
        self.b1: OrderedDict[BlockHash, None] = OrderedDict()
        self.b2: OrderedDict[BlockHash, None] = OrderedDict()

    def get(self, block_hash: BlockHash) -> BlockStatus | None:
        block = self.t1.get(block_hash)
        return block if block is not None else self.t2.get(block_hash)

    def insert(self, block_hash: BlockHash, block: BlockStatus) -> None:
        self.t1[block_hash] = block
        self.b1.pop(block_hash, None)
        self.b2.pop(block_hash, None)

    def remove(self, block_hash: BlockHash) -> None:
        if self.t1.pop(block_hash, None) is None:
            del self.t2[block_hash]

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for block_hash in reversed(block_hashes):
            block = t1.pop(block_hash, None)
            if block is not None:
                # A block whose store is still in flight has not really been seen twice.
                (t2 if block.is_ready else t1)[block_hash] = block
            elif block_hash in t2:
                t2.move_to_end(block_hash)
            elif block_hash in b1:
                self.p = min(self.p + max(1.0, len(b2) / len(b1)), self.capacity)
                b1.move_to_end(block_hash)
            elif block_hash in b2:
                self.p = max(self.p - max(1.0, len(b1) / len(b2)), 0.0)
                b2.move_to_end(block_hash)

    def evict(
        self, n: int, protected: Collection[BlockHash]
    ) -> list[tuple[BlockHash, BlockStatus]]:
        # Victims come one at a time, as if the earlier ones were already gone: from T1 while what
        # remains of it is at least floor(p), else from T2, each side falling back on the other.
        from_t1 = idle_victims(self.t1.items(), protected)
        from_t2 = idle_victims(self.t2.items(), protected)
        target_t1 = int(self.p)
        remaining_t1 = len(self.t1)
        chosen_t1: list[tuple[BlockHash, BlockStatus]] = []
        chosen_t2: list[tuple[BlockHash, BlockStatus]] = []
        victims: list[tuple[BlockHash, BlockStatus]] = []
        for _ in range(n):
            sides = (from_t1, from_t2) if remaining_t1 >= target_t1 else (from_t2, from_t1)
            for side in sides:
                victim = next(side, None)
                if victim is not None:
                    break
            if side is from_t1:
                chosen_t1.append(victim)
                remaining_t1 -= 1
            else:
                chosen_t2.append(victim)
            victims.append(victim)
        # Lists change only now: the generators above walk them.
        self._retire(chosen_t1, self.t1, self.b1)
        self._retire(chosen_t2, self.t2, self.b2)
        return victims

    def _retire(
        self,
        victims: list[tuple[BlockHash, BlockStatus]],
        resident: OrderedDict[BlockHash, BlockStatus],
        ghosts: OrderedDict[BlockHash, None],
    ) -> None:
        for block_hash, _ in victims:
            del resident[block_hash]
            ghosts[block_hash] = None
        for _ in range(len(ghosts) - self.capacity):
            ghosts.popitem(last=False)

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
