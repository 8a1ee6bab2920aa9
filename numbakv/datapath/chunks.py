"""Chunks of blocks from several KV cache groups, moved as one job: the core of vLLM's worker.

An engine with KV cache groups (vLLM's hybrid models) keeps each group's pages in canonical byte
tensors, `[num_blocks, page_bytes]`, and says which tensors, and how many bytes of each page, each
group uses. A job names GPU blocks group by group, and host chunks; a chunk holds
`blocks_per_chunk` consecutive blocks of one group of one request. Here each group is one
`KVLayout` (its tensors as block-major byte arrays) with its own `TransferEngine`, and a host block
holds one GPU block of the group, so chunk c is host blocks `[c * k, c * k + k)`. Groups whose
blocks are equally large share one host pool: a chunk belongs to one key, hence to one group, at a
time. Engine-agnostic: the vLLM adapter (numbakv.integrations.vllm.worker) maps vLLM's specs to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from numbakv.checks import positive
from numbakv.datapath._device import array_interface, interface_strides
from numbakv.datapath.host_pool import HostPool
from numbakv.datapath.layouts import KVLayout, LayoutKind
from numbakv.datapath.transfer import TransferEngine, check_engine_options
from numbakv.datapath.validation import (
    as_ids,
    check_callback,
    check_count,
    check_job_id,
    check_range,
)
from numbakv.jobs import Direction, FinishedJob, JobDoneCallback

GroupRefs = Sequence[tuple[int, int]]
"""One KV cache group's data: (index of a canonical tensor, bytes of each page it uses) per layer."""


@dataclass(eq=False)
class _InFlight:
    """A job until its every group's part has finished: bytes moved, the slowest part's seconds."""

    direction: Direction
    chunk_ids: np.ndarray
    pending: set[int]  # groups whose part has not finished
    nbytes: int = 0
    seconds: float = 0.0
    success: bool = True


class ChunkTransfers:
    """Stores and loads chunks with one transfer engine per KV cache group.

    `block_arrays[t]` is canonical tensor t as a 2-D byte array `[num_blocks, page_bytes]` (any
    GPU array with `__cuda_array_interface__`; on the CUDA simulator, a NumPy array too).
    `compute_stream()` gives the stream whose queued work every job waits for: a store must not
    read blocks the model is still writing, and a load must not overwrite blocks queued kernels
    still read (or are zeroing). `host_pool(num_blocks, block_bytes)` makes each host pool (a
    `HostPool` of this process's own by default; one the node's processes share, for instance).

    A store that fails leaves its chunks marked unloadable until a later store to them succeeds:
    whatever the scheduler does with the failure, this process loads no half-written chunk. The
    mark is this process's own: with a pool the node shares, the other processes rely on the
    scheduler dropping the failed store (vLLM's connector does).
    """

    def __init__(
        self,
        block_arrays: Sequence[Any],
        group_refs: Sequence[GroupRefs],
        blocks_per_chunk: int,
        num_chunks: int,
        *,
        compute_stream: Callable[[], Any] | None = None,
        engine_options: Mapping[str, Any] | None = None,
        on_job_done: JobDoneCallback | None = None,
        host_pool: Callable[[int, int], HostPool] = HostPool,
    ) -> None:
        self.blocks_per_chunk = positive("blocks_per_chunk", blocks_per_chunk, integer=True)
        self.num_chunks = positive("num_chunks", num_chunks, integer=True)
        check_callback("on_job_done", on_job_done)
        if not group_refs:
            raise ValueError("no KV cache group to offload")
        check_engine_options(engine_options or {})
        self._compute_stream = compute_stream
        self._on_job_done = on_job_done
        self.layouts = [
            _group_layout(group, refs, block_arrays) for group, refs in enumerate(group_refs)
        ]
        self.pools: dict[int, HostPool] = {}
        for layout in self.layouts:
            if layout.block_bytes not in self.pools:
                self.pools[layout.block_bytes] = host_pool(
                    self.num_chunks * self.blocks_per_chunk, layout.block_bytes
                )
        self.engines = [
            TransferEngine(
                layout,
                self.pools[layout.block_bytes],
                on_job_done=partial(self._part_done, group),
                **(engine_options or {}),
            )
            for group, layout in enumerate(self.layouts)
        ]
        self._sub_blocks = np.arange(self.blocks_per_chunk, dtype=np.int64)
        self._unloadable = np.zeros(self.num_chunks, dtype=bool)
        self._jobs: dict[int, _InFlight] = {}
        self._done: list[FinishedJob] = []

    @property
    def host_bytes(self) -> int:
        return sum(pool.nbytes for pool in self.pools.values())

    def submit(
        self,
        job_id: int,
        direction: Direction | str,
        gpu_block_ids: np.ndarray,
        group_sizes: Sequence[int],
        block_indices: Sequence[int],
        chunk_ids: np.ndarray,
    ) -> None:
        """Queue one job: group g's `group_sizes[g]` GPU blocks, the first being block
        `block_indices[g]` of its request, to or from the chunks that hold them, in order.

        Raises (ValueError, IndexError, TypeError) if the job does not fit, checked for every
        group before any memory is touched.
        """
        direction = Direction(direction)
        check_job_id(job_id)
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} is already in flight")
        chunk_ids = as_ids("chunk_ids", chunk_ids)
        check_range("chunk_ids", chunk_ids, self.num_chunks)
        if direction is Direction.LOAD and self._unloadable[chunk_ids].any():
            bad = chunk_ids[self._unloadable[chunk_ids]]
            raise ValueError(f"host chunks {bad.tolist()} were not stored completely: not loadable")
        parts = [
            (
                group,
                self.engines[group].check_gpu_ids(direction, gpu_ids),
                self.engines[group].check_host_ids(direction, host_ids),
            )
            for group, gpu_ids, host_ids in self._parts(
                as_ids("gpu_block_ids", gpu_block_ids), group_sizes, block_indices, chunk_ids
            )
        ]
        wait_event = None if self._compute_stream is None else self._compute_stream()
        job = _InFlight(direction, chunk_ids, pending={group for group, _, _ in parts})
        self._jobs[job_id] = job
        queued: list[int] = []
        try:
            for group, gpu_ids, host_ids in parts:
                self.engines[group].enqueue(job_id, direction, gpu_ids, host_ids, wait_event)
                queued.append(group)
        except BaseException:
            self._abandon(job_id, queued)
            raise

    def _parts(
        self,
        gpu_ids: np.ndarray,
        group_sizes: Sequence[int],
        block_indices: Sequence[int],
        chunk_ids: np.ndarray,
    ) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Each group's (group, GPU block ids, host block ids); one empty part for an empty job."""
        if len(group_sizes) != len(self.engines) or len(block_indices) != len(group_sizes):
            raise ValueError(
                f"expected group_sizes and block_indices for {len(self.engines)} KV cache "
                f"group(s), got {len(group_sizes)} and {len(block_indices)}"
            )
        sizes = [check_count(f"group_sizes[{g}]", size) for g, size in enumerate(group_sizes)]
        firsts = [check_count(f"block_indices[{g}]", i) for g, i in enumerate(block_indices)]
        if gpu_ids.ndim != 1 or sum(sizes) != len(gpu_ids):
            raise ValueError(f"group_sizes {sizes} do not add up to the {len(gpu_ids)} GPU blocks")
        k = self.blocks_per_chunk
        parts = []
        gpu_at = chunk_at = 0
        for group, (size, first) in enumerate(zip(sizes, firsts)):
            if size == 0:
                continue
            skip = first % k  # blocks of the first chunk before this job's first block
            count = -(-(skip + size) // k)
            chunks = chunk_ids[chunk_at : chunk_at + count]
            if k == 1:
                host_ids = chunks
            else:
                host_ids = (chunks[:, None] * k + self._sub_blocks).reshape(-1)[skip : skip + size]
            parts.append((group, gpu_ids[gpu_at : gpu_at + size], host_ids))
            gpu_at += size
            chunk_at += count
        if chunk_at != len(chunk_ids):
            raise ValueError(
                f"the GPU blocks fill {chunk_at} host chunks, the job names {len(chunk_ids)}"
            )
        return parts or [(0, gpu_ids, chunk_ids)]

    def _abandon(self, job_id: int, queued: list[int]) -> None:
        """A job an engine could not queue (a CUDA error): wait for its queued parts, report none,
        and if it is a store, mark its chunks unloadable (a staged part may have written some of
        its rounds before the failing one)."""
        job = self._jobs[job_id]
        for group in queued:
            self.engines[group].wait(job_id)
            self.engines[group].get_finished()  # reaps the part: the job's id is free again
        if job.direction is Direction.STORE:
            self._unloadable[job.chunk_ids] = True
        del self._jobs[job_id]

    def _part_done(self, group: int, part: FinishedJob) -> None:
        job = self._jobs[part.job_id]
        job.pending.discard(group)
        job.nbytes += part.nbytes
        job.seconds = max(job.seconds, part.seconds)
        job.success = job.success and part.success
        if not job.pending:
            finished = FinishedJob(part.job_id, job.direction, job.success, job.nbytes, job.seconds)
            self._done.append(finished)
            if self._on_job_done is not None:  # once per job, as the engines' callers expect
                self._on_job_done(finished)

    def get_finished(self) -> list[FinishedJob]:
        """Jobs whose every part finished since the last call; never blocks."""
        for engine in self.engines:
            engine.get_finished()  # reaps the finished parts into _part_done
        done, self._done = self._done, []
        for finished in done:
            job = self._jobs.pop(finished.job_id)
            if job.direction is Direction.STORE:
                self._unloadable[job.chunk_ids] = not job.success
        return done

    def wait(self, job_ids: Sequence[int] | set[int]) -> None:
        """Block until these jobs have finished (unknown or reported ones are skipped)."""
        for job_id in job_ids:
            job = self._jobs.get(job_id)
            if job is not None:
                for group in list(job.pending):
                    self.engines[group].wait(job_id)

    def drain(self) -> None:
        """Block until every job in flight has finished (they are still reported)."""
        self.wait(list(self._jobs))

    @property
    def jobs_in_flight(self) -> int:
        return len(self._jobs)


def _group_layout(group: int, refs: GroupRefs, block_arrays: Sequence[Any]) -> KVLayout:
    """A group's tensors, `page` bytes of each block, as a block-major layout of byte arrays."""
    if not refs:
        raise ValueError(f"KV cache group {group} names no tensor")
    views = []
    for tensor_index, page_bytes in refs:
        if not 0 <= tensor_index < len(block_arrays):
            raise ValueError(
                f"KV cache group {group} names tensor {tensor_index}; there are {len(block_arrays)}"
            )
        array = block_arrays[tensor_index]
        if len(array.shape) != 2 or not 0 < page_bytes <= array.shape[1]:
            raise ValueError(
                f"KV cache group {group}: tensor {tensor_index} has shape {tuple(array.shape)}, "
                f"expected [num_blocks, page_bytes >= {page_bytes}]"
            )
        views.append(_Pages(array, page_bytes))
    try:
        return KVLayout.from_arrays(LayoutKind.MLA, views)
    except (TypeError, ValueError) as error:
        raise ValueError(f"KV cache group {group}: {error}") from None


class _Pages:
    """The first `page_bytes` of each row of a `[num_blocks, row]` array as the block-major
    `[num_blocks, 1, page]` array an MLA layout takes: the same memory, described anew through
    the CUDA array interface (a Numba device array cannot gain an axis by indexing)."""

    def __init__(self, array: Any, page_bytes: int) -> None:
        interface = array_interface(array)
        row_stride, item_stride = interface_strides(interface)
        self.__cuda_array_interface__ = {
            "shape": (int(interface["shape"][0]), 1, page_bytes),
            "strides": (row_stride, page_bytes * item_stride, item_stride),
            "typestr": interface["typestr"],
            "data": interface["data"],
            "version": 3,
        }
        self.array = array  # keeps the memory alive
