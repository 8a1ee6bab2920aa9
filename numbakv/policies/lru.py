"""Least recently used: one recency order over all cached blocks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from itertools import islice

from numbakv.policies.base import BlockStatus, CachePolicy, idle_victims
from numbakv.specs import BlockHash


class LRUPolicy(CachePolicy):
    """Evicts the least recently inserted or touched idle blocks.

    Touching a request's chain makes its *first* block the most recent: every later hit on any
    part of the chain needs the head, so the head should outlive the tail.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._blocks: OrderedDict[BlockHash, BlockStatus] = OrderedDict()

    def get(self, block_hash: BlockHash) -> BlockStatus | None:
        return self._blocks.get(block_hash)

    def insert(self, block_hash: BlockHash, block: BlockStatus) -> None:
        self._blocks[block_hash] = block

    def remove(self, block_hash: BlockHash) -> None:
        del self._blocks[block_hash]

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        blocks = self._blocks
        move_to_end = blocks.move_to_end
        for block_hash in reversed(block_hashes):
            if block_hash in blocks:
                move_to_end(block_hash)

    def evict(
        self, n: int, protected: Collection[BlockHash]
    ) -> list[tuple[BlockHash, BlockStatus]]:
        victims = list(islice(idle_victims(self._blocks.items(), protected), n))
        for block_hash, _ in victims:
            del self._blocks[block_hash]
        return victims

    def clear(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)
