"""SIEVE: one FIFO queue, a visited bit per block, and a hand that sweeps from old to new.

Yazhuo Zhang, Juncheng Yang, Yao Yue, Ymir Vigfusson, K. V. Rashmi: "SIEVE is Simpler than LRU: an
Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI 2024.
https://www.usenix.org/conference/nsdi24/presentation/zhang-yazhuo
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash


class _Node:
    __slots__ = ("block_hash", "block_id", "newer", "older", "visited")

    def __init__(self, block_hash: BlockHash, block_id: int) -> None:
        self.block_hash = block_hash
        self.block_id = block_id
        self.visited = False
        self.newer: _Node | None = None
        self.older: _Node | None = None


class SIEVEPolicy(CachePolicy):
    """Lazy promotion and quick demotion with no reordering on hits.

    New blocks enter at the new end. The hand walks from the old end towards the new end: a
    visited block keeps its place and loses its bit, the first unvisited one is evicted and the hand
    stays where it was. Blocks that survive a sweep are the ones re-used since the last one.
    """

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self._nodes: dict[BlockHash, _Node] = {}
        self._newest: _Node | None = None
        self._oldest: _Node | None = None
        self._hand: _Node | None = None

    def get(self, block_hash: BlockHash) -> int | None:
        node = self._nodes.get(block_hash)
        return node.block_id if node is not None else None

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        for block_hash, block_id in zip(block_hashes, block_ids):
            node = _Node(block_hash, block_id)
            node.older = self._newest
            if self._newest is not None:
                self._newest.newer = node
            else:
                self._oldest = node
            self._newest = node
            self._nodes[block_hash] = node

    def remove(self, block_hash: BlockHash) -> None:
        self._unlink(self._nodes.pop(block_hash))

    def _unlink(self, node: _Node) -> None:
        if self._hand is node:
            self._hand = node.newer
        if node.older is not None:
            node.older.newer = node.newer
        else:
            self._oldest = node.newer
        if node.newer is not None:
            node.newer.older = node.older
        else:
            self._newest = node.older

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        nodes = self._nodes
        for block_hash in block_hashes:
            node = nodes.get(block_hash)
            if node is not None:
                node.visited = True

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        victims = []
        hand = self._hand
        while len(victims) < n:
            if hand is None:
                hand = self._oldest
            if self.ref_counts[hand.block_id] != 0 or hand.block_hash in protected:
                hand = hand.newer
            elif hand.visited:
                hand.visited = False
                hand = hand.newer
            else:
                victim, hand = hand, hand.newer
                self._hand = hand  # so that _unlink does not move it
                self._unlink(victim)
                del self._nodes[victim.block_hash]
                victims.append((victim.block_hash, victim.block_id))
        self._hand = hand
        return victims

    def clear(self) -> None:
        self._nodes.clear()
        self._newest = self._oldest = self._hand = None

    def __len__(self) -> int:
        return len(self._nodes)
