"""How often blocks seen once come back, by the shape of the request that stored them."""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from heapq import heapify, heappop, heappush, heapreplace

from numbakv.policies.block_lists import BlockLists
from numbakv.policies.sarc.miniatures import sample_point
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
REMEMBERED = 125_000  # hashes remembered before a sample is (5 capacities at 25,000 blocks)
RERANK = 16  # the classes are ranked afresh every capacity / RERANK ticks


def block_class(prefix: int, tail: int, position: int) -> int:
    """The class of the block at `position` of a request's `tail` new blocks after `prefix`
    cached ones: its three buckets as one number, ordered as the (prefix, tail, position) tuples."""
    return group_class(prefix, tail) + position_bucket(position)


def group_class(prefix: int, tail: int) -> int:
    """The class of a request's new blocks, less their positions."""
    return (bisect_right(PREFIX_EDGES, prefix) * BUCKETS + bisect_right(TAIL_EDGES, tail)) * BUCKETS


def position_bucket(position: int) -> int:
    return POSITION_BUCKETS[position] if position < len(POSITION_BUCKETS) else BUCKETS - 1


def tail_classes(prefix: int, tail: int) -> list[int]:
    """The classes of a request's `tail` new blocks after `prefix` cached ones, the last first."""
    base = group_class(prefix, tail)
    beyond = [base + BUCKETS - 1] * (tail - len(POSITION_BUCKETS))
    return beyond + [base + bucket for bucket in POSITION_BUCKETS[:tail][::-1]]


POSITION_BUCKETS = tuple(bisect_right(POSITION_EDGES, p) for p in range(POSITION_EDGES[-1]))
"""The bucket of each position below the last edge (the rest are in the last bucket)."""


class ReuseClasses:
    """Blocks seen once, queued by class in rank order, and how often each class comes back.

    Whether a once-seen block is used again is mostly whether its conversation goes on, and the
    request that stored it says a little about that: a first turn's blocks come back about twice
    as often as a later turn's. Each class counts its stored blocks and those a later touch names
    while their class is remembered (`memory` blocks, the most recently stored; beyond `REMEMBERED`
    hashes, a sample of them that counts for all). The victim is
    the class head with the largest age divided by its class's re-use rate: a class that comes
    back half as often ages twice as fast.

    Queued blocks are host block ids, linked per class through `BlockLists`; the remembered
    classes are kept by hash, since a block is often named again after it was evicted.

    Rates move with every block stored or seen again, and ages with the clock, so an exact
    ranking would be rebuilt for every eviction. Instead the classes are ranked every
    `rerank_every` ticks (default capacity / `RERANK`): a heap with one entry per class, keyed by
    its oldest block's weighted age at the tick the next ranking is due, with the rates of the
    ranking (of its own time for an entry made since). Between rankings an entry is brought up
    to date when it reaches the top; 0 ranks at every eviction, at its own tick: exact.
    """

    def __init__(
        self,
        capacity: int,
        memory: int,
        ticks: Sequence[float],
        pinned: Sequence[int],
        hash_of: Sequence[BlockHash],
        rerank_every: int | None = None,
    ) -> None:
        self.capacity = capacity
        self.memory = memory
        self.sampling = max(1, memory // REMEMBERED)  # 1 in this many hashes is remembered
        self._remembered_limit = memory // self.sampling
        self.rerank_every = capacity // RERANK if rerank_every is None else rerank_every
        # The policy's, per block id: clock ticks (ages are taken from them), ref counts (only
        # blocks at 0 may leave) and hashes.
        self._ticks, self._pinned, self._hash_of = ticks, pinned, hash_of
        self._queues = BlockLists(capacity, CLASSES)
        self._class_of = [-1] * capacity  # queued block -> its class, -1 when not queued
        self._sizes = [0] * CLASSES  # queued blocks per class
        self._heads: dict[int, int] = {}  # class -> its oldest block, for the classes with any
        # The ranking: heap entries (weighted age at tick `_ranked_at`, class, head, weight); a
        # class's current entry is `_entries[class]`, others are left over and skipped. Classes
        # whose key may have dropped below their entry's (a new or demoted head, a head skipped
        # by an eviction) get a new entry at the next eviction.
        self._heap: list[tuple[float, int, int, float]] = []
        self._entries: dict[int, tuple[float, int, int, float]] = {}
        self._rekey: set[int] = set()
        self._ranked_at = -1  # no ranking yet
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
        """Blocks just stored join their classes as the most recent, in order, and count as
        stored (those in the sample, each for `sampling` blocks)."""
        # A run of one class at a time: a store's blocks come in a few, one per position bucket.
        # Linked as they are counted: a `push_newest_all` per run cost 2.0-2.3% more instructions.
        newer, older = self._queues.newer, self._queues.older
        first, class_of, sizes, heads = self.capacity, self._class_of, self._sizes, self._heads
        run_class = end = newest = -1
        for block_id, block_class in zip(block_ids, classes):
            if block_class != run_class:
                if run_class >= 0:
                    newer[newest] = end
                    older[end] = newest
                run_class, end = block_class, first + block_class
                newest = older[end]
                if not sizes[block_class]:
                    heads[block_class] = block_id
                    self._rekey.add(block_class)
            newer[newest] = block_id
            older[block_id] = newest
            class_of[block_id] = block_class
            sizes[block_class] += 1
            newest = block_id
        if run_class >= 0:
            newer[newest] = end
            older[end] = newest
        sampling = self.sampling
        counted = list(zip(block_hashes, classes))
        if sampling > 1:
            counted = [(h, c) for h, c in counted if sample_point(h) % sampling == 0]
        remembered, stored = self._remembered, self._stored
        for block_hash, block_class in counted:
            remembered[block_hash] = block_class
            stored[block_class] += sampling
        total = self._total_stored + sampling * len(counted)
        halve_at = HALVE_AFTER * self.capacity
        if total > halve_at:  # as if halved right after the count that passed `halve_at`
            late = counted[int((halve_at - self._total_stored) // sampling) + 1 :]
            stored[:] = [count / 2 for count in stored]
            self._reused[:] = [count / 2 for count in self._reused]
            self._total_reused /= 2
            for _, block_class in late:  # counted after the halving: in full
                stored[block_class] += sampling / 2
            total = (total + sampling * len(late)) / 2
        self._total_stored = total
        forget = remembered.popitem
        for _ in range(len(remembered) - self._remembered_limit):  # the oldest go, as after each
            forget(False)

    def renew(self, block_id: int) -> None:
        """A queued block touched again (while its store is in flight) becomes the newest of its
        class, so that each class stays in tick order."""
        block_class = self._class_of[block_id]
        heads = self._heads
        if heads[block_class] == block_id:
            after = self._queues.newer[block_id]
            if after != self._queues.sentinel(block_class):
                heads[block_class] = after
        self._queues.unlink(block_id)
        self._queues.push_newest(block_id, self._queues.sentinel(block_class))

    def demote(self, block_id: int) -> None:
        """A queued block becomes the oldest of its class."""
        block_class = self._class_of[block_id]
        self._queues.unlink(block_id)
        self._queues.push_oldest(block_id, self._queues.sentinel(block_class))
        self._heads[block_class] = block_id
        self._rekey.add(block_class)

    def leave_all(self, block_ids: Iterable[int]) -> None:
        """Blocks no longer seen once (hit, evicted, or removed); others are ignored."""
        # Unlinked as they are counted: an `unlink_all` of them cost 0.4-0.7% more instructions.
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
        remembered, reused, sampling = self._remembered, self._reused, self.sampling
        for block_hash in remembered.keys() & block_hashes:
            reused[remembered.pop(block_hash)] += sampling
            self._total_reused += sampling

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
        return self._queues.oldest_first(self._queues.sentinel(block_class))

    def take_victims(self, count: int, now: int, protected: AbstractSet[BlockHash]) -> list[int]:
        """Dequeue and return up to `count` blocks that may be evicted (ref count 0, hash not
        `protected`): one at a time, the first such block of the class of largest weighted age
        (ties to the smaller class), ranked as of tick `now` or the ranking's.

        Each class is in tick order, and its key only grows as its head leaves, so a stale entry
        is a lower bound: it reaches the top no later than it should, and is replaced there."""
        if now >= self._ranked_at:
            self._rank(now)
        else:
            for block_class in self._rekey:
                head = self._heads.get(block_class)
                if head is not None:
                    self._enter(block_class, head)
        self._rekey.clear()
        ticks, heap, entries, heads = self._ticks, self._heap, self._entries, self._heads
        pinned, hash_of = self._pinned, self._hash_of
        at, newer, first = self._ranked_at, self._queues.newer, self.capacity
        class_of = self._class_of
        walked: set[int] = set()  # classes checked in this call (their entries may be past a head)
        taken: list[int] = []
        while heap and count:
            entry = heap[0]
            key, block_class, head, weight = entry
            if entries.get(block_class) is not entry:  # superseded
                heappop(heap)
                continue
            if block_class not in walked:
                oldest = heads.get(block_class)
                if oldest is None:
                    heappop(heap)
                    del entries[block_class]
                    continue
                if oldest != head or (ticks[oldest] - at) * weight != key:
                    entry = ((ticks[oldest] - at) * weight, block_class, oldest, weight)
                    entries[block_class] = entry
                    heapreplace(heap, entry)
                    continue
                walked.add(block_class)
            end = first + block_class
            # The class keeps the lead, with no heap operation, while its next block sorts
            # before the best of the other entries (the smaller of the heap's two children).
            rival = min(heap[1:3]) if len(heap) > 1 else None
            run, run_start = head, len(taken)  # the blocks taken in a row leave together
            while True:
                if pinned[head] or hash_of[head] in protected:
                    self._rekey.add(block_class)  # its entry moves past its oldest block
                    self._leave_run(block_class, run, head, len(taken) - run_start)
                    run, run_start = newer[head], len(taken)
                else:
                    taken.append(head)
                    class_of[head] = -1
                    count -= 1
                    if not count:
                        head = newer[head]
                        break
                head = newer[head]
                if head == end:
                    heappop(heap)
                    del entries[block_class]
                    break
                entry = ((ticks[head] - at) * weight, block_class, head, weight)
                if rival is not None and rival < entry:
                    entries[block_class] = entry
                    heapreplace(heap, entry)
                    break
            self._leave_run(block_class, run, head, len(taken) - run_start)
        return taken

    def _leave_run(self, block_class: int, run: int, stop: int, length: int) -> None:
        """The `length` blocks of a class's queue from `run` up to `stop` (not included) leave it
        (their `_class_of` is already cleared)."""
        if not length:
            return
        # Spliced here: a call to BlockLists per run cost 0.4% more instructions.
        newer, older = self._queues.newer, self._queues.older
        before = older[run]
        newer[before] = stop
        older[stop] = before
        self._sizes[block_class] -= length
        if not self._sizes[block_class]:
            del self._heads[block_class]
        elif self._heads[block_class] == run:
            self._heads[block_class] = stop

    def _rank(self, now: int) -> None:
        """A fresh heap of every class with blocks, keyed at the tick the next ranking is due."""
        at = self._ranked_at = now + self.rerank_every
        slowness, ticks = self.slowness(), self._ticks
        self._heap = [
            ((ticks[head] - at) * (weight := slowness(c)), c, head, weight)
            for c, head in self._heads.items()
        ]
        heapify(self._heap)
        self._entries = {entry[1]: entry for entry in self._heap}

    def _enter(self, block_class: int, head: int) -> None:
        """A new entry for a class, keyed by `head`, superseding any it had."""
        weight = self.slowness()(block_class)
        entry = ((self._ticks[head] - self._ranked_at) * weight, block_class, head, weight)
        self._entries[block_class] = entry
        heappush(self._heap, entry)
