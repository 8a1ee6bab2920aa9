"""ARC that admits a block into its frequent side on its second sighting, remembered far back."""

from __future__ import annotations

from collections import OrderedDict

from numbakv.policies.arc import ARCPolicy
from numbakv.policies.base import BlockStatus
from numbakv.specs import BlockHash

SIGHTING_MEMORY = 4  # recently evicted once-seen hashes remembered, in cache capacities


class SightingARCPolicy(ARCPolicy):
    """ARC as Megiddo & Modha wrote it, with a longer memory of blocks seen once.

    Most KV blocks are never used again, and those that are come back after a long gap (the next
    turn of a conversation). vLLM's ARC puts a returning block back into T1, the side of blocks seen
    once, where the next burst of one-off blocks pushes it out again. Here a block whose hash is
    still a ghost goes straight into T2 (seen twice), as in the paper; and B1 remembers
    `SIGHTING_MEMORY` capacities of hashes, so a second sighting is recognised even when the gap is
    longer than the cache. The target size p of T1 adapts as in ARC, from the middle.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = capacity / 2

    def insert(self, block_hash: BlockHash, block: BlockStatus) -> None:
        seen_before = block_hash in self.b1 or block_hash in self.b2
        self.b1.pop(block_hash, None)
        self.b2.pop(block_hash, None)
        (self.t2 if seen_before else self.t1)[block_hash] = block

    def _retire(
        self,
        victims: list[tuple[BlockHash, BlockStatus]],
        resident: OrderedDict[BlockHash, BlockStatus],
        ghosts: OrderedDict[BlockHash, None],
    ) -> None:
        for block_hash, _ in victims:
            del resident[block_hash]
            ghosts[block_hash] = None
        limit = self.capacity * (SIGHTING_MEMORY if ghosts is self.b1 else 1)
        for _ in range(len(ghosts) - limit):
            ghosts.popitem(last=False)

    def clear(self) -> None:
        super().clear()
        self.p = self.capacity / 2
