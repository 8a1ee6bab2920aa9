"""Least recently used: one recency order over all cached blocks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import islice
from operator import itemgetter

from numbakv.policies.base import idle_entries
from numbakv.policies.block_table import BlockTable
from numbakv.specs import BlockHash


class LRUPolicy(BlockTable):
    """Evicts the least recently inserted or touched idle blocks.

    Touching a request's chain makes its *first* block the most recent: every later hit on any
    part of the chain needs the head, so the head should outlive the tail. A finished request
    touches all its blocks, so a chain is evicted from its tail (vLLM 0.32's order).
    """

    _where: OrderedDict[BlockHash, int]  # least recent first
    touches_before_storing = False  # vLLM's: a finished request touches every block it named

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts, OrderedDict())

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        self._where.update(zip(block_hashes, block_ids))

    def remove(self, block_hash: BlockHash) -> None:
        del self._where[block_hash]

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        blocks = self._where
        move_to_end = blocks.move_to_end
        for block_hash in reversed(block_hashes):
            if block_hash in blocks:
                move_to_end(block_hash)

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        pop = self._where.popitem
        victims = [pop(last=False) for _ in range(n)]
        # Usually the n least recent blocks are all evictable: check them in one C-level gather.
        hashes, block_ids = zip(*victims)
        ref_counts = (
            itemgetter(*block_ids)(self.ref_counts) if n > 1 else (self.ref_counts[block_ids[0]],)
        )
        if any(ref_counts) or not protected.isdisjoint(hashes):
            self._restore(victims)
            victims = list(islice(idle_entries(self._where.items(), self.ref_counts, protected), n))
            for block_hash, _ in victims:
                del self._where[block_hash]
        return victims

    def _restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Put entries popped from the front back there, in their order."""
        blocks = self._where
        for block_hash, block_id in reversed(entries):
            blocks[block_hash] = block_id
            blocks.move_to_end(block_hash, last=False)
