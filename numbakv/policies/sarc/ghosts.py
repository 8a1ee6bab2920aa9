"""Ghost lists: the hashes of recently evicted blocks, oldest first, at most a given number."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from itertools import chain

from numbakv.specs import BlockHash

# A compaction visits COMPACT_RATE places per place a later call adds (and per refresh or
# removal), so it is over once a third as many places as it found have been added, and no call
# pays for more than its own share; the call that starts it visits AT_ONCE places (a small list:
# all of them).
COMPACT_RATE = 4
AT_ONCE = 8192


class GhostList:
    """A bounded FIFO of hashes with O(1) membership, refresh and removal.

    An ordered dict would do, at about 180 bytes a hash; here a set answers membership and a deque
    keeps the order, about 50 bytes a hash. A refreshed or removed hash leaves its old place in the
    deque behind; `_stale` counts those places per hash, and trimming skips them. They are always
    older than the hash's live place, so a popped place is live exactly when its hash has none.

    A list that never fills is never trimmed, so once the deque holds `limit` stale places it is
    compacted: a small list at once, a large one a few places per later call (`COMPACT_RATE`), so
    that no call stalls.
    Meanwhile the places are, oldest first, `_compacted` (the live places already visited),
    `_pending` (those not visited yet, as the compaction found them) and `_order` (those added
    since); then the places added since are moved behind the compacted ones, again a few per call.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.members: set[BlockHash] = set()  # hot loops test membership here, at C speed
        self._order: deque[BlockHash] = deque()
        self._stale: dict[BlockHash, int] = {}
        self._compacted: deque[BlockHash] = deque()
        self._pending: deque[BlockHash] = deque()
        self._compacting = False

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self.members

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[BlockHash]:
        """Members, oldest first (for inspection: O(number of places))."""
        stale = dict(self._stale)
        for block_hash in chain(self._compacted, self._pending, self._order):
            if stale.get(block_hash):
                stale[block_hash] -= 1
            else:
                yield block_hash

    @property
    def places(self) -> int:
        """Places held, live and stale."""
        return len(self._compacted) + len(self._pending) + len(self._order)

    def add_all(self, block_hashes: Sequence[BlockHash]) -> None:
        """Hashes that are not members become the newest, in order; the oldest go beyond the limit."""
        members, stale = self.members, self._stale
        members.update(block_hashes)
        self._order.extend(block_hashes)
        excess = len(members) - self.limit  # trimmed after all, as if after each: FIFO either way
        pop_oldest = self._pop_oldest if self._compacting else self._order.popleft
        if not stale:
            for _ in range(excess):
                members.remove(pop_oldest())
        else:
            for _ in range(excess):
                oldest = pop_oldest()
                places = stale.get(oldest)
                while places:
                    if places == 1:
                        del stale[oldest]
                    else:
                        stale[oldest] = places - 1
                    oldest = pop_oldest()
                    places = stale.get(oldest)
                members.remove(oldest)
        if self._compacting:
            self._compact(COMPACT_RATE * len(block_hashes))

    def refresh(self, block_hash: BlockHash) -> None:
        """A member becomes the newest."""
        self._order.append(block_hash)
        self._leave_place(block_hash)

    def remove(self, block_hash: BlockHash) -> None:
        """Remove a member."""
        self.members.remove(block_hash)
        self._leave_place(block_hash)

    def _leave_place(self, block_hash: BlockHash) -> None:
        """A member's place goes stale."""
        stale = self._stale
        stale[block_hash] = stale.get(block_hash, 0) + 1
        if self._compacting:
            self._compact(COMPACT_RATE)
        elif len(self._order) > len(self.members) + self.limit:
            self._pending, self._order = self._order, deque()
            self._compacting = True
            self._compact(AT_ONCE)

    def _pop_oldest(self) -> BlockHash:
        """The oldest place, taken out, while a compaction is under way."""
        for places in (self._compacted, self._pending):
            if places:
                return places.popleft()
        return self._order.popleft()

    def _compact(self, budget: int) -> None:
        """Visit up to `budget` places: first the pending ones, whose stale places are dropped
        (by the trimming rule: `_compacted` holds no place of a hash with a pending one), then
        those added since, moved as they are."""
        pending, compacted, stale = self._pending, self._compacted, self._stale
        visits = min(budget, len(pending))
        for _ in range(visits):
            place = pending.popleft()
            places = stale.get(place)
            if not places:
                compacted.append(place)
            elif places == 1:
                del stale[place]
            else:
                stale[place] = places - 1
        order = self._order
        for _ in range(min(budget - visits, len(order))):
            compacted.append(order.popleft())
        if not pending and not order:
            self._order, self._compacted = compacted, order
            # The counts left are those of places gone stale meanwhile: a table sized for them
            # (a dict keeps the size of its peak, and the compaction visited a limit's worth).
            self._stale = dict(stale)
            self._compacting = False

    def clear(self) -> None:
        self.members.clear()
        self._order.clear()
        self._stale.clear()
        self._compacted.clear()
        self._pending.clear()
        self._compacting = False
