"""`ChunkTier`: chunks move between host-pool rows and a backend, off the caller's thread.

One row of the host pool is one chunk, one key one value. What every backend shares lives here: the
header written with each payload and checked before a loaded chunk counts, the threads that keep
I/O off the engine's step, a deadline on lookups (late is a miss), a circuit breaker that stops
calling a store found unreachable, jobs reported as `FinishedJob`s, and the rule that a chunk whose
load failed is not found again until it is stored anew.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue
from typing import Protocol

import numpy as np

from numbakv.checks import positive
from numbakv.jobs import Direction, FinishedJob, JobDoneCallback
from numbakv.metrics.definitions import DURATION_BUCKETS_SECONDS, no_durations
from numbakv.tiers.backend import BackendUnavailable, ChunkBackend, Occupancy, StoredValue
from numbakv.tiers.breaker import CircuitBreaker
from numbakv.tiers.chunk_format import (
    HEADER_BYTES,
    CorruptChunk,
    encode_header,
    parse_header,
    verify,
)
from numbakv.tiers.namespace import Namespace

logger = logging.getLogger("numbakv.tiers")


class HostPoolLike(Protocol):
    """What a tier reads of a numbakv `HostPool` (the data path's, which a tier never imports)."""

    @property
    def blocks(self) -> np.ndarray: ...


DEFAULT_LOOKUP_DEADLINE_S = 0.005
DEFAULT_IO_THREADS = 4
DEFAULT_BREAKER_COOLDOWN_S = 5.0
UNLOADABLE_LIMIT = 1 << 16
STALLED_DEADLINES = 10
"""Deadlines a lookup may go unanswered before the store counts as stalled (`ChunkTier.lookup`)."""


class LookupTooLate(Exception):
    """A lookup whose deadline had passed when its turn came: the store is never asked (its
    answer could only be late), so lookups queued behind a slow store cost nothing."""


_STALLED: Future[list[bool]] = Future()  # the answer of a lookup not asked: failed, so misses
_STALLED.set_exception(BackendUnavailable("the store left a lookup unanswered: stalled"))


@dataclass(frozen=True)
class TierSettings:
    """How a tier runs over any backend, checked when built.

    `lookup_deadline_s`: a batched lookup not answered by then is misses. `io_threads`: threads
    moving chunks. `breaker_cooldown_s`: how long a store found unreachable is left alone before
    one call probes it.
    """

    lookup_deadline_s: float = DEFAULT_LOOKUP_DEADLINE_S
    io_threads: int = DEFAULT_IO_THREADS
    breaker_cooldown_s: float = DEFAULT_BREAKER_COOLDOWN_S

    def __post_init__(self) -> None:
        for name, integer in (
            ("lookup_deadline_s", False),
            ("io_threads", True),
            ("breaker_cooldown_s", False),
        ):
            unit = "" if integer else "seconds"
            value = positive(name, getattr(self, name), integer=integer, unit=unit)
            object.__setattr__(self, name, value)


@dataclass(slots=True)
class Latency:
    """A histogram of durations: counts per bucket of the metrics' `DURATION_BUCKETS_SECONDS`
    (the last past every bound, not cumulative), as a transfer job's, and their sum."""

    buckets: list[int] = field(default_factory=no_durations)
    seconds: float = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(DURATION_BUCKETS_SECONDS, seconds)] += 1
        self.seconds += seconds


@dataclass
class TierCounters:
    """Running totals since the tier started; metrics read them, nothing resets them."""

    lookups: int = 0
    lookup_hits: int = 0
    late_lookups: int = 0  # batched lookups taken as misses, unanswered at their deadline
    loaded_own: int = 0  # chunks loaded that this writer stored
    loaded_other: int = 0  # chunks loaded that another writer stored
    loaded_bytes: int = 0
    stored: int = 0
    stored_bytes: int = 0
    dropped_stores: int = 0  # refused by the store (full) or failed
    integrity_failures: int = 0  # values whose header did not match: deleted, never loaded
    # Calls that found the store unreachable, or were skipped while the breaker was open.
    unavailable: int = 0
    breaker_opens: int = 0
    breaker_open: int = 0  # 1 while the breaker is open: a gauge among the totals
    lookup_latency: Latency = field(default_factory=Latency)  # one per batched lookup answered
    load_latency: Latency = field(default_factory=Latency)  # one per load job
    store_latency: Latency = field(default_factory=Latency)  # one per store job


class TierLookup:
    """A batched lookup under way: its answer once the tier has it, misses once its deadline has
    passed without one (counted once in `late_lookups`) or when it failed."""

    def __init__(
        self, future: Future[list[bool]], size: int, deadline_s: float, on_late: Callable[[], None]
    ) -> None:
        self._future = future
        self._misses = [False] * size
        self._deadline = time.monotonic() + deadline_s
        self._on_late = on_late
        self._late = False

    def answer(self, wait: bool = False) -> list[bool] | None:
        """Which keys are there to load; None while the tier is still asked before the deadline
        (with `wait`, it waits until then instead). A late lookup stays misses."""
        if not self._late:
            remaining = self._deadline - time.monotonic()
            if wait and remaining > 0:
                wait_for_futures((self._future,), timeout=remaining)
            error = self._future.exception() if self._future.done() else None
            if self._future.done() and not isinstance(error, LookupTooLate):
                return self._misses if error else self._future.result()
            if not wait and remaining > 0:
                return None
            self._late = True
            self._on_late()
        return self._misses


class ChunkTier:
    """A tier below host memory over one `ChunkBackend`, reading and writing `host_pool` rows.

    `host_pool` is a numbakv `HostPool` or its 2-D uint8 array (`HostPool.blocks`), one row per
    chunk: a view of the host tier's memory, never a copy. `namespace` is checked in every value
    loaded; `writer_id` (8 bytes, random by default) tells this engine's writes from others'. The
    other settings are `TierSettings`'. After a call finds the store unreachable, the tier stops
    calling it for `breaker_cooldown_s` (lookups are misses, jobs fail), then probes it.
    `numbakv.tiers.open_tier` builds one from a URL.
    """

    def __init__(
        self,
        backend: ChunkBackend,
        host_pool: np.ndarray | HostPoolLike,
        namespace: Namespace,
        *,
        writer_id: bytes | None = None,
        io_threads: int = DEFAULT_IO_THREADS,
        lookup_deadline_s: float = DEFAULT_LOOKUP_DEADLINE_S,
        breaker_cooldown_s: float = DEFAULT_BREAKER_COOLDOWN_S,
        on_job_done: JobDoneCallback | None = None,
    ) -> None:
        host_pool = host_rows(host_pool)
        if backend.chunk_bytes is not None and backend.chunk_bytes != host_pool.shape[1]:
            raise ValueError(
                f"the backend's chunk_bytes ({backend.chunk_bytes:,}) must equal the host pool's "
                f"row ({host_pool.shape[1]:,} bytes)"
            )
        writer_id = os.urandom(8) if writer_id is None else writer_id
        if not isinstance(writer_id, bytes) or len(writer_id) != 8:
            raise ValueError(f"writer_id must be 8 bytes, got {writer_id!r}")
        settings = TierSettings(lookup_deadline_s, io_threads, breaker_cooldown_s)
        self._breaker = CircuitBreaker(settings.breaker_cooldown_s, type(backend).__name__)
        self.backend = backend
        self.namespace = namespace
        self.writer_id = writer_id
        self.lookup_deadline_s = settings.lookup_deadline_s
        self._counters = TierCounters()
        self._pool = host_pool
        self._namespace_digest = namespace.digest
        self._on_job_done = on_job_done
        # Failed loads, until stored anew; the oldest forgotten past UNLOADABLE_LIMIT keys (by
        # then the store has usually dropped them: a forgotten key costs one more failed load).
        self._unloadable: OrderedDict[bytes, None] = OrderedDict()
        # Which store batch (by count) last stored each key, as many keys as _unloadable holds:
        # a load that found a key absent marks it only if no store of it ended meanwhile.
        self._stores = 0
        self._last_stored: OrderedDict[bytes, int] = OrderedDict()
        self._lock = threading.Lock()
        self._finished: SimpleQueue[FinishedJob] = SimpleQueue()
        self._pending: dict[Future, Hashable] = {}  # jobs submitted and not finished: their ids
        self._unreported: set[Hashable] = set()  # ids of the jobs submitted and not reported
        # Lookups get their own thread, so they never wait behind a transfer.
        self._lookup_thread = ThreadPoolExecutor(1, thread_name_prefix="numbakv-tier-lookup")
        # The oldest lookup the store has not answered yet (or the last answered), and when.
        self._last_lookup: tuple[Future, float] = (_STALLED, 0.0)
        self._io_threads = ThreadPoolExecutor(
            settings.io_threads, thread_name_prefix="numbakv-tier-io"
        )
        logger.info("numbakv tier over %s: %s", type(backend).__name__, namespace.describe())

    @property
    def counters(self) -> TierCounters:
        """The running totals, the breaker's state as of now among them."""
        self._counters.breaker_opens = self._breaker.opened
        self._counters.breaker_open = int(self._breaker.is_open)
        return self._counters

    @property
    def chunk_bytes(self) -> int:
        return self._pool.shape[1]

    @property
    def num_rows(self) -> int:
        """Rows of the host pool the tier reads and writes (one chunk each)."""
        return self._pool.shape[0]

    @property
    def rows(self) -> np.ndarray:
        """The host pool's rows the tier reads and writes in place."""
        if self._pool is None:
            raise RuntimeError("the tier is closed")
        return self._pool

    @property
    def breaker_open(self) -> bool:
        """Whether the tier has stopped calling its store, found unreachable."""
        return self._breaker.is_open

    def occupancy(self) -> Occupancy | None:
        """The chunks the store holds and may hold, where its backend knows them; read by the
        metrics when they export."""
        return self.backend.occupancy()

    def lookup(self, keys: Sequence[bytes]) -> TierLookup:
        """Start a batched lookup, answered off the caller's thread within the tier's deadline.

        Lookups are asked one after another; one whose deadline passed while it waited its turn
        is never asked (misses, counted late). While the store leaves one unanswered for
        STALLED_DEADLINES deadlines, it is stalled: a new lookup is misses at once (counted late)
        instead of waiting its deadline behind it, until the store answers or the breaker opens.
        While the breaker is open, a lookup is answered (misses) on the caller's thread.
        """
        keys = self._checked_keys(keys)
        if self._breaker.refusing():
            answered: Future[list[bool]] = Future()
            answered.set_result(self._refused_lookup(keys))
            return TierLookup(answered, len(keys), 0.0, self._count_late)
        now = time.monotonic()
        asked, since = self._last_lookup
        if not asked.done() and now - since > STALLED_DEADLINES * self.lookup_deadline_s:
            self._count_late()
            return TierLookup(_STALLED, len(keys), 0.0, self._count_late)
        future = self._lookup_thread.submit(self._lookup, keys, now + self.lookup_deadline_s)
        if asked.done():  # the oldest unanswered: every later lookup waits behind it
            self._last_lookup = (future, now)
        return TierLookup(future, len(keys), self.lookup_deadline_s, self._count_late)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Which keys are there, waiting at most the deadline: a late or failed lookup is misses."""
        return self.lookup(keys).answer(wait=True)

    def touch(self, keys: Sequence[bytes]) -> None:
        """Mark the keys as used now, the first as the most recent, on the caller's thread: the
        backend keeps recency in memory (its policy's), or ignores it."""
        self.backend.touch(self._checked_keys(keys))

    def clear(self) -> int | None:
        """Remove every chunk of this tier's namespace from the store, on the caller's thread
        (every engine's alike: engines sharing a store share the namespace); how many, or None
        when the store could not be reached. A store job in flight may land after it."""
        removed = self._ask_backend(self.backend.clear, None)
        if removed is not None:
            with self._lock:
                self._unloadable.clear()
        return removed

    def submit_store(self, job_id: Hashable, keys: Sequence[bytes], rows: Sequence[int]) -> None:
        """Store the chunks in host-pool `rows` under `keys`; the rows must not change until done."""
        keys, rows = self._checked_job(keys, rows)
        self._submit(self._store, Direction.STORE, job_id, keys, rows)

    def submit_load(self, job_id: Hashable, keys: Sequence[bytes], rows: Sequence[int]) -> None:
        """Load the chunks stored under `keys` into host-pool `rows`, each checked first."""
        keys, rows = self._checked_job(keys, rows)
        if len(set(rows.tolist())) != len(rows):
            raise ValueError("rows of a load must be distinct: two chunks cannot land in one row")
        self._submit(self._load, Direction.LOAD, job_id, keys, rows)

    def take_finished(self) -> list[FinishedJob]:
        """The jobs finished since the last call. Never blocks: another thread taking them at the
        same time gets the others."""
        finished = []
        while True:
            try:
                finished.append(self._finished.get_nowait())
            except Empty:
                return finished

    def wait(self, job_id: Hashable) -> None:
        """Wait until the job `job_id` has finished (its result waits in `take_finished`); at once
        if it has, or was never submitted."""
        with self._lock:
            pending = [
                future for future, pending_id in self._pending.items() if pending_id == job_id
            ]
        for future in pending:
            future.exception()  # waits; jobs report their own failures

    def drain(self) -> None:
        """Wait until every submitted job has finished (its result waits in `take_finished`)."""
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            for future in pending:
                future.exception()  # waits; jobs report their own failures

    def close(self, discard_pending: bool = False) -> None:
        """Finish every submitted job, then release the threads, the backend and the host pool
        (a view of the host tier's memory, which its owner can then unmap). With
        `discard_pending`, jobs not yet started are dropped, unreported, and only those under way
        finish: an engine shutting down (vLLM's own tiers do so) waits for no queue."""
        if discard_pending:
            self._io_threads.shutdown(cancel_futures=True)
        self.drain()
        self._lookup_thread.shutdown()
        self._io_threads.shutdown()
        self.backend.close()
        self._pool = None

    def _checked_keys(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys as a list, each checked; a RuntimeError once the tier is closed."""
        if self._pool is None:
            raise RuntimeError("the tier is closed")
        return _checked_keys(keys, self.backend.max_key_bytes)

    def _checked_job(
        self, keys: Sequence[bytes], rows: Sequence[int]
    ) -> tuple[list[bytes], np.ndarray]:
        keys = self._checked_keys(keys)
        rows = np.asarray(rows)
        if rows.size == 0:
            rows = rows.astype(np.int64)  # [] reads as float64
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or len(rows) != len(keys):
            raise ValueError(
                f"rows must be a 1-D integer sequence as long as keys ({len(keys)}), got "
                f"{rows.dtype} {rows.shape}"
            )
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self._pool)):
            raise ValueError(
                f"rows must lie in [0, {len(self._pool)}), got {rows.min()}..{rows.max()}"
            )
        return keys, rows.astype(np.int64)

    def _submit(
        self, work, direction: Direction, job_id: Hashable, keys: list[bytes], rows: np.ndarray
    ) -> None:
        with self._lock:
            if job_id in self._unreported:
                raise ValueError(f"job_id {job_id!r} is in flight already")
            self._unreported.add(job_id)
        try:
            future = self._io_threads.submit(self._run, work, direction, job_id, keys, rows)
        except BaseException:  # a closed pool: the id stays free
            with self._lock:
                self._unreported.discard(job_id)
            raise
        with self._lock:
            self._pending[future] = job_id
        future.add_done_callback(self._forget)

    def _forget(self, future: Future) -> None:
        with self._lock:
            job_id = self._pending.pop(future, None)
            if future.cancelled():  # dropped by close(discard_pending=True): never reported
                self._unreported.discard(job_id)

    def _count_late(self) -> None:
        with self._lock:
            self._counters.late_lookups += 1

    def _run(
        self, work, direction: Direction, job_id: Hashable, keys: list[bytes], rows: np.ndarray
    ) -> None:
        """Run a job and report it, whatever goes wrong: its caller waits for the report. `work`
        returns the keys that failed; an error fails them all (one that is no Exception, as a
        cancelled client's, is raised again once the job is reported)."""
        start = time.perf_counter()
        failed = tuple(keys)
        try:
            failed = work(keys, rows)
        except Exception:
            logger.exception("numbakv tier: %s job %r failed", direction.value, job_id)
        finally:
            self._report(job_id, direction, keys, failed, start)

    def _call(self, method, *args):
        """Call the backend through the breaker; BackendUnavailable when it is open or the store
        is unreachable (counted)."""
        if not self._breaker.allow():
            with self._lock:
                self._counters.unavailable += 1
            raise BackendUnavailable("breaker open")
        try:
            result = method(*args)
        except BackendUnavailable as error:
            self._breaker.failed(error)
            with self._lock:
                self._counters.unavailable += 1
            raise
        except BaseException:
            self._breaker.undecided()
            raise
        self._breaker.succeeded()
        return result

    def _lookup(self, keys: list[bytes], deadline: float) -> list[bool]:
        if time.monotonic() >= deadline:
            raise LookupTooLate
        start = time.perf_counter()
        found = self._ask_backend(self.backend.exists, [False] * len(keys), keys)
        return self._counted_lookup(keys, found, start)

    def _refused_lookup(self, keys: list[bytes]) -> list[bool]:
        """Misses, counted as a lookup the breaker refused, without calling the store."""
        with self._lock:
            self._counters.unavailable += 1
        return self._counted_lookup(keys, [False] * len(keys), time.perf_counter())

    def _counted_lookup(self, keys: list[bytes], found: list[bool], start: float) -> list[bool]:
        with self._lock:
            found = [hit and key not in self._unloadable for key, hit in zip(keys, found)]
            self._counters.lookups += len(keys)
            self._counters.lookup_hits += sum(found)
            self._counters.lookup_latency.observe(time.perf_counter() - start)
        return found

    def _ask_backend(self, method, failed_answer, *args):
        """`method(*args)` through the breaker, or `failed_answer` when the store fails or answers
        for another number of keys: a tier never fails its caller."""
        try:
            answer = self._call(method, *args)
        except BackendUnavailable:
            return failed_answer  # counted by _call
        except Exception:
            logger.exception("numbakv tier: %s failed", method.__name__)
            return failed_answer
        if failed_answer is not None and len(answer) != len(failed_answer):
            logger.error(
                "numbakv tier: %s answered for %d keys, asked for %d",
                method.__name__,
                len(answer),
                len(failed_answer),
            )
            return failed_answer
        return answer

    def _store(self, keys: list[bytes], rows: np.ndarray) -> tuple[bytes, ...]:
        payloads = [memoryview(self._pool[row]) for row in rows]
        headers = _Headers(self._namespace_digest, self.writer_id, keys, payloads)
        written = self._ask_backend(
            self.backend.write, [False] * len(keys), keys, headers, payloads
        )
        stored = [key for key, ok in zip(keys, written) if ok]
        with self._lock:
            self._stores += 1
            for key in stored:
                self._unloadable.pop(key, None)
                self._last_stored[key] = self._stores
                self._last_stored.move_to_end(key)
            while len(self._last_stored) > UNLOADABLE_LIMIT:
                self._last_stored.popitem(last=False)
            self._counters.stored += len(stored)
            self._counters.stored_bytes += len(stored) * self.chunk_bytes
            self._counters.dropped_stores += len(keys) - len(stored)
        return tuple(key for key, ok in zip(keys, written) if not ok)

    def _load(self, keys: list[bytes], rows: np.ndarray) -> tuple[bytes, ...]:
        payloads = [memoryview(self._pool[row]) for row in rows]
        with self._lock:
            stores_before = self._stores
        no_answer = [BackendUnavailable("no answer")] * len(keys)
        values = self._ask_backend(self.backend.read_into, no_answer, keys, payloads, HEADER_BYTES)
        # Found absent or corrupt: unloadable until stored anew. A store that did not answer, for
        # the batch or for a key, said nothing of it.
        failed, unloadable, corrupt, own, other = [], [], [], 0, 0
        for key, payload, value in zip(keys, payloads, values):
            if not isinstance(value, StoredValue):
                failed.append(key)
                if value is None:
                    unloadable.append(key)
                continue
            try:
                header = parse_header(value.header)
                digest = value.checksum
                verify(header, self._namespace_digest, payload, value.payload_bytes, key, digest)
            except CorruptChunk as error:
                logger.warning(
                    "numbakv tier: chunk %s failed its %s check", key.hex(), error.reason
                )
                failed.append(key)
                unloadable.append(key)
                corrupt.append(key)
                continue
            if header.writer == self.writer_id:
                own += 1
            else:
                other += 1
        if corrupt:  # if the delete fails, the next reader's check catches them again
            self._ask_backend(self.backend.delete, None, corrupt)
        with self._lock:
            stored_meanwhile = self._last_stored.get
            self._unloadable.update(
                (key, None) for key in unloadable if stored_meanwhile(key, 0) <= stores_before
            )
            while len(self._unloadable) > UNLOADABLE_LIMIT:
                self._unloadable.popitem(last=False)
            self._counters.integrity_failures += len(corrupt)
            self._counters.loaded_own += own
            self._counters.loaded_other += other
            self._counters.loaded_bytes += (own + other) * self.chunk_bytes
        return tuple(failed)

    def _report(
        self, job_id: Hashable, direction: Direction, keys: list[bytes], failed: tuple, start: float
    ) -> None:
        moved = len(keys) - len(failed)
        seconds = time.perf_counter() - start
        latency = (
            self._counters.load_latency
            if direction is Direction.LOAD
            else self._counters.store_latency
        )
        job = FinishedJob(
            job_id,
            direction,
            success=not failed,
            nbytes=moved * self.chunk_bytes,
            seconds=seconds,
            failed_keys=failed,
        )
        self._finished.put(job)
        with self._lock:
            latency.observe(seconds)
            self._unreported.discard(job_id)  # its id is free again, for on_job_done too
        if self._on_job_done is not None:
            try:
                self._on_job_done(job)
            except Exception:  # the job is reported all the same
                logger.exception("numbakv tier: on_job_done failed for job %r", job_id)


class _Headers(Sequence[bytes]):
    """A store job's headers, each encoded (its payload's checksum taken) when the backend asks
    for it: on the backend's own threads, one chunk's checksum beside another's I/O, where the
    backend spreads a batch over threads."""

    def __init__(
        self, namespace: bytes, writer: bytes, keys: list[bytes], payloads: list[memoryview]
    ) -> None:
        self._namespace, self._writer = namespace, writer
        self._keys, self._payloads = keys, payloads

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, index: int) -> bytes:  # by position, as backends ask
        payload, key = self._payloads[index], self._keys[index]
        return encode_header(self._namespace, self._writer, payload, key)


def host_rows(host_pool: np.ndarray | HostPoolLike) -> np.ndarray:
    """The host pool's rows: a HostPool's `blocks` (read without importing the data path), or the
    2-D uint8 array itself; anything else is refused, naming what was given."""
    rows = host_pool if isinstance(host_pool, np.ndarray) else getattr(host_pool, "blocks", None)
    if not (
        isinstance(rows, np.ndarray)
        and rows.dtype == np.uint8
        and rows.ndim == 2
        and rows.flags.c_contiguous
        and rows.size
    ):
        raise ValueError(
            "host_pool must be a numbakv HostPool or a C-contiguous 2-D uint8 array (one row per "
            f"chunk, none empty), got {type(host_pool).__name__} "
            f"{getattr(host_pool, 'dtype', '')} {getattr(host_pool, 'shape', '')}"
        )
    if not rows.flags.writeable:
        raise ValueError("host_pool must be writable (loads land in its rows), got a read-only one")
    return rows


def _checked_keys(keys: Sequence[bytes], longest: int | None) -> list[bytes]:
    if isinstance(keys, (bytes, bytearray, str)):
        raise TypeError(f"keys must be a sequence of keys, not a single {type(keys).__name__}")
    keys = list(keys)
    for key in keys:
        if not isinstance(key, bytes) or not key:
            raise ValueError(f"keys must be non-empty bytes, got {key!r}")
        if longest is not None and len(key) > longest:
            raise ValueError(f"keys must be at most {longest} bytes in this store, got {key!r}")
    return keys
