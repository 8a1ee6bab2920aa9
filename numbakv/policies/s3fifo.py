"""S3-FIFO: a small probationary FIFO, a main FIFO with reinsertion, and a ghost FIFO.

Juncheng Yang, Yazhuo Zhang, Ziyue Qiu, Yao Yue, K. V. Rashmi: "FIFO queues are all you need for
cache eviction", SOSP 2023. https://doi.org/10.1145/3600006.3613147
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash

SMALL_SHARE = 0.1  # the paper's 10% of the cache for the small queue
MAX_FREQUENCY = 3  # a 2-bit counter


class S3FIFOPolicy(CachePolicy):
    """Quick demotion: most blocks are used once, so new blocks wait in a small FIFO.

    A block re-used while in the small queue moves to the main queue when it reaches the end of the
    small one; the others leave and their hashes wait in a ghost queue. A block whose hash is found
    in the ghost queue goes straight to the main queue. The main queue is a FIFO that gives each
    block one more round per use (up to 3), like CLOCK.
    """

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        super().__init__(capacity, ref_counts)
        self.small_target = max(1, int(capacity * SMALL_SHARE))
        self.small: OrderedDict[BlockHash, int] = OrderedDict()
        self.main: OrderedDict[BlockHash, int] = OrderedDict()
        self.ghost: OrderedDict[BlockHash, None] = OrderedDict()
        self.frequency: dict[BlockHash, int] = {}

    def get(self, block_hash: BlockHash) -> int | None:
        block_id = self.small.get(block_hash)
        return block_id if block_id is not None else self.main.get(block_hash)

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        for block_hash, block_id in zip(block_hashes, block_ids):
            if block_hash in self.ghost:
                del self.ghost[block_hash]
                self.main[block_hash] = block_id
            else:
                self.small[block_hash] = block_id
            self.frequency[block_hash] = 0

    def remove(self, block_hash: BlockHash) -> None:
        if self.small.pop(block_hash, None) is None:
            del self.main[block_hash]
        del self.frequency[block_hash]

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        frequency = self.frequency
        for block_hash in block_hashes:
            uses = frequency.get(block_hash)
            if uses is not None and uses < MAX_FREQUENCY:
                frequency[block_hash] = uses + 1

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        victims: list[tuple[BlockHash, int]] = []
        while len(victims) < n:
            victim = None
            if len(self.small) >= self.small_target or not self.main:
                victim = self._evict_small(protected)
            if victim is None:
                victim = self._evict_main(protected)
            if victim is None:
                victim = self._evict_small(protected)
            victims.append(victim)
        return victims

    def _evict_small(self, protected: AbstractSet[BlockHash]) -> tuple | None:
        """Walk the small queue from its oldest block: promote re-used ones, evict the first other."""
        small, frequency = self.small, self.frequency
        skipped: list[tuple[BlockHash, int]] = []
        victim = None
        while small:
            block_hash, block_id = small.popitem(last=False)
            if self.ref_counts[block_id] != 0 or block_hash in protected:
                skipped.append((block_hash, block_id))
            elif frequency[block_hash] > 0:
                frequency[block_hash] = 0
                self.main[block_hash] = block_id
            else:
                victim = (block_hash, block_id)
                del frequency[block_hash]
                self.ghost[block_hash] = None
                if len(self.ghost) > len(self.main):
                    self.ghost.popitem(last=False)
                break
        # Blocks that could not leave keep their place at the old end.
        for block_hash, block_id in reversed(skipped):
            small[block_hash] = block_id
            small.move_to_end(block_hash, last=False)
        return victim

    def _evict_main(self, protected: AbstractSet[BlockHash]) -> tuple | None:
        """CLOCK over the main FIFO: a used block goes round again with one use less."""
        main, frequency = self.main, self.frequency
        for _ in range(len(main) * (MAX_FREQUENCY + 1)):
            block_hash, block_id = main.popitem(last=False)
            uses = frequency[block_hash]
            if self.ref_counts[block_id] != 0 or block_hash in protected:
                main[block_hash] = block_id
            elif uses > 0:
                frequency[block_hash] = uses - 1
                main[block_hash] = block_id
            else:
                del frequency[block_hash]
                return block_hash, block_id
        return None

    def clear(self) -> None:
        for entries in (self.small, self.main, self.ghost, self.frequency):
            entries.clear()

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def stats(self) -> dict[str, float]:
        return {"small": len(self.small), "main": len(self.main), "ghost": len(self.ghost)}
