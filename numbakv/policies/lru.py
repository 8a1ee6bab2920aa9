"""Least recently used: one recency order over all cached blocks."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import islice
from operator import itemgetter

from numbakv.policies.base import NOT_READY, idle_entries
from numbakv.policies.block_table import BlockTable
from numbakv.policies.running_request import RunningRequest
from numbakv.request_access import RequestAccess
from numbakv.specs import BlockHash


class LRUPolicy(BlockTable):
    """Evicts the least recently inserted or touched idle blocks.

    Touching a request's chain makes its *first* block the most recent: every later hit on any
    part of the chain needs the head, so the head should outlive the tail. A finished request
    touches all its blocks, so a chain is evicted from its tail (vLLM 0.32's order).

    Where a running request knows its blocks' token positions (vLLM 0.33), the blocks it names
    take its rank, tails first (`RunningRequest`), unless they are more recent already. Its rank
    sits in `_where` as a marker; from the first such request on, each block's moment of
    becoming recent is kept (`_moved`) to compare with those ranks.
    """

    _where: OrderedDict[BlockHash, int]  # least recent first
    touches_before_storing = False  # vLLM's: a finished request touches every block it named

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts, OrderedDict())
        self._clear_ranks()

    def _clear_ranks(self) -> None:
        self._ranked = False  # whether a request has ranked blocks by position
        self._clock = 0
        self._moved: dict[BlockHash, int] = {}  # clock of each block's last move, once ranked
        self._running: dict[RequestAccess, RunningRequest] = {}
        self._running_of: dict[BlockHash, RunningRequest] = {}

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        self._where.update(zip(block_hashes, block_ids))
        if self._ranked:
            self._stamp(block_hashes)

    def remove(self, block_hash: BlockHash) -> None:
        del self._where[block_hash]
        if self._ranked:
            self._moved.pop(block_hash, None)
            running = self._running_of.pop(block_hash, None)
            if running is not None:
                running.discard(block_hash)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        blocks = self._where
        move_to_end = blocks.move_to_end
        if not self._ranked:
            for block_hash in reversed(block_hashes):
                if block_hash in blocks:
                    move_to_end(block_hash)
            return
        touched = [block_hash for block_hash in reversed(block_hashes) if block_hash in blocks]
        running_of = self._running_of
        for block_hash in touched:
            running = running_of.pop(block_hash, None)
            if running is not None:
                running.discard(block_hash)
            move_to_end(block_hash)
        self._stamp(touched)

    def _stamp(self, block_hashes: Sequence[BlockHash]) -> None:
        """These blocks became recent now, the last the most recent."""
        moved, clock = self._moved, self._clock
        for block_hash in block_hashes:
            clock += 1
            moved[block_hash] = clock
        self._clock = clock

    def request_finished(
        self,
        block_hashes: Sequence[BlockHash],
        inserted: AbstractSet[BlockHash],
        reused: AbstractSet[BlockHash],
    ) -> None:
        """Touch the chain, head first; a finished request's rank, emptied so, goes."""
        self.touch(block_hashes)
        for request, running in list(self._running.items()):
            if request.finished and not running.positions:
                del self._running[request], self._where[running]

    def request_access(self, request: RequestAccess, block_hashes: Sequence[BlockHash]) -> None:
        """Cached blocks the running request names take its rank at their position, unless
        they rank higher already (vLLM 0.33's LRU)."""
        running = self._running_request(request)
        rank, positions = running.rank, request.positions
        blocks, running_of, moved = self._where, self._running_of, self._moved
        for block_hash in block_hashes:
            position = positions(block_hash)
            if position is None or block_hash not in blocks:
                continue
            current = running_of.get(block_hash)
            if current is None:
                if moved.get(block_hash, 0) > rank:
                    continue
            elif (current.rank, -current.positions[block_hash]) >= (rank, -position):
                continue
            self._rank_with(running, block_hash, position)

    def request_inserted(self, request: RequestAccess, block_hashes: Sequence[BlockHash]) -> None:
        """The request's new blocks take its rank at their position (those it knows)."""
        positions = request.positions
        for block_hash in block_hashes:
            position = positions(block_hash)
            if position is not None:
                self._rank_with(self._running_request(request), block_hash, position)

    def _running_request(self, request: RequestAccess) -> RunningRequest:
        """The request's rank, taken (now) the first time it is asked for."""
        running = self._running.get(request)
        if running is None:
            self._ranked = True
            self._clock += 1
            running = self._running[request] = RunningRequest(request, self._clock)
            self._where[running] = NOT_READY  # its place in the order; no block id
        return running

    def _rank_with(self, running: RunningRequest, block_hash: BlockHash, position: int) -> None:
        current = self._running_of.get(block_hash)
        if current is not None:
            current.discard(block_hash)
        running.add(block_hash, position)
        self._running_of[block_hash] = running

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        if self._ranked:
            return self._evict_ranked(n, protected)
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

    def _evict_ranked(
        self, n: int, protected: AbstractSet[BlockHash]
    ) -> list[tuple[BlockHash, int]]:
        """The walk of `evict` through the order with its running requests' markers: each
        marker gives its request's blocks, tails first; their own entries are passed over."""
        blocks, ref_counts, running_of = self._where, self.ref_counts, self._running_of
        victims: list[tuple[BlockHash, int]] = []
        for entry, block_id in blocks.items():
            if type(entry) is RunningRequest:
                victims += entry.take_idle(n - len(victims), blocks, ref_counts, protected)
            elif ref_counts[block_id] == 0 and entry not in protected and entry not in running_of:
                victims.append((entry, block_id))
            else:
                continue
            if len(victims) == n:
                break
        moved = self._moved
        for block_hash, _ in victims:
            del blocks[block_hash]
            moved.pop(block_hash, None)
            running_of.pop(block_hash, None)
        return victims

    def clear(self) -> None:
        super().clear()
        self._clear_ranks()

    def __len__(self) -> int:
        return len(self._where) - len(self._running)

    def _restore(self, entries: list[tuple[BlockHash, int]]) -> None:
        """Put entries popped from the front back there, in their order."""
        blocks = self._where
        for block_hash, block_id in reversed(entries):
            blocks[block_hash] = block_id
            blocks.move_to_end(block_hash, last=False)
