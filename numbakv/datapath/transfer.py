"""Asynchronous block transfers between the engine's GPU KV cache and the host pool.

One CUDA stream per direction, so a store (GPU -> host) and a load (host -> GPU) run at the same
time on the full-duplex link. A job is one kernel launch whatever its number of blocks and layers;
submitting costs a few vectorised NumPy checks, one small id upload and one launch. Completion is
polled (`get_finished`) or awaited (`wait`); every job is reported exactly once by `get_finished`.
Not thread-safe: call it from the thread that owns the engine's GPU work.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
from numba import cuda
from numba.cuda.core.errors import NumbaPerformanceWarning

from numbakv.datapath import kernels
from numbakv.datapath._device import CUDA_ERRORS, event_done, foreign_stream, upload_prefix
from numbakv.datapath.host_pool import HostPool
from numbakv.datapath.layouts import KVLayout


class Direction(str, Enum):
    """Which way a job moves blocks; plain strings "store" and "load" are accepted too."""

    STORE = "store"  # GPU -> host (gather)
    LOAD = "load"  # host -> GPU (scatter)


JobDoneCallback = Callable[[Hashable, Direction, int, float, bool], None]
"""on_job_done(job_id, direction, nbytes, seconds, success), called once per finished job."""


@dataclass(eq=False)
class _Slot:
    """What one job in flight needs and may not share: staged ids and its timing events."""

    staged_ids: np.ndarray
    start: Any
    end: Any


@dataclass(eq=False)
class _Job:
    job_id: Hashable
    direction: Direction
    nbytes: int
    slot: _Slot | None
    success: bool | None = None


class _Lane:
    """One direction: its stream, kernel, device id buffer and a ring of job slots.

    A job's destinations are unique, so it has at most `num_destinations` pairs: that sizes the
    id buffers once, and `destination_stamps` serves the duplicate check without allocating.
    """

    def __init__(
        self, kernel: Any, threads_per_block: int, num_destinations: int, max_jobs_in_flight: int
    ) -> None:
        self.kernel = kernel
        self.threads_per_block = threads_per_block
        self.stream = cuda.stream()
        self.launchers: dict[int, Any] = {}
        self.device_ids = cuda.device_array(2 * num_destinations, dtype=np.int64)
        self.dependency = cuda.event()
        self.free_slots = [
            _Slot(
                cuda.pinned_array(2 * num_destinations, dtype=np.int64), cuda.event(), cuda.event()
            )
            for _ in range(max_jobs_in_flight)
        ]
        self.in_flight: deque[_Job] = deque()
        self.destination_stamps = np.empty(num_destinations, dtype=np.int64)

    def launcher(self, grid: int) -> Any:
        """The kernel configured for `grid` thread blocks on this lane's stream, made once per grid."""
        launch = self.launchers.get(grid)
        if launch is None:
            with warnings.catch_warnings():  # small grids are deliberate (capped, or small jobs)
                warnings.simplefilter("ignore", NumbaPerformanceWarning)
                launch = self.launchers[grid] = self.kernel[
                    grid, self.threads_per_block, self.stream
                ]
        return launch


class TransferEngine:
    """Moves batches of (gpu_block_id, host_block_id) pairs between a KVLayout and a HostPool."""

    def __init__(
        self,
        layout: KVLayout,
        host_pool: HostPool,
        *,
        max_thread_blocks: int | None = None,
        threads_per_block: int = 1024,
        max_jobs_in_flight: int = 8,
        on_job_done: JobDoneCallback | None = None,
    ) -> None:
        if host_pool.block_bytes != layout.block_bytes:
            raise ValueError(
                f"host_pool.block_bytes is {host_pool.block_bytes}, the layout needs {layout.block_bytes}"
            )
        if threads_per_block % kernels.WARP_SIZE or not 0 < threads_per_block <= 1024:
            raise ValueError(
                f"threads_per_block must be a multiple of 32 up to 1024, got {threads_per_block}"
            )
        if max_thread_blocks is not None and max_thread_blocks <= 0:
            raise ValueError(f"max_thread_blocks must be positive or None, got {max_thread_blocks}")
        if max_jobs_in_flight <= 0:
            raise ValueError(f"max_jobs_in_flight must be positive, got {max_jobs_in_flight}")
        self.layout = layout
        self.host_pool = host_pool
        self.max_thread_blocks = max_thread_blocks
        self.threads_per_block = threads_per_block
        self.on_job_done = on_job_done

        word = layout.word.itemsize
        self._arena = layout.arena
        self._host = host_pool.words(layout.word)
        self._segments = cuda.to_device(layout.segment_offsets // word)
        self._block_stride = layout.block_stride // word
        self._chunk_words = layout.chunk_bytes // word
        gather, scatter = (
            kernels.get_kernel("gather", layout.word),
            kernels.get_kernel("scatter", layout.word),
        )
        self._lanes = {
            Direction.STORE: _Lane(
                gather, threads_per_block, host_pool.num_blocks, max_jobs_in_flight
            ),
            Direction.LOAD: _Lane(
                scatter, threads_per_block, layout.num_blocks, max_jobs_in_flight
            ),
        }
        self._event_type = type(self._lanes[Direction.STORE].dependency)
        self._stream_type = type(self._lanes[Direction.STORE].stream)
        self._positions = np.arange(max(host_pool.num_blocks, layout.num_blocks), dtype=np.int64)
        self._jobs: dict[Hashable, _Job] = {}
        self._finished: list[tuple[Hashable, bool]] = []

    def submit(
        self,
        job_id: Hashable,
        direction: Direction | str,
        gpu_block_ids: np.ndarray | Sequence[int],
        host_block_ids: np.ndarray | Sequence[int],
        wait_event: Any = None,
    ) -> None:
        """Queue one job moving block `gpu_block_ids[i]` <-> host block `host_block_ids[i]` for all i.

        `wait_event` (a Numba event, a Numba stream, or a stream with a `cuda_stream` handle such as
        torch's) holds the job back until the engine's compute has reached that point: pass the
        compute stream to a store so it never reads blocks still being written. Everything is
        validated before any memory is touched; on error nothing is queued.
        """
        direction = _as_direction(direction)
        if job_id in self._jobs:
            raise ValueError(
                f"job_id {job_id!r} is already in flight (or finished and not yet reported)"
            )
        gpu_ids = _as_ids("gpu_block_ids", gpu_block_ids)
        host_ids = _as_ids("host_block_ids", host_block_ids)
        if len(gpu_ids) != len(host_ids):
            raise ValueError(
                f"gpu_block_ids has {len(gpu_ids)} ids, host_block_ids has {len(host_ids)}: lengths must match"
            )
        _check_range("gpu_block_ids", gpu_ids, self.layout.num_blocks)
        _check_range("host_block_ids", host_ids, self.host_pool.num_blocks)
        dependency = self._dependency(wait_event)
        lane = self._lanes[direction]
        if direction is Direction.STORE:
            self._check_unique("host_block_ids", host_ids, lane.destination_stamps)
        else:
            self._check_unique("gpu_block_ids", gpu_ids, lane.destination_stamps)

        slot = self._take_slot(lane)
        count = len(gpu_ids)
        slot.staged_ids[:count] = gpu_ids
        slot.staged_ids[count : 2 * count] = host_ids
        if dependency is not None:
            self._hold_back(lane, dependency)
        slot.start.record(lane.stream)
        if count:
            upload_prefix(lane.device_ids, slot.staged_ids, 2 * count, lane.stream)
            grid = kernels.grid_size(
                count * self.layout.num_segments, self.threads_per_block, self.max_thread_blocks
            )
            lane.launcher(grid)(
                self._arena,
                self._host,
                self._segments,
                lane.device_ids,
                count,
                self._block_stride,
                self._chunk_words,
            )
        slot.end.record(lane.stream)
        job = _Job(job_id, direction, count * self.layout.block_bytes, slot)
        lane.in_flight.append(job)
        self._jobs[job_id] = job

    def get_finished(self) -> list[tuple[Hashable, bool]]:
        """Jobs finished since the last call, as (job_id, success); never blocks."""
        for lane in self._lanes.values():
            self._reap(lane, block_until=None)
        finished, self._finished = self._finished, []
        for job_id, _ in finished:
            del self._jobs[job_id]
        return finished

    def wait(self, job_id: Hashable) -> bool:
        """Block until `job_id` has finished; return its success (get_finished still reports it)."""
        job = self._job(job_id)
        if job.success is None:
            self._reap(self._lanes[job.direction], block_until=job)
        return bool(job.success)

    @property
    def num_gpu_blocks(self) -> int:
        return self.layout.num_blocks

    def completion_event(self, job_id: Hashable) -> Any | None:
        """An event the compute stream can wait on (`event.wait(stream)`) before using loaded blocks.

        None once the job has finished: its blocks are ready and there is nothing to wait for.
        """
        job = self._job(job_id)
        return None if job.slot is None else job.slot.end

    def _job(self, job_id: Hashable) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(
                f"unknown job_id {job_id!r}: not submitted, or already reported by get_finished"
            )
        return job

    def _check_unique(self, name: str, ids: np.ndarray, stamps: np.ndarray) -> None:
        """Raise if `ids` repeats a value: each id stamps its position; a repeat overwrites one."""
        message = f"{name} are this job's destinations and must be unique, got a repeated id"
        if len(ids) > len(stamps):  # more ids than destinations: some must repeat
            raise ValueError(message)
        positions = self._positions[: len(ids)]
        stamps[ids] = positions
        if not np.array_equal(stamps[ids], positions):
            raise ValueError(message)

    def _dependency(self, wait_event: Any) -> Any:
        """`wait_event` as a Numba event or stream (None: nothing to wait for); checked before use."""
        if wait_event is None or isinstance(wait_event, (self._event_type, self._stream_type)):
            return wait_event
        if hasattr(wait_event, "cuda_stream"):
            return foreign_stream(wait_event)
        raise TypeError(
            "wait_event must be a Numba event, a Numba stream or a stream with a cuda_stream handle "
            f"(torch), got {type(wait_event).__name__}"
        )

    def _hold_back(self, lane: _Lane, dependency: Any) -> None:
        if isinstance(dependency, self._event_type):
            dependency.wait(lane.stream)
            return
        lane.dependency.record(dependency)
        lane.dependency.wait(lane.stream)

    def _take_slot(self, lane: _Lane) -> _Slot:
        if not lane.free_slots:
            self._reap(lane, block_until=lane.in_flight[0])
        return lane.free_slots.pop()

    def _reap(self, lane: _Lane, block_until: _Job | None) -> None:
        """Retire the lane's finished jobs in order (they finish in order on one stream)."""
        while lane.in_flight:
            job = lane.in_flight[0]
            slot = job.slot
            try:
                if block_until is not None:  # jobs before it finish first: wait for each in turn
                    slot.end.synchronize()
                elif not event_done(slot.end):
                    return
                seconds = max(slot.start.elapsed_time(slot.end), 0.0) / 1e3  # the simulator says -1
                job.success = True
            except CUDA_ERRORS:
                seconds, job.success = 0.0, False
            lane.in_flight.popleft()
            job.slot = None
            lane.free_slots.append(slot)
            self._finished.append((job.job_id, job.success))
            if self.on_job_done is not None:
                self.on_job_done(job.job_id, job.direction, job.nbytes, seconds, job.success)
            if job is block_until:
                return


def _as_direction(direction: Direction | str) -> Direction:
    try:
        return Direction(direction)
    except ValueError:
        raise ValueError(f"direction must be 'store' or 'load', got {direction!r}") from None


def _as_ids(name: str, ids: Any) -> np.ndarray:
    """`ids` as a 1-D int64 array: integer NumPy arrays as they are, lists converted once."""
    if not isinstance(ids, np.ndarray):
        if not isinstance(ids, (list, tuple)):
            raise TypeError(
                f"{name} must be an integer NumPy array or a list of ints, got {type(ids).__name__}"
            )
        ids = np.asarray(ids) if len(ids) else np.empty(0, dtype=np.int64)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int64 or int32), got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {ids.shape}")
    return ids.astype(np.int64, copy=False)


def _check_range(name: str, ids: np.ndarray, limit: int) -> None:
    if len(ids) and (ids.min() < 0 or ids.max() >= limit):
        bad = ids[(ids < 0) | (ids >= limit)][0]
        raise IndexError(f"{name} must lie in [0, {limit}), got {bad}")
