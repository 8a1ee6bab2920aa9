"""Whether the last block of a request comes back as often as the blocks before it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from numbakv.specs import BlockHash

EVIDENCE = 16  # re-used siblings seen before chain ends are judged against them
RARELY = 8  # chain ends are demoted when re-used less than 1/RARELY as often as their siblings


class ChainEndWatch:
    """How often stored chain ends come back, against the block stored just before each.

    A prompt's last block is usually partial: when the conversation goes on, its content and hash
    change, so it never hits. This remembers the last `size` ends and siblings (hashes only,
    cached or not) and counts those a later touch names. `demote` turns on once siblings have come
    back `EVIDENCE` times and ends at under 1/`RARELY` of their rate.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.last_touched: BlockHash | None = None
        self._watched: OrderedDict[BlockHash, int] = OrderedDict()  # hash -> 0 (end) or 1 (sibling)
        self._watched_count = [0, 0]
        self._reused_count = [0, 0]
        self.demote = False

    def seen(self, block_hashes: Sequence[BlockHash]) -> None:
        """A request's chain was touched."""
        if not block_hashes:
            return
        self.last_touched = block_hashes[-1]
        watched = self._watched
        for block_hash in watched.keys() & block_hashes:
            self._reused_count[watched.pop(block_hash)] += 1
        ends, siblings = self._reused_count
        watched_ends, watched_siblings = self._watched_count
        self.demote = (
            siblings >= EVIDENCE and RARELY * ends * watched_siblings < siblings * watched_ends
        )

    def watch(self, end: BlockHash, sibling: BlockHash | None) -> None:
        """A chain end (and the block before it, if stored with it) was just stored."""
        watched = self._watched
        watched[end] = 0
        self._watched_count[0] += 1
        if sibling is not None:
            watched[sibling] = 1
            self._watched_count[1] += 1
        while len(watched) > self.size:
            watched.popitem(last=False)
