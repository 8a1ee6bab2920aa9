"""Least recently used: one recency order over all cached blocks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from operator import itemgetter

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash


class LRUPolicy(CachePolicy):
    """Evicts the least recently inserted or touched idle blocks.

    Touching a request's chain makes its *first* block the most recent: every later hit on any
    part of the chain needs the head, so the head should outlive the tail.
    """

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self._blocks: OrderedDict[BlockHash, int] = OrderedDict()
        self.get = self._blocks.get  # the manager's hottest call, kept at C speed

    def get(self, block_hash: BlockHash) -> int | None:
        return self._blocks.get(block_hash)

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        self._blocks.update(zip(block_hashes, block_ids))

    def remove(self, block_hash: BlockHash) -> None:
        del self._blocks[block_hash]

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        for block_hash in reversed(block_hashes):
            if block_hash in blocks:
                move_to_end(block_hash)

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        pop = self._blocks.popitem
        victims = [pop(last=False) for _ in range(n)]
        # Usually the n least recent blocks are all evictable: check them in one C-level gather.
        hashes, block_ids = zip(*victims)
        ref_counts = (
            itemgetter(*block_ids)(self.ref_counts) if n > 1 else (self.ref_counts[block_ids[0]],)
        )
        if any(ref_counts) or not protected.isdisjoint(hashes):
            self._restore(victims)
            victims = self._evict_sparing(n, protected)
        return victims

    def _restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Put entries popped from the front back there, in their order."""
        blocks = self._blocks
        for block_hash, block_id in reversed(entries):
            blocks[block_hash] = block_id
            blocks.move_to_end(block_hash, last=False)

    def _evict_sparing(
        self, n: int, protected: AbstractSet[BlockHash]
    ) -> list[tuple[BlockHash, int]]:
        pop, ref_counts = self._blocks.popitem, self.ref_counts
        victims: list[tuple[BlockHash, int]] = []
        spared: list[tuple[BlockHash, int]] = []
        while len(victims) < n:
            block_hash, block_id = entry = pop(last=False)
            if ref_counts[block_id] == 0 and block_hash not in protected:
                victims.append(entry)
            else:
                spared.append(entry)
        self._restore(spared)
        return victims

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)
