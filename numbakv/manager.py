"""The offloading manager: which host slots hold which KV blocks, with vLLM's interface.

It decides and hands out plain specs; it never touches a GPU (docs/ARCHITECTURE.md). Per block,
every method costs a few dictionary operations, whatever the capacity: an eviction scans past only
the blocks it may not evict (being stored, being read, named in the call), never the whole cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from numbakv.checks import positive
from numbakv.policies import NOT_READY, resolve_policy
from numbakv.request_access import RequestAccess
from numbakv.specs import (
    MEDIUM_CPU,
    BlockEvent,
    BlockHash,
    HostBlocks,
    StorePlan,
)


@dataclass(frozen=True)
class ManagerStats:
    """Monotonic counters (blocks unless named otherwise) and current gauges, read in O(1)."""

    lookups: int
    hit_blocks: int
    missed_blocks: int
    evicted_blocks: int
    stored_blocks: int
    failed_store_blocks: int
    loaded_blocks: int
    stores_skipped: int
    refused_store_blocks: int  # what refused stores (prepare_store -> None) were to store
    used: int
    free: int
    being_stored: int
    being_read: int
    capacity: int


MAX_SIZE = 2**31
"""The largest block count (and block size) taken: the manager keeps a few list slots per block,
so a larger pool would need hundreds of GiB of bookkeeping before its first call."""
MAX_TRACKER_SIZE = 64_000
"""Recent hashes whose store offers are counted for `store_threshold` admission (vLLM's default)."""


def _size(name: str, value: object) -> int:
    value = positive(name, value, integer=True)
    if value > MAX_SIZE:
        raise ValueError(f"{name} must be at most 2**31 ({MAX_SIZE:,}), got {value:,}")
    return value


def _hash_list(block_hashes: Iterable[BlockHash], argument: str = "block_hashes") -> Sequence:
    """The hashes as a sequence; a lone str or bytes is refused, since it would iterate as keys."""
    if isinstance(block_hashes, (list, tuple)):
        return block_hashes
    if isinstance(block_hashes, (str, bytes, bytearray)):
        raise TypeError(
            f"{argument} must be a sequence of block hashes, not a single {type(block_hashes).__name__}"
        )
    try:
        return list(block_hashes)
    except TypeError:
        raise TypeError(
            f"{argument} must be an iterable of block hashes, got {type(block_hashes).__name__}"
        ) from None


def _checked(positions: Callable[[BlockHash], int | None]) -> Callable[[BlockHash], int | None]:
    """`positions`, its answers checked: a whole number of tokens, or None where unknown."""

    def position_of(block_hash: BlockHash) -> int | None:
        position = positions(block_hash)
        if position is None or type(position) is int:
            return position
        if isinstance(position, Integral) and not isinstance(position, bool):
            return int(position)
        raise TypeError(
            f"positions({block_hash!r}) must be a token position (an int) or None, got {position!r}"
        )

    return position_of


def _hash_error(
    method: str, hashes: Sequence, error: TypeError, argument: str = "block_hashes"
) -> TypeError:
    """What `method` raises when hashing its `hashes` raised `error`, before it changed anything.

    The manager's one check of hashes one by one, on error paths only (the methods' own hashing
    finds a bad hash for free): a TypeError naming the method and the position of the first hash
    that is not hashable, or `error` itself if every hash is (it came from elsewhere: pass it on).
    """
    for position, block_hash in enumerate(hashes):
        try:
            hash(block_hash)
        except TypeError:
            return TypeError(
                f"{method}: {argument}[{position}] is a {type(block_hash).__name__}, which is "
                "not hashable: a block hash must be bytes, an int or another hashable value"
            )
    return error


class CPUOffloadingManager:
    """Tracks the host pool's blocks: lookups, loads and stores with ref counts, eviction and events.

    A drop-in for vLLM's CPU offloading manager. Blocks being stored (not ready) or read by a load
    are never evicted; an eviction either frees exactly what a store needs or changes nothing.
    Loads and stores made for a request (`begin_request`) reach the policy once, in prefix order,
    when the request finishes (`finish_request`), as in vLLM 0.32.
    """

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = MAX_TRACKER_SIZE,
    ) -> None:
        self.block_size = _size("block_size", block_size)
        self.num_blocks = _size("num_blocks", num_blocks)
        self.store_threshold = positive("store_threshold", store_threshold, integer=True)
        self.max_tracker_size = positive("max_tracker_size", max_tracker_size, integer=True)
        self.policy_name = cache_policy
        if not isinstance(enable_events, (bool, np.bool_)):
            raise TypeError(f"enable_events must be True or False, got {enable_events!r}")
        # Reader count of each host slot, by block id; free slots and blocks being stored hold -1.
        # Filled by _reset_slots, in place: the policy keeps a reference to this list.
        self._ref_counts: list[int] = []
        self._policy = resolve_policy(cache_policy)(self.num_blocks, self._ref_counts)
        self._events: list[BlockEvent] | None = [] if enable_events else None
        # How often prepare_store was offered each recent hash; only kept when admission needs it.
        self._offers: OrderedDict[BlockHash, int] | None = (
            OrderedDict() if self.store_threshold > 1 else None
        )
        self._generation = 0  # bumped by reset_cache: requests begun before it are forgotten
        self._lookups = self._hit_blocks = self._missed_blocks = 0
        self._evicted_blocks = self._stored_blocks = self._failed_store_blocks = 0
        self._loaded_blocks = self._stores_skipped = self._refused_store_blocks = 0
        self._reset_slots()

    def _reset_slots(self) -> None:
        self._fresh = 0  # slots from here on were never handed out
        self._free_slots: list[int] = []  # slots freed since, the most recent last
        self._ref_counts[:] = [NOT_READY] * self.num_blocks
        self._num_idle = 0  # ready with ref count 0: the only evictable blocks
        self._num_being_stored = 0
        self._num_being_read = 0

    # --- lookups and loads ---

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        """How many hashes, from the first, are cached and ready. Changes no recency."""
        hashes = _hash_list(block_hashes)
        get, ref_counts = self._policy.get, self._ref_counts
        hits = 0
        try:
            for block_hash in hashes:
                block_id = get(block_hash)
                if block_id is None or ref_counts[block_id] < 0:
                    break
                hits += 1
            if hits + 1 < len(hashes):  # those past the first miss must be hashable all the same:
                hash(tuple(hashes[hits + 1 :]))  # hashes each in C and builds no set
        except TypeError as error:
            raise _hash_error("lookup", hashes, error) from None
        self._lookups += 1
        self._hit_blocks += hits
        self._missed_blocks += len(hashes) - hits
        return hits

    def room(self, spared: Iterable[BlockHash] = ()) -> int:
        """How many new blocks a store could place now: free slots and idle ready blocks, less
        the idle ones among `spared` (what `prepare_store(..., spared=)` keeps). Counts nothing."""
        spared = _hash_list(spared, "spared")
        get, ref_counts = self._policy.get, self._ref_counts
        try:
            kept = {get(block_hash) for block_hash in spared}
        except TypeError as error:
            raise _hash_error("room", spared, error, "spared") from None
        idle_kept = sum(ref_counts[block_id] == 0 for block_id in kept if block_id is not None)
        return self._free_count() + self._num_idle - idle_kept

    def is_being_stored(self, block_hash: BlockHash) -> bool:
        """Whether a store of this hash is prepared and not completed yet. Counts no lookup."""
        block_id = self._policy.get(block_hash)
        return block_id is not None and self._ref_counts[block_id] == NOT_READY

    def ready_block_ids(self) -> HostBlocks:
        """The host slots of every ready block, idle or being read, ascending: what a tier below
        host memory may copy (a block being stored is not there yet). O(capacity), in NumPy."""
        ready = np.array(self._ref_counts, dtype=np.int64) >= 0
        return HostBlocks(np.flatnonzero(ready).astype(np.int64))

    # --- requests ---

    def begin_request(
        self, positions: Callable[[BlockHash], int | None] | None = None
    ) -> RequestAccess:
        """A record for one request's loads and stores, to pass to them and to `finish_request`;
        `positions` gives each block's end-token position where the engine knows it."""
        if positions is not None and not callable(positions):
            raise TypeError(
                "positions must be a function of a block hash (its end-token position, or None), "
                f"got {type(positions).__name__}"
            )
        return RequestAccess(
            self, self._generation, positions=None if positions is None else _checked(positions)
        )

    def _checked_request(self, method: str, request: RequestAccess | None) -> bool:
        """Whether `request` is to be recorded (begun here since the last reset); a TypeError
        naming `method` for anything but a RequestAccess, before the method changes anything."""
        if request is None:
            return False
        if not isinstance(request, RequestAccess):
            raise TypeError(
                f"{method}: request must be a RequestAccess from begin_request, got "
                f"{type(request).__name__}"
            )
        if request.owner is not self:
            raise ValueError(f"{method}: request was begun by another CPUOffloadingManager")
        return self.is_current(request)

    def _record(
        self,
        request: RequestAccess,
        block_hashes: Sequence[BlockHash],
        reused: Collection[BlockHash],
    ) -> None:
        """Note a request's blocks; with positions, show the policy those it names first."""
        if request.positions is None:
            request.record(block_hashes, reused)
            return
        seen = request.blocks
        new = [block_hash for block_hash in dict.fromkeys(block_hashes) if block_hash not in seen]
        request.record(block_hashes, reused)
        if new:
            self._policy.request_access(request, new)

    def is_current(self, request: RequestAccess) -> bool:
        """Whether the request was begun by this manager since its last `reset_cache`."""
        return request.owner is self and request.generation == self._generation

    def finish_request(
        self, request: RequestAccess, ordered: Sequence[BlockHash] | None = None
    ) -> None:
        """Apply the request's accesses to the policy, once: its blocks in prefix order, head the
        most recent (by default the order first seen; `ordered` when the caller knows the
        positions better). A request finished already, or begun before a reset, changes nothing."""
        if not self._checked_request("finish_request", request) or request.finished:
            return
        chain = list(request.blocks) if ordered is None else _hash_list(ordered, "ordered")
        request.finished = True
        if not self._policy.touches_before_storing:
            self._policy.request_finished(chain, request.inserted - request.reused, request.reused)
        elif not request.touched:
            self._policy.touch(chain)

    def _record_offers(self, offered: Sequence[BlockHash]) -> None:
        """Count one store offer of each hash, as vLLM 0.32 does: hashes tracked already count
        again and are spared; a new one takes the place of the least recently offered other
        hash once the tracker is full, and goes untracked when every tracked hash is spared."""
        offers = self._offers
        spared = set()
        for block_hash in offered:
            count = offers.get(block_hash)
            if count is not None:
                offers[block_hash] = count + 1
                offers.move_to_end(block_hash)
                spared.add(block_hash)
        replaceable = len(offers) - len(spared)
        for block_hash in offered:
            if block_hash in offers:
                continue
            if len(offers) >= self.max_tracker_size:
                if replaceable == 0:
                    continue
                offers.popitem(last=False)
                replaceable -= 1
            offers[block_hash] = 1

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Mark the hashes as used now, the first as the most recent; unknown hashes are ignored."""
        hashes = _hash_list(block_hashes)
        try:
            hash(tuple(hashes))  # all before the policy, which applies a touch hash by hash
        except TypeError as error:
            raise _hash_error("touch", hashes, error) from None
        self._policy.touch(hashes)

    def prepare_load(
        self, block_hashes: Iterable[BlockHash], request: RequestAccess | None = None
    ) -> HostBlocks:
        """Pin every block for reading and say where it is; all must be cached and ready.

        With a `request`, the blocks count as its re-uses when it finishes."""
        hashes = _hash_list(block_hashes)
        recorded = self._checked_request("prepare_load", request)
        get, ref_counts = self._policy.get, self._ref_counts
        try:
            block_ids = [get(block_hash) for block_hash in hashes]
        except TypeError as error:
            raise _hash_error("prepare_load", hashes, error) from None
        for position, (block_hash, block_id) in enumerate(zip(hashes, block_ids)):
            if block_id is None:
                raise KeyError(
                    f"prepare_load: block {block_hash!r} (position {position}) is not cached"
                )
            if ref_counts[block_id] < 0:
                raise ValueError(
                    f"prepare_load: block {block_hash!r} (position {position}) is still being stored"
                )
        if recorded:  # before the pins: a positions function that raises leaves none
            self._record(request, hashes, hashes)
        newly_read = 0
        for block_id in block_ids:
            newly_read += ref_counts[block_id] == 0
            ref_counts[block_id] += 1
        self._num_idle -= newly_read
        self._num_being_read += newly_read
        self._loaded_blocks += len(block_ids)
        return HostBlocks(np.array(block_ids, dtype=np.int64))

    def complete_load(self, block_hashes: Iterable[BlockHash]) -> None:
        """Release the pins of a finished load; every hash must be one being loaded."""
        hashes = _hash_list(block_hashes)
        get, ref_counts = self._policy.get, self._ref_counts
        try:
            block_ids = [get(block_hash) for block_hash in hashes]
        except TypeError as error:
            raise _hash_error("complete_load", hashes, error) from None
        released = 0
        for position, (block_hash, block_id) in enumerate(zip(hashes, block_ids)):
            if block_id is None or ref_counts[block_id] <= 0:
                for undone in block_ids[:position]:
                    ref_counts[undone] += 1
                problem = KeyError if block_id is None else ValueError
                state = "not cached" if block_id is None else "not being loaded"
                raise problem(
                    f"complete_load: block {block_hash!r} (position {position}) is {state}"
                )
            ref_counts[block_id] -= 1
            released += ref_counts[block_id] == 0
        self._num_idle += released
        self._num_being_read -= released

    # --- stores ---

    def prepare_store(
        self,
        block_hashes: Iterable[BlockHash],
        request: RequestAccess | None = None,
        *,
        spared: Iterable[BlockHash] = (),
    ) -> StorePlan | None:
        """Allocate host slots for the hashes not cached yet, evicting if needed.

        Returns None when not enough blocks can be evicted (only ready, idle blocks named neither
        in this call nor in `spared` are victims): nothing is stored or evicted then, but the
        offer is counted, as vLLM counts it (`store_threshold`, stores skipped, the request's
        record). With a `request`, the blocks it stores or finds ready are noted for
        `finish_request`, and the policy is shown each new block once per request before it goes
        in (ARC adapts there). `spared`: cached blocks the caller is about to load (a lookup's
        hits), kept without being offered.
        """
        hashes = _hash_list(block_hashes)
        spared = _hash_list(spared, "spared")
        recorded = self._checked_request("prepare_store", request)
        get, ref_counts = self._policy.get, self._ref_counts
        # One pass: the hashes not cached, and the ready ones by block id (an eviction spares
        # them); duplicates fold, and a hash being stored is in neither.
        new: dict[BlockHash, None] = {}
        ready: dict[BlockHash, int] = {}
        try:
            for block_hash in hashes:
                block_id = get(block_hash)
                if block_id is None:
                    new[block_hash] = None
                elif ref_counts[block_id] >= 0:
                    ready[block_hash] = block_id
        except TypeError as error:
            raise _hash_error("prepare_store", hashes, error) from None
        kept = dict(ready) if spared else ready
        try:
            for block_hash in spared:
                block_id = get(block_hash)
                if block_id is not None and ref_counts[block_id] >= 0:
                    kept[block_hash] = block_id
        except TypeError as error:
            raise _hash_error("prepare_store", spared, error, "spared") from None
        if self._offers is not None:
            self._record_offers(hashes)
        to_store = list(new)
        if self._offers is not None and to_store:
            offers, threshold = self._offers, self.store_threshold
            admitted = [h for h in to_store if offers.get(h, 0) >= threshold]
            self._stores_skipped += len(to_store) - len(admitted)
            to_store = admitted
        if recorded:
            self._observe_store(request, hashes, to_store, ready)
        if not to_store:
            return StorePlan([], HostBlocks(), [])

        shortfall = len(to_store) - self._free_count()
        evicted: list[BlockHash] = []
        evicted_ids = HostBlocks()
        if shortfall > 0:
            victims = self._evict(shortfall, kept)
            if victims is None:
                self._refused_store_blocks += len(to_store)
                return None
            evicted, evicted_ids = victims
        slots = self._allocate(len(to_store))
        self._policy.insert(to_store, slots)  # free slots already hold NOT_READY
        self._num_being_stored += len(to_store)
        if recorded:
            request.inserted.update(to_store)
            if request.positions is not None:
                try:
                    self._policy.request_inserted(request, to_store)
                except BaseException:  # the caller gets no plan: nothing may stay being stored
                    request.inserted.difference_update(to_store)
                    self.complete_store(to_store, success=False)
                    raise
        return StorePlan(
            to_store, HostBlocks(np.array(slots, dtype=np.int64)), evicted, evicted_ids
        )

    def _observe_store(
        self,
        request: RequestAccess,
        offered: Sequence[BlockHash],
        to_store: list[BlockHash],
        ready: Collection[BlockHash],
    ) -> None:
        """Record the offer (the blocks to store and those found ready, in the order offered),
        show a policy that reads them the request's new blocks it has not seen yet, and give a
        policy that touches before storing its one touch of the request."""
        if not ready:
            noted = to_store
        elif len(to_store) + len(ready) == len(offered):  # each block once, to store or ready
            noted = offered
        else:  # repeats, or blocks being stored or not admitted (left out)
            storing = set(to_store)
            noted = [h for h in offered if h in ready or h in storing]
        self._record(request, noted, ready)
        if self._policy.reads_store_misses:
            misses = [h for h in to_store if h not in request.store_misses]
            if misses:
                self._policy.on_store_miss(misses)
                request.store_misses.update(misses)
        if to_store and self._policy.touches_before_storing and not request.touched:
            request.touched = True
            self._policy.touch(list(request.blocks))

    def _free_count(self) -> int:
        return len(self._free_slots) + self.num_blocks - self._fresh

    def _allocate(self, count: int) -> list[int]:
        """`count` free slots, as vLLM hands them out: never-used ones in ascending order first,
        then freed ones, the most recently freed first."""
        fresh = min(count, self.num_blocks - self._fresh)
        slots = list(range(self._fresh, self._fresh + fresh))
        self._fresh += fresh
        if fresh < count:
            freed = self._free_slots
            slots += reversed(freed[fresh - count :])
            del freed[fresh - count :]
        return slots

    def _evict(
        self, shortfall: int, spared: dict[BlockHash, int]
    ) -> tuple[list[BlockHash], HostBlocks] | None:
        """Free `shortfall` slots, sparing the ready blocks in `spared` (hash -> block id); None
        if it cannot.

        Returns the victims' hashes and their slots."""
        if shortfall > self._num_idle:  # fail fast, without looking at any block
            return None
        ref_counts = self._ref_counts
        idle_spared = sum(ref_counts[block_id] == 0 for block_id in spared.values())
        if shortfall > self._num_idle - idle_spared:
            return None
        evicted, freed = zip(*self._policy.evict(shortfall, spared.keys()))
        for block_id in freed:
            ref_counts[block_id] = NOT_READY
        self._free_slots += freed
        self._num_idle -= shortfall
        self._evicted_blocks += shortfall
        evicted = list(evicted)
        if self._events is not None:
            self._emit(evicted, removed=True)
        return evicted, HostBlocks(np.array(freed, dtype=np.int64))

    def complete_store(self, block_hashes: Iterable[BlockHash], success: bool = True) -> None:
        """Make stored blocks ready, or on failure drop them and free their slots.

        Only blocks still being stored are affected; ready and unknown hashes are ignored.
        """
        listed = _hash_list(block_hashes)
        try:
            hashes = dict.fromkeys(listed)
        except TypeError as error:
            raise _hash_error("complete_store", listed, error) from None
        ref_counts = self._ref_counts
        pending = [
            (block_hash, block_id)
            for block_hash, block_id in zip(hashes, map(self._policy.get, hashes))
            if block_id is not None and ref_counts[block_id] < 0
        ]
        if not pending:
            return
        finished, block_ids = zip(*pending)
        self._num_being_stored -= len(pending)
        if success:
            for block_id in block_ids:
                ref_counts[block_id] = 0
            self._num_idle += len(pending)
            self._stored_blocks += len(pending)
            if self._events is not None:
                self._emit(list(finished), removed=False)
        else:
            for block_hash in finished:
                self._policy.remove(block_hash)
            self._free_slots += block_ids
            self._failed_store_blocks += len(pending)

    def remove(self, block_hashes: Iterable[BlockHash]) -> list[BlockHash]:
        """Forget ready blocks that no load is reading, because their bytes are gone (deleted or
        found corrupt); returns the hashes forgotten, announced as removed.

        Blocks being stored or read, and hashes not cached, are left as they are.
        """
        hashes = _hash_list(block_hashes)
        try:
            unique = dict.fromkeys(hashes)
        except TypeError as error:
            raise _hash_error("remove", hashes, error) from None
        get, ref_counts = self._policy.get, self._ref_counts
        removed = []
        for block_hash in unique:
            block_id = get(block_hash)
            if block_id is not None and ref_counts[block_id] == 0:
                self._policy.remove(block_hash)
                ref_counts[block_id] = NOT_READY
                self._free_slots.append(block_id)
                removed.append(block_hash)
        self._num_idle -= len(removed)
        if removed and self._events is not None:
            self._emit(removed, removed=True)
        return removed

    # --- events, reset and stats ---

    def _emit(self, block_hashes: list[BlockHash], removed: bool) -> None:
        self._events.append(BlockEvent(block_hashes, self.block_size, MEDIUM_CPU, removed))

    def take_events(self) -> Iterator[BlockEvent]:
        """Yield the pending events in order, then clear them; none when events are disabled."""
        if self._events is not None:
            yield from self._events
            self._events.clear()

    def reset_cache(self) -> None:
        """Forget every block, ghost, offer count, request and pending event; counters keep
        counting.

        The caller must not complete transfers begun before the reset; requests begun before it
        are ignored from now on (a new `begin_request` starts afresh).
        """
        self._policy.clear()
        self._reset_slots()
        self._generation += 1
        if self._offers is not None:
            self._offers.clear()
        if self._events is not None:
            self._events.clear()

    def stats(self) -> ManagerStats:
        """Counters and gauges for metrics, in O(1)."""
        free = self._free_count()
        return ManagerStats(
            lookups=self._lookups,
            hit_blocks=self._hit_blocks,
            missed_blocks=self._missed_blocks,
            evicted_blocks=self._evicted_blocks,
            stored_blocks=self._stored_blocks,
            failed_store_blocks=self._failed_store_blocks,
            loaded_blocks=self._loaded_blocks,
            stores_skipped=self._stores_skipped,
            refused_store_blocks=self._refused_store_blocks,
            used=self.num_blocks - free,
            free=free,
            being_stored=self._num_being_stored,
            being_read=self._num_being_read,
            capacity=self.num_blocks,
        )

    def policy_stats(self) -> dict[str, float]:
        """The policy's own gauges (ARC and sarc: target p and list sizes; S3-FIFO: queues)."""
        return self._policy.stats()
