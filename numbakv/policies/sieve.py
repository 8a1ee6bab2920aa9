"""SIEVE: one FIFO queue, a visited bit per block, and a hand that sweeps from old to new.

Yazhuo Zhang, Juncheng Yang, Yao Yue, Ymir Vigfusson, K. V. Rashmi: "SIEVE is Simpler than LRU: an
Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI 2024.
https://www.usenix.org/conference/nsdi24/presentation/zhang-yazhuo
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from numbakv.policies.block_lists import BlockLists
from numbakv.policies.block_table import BlockTable
from numbakv.specs import BlockHash


class SIEVEPolicy(BlockTable):
    """Lazy promotion and quick demotion with no reordering on hits.

    New blocks enter at the new end. The hand walks from the old end towards the new end: a
    visited block keeps its place and loses its bit, the first unvisited one is evicted and the hand
    stays where it was. Blocks that survive a sweep are the ones re-used since the last one.

    The queue is threaded through host block ids (`BlockLists`), with a visited byte per id: no
    Python object per block, so the garbage collector has nothing to walk.
    """

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self._hash_of: list[BlockHash] = [None] * capacity
        self._visited = bytearray(capacity)
        self._queue = BlockLists(capacity, 1)
        self._end = self._queue.sentinel(0)
        self._hand = self._end  # at the sentinel: the next sweep starts from the oldest

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        hash_of, visited = self._hash_of, self._visited
        for block_hash, block_id in zip(block_hashes, block_ids):
            hash_of[block_id] = block_hash
            visited[block_id] = 0
        self._queue.push_newest_all(block_ids, self._end)
        self._where.update(zip(block_hashes, block_ids))

    def remove(self, block_hash: BlockHash) -> None:
        block_id = self._where.pop(block_hash)
        if self._hand == block_id:
            self._hand = self._queue.newer[block_id]
        self._queue.unlink(block_id)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        get, visited = self._where.get, self._visited
        for block_hash in block_hashes:
            block_id = get(block_hash)
            if block_id is not None:
                visited[block_id] = 1

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        newer, older, end = self._queue.newer, self._queue.older, self._end
        pinned, hash_of, visited, where = self.ref_counts, self._hash_of, self._visited, self._where
        victims: list[tuple[BlockHash, int]] = []
        hand = self._hand
        while len(victims) < n:
            if hand == end:
                hand = newer[end]
            if pinned[hand] or hash_of[hand] in protected:
                hand = newer[hand]
            elif visited[hand]:
                visited[hand] = 0
                hand = newer[hand]
            else:  # unlinked now, not batched after the sweep: the hand may come round again
                before, after = older[hand], newer[hand]
                newer[before] = after
                older[after] = before
                block_hash = hash_of[hand]
                del where[block_hash]
                victims.append((block_hash, hand))
                hand = after
        self._hand = hand
        return victims

    def clear(self) -> None:
        super().clear()
        self._queue.clear()
        self._hand = self._end
