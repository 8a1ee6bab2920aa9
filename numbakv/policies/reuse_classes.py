"""How often blocks seen once come back, by the shape of the request that stored them."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from heapq import heapify, heappop, heapreplace

from numbakv.policies.block_lists import BlockLists
from numbakv.specs import BlockHash

# A stored block's class: buckets of the request's cached prefix, of its new tail and of the
# block's position in that tail (all in blocks; each bucket holds values from its edge up).
PREFIX_EDGES = (1, 2, 3, 4, 8, 16)
TAIL_EDGES = (2, 4, 8, 16, 32, 64)
POSITION_EDGES = (1, 2, 4, 8, 16, 32)
BUCKETS = len(PREFIX_EDGES) + 1  # the same for the three
CLASSES = BUCKETS**3
PRIOR = 100  # every class starts as this many blocks re-used at the mean rate
HALVE_AFTER = 8  # counts halve once this many capacities of blocks have been classed


def block_class(prefix: int, tail: int, position: int) -> int:
    """The class of the block at `position` of a request's `tail` new blocks after `prefix`
    cached ones: its three buckets as one number, ordered as the (prefix, tail, position) tuples."""
    return group_class(prefix, tail) + position_bucket(position)


def group_class(prefix: int, tail: int) -> int:
    """The class of a request's new blocks, less their positions."""
    return (bisect_right(PREFIX_EDGES, prefix) * BUCKETS + bisect_right(TAIL_EDGES, tail)) * BUCKETS


def position_bucket(position: int) -> int:
    return POSITION_BUCKETS[position] if position < len(POSITION_BUCKETS) else BUCKETS - 1


POSITION_BUCKETS = tuple(bisect_right(POSITION_EDGES, p) for p in range(POSITION_EDGES[-1]))
"""The bucket of each position below the last edge (the rest are in the last bucket)."""


class ReuseClasses:
    """Blocks seen once, queued by class in rank order, and how often each class comes back.

    Whether a once-seen block is used again is mostly whether its conversation goes on, and the
    request that stored it says a little about that: a first turn's blocks come back about twice
    as often as a later turn's. Each class counts its stored blocks and those a later touch names
    while their class is remembered (`memory` blocks, the most recently stored). The victim is
    the class head with the largest age divided by its class's re-use rate: a class that comes
    back half as often ages twice as fast.

    Queued blocks are host block ids, linked per class through `BlockLists`; the remembered
    classes are kept by hash, since a block is often named again after it was evicted.
    """

    def __init__(self, capacity: int, memory: int, ticks: Sequence[float]) -> None:
        self.capacity = capacity
        self.memory = memory
        self._ticks = ticks  # the policy's clock tick per block id, which ages are taken from
        self._queues = BlockLists(capacity, CLASSES)
        self._class_of = [-1] * capacity  # queued block -> its class, -1 when not queued
        self._sizes = [0] * CLASSES  # queued blocks per class
        self._heads: dict[int, int] = {}  # class -> its oldest block, for the classes with any
        # Stored, not yet seen again, oldest first (a dict would rescan its deleted front entries).
        self._remembered: OrderedDict[BlockHash, int] = OrderedDict()
        self._stored = [0.0] * CLASSES
        self._reused = [0.0] * CLASSES
        self._total_stored = 0.0
        self._total_reused = 0.0

    @property
    def queued(self) -> dict[int, int]:
        """Queued blocks per class, for the classes with any."""
        return {block_class: self._sizes[block_class] for block_class in self._heads}

    def add_all(
        self, block_ids: Sequence[int], block_hashes: Sequence[BlockHash], classes: Sequence[int]
    ) -> None:
        """Blocks just stored join their classes as the most recent, in order."""
        newer, older = self._queues.newer, self._queues.older
        first, class_of, sizes, heads = self.capacity, self._class_of, self._sizes, self._heads
        remembered, stored = self._remembered, self._stored
        total, halve_at = self._total_stored, HALVE_AFTER * self.capacity
        for block_id, block_hash, block_class in zip(block_ids, block_hashes, classes):
            class_of[block_id] = block_class
            end = first + block_class
            newest = older[end]
            newer[newest] = block_id
            older[block_id] = newest
            newer[block_id] = end
            older[end] = block_id
            if not sizes[block_class]:
                heads[block_class] = block_id
            sizes[block_class] += 1
            remembered[block_hash] = block_class
            stored[block_class] += 1
            total += 1
            if total > halve_at:
                stored[:] = [count / 2 for count in stored]
                self._reused[:] = [count / 2 for count in self._reused]
                total /= 2
                self._total_reused /= 2
        self._total_stored = total
        for _ in range(len(remembered) - self.memory):  # the oldest go, as if after each add
            remembered.popitem(last=False)

    def renew(self, block_id: int) -> None:
        """A queued block touched again (while its store is in flight) becomes the newest of its
        class, so that each class stays in tick order."""
        block_class = self._class_of[block_id]
        heads = self._heads
        if heads[block_class] == block_id:
            after = self._queues.newer[block_id]
            if after != self.capacity + block_class:
                heads[block_class] = after
        self._queues.unlink(block_id)
        self._queues.push_newest(block_id, self.capacity + block_class)

    def demote(self, block_id: int) -> None:
        """A queued block becomes the oldest of its class."""
        block_class = self._class_of[block_id]
        self._queues.unlink(block_id)
        self._queues.push_oldest(block_id, self.capacity + block_class)
        self._heads[block_class] = block_id

    def leave_all(self, block_ids: Iterable[int]) -> None:
        """Blocks no longer seen once (hit, evicted, or removed); others are ignored."""
        newer, older = self._queues.newer, self._queues.older
        class_of, sizes, heads = self._class_of, self._sizes, self._heads
        for block_id in block_ids:
            block_class = class_of[block_id]
            if block_class < 0:
                continue
            class_of[block_id] = -1
            before, after = older[block_id], newer[block_id]
            newer[before] = after
            older[after] = before
            sizes[block_class] -= 1
            if not sizes[block_class]:
                del heads[block_class]
            elif heads[block_class] == block_id:
                heads[block_class] = after

    def seen(self, block_hashes: Sequence[BlockHash]) -> None:
        """A touch named these hashes: remembered ones count as re-used, once."""
        pop = self._remembered.pop
        reused = self._reused
        for block_hash in block_hashes:
            block_class = pop(block_hash, None)
            if block_class is not None:
                reused[block_class] += 1
                self._total_reused += 1

    def slowness(self) -> Callable[[int], float]:
        """1 / re-use rate, per class, drawn towards the mean while a class has few blocks (1 for
        all while nothing has come back: no class is worse)."""
        if not self._total_reused:
            return lambda block_class: 1.0
        mean = self._total_reused / self._total_stored
        stored, reused, prior_reused = self._stored, self._reused, PRIOR * mean
        return lambda block_class: (
            (stored[block_class] + PRIOR) / (reused[block_class] + prior_reused)
        )

    def queue(self, block_class: int) -> Iterator[int]:
        """The queued blocks of a class, oldest first."""
        return self._queues.oldest_first(self.capacity + block_class)

    def take_victims(
        self,
        count: int,
        now: int,
        pinned: Sequence[int],
        hash_of: Sequence[BlockHash],
        protected: AbstractSet[BlockHash],
    ) -> list[int]:
        """Dequeue and return up to `count` blocks that may be evicted (`pinned` 0, hash not
        `protected`): one at a time, the first such block of the class of largest age / rate
        at time `now` (ties to the smaller class).

        Rates move with every block stored or seen again, and ages with the clock, so the heap
        is built afresh: one entry per class, keyed by its oldest block. Each class is in tick
        order, so a class whose oldest blocks may not leave sorts later once they are skipped,
        and the merge is exact.
        """
        ticks, stored, reused = self._ticks, self._stored, self._reused
        prior = PRIOR * (self._total_reused / self._total_stored) if self._total_reused else 0.0
        if prior:  # slowness(), inlined; each entry keeps its class's weight
            heap = [
                ((ticks[head] - now) * (w := (stored[c] + PRIOR) / (reused[c] + prior)), c, head, w)
                for c, head in self._heads.items()
            ]
        else:
            heap = [((ticks[head] - now) * 1.0, c, head, 1.0) for c, head in self._heads.items()]
        heapify(heap)
        newer, first = self._queues.newer, self.capacity
        taken: list[int] = []
        while heap and count:
            _, block_class, head, weight = heap[0]
            end = first + block_class
            # The class keeps the lead, with no heap operation, while its next block sorts
            # before the best of the other classes (the smaller of the heap's two children).
            rival = min(heap[1:3]) if len(heap) > 1 else None
            while True:
                if not (pinned[head] or hash_of[head] in protected):
                    taken.append(head)
                    count -= 1
                    if not count:
                        break
                head = newer[head]
                while head != end and (pinned[head] or hash_of[head] in protected):
                    head = newer[head]
                if head == end:
                    heappop(heap)
                    break
                entry = ((ticks[head] - now) * weight, block_class, head, weight)
                if rival is not None and rival < entry:
                    heapreplace(heap, entry)
                    break
        self.leave_all(taken)
        return taken
