"""Asynchronous block transfers between the engine's GPU KV cache and the host pool.

One CUDA stream per direction, so a store (GPU -> host) and a load (host -> GPU) run at the same
time on the full-duplex link. The streams never synchronise with the default stream: a job is
ordered after the engine's compute only by the `wait_event` the caller gives. Each direction takes
one of two paths (`path`): zero-copy, one kernel launch that reads or writes the mapped host pool
over the link, or staged (numbakv.datapath.staging), the same kernel into a device staging buffer
and one batched copy by the copy engines. Either way submitting costs a few vectorised NumPy
checks (`numbakv.datapath.validation`) and a few driver calls (two event records, the id upload,
the launch, and a staged job's batched copy per round), whatever the blocks and layers.
Completion is polled (`get_finished`) or awaited (`wait`, which polls briefly, then sleeps); every
job is reported exactly once by `get_finished`, as a `numbakv.jobs.FinishedJob`. Not thread-safe:
call it from the thread that owns the engine's GPU work.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numba import cuda

from numbakv.checks import positive
from numbakv.datapath import kernels
from numbakv.datapath._device import (
    CudaAPIError,
    Launcher,
    batch_copy_unsupported,
    current_device_id,
    device_address,
    event_done,
    handle_of,
    new_event,
    new_stream,
    record,
    stream_wait,
    synchronize,
    upload,
)
from numbakv.datapath.host_pool import HostPool
from numbakv.datapath.layouts import KVLayout
from numbakv.datapath.staging import Staging
from numbakv.datapath.validation import IdCheck, check_callback, check_job_id
from numbakv.jobs import Direction, FinishedJob, JobDoneCallback

DEFAULT_MAX_THREAD_BLOCKS = 16
"""Thread blocks a zero-copy job may hold by default (it holds them while it crosses the link): 16
leave the other SMs to the engine's kernels and the other direction's job (docs/DATAPATH.md,
"Launch shape")."""
SIMULATOR_LAUNCH = MappingProxyType({"threads_per_block": 32, "max_thread_blocks": 2})
"""Launch options for Numba's CUDA simulator, which runs every thread in Python: one warp in two
thread blocks keeps it quick (the engine's defaults took 8 times as long in the demo)."""
DEFAULT_THREADS_PER_BLOCK = MappingProxyType({Direction.STORE: 128, Direction.LOAD: 1024})
"""Threads of each thread block by default, per direction (measured on an H200,
docs/benchmarks/datapath.md): a store's writes are posted, so 16 blocks of 128 threads reach the
link's rate and slow the compute beside them 7 times less than 16 of 1024; a load's reads wait a
round trip each, and need 16 of 1024 to keep enough of them in flight."""
ZERO_COPY, STAGED = "zero_copy", "staged"
PATHS = (ZERO_COPY, STAGED)
DEFAULT_PATHS = MappingProxyType({Direction.STORE: STAGED, Direction.LOAD: STAGED})
"""Each direction's path by default, as measured on an H200 (docs/DATAPATH.md, "Which path"): a
staged store slowed the compute beside it by under 1 % against zero-copy's 17 %; beside it, a
staged load moved 33-39 % more than a zero-copy one from 16 KiB chunks up. A staged default falls
back to zero-copy where the driver cannot batch copies."""
STAGED_LAUNCH = MappingProxyType({"threads_per_block": 1024, "max_thread_blocks": None})
"""A staged kernel's launch shape at the engine's default options: it moves device memory only, for
tens of microseconds a round, so it takes a warp per 4 KiB piece, uncapped, to run at HBM speed
(16 blocks of 128 threads keep 64 KiB in flight: about 100 GB/s at HBM's latency, slower than the
link)."""
DEFAULT_STAGING_BYTES = 64 * 2**20
"""Device memory for each staged direction's buffer: a job larger than it moves in rounds (each
round's kernel waits for the copy before it: 3-4 % of a round at HBM speed)."""
WAIT_SPIN_SECONDS = 0.002
"""How long `wait` polls before it sleeps: a per-step job is seen done as soon as polling would
see it (a sleeping thread's wake-up cost a third of a per-step job's time on an H200), and a long
job costs at most this much CPU."""


class GPUFault(RuntimeError):
    """A transfer kernel faulted on the GPU (an illegal address, say).

    CUDA cannot recover a context after such a fault: every later call of the engine raises this
    error again, no job is reported, and nothing in flight may be trusted. Restart the process.
    """


@dataclass(eq=False, slots=True)
class _Slot:
    """What one job in flight needs and may not share: its ids in pinned memory, for the upload,
    and its timing events."""

    pinned_ids: np.ndarray
    pinned_ids_at: int
    start: Any
    end: Any  # blocking-sync: waiting on it sleeps
    start_at: int
    end_at: int


@dataclass(eq=False, slots=True)
class _InFlight:
    """A queued job until it is reaped."""

    job_id: Hashable
    direction: Direction
    nbytes: int
    slot: _Slot | None  # None once finished


class _Lane:
    """One direction: its stream, launcher, device id buffer, a ring of job slots and, on the
    staged path, its staging buffer.

    A job's destinations are unique, so it has at most `num_destinations` pairs: that sizes the
    id buffers once.
    """

    def __init__(
        self,
        direction: Direction,
        kernel: Any,
        kernel_args: tuple,
        threads_per_block: int,
        max_thread_blocks: int | None,
        num_destinations: int,
        max_jobs_in_flight: int,
        stream: Any,
        staging: Staging | None,
    ) -> None:
        self.direction = direction
        self.threads_per_block = threads_per_block
        self.max_thread_blocks = max_thread_blocks
        self.stream = stream
        self.stream_at = handle_of(stream)
        self.device_ids = cuda.device_array(2 * num_destinations, dtype=np.int64)
        self.device_ids_at = device_address(self.device_ids)
        self.staging = staging
        arena, host, segments, block_stride, chunk_words, piece_words = kernel_args
        if staging is not None:
            host = staging.words  # the kernel reads or writes the buffer, not the pool
        self.launch = Launcher(
            kernel,
            (arena, host, segments, self.device_ids, 0, 0, 0, 0, 0, 0, 0, block_stride)
            + (chunk_words, piece_words),
            # the job's pairs, the first pair and the pairs of this launch; its segments
            (4, 5, 6, 7, 8, 9, 10),
            threads_per_block,
            self.stream,
        )
        self.dependency = new_event(timing=False)
        self.dependency_at = handle_of(self.dependency)
        self.free_slots = [self._slot(num_destinations) for _ in range(max_jobs_in_flight)]
        self.in_flight: deque[_InFlight] = deque()

    @staticmethod
    def _slot(num_destinations: int) -> _Slot:
        ids = cuda.pinned_array(2 * num_destinations, dtype=np.int64)
        start, end = new_event(), new_event(blocking=True)
        return _Slot(ids, device_address(ids), start, end, handle_of(start), handle_of(end))


class TransferEngine:
    """Moves batches of (gpu_block_id, host_block_id) pairs between a KVLayout and a HostPool."""

    def __init__(
        self,
        layout: KVLayout,
        host_pool: HostPool,
        *,
        max_thread_blocks: int | None = DEFAULT_MAX_THREAD_BLOCKS,
        threads_per_block: int | None = None,
        path: str | Mapping[Direction | str, str] | None = None,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        max_jobs_in_flight: int = 8,
        on_job_done: JobDoneCallback | None = None,
    ) -> None:
        if host_pool.block_bytes != layout.block_bytes:
            raise ValueError(
                f"host_pool.block_bytes is {host_pool.block_bytes}, the layout needs {layout.block_bytes}"
            )
        max_thread_blocks, threads_per_block, paths, staging_bytes, max_jobs_in_flight = (
            _checked_options(
                max_thread_blocks, threads_per_block, path, staging_bytes, max_jobs_in_flight
            )
        )
        check_callback("on_job_done", on_job_done)
        _check_same_device(layout, host_pool)
        self.layout = layout
        self.host_pool = host_pool
        self.max_thread_blocks = max_thread_blocks
        self.path = paths
        """Each direction's path, "zero_copy" or "staged" (one `path` sets both)."""
        default_launch = (
            threads_per_block is None and max_thread_blocks == DEFAULT_MAX_THREAD_BLOCKS
        )
        self.threads_per_block = {}
        """Threads of each thread block, per direction (one `threads_per_block` sets both)."""
        self.thread_blocks = {}
        """The most thread blocks a job's launch takes, per direction (None: a warp per piece)."""
        for direction, chosen in paths.items():
            staged_default = default_launch and chosen == STAGED
            self.threads_per_block[direction] = (
                STAGED_LAUNCH["threads_per_block"]
                if staged_default
                else threads_per_block or DEFAULT_THREADS_PER_BLOCK[direction]
            )
            self.thread_blocks[direction] = (
                STAGED_LAUNCH["max_thread_blocks"] if staged_default else max_thread_blocks
            )
        self.on_job_done = on_job_done

        word = layout.word.itemsize
        chunk_words = layout.chunk_bytes // word
        piece_words = kernels.piece_words(chunk_words, layout.word)
        self._pieces_per_chunk = kernels.num_items(1, 1, chunk_words, piece_words)
        kernel_args = (
            layout.arena,
            host_pool.words(layout.word),
            cuda.to_device(layout.segment_offsets // word),
            layout.block_stride // word,
            chunk_words,
            piece_words,
        )
        capacity = max(1, staging_bytes // layout.block_bytes)
        self._lanes = {}
        for direction, name, num_destinations in (
            (Direction.STORE, "gather", host_pool.num_blocks),
            (Direction.LOAD, "scatter", layout.num_blocks),
        ):
            stream = new_stream()
            staging = None
            if paths[direction] == STAGED:
                staging = Staging(
                    direction,
                    stream,
                    layout.chunk_bytes,
                    layout.num_segments,
                    min(capacity, num_destinations),
                    host_pool.address,
                    host_pool.num_blocks,
                    num_destinations,
                    layout.word,
                )
            self._lanes[direction] = _Lane(
                direction,
                kernels.get_kernel(name, layout.word),
                kernel_args,
                self.threads_per_block[direction],
                self.thread_blocks[direction],
                num_destinations,
                max_jobs_in_flight,
                stream,
                staging,
            )
        self._event_type = type(self._lanes[Direction.STORE].dependency)
        self._stream_type = type(self._lanes[Direction.STORE].stream)
        self._host_ids = IdCheck(host_pool.num_blocks)
        self._gpu_ids = IdCheck(layout.num_blocks)
        self._jobs: dict[Hashable, _InFlight] = {}
        self._finished: list[FinishedJob] = []
        self._fault: str | None = None

    def submit(
        self,
        job_id: Hashable,
        direction: Direction | str,
        gpu_block_ids: np.ndarray | Sequence[int],
        host_block_ids: np.ndarray | Sequence[int],
        wait_event: Any = None,
        *,
        layers: range | None = None,
    ) -> None:
        """Queue one job moving block `gpu_block_ids[i]` <-> host block `host_block_ids[i]` for all i.

        `wait_event` holds the job back until the engine's compute has reached that point: a
        Numba event or stream, a stream with a `cuda_stream` handle (torch.cuda.Stream) or an
        event with a `cuda_event` handle (torch.cuda.Event). Pass the compute stream to a store,
        so it never reads blocks still being written, and to a load, so it never overwrites blocks
        that queued kernels still read. Without it the job starts at once. `layers` (a range of
        layer indices) moves only those layers of each block, to or from their place in the host
        block: loads of consecutive ranges let the engine's layer i wait for its own range only.
        Everything is validated before any memory is touched. A CUDA error while queueing leaves
        no job behind, but a staged job's earlier rounds may have run: a failed store's host
        blocks hold no chunk to trust.
        """
        lane = self._lane(direction)
        is_store = lane.direction is Direction.STORE
        self._enqueue(
            lane,
            job_id,
            self._gpu_ids("gpu_block_ids", gpu_block_ids, not is_store),
            self._host_ids("host_block_ids", host_block_ids, is_store),
            wait_event,
            layers,
        )

    def check_gpu_ids(self, direction: Direction | str, gpu_block_ids: Any) -> np.ndarray:
        """`gpu_block_ids` as int64, each a GPU block; unique where they are destinations
        (a load)."""
        is_load = self._lane(direction).direction is Direction.LOAD
        return self._gpu_ids("gpu_block_ids", gpu_block_ids, is_load)

    def check_host_ids(self, direction: Direction | str, host_block_ids: Any) -> np.ndarray:
        """`host_block_ids` as int64, each a host block; unique where they are destinations
        (a store)."""
        is_store = self._lane(direction).direction is Direction.STORE
        return self._host_ids("host_block_ids", host_block_ids, is_store)

    def check_wait_event(self, wait_event: Any) -> None:
        """Raise TypeError naming `wait_event` unless a job can wait for it (see `submit`)."""
        self._dependency(wait_event)

    def enqueue(
        self,
        job_id: Hashable,
        direction: Direction | str,
        gpu_ids: np.ndarray,
        host_ids: np.ndarray,
        wait_event: Any = None,
        *,
        layers: range | None = None,
    ) -> None:
        """`submit` for ids already checked (by `check_gpu_ids` and `check_host_ids`, or host ids
        from a manager no larger than this pool): only the job itself is checked here."""
        self._enqueue(self._lane(direction), job_id, gpu_ids, host_ids, wait_event, layers)

    def _enqueue(
        self,
        lane: _Lane,
        job_id: Hashable,
        gpu_ids: np.ndarray,
        host_ids: np.ndarray,
        wait_event: Any,
        layers: range | None,
    ) -> None:
        self._raise_if_faulted()
        check_job_id(job_id)
        if job_id in self._jobs:
            raise ValueError(
                f"job_id {job_id!r} is already in flight (or finished and not yet reported)"
            )
        count = len(gpu_ids)
        if count != len(host_ids):
            raise ValueError(
                f"gpu_block_ids has {count} ids, host_block_ids has {len(host_ids)}: lengths must match"
            )
        dependency = self._dependency(wait_event)
        seg_first, seg_count = self.layout.layer_segments(layers)
        staging = lane.staging
        if staging is not None:
            staging.use(seg_count)

        slot = self._take_slot(lane)
        try:
            pinned = slot.pinned_ids  # the job's GPU ids, then its host ids (or staged places)
            pinned[:count] = gpu_ids
            if staging is None:
                pinned[count : 2 * count] = host_ids
            else:
                staging.positions(out=pinned[count : 2 * count])
            if dependency is not None:
                self._hold_back(lane, *dependency)
            record(slot.start_at, lane.stream_at)
            if count:
                upload(
                    lane.device_ids,
                    lane.device_ids_at,
                    pinned,
                    slot.pinned_ids_at,
                    2 * count,
                    lane.stream_at,
                )
                pairs = count if staging is None else min(count, staging.capacity)  # per launch
                items = pairs * seg_count * self._pieces_per_chunk
                grid = kernels.grid_size(items, lane.threads_per_block, lane.max_thread_blocks)
                if staging is None:  # host blocks of every segment, the job's at their place
                    every = self.layout.num_segments
                    lane.launch(grid, count, 0, count, seg_first, seg_count, every, 0)
                else:  # staged parts of the job's segments only
                    segments = (seg_first, seg_count, seg_count, seg_first)
                    staging.queue(lane.launch, grid, host_ids, count, segments)
            record(slot.end_at, lane.stream_at)
        except BaseException:
            _settle(lane)  # what was queued ran to its end: nothing still reads the slot
            lane.free_slots.append(slot)  # no job holds it any more: the slot is free again
            raise
        job = _InFlight(job_id, lane.direction, count * seg_count * self.layout.chunk_bytes, slot)
        lane.in_flight.append(job)
        self._jobs[job_id] = job

    def _lane(self, direction: Direction | str) -> _Lane:
        lane = self._lanes.get(direction) if isinstance(direction, str) else None
        if lane is None:
            raise ValueError(f"direction must be 'store' or 'load', got {direction!r}")
        return lane

    def get_finished(self) -> list[FinishedJob]:
        """Jobs finished since the last call, in the order they finished; never blocks.

        Each succeeded: a job that fails on the GPU raises `GPUFault` instead.
        """
        self._raise_if_faulted()
        for lane in self._lanes.values():
            self._reap(lane, block_until=None)
        finished, self._finished = self._finished, []
        for job in finished:
            del self._jobs[job.job_id]
        return finished

    def wait(self, job_id: Hashable) -> bool:
        """Block (sleeping) until `job_id` has finished; True (get_finished still reports it)."""
        self._raise_if_faulted()
        job = self._job(job_id)
        if job.slot is not None:
            self._reap(self._lanes[job.direction], block_until=job)
        return True

    @property
    def num_gpu_blocks(self) -> int:
        return self.layout.num_blocks

    @property
    def num_host_blocks(self) -> int:
        return self.host_pool.num_blocks

    def completion_event(self, job_id: Hashable) -> Any | None:
        """An event the compute stream can wait on (`event.wait(stream)`) before using loaded blocks.

        None once the engine has noticed the job finished (`wait`, `get_finished`, or a submit
        taking its slot), and for an id not in flight; until then the job's event, which costs
        nothing to wait on once the copy has landed.
        """
        job = self._jobs.get(job_id)
        return None if job is None or job.slot is None else job.slot.end

    def _job(self, job_id: Hashable) -> _InFlight:
        job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(
                f"unknown job_id {job_id!r}: not submitted, or already reported by get_finished"
            )
        return job

    def _dependency(self, wait_event: Any) -> tuple[int, bool] | None:
        """`wait_event` as (raw handle, is a stream), None if there is nothing to wait for."""
        if wait_event is None:
            return None
        if isinstance(wait_event, self._event_type):
            return handle_of(wait_event), False
        if isinstance(wait_event, self._stream_type):
            return handle_of(wait_event), True
        stream = getattr(wait_event, "cuda_stream", None)
        if isinstance(stream, int):
            return stream, True
        event = getattr(wait_event, "cuda_event", None)
        if isinstance(event, int):
            return (event, False) if event else None  # 0: a torch event never recorded
        raise TypeError(
            "wait_event must be a Numba event or stream, a stream with a cuda_stream handle or an "
            f"event with a cuda_event handle (torch), got {type(wait_event).__name__}"
        )

    @staticmethod
    def _hold_back(lane: _Lane, handle: int, is_stream: bool) -> None:
        if is_stream:  # mark where the engine's stream is now, and wait for that point only
            record(lane.dependency_at, handle)
            handle = lane.dependency_at
        stream_wait(lane.stream_at, handle)

    def _take_slot(self, lane: _Lane) -> _Slot:
        if not lane.free_slots:
            self._reap(lane, block_until=lane.in_flight[0])
        return lane.free_slots.pop()

    def _reap(self, lane: _Lane, block_until: _InFlight | None) -> None:
        """Retire the lane's finished jobs in order (they finish in order on one stream)."""
        while lane.in_flight:
            job = lane.in_flight[0]
            slot = job.slot
            try:
                if block_until is not None:  # jobs before it finish first: wait for each in turn
                    synchronize(slot.end, WAIT_SPIN_SECONDS)
                elif not event_done(slot.end):
                    return
                seconds = max(slot.start.elapsed_time(slot.end), 0.0) / 1e3  # the simulator says -1
            except CudaAPIError as error:
                self._fault = (
                    f"{job.direction.value} job {job.job_id!r} failed on the GPU ({error}). A kernel "
                    "fault leaves the CUDA context unusable: no job in flight is reported and "
                    "nothing they wrote may be trusted; restart the process"
                )
                raise GPUFault(self._fault) from error
            lane.in_flight.popleft()
            job.slot = None
            lane.free_slots.append(slot)
            finished = FinishedJob(job.job_id, job.direction, True, job.nbytes, seconds)
            self._finished.append(finished)
            if self.on_job_done is not None:
                self.on_job_done(finished)
            if job is block_until:
                return

    def _raise_if_faulted(self) -> None:
        if self._fault is not None:
            raise GPUFault(self._fault)


def check_engine_options(options: Mapping[str, Any]) -> None:
    """Check `TransferEngine`'s keyword options (all but `on_job_done`) without building anything:
    `ChunkTransfers` refuses bad ones before it makes a host pool."""
    if not isinstance(options, Mapping):
        raise TypeError(f"engine_options must be a mapping, got {type(options).__name__}")
    names = tuple(inspect.signature(_checked_options).parameters)
    unknown = sorted(set(options) - set(names), key=str)
    if unknown:
        raise TypeError(f"engine_options: unknown option {unknown[0]!r}, expected any of {names}")
    defaults = inspect.signature(TransferEngine).parameters
    _checked_options(**{name: options.get(name, defaults[name].default) for name in names})


def _checked_options(
    max_thread_blocks: Any,
    threads_per_block: Any,
    path: Any,
    staging_bytes: Any,
    max_jobs_in_flight: Any,
) -> tuple[int | None, int | None, dict[Direction, str], int, int]:
    """The launch options, each checked by name; `path` as each direction's path."""
    if threads_per_block is not None:
        threads_per_block = positive("threads_per_block", threads_per_block, integer=True)
        if threads_per_block % kernels.WARP_SIZE or threads_per_block > 1024:
            raise ValueError(
                f"threads_per_block must be a multiple of 32 up to 1024, got {threads_per_block}"
            )
    if max_thread_blocks is not None:
        max_thread_blocks = positive("max_thread_blocks", max_thread_blocks, integer=True)
    staging_bytes = positive("staging_bytes", staging_bytes, integer=True)
    max_jobs_in_flight = positive("max_jobs_in_flight", max_jobs_in_flight, integer=True)
    return max_thread_blocks, threads_per_block, _paths(path), staging_bytes, max_jobs_in_flight


def _paths(path: str | Mapping[Direction | str, str] | None) -> dict[Direction, str]:
    """Each direction's path: the defaults, one path for both, or one per direction. Staged needs
    a driver that batches copies: without one the defaults fall back to zero-copy, and a path
    asked for is an error."""
    if path is None:
        chosen = dict(DEFAULT_PATHS)
    elif isinstance(path, str):
        chosen = dict.fromkeys(Direction, path)
    elif isinstance(path, Mapping) and set(path) == set(Direction):
        chosen = {Direction(direction): value for direction, value in path.items()}
    else:
        raise ValueError(
            f"path must be one of {PATHS} or a mapping of 'store' and 'load' to one, got {path!r}"
        )
    for value in chosen.values():
        if value not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {value!r}")
    unsupported = batch_copy_unsupported() if STAGED in chosen.values() else None
    if unsupported is not None:
        if path is not None:
            raise ValueError(f"path 'staged' is not available here: {unsupported}")
        chosen = dict.fromkeys(Direction, ZERO_COPY)
    return chosen


def _settle(lane: _Lane) -> None:
    """Wait for what a failed submit queued, so that none of it reads a slot given back; a broken
    context raises again where the caller's error is already on its way."""
    try:
        lane.stream.synchronize()
    except CudaAPIError:
        pass


def _check_same_device(layout: KVLayout, host_pool: HostPool) -> None:
    current = current_device_id()
    if layout.device != current:
        raise ValueError(
            f"the KV cache is on CUDA device {layout.device} but the current device is {current}: "
            "build the engine with the cache's device current"
        )
    if host_pool.device != layout.device:
        raise ValueError(
            f"the host pool was made on CUDA device {host_pool.device}, the KV cache is on device "
            f"{layout.device}: make the pool with the cache's device current"
        )
