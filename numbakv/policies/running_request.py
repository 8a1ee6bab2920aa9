"""A running request's blocks inside LRU's order, as vLLM 0.33 ranks them.

vLLM 0.33's LRU gives every block a request names, while that request runs, one rank: the moment
the request first named a block. Among themselves the request's blocks go by token position,
the tail first, so pressure takes a running request's chain from its end (its head is what a
later turn needs). When the request finishes, its blocks become recent as in vLLM 0.32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from heapq import heapify, heappop, heappush

from numbakv.request_access import RequestAccess
from numbakv.specs import BlockHash


class RunningRequest:
    """The blocks ranked with one running request: its place in LRU's order (`rank`) and each
    block's end-token position. Doubles as the request's marker in LRU's ordered map."""

    __slots__ = ("_heap", "positions", "rank", "request")

    def __init__(self, request: RequestAccess, rank: int) -> None:
        self.request = request
        self.rank = rank
        self.positions: dict[BlockHash, int] = {}
        self._heap: list[tuple[int, BlockHash]] = []  # (-position, hash); left ones are stale

    def add(self, block_hash: BlockHash, position: int) -> None:
        self.positions[block_hash] = position
        heappush(self._heap, (-position, block_hash))

    def discard(self, block_hash: BlockHash) -> None:
        del self.positions[block_hash]
        if len(self._heap) > 2 * len(self.positions) + 64:  # drop the stale entries
            self._heap = [(-position, h) for h, position in self.positions.items()]
            heapify(self._heap)

    def take_idle(
        self,
        n: int,
        block_ids: Mapping[BlockHash, int],
        ref_counts: Sequence[int],
        protected: AbstractSet[BlockHash],
    ) -> list[tuple[BlockHash, int]]:
        """Up to n idle, unprotected (hash, block id) pairs, the latest position first (ties by
        hash, as vLLM breaks them), taken out of this request."""
        heap, positions = self._heap, self.positions
        victims: list[tuple[BlockHash, int]] = []
        spared = []
        while heap and len(victims) < n:
            entry = heappop(heap)
            negated, block_hash = entry
            if positions.get(block_hash) != -negated:
                continue  # left the request (or taken already)
            block_id = block_ids[block_hash]
            if ref_counts[block_id] == 0 and block_hash not in protected:
                victims.append((block_hash, block_id))
                del positions[block_hash]
            else:
                spared.append(entry)
        for entry in spared:
            heappush(heap, entry)
        return victims
