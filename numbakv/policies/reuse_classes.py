"""How often blocks seen once come back, by the shape of the request that stored them."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from heapq import heapify, heappop, heapreplace

from numbakv.specs import BlockHash

# A stored block's class: buckets of the request's cached prefix, of its new tail and of the
# block's position in that tail (all in blocks; each bucket holds values from its edge up).
PREFIX_EDGES = (1, 2, 3, 4, 8, 16)
TAIL_EDGES = (2, 4, 8, 16, 32, 64)
POSITION_EDGES = (1, 2, 4, 8, 16, 32)
PRIOR = 100  # every class starts as this many blocks re-used at the mean rate
HALVE_AFTER = 8  # counts halve once this many capacities of blocks have been classed

BlockClass = tuple[int, int, int]


_CLASSES: dict[BlockClass, BlockClass] = {}  # one tuple per class, shared by all its blocks


def block_class(prefix: int, tail: int, position: int) -> BlockClass:
    """The class of the block at `position` of a request's `tail` new blocks after `prefix` cached ones."""
    key = (
        bisect_right(PREFIX_EDGES, prefix),
        bisect_right(TAIL_EDGES, tail),
        bisect_right(POSITION_EDGES, position),
    )
    return _CLASSES.setdefault(key, key)


class ReuseClasses:
    """Blocks seen once, queued by class in rank order, and how often each class comes back.

    Whether a once-seen block is used again is mostly whether its conversation goes on, and the
    request that stored it says a little about that: a first turn's blocks come back about twice
    as often as a later turn's. Each class counts its stored blocks and those a later touch names
    while their class is remembered (`memory` blocks, the most recently stored). The victim is
    the class head with the largest age divided by its class's re-use rate: a class that comes
    back half as often ages twice as fast.
    """

    def __init__(self, capacity: int, memory: int) -> None:
        self.capacity = capacity
        self.memory = memory
        self.queues: defaultdict[BlockClass, OrderedDict[BlockHash, None]] = defaultdict(
            OrderedDict
        )
        self._queued: dict[BlockHash, BlockClass] = {}  # queued block -> its class
        # Stored, not yet seen again, oldest first (a dict would rescan its deleted front entries).
        self._remembered: OrderedDict[BlockHash, BlockClass] = OrderedDict()
        self._stored: defaultdict[BlockClass, float] = defaultdict(float)
        self._reused: defaultdict[BlockClass, float] = defaultdict(float)
        self._total_stored = 0.0
        self._total_reused = 0.0

    def add(self, block_hash: BlockHash, block_class: BlockClass) -> None:
        """A block just stored joins its class as the most recent."""
        self._queued[block_hash] = block_class
        self.queues[block_class][block_hash] = None
        remembered = self._remembered
        remembered[block_hash] = block_class
        if len(remembered) > self.memory:
            remembered.popitem(last=False)
        self._stored[block_class] += 1
        self._total_stored += 1
        if self._total_stored > HALVE_AFTER * self.capacity:
            for counts in (self._stored, self._reused):
                for key in counts:
                    counts[key] /= 2
            self._total_stored /= 2
            self._total_reused /= 2

    def demote(self, block_hash: BlockHash) -> None:
        """A queued block becomes the oldest of its class."""
        self.queues[self._queued[block_hash]].move_to_end(block_hash, last=False)

    def leave(self, block_hash: BlockHash) -> None:
        """A block is no longer seen once (hit, evicted, or removed); unknown hashes are ignored."""
        block_class = self._queued.pop(block_hash, None)
        if block_class is not None:
            queue = self.queues[block_class]
            del queue[block_hash]
            if not queue:
                del self.queues[block_class]

    def seen(self, block_hashes: Sequence[BlockHash]) -> None:
        """A touch named these hashes: remembered ones count as re-used, once."""
        remembered = self._remembered
        for block_hash in block_hashes:
            block_class = remembered.pop(block_hash, None)
            if block_class is not None:
                self._reused[block_class] += 1
                self._total_reused += 1

    def _slowness(self) -> Callable[[BlockClass], float]:
        """1 / re-use rate, per class, drawn towards the mean while a class has few blocks (1 for
        all while nothing has come back: no class is worse)."""
        if not self._total_reused:
            return lambda block_class: 1.0
        mean = self._total_reused / self._total_stored
        stored, reused, prior_reused = self._stored, self._reused, PRIOR * mean
        return lambda block_class: (
            (stored[block_class] + PRIOR) / (reused[block_class] + prior_reused)
        )

    def victims(
        self, now: int, last_used: Mapping[BlockHash, int], evictable: Callable[[BlockHash], bool]
    ) -> Iterator[BlockHash]:
        """Evictable queued blocks, largest age / class rate at time `now` first.

        Lazy: one evict call takes what it needs. The queues must not change while it runs.
        """
        slowness = self._slowness()
        heap = []
        for block_class, queue in self.queues.items():
            candidates = filter(evictable, queue)
            head = next(candidates, None)
            if head is not None:
                weight = slowness(block_class)
                heap.append(
                    ((last_used[head] - now) * weight, block_class, head, candidates, weight)
                )
        heapify(heap)
        while heap:
            _, block_class, head, candidates, weight = heap[0]
            yield head
            head = next(candidates, None)
            if head is None:
                heappop(heap)
            else:
                heapreplace(
                    heap, ((last_used[head] - now) * weight, block_class, head, candidates, weight)
                )
