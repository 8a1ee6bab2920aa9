"""Ghost lists: the hashes of recently evicted blocks, oldest first, at most a given number."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from numbakv.specs import BlockHash


class GhostList:
    """A bounded FIFO of hashes with O(1) membership, refresh and removal.

    An ordered dict would do, at about 180 bytes a hash; here a set answers membership and a deque
    keeps the order, about 50 bytes a hash. A refreshed or removed hash leaves its old place in the
    deque behind; `_stale` counts those places per hash, and trimming skips them. They are always
    older than the hash's live place, so a popped place is live exactly when its hash has none.
    A list that never fills is never trimmed, so once the deque holds `limit` stale places it is
    rebuilt without them: O(limit), at most once per `limit` removals or refreshes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.members: set[BlockHash] = set()  # hot loops test membership here, at C speed
        self._order: deque[BlockHash] = deque()
        self._stale: dict[BlockHash, int] = {}

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self.members

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[BlockHash]:
        """Members, oldest first (for inspection: O(length of the deque))."""
        stale = dict(self._stale)
        for block_hash in self._order:
            if stale.get(block_hash):
                stale[block_hash] -= 1
            else:
                yield block_hash

    def add_all(self, block_hashes: Sequence[BlockHash]) -> None:
        """Hashes that are not members become the newest, in order; the oldest go beyond the limit."""
        members, order, stale = self.members, self._order, self._stale
        members.update(block_hashes)
        order.extend(block_hashes)
        excess = len(members) - self.limit  # trimmed after all, as if after each: FIFO either way
        if not stale:
            for _ in range(excess):
                members.remove(order.popleft())
            return
        for _ in range(excess):
            oldest = order.popleft()
            places = stale.get(oldest)
            while places:
                if places == 1:
                    del stale[oldest]
                else:
                    stale[oldest] = places - 1
                oldest = order.popleft()
                places = stale.get(oldest)
            members.remove(oldest)

    def refresh(self, block_hash: BlockHash) -> None:
        """A member becomes the newest."""
        self._order.append(block_hash)
        self._leave_place(block_hash)

    def remove(self, block_hash: BlockHash) -> None:
        """Remove a member."""
        self.members.remove(block_hash)
        self._leave_place(block_hash)

    def _leave_place(self, block_hash: BlockHash) -> None:
        """A member's place in the deque goes stale."""
        stale = self._stale
        stale[block_hash] = stale.get(block_hash, 0) + 1
        if len(self._order) > len(self.members) + self.limit:
            self._order = deque(self)
            stale.clear()

    def clear(self) -> None:
        self.members.clear()
        self._order.clear()
        self._stale.clear()
