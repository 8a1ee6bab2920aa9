"""Gather (GPU -> host) and scatter (host -> GPU) kernels over all layers in one launch.

Work item: one warp copies one segment (one layer's chunk) of one (gpu block, host block) pair,
lanes striding over the chunk in words so each warp instruction moves 32 consecutive words;
four loads are issued before their stores to keep more requests in flight over the link. Warps
walk the work items with a grid-stride loop, so the caller may cap the number of thread blocks.

Kernel arguments (all offsets in words):
    arena        the word view spanning every layer (KVLayout.arena)
    host         the host pool as a flat word view (HostPool.words)
    segments     int64 offsets of block 0 of each segment in the arena
    ids          int64 [gpu ids of the n pairs..., host ids of the n pairs...]
    n            number of pairs
    block_stride words between consecutive GPU blocks of one segment
    chunk_words  words per segment per block
The host block of pair i is segment after segment, `len(segments) * chunk_words` words.

Each word width is compiled once, with an explicit signature, on first use and cached on disk
(`cache=True`), so a restarted process loads it instead of compiling it again.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import cuda, from_dtype, types

WARP_SIZE = 32

COMPILE_SECONDS: dict[str, float] = {}
"""Seconds the first use of each kernel took to compile (or load from the disk cache)."""

_compiled: dict[tuple[str, np.dtype], Any] = {}


@cuda.jit(device=True)
def _copy_run(dst, dst_start, src, src_start, count, lane):
    """One warp copies `count` words; lane `lane` takes every 32nd word, four at a time."""
    i = lane
    while i + 3 * WARP_SIZE < count:
        a = src[src_start + i]
        b = src[src_start + i + WARP_SIZE]
        c = src[src_start + i + 2 * WARP_SIZE]
        d = src[src_start + i + 3 * WARP_SIZE]
        dst[dst_start + i] = a
        dst[dst_start + i + WARP_SIZE] = b
        dst[dst_start + i + 2 * WARP_SIZE] = c
        dst[dst_start + i + 3 * WARP_SIZE] = d
        i += 4 * WARP_SIZE
    while i < count:
        dst[dst_start + i] = src[src_start + i]
        i += WARP_SIZE


@cuda.jit(device=True)
def _item_starts(item, segments, ids, n, block_stride, chunk_words):
    """Word offsets of work item `item` (pair-major, segment-minor) in the arena and the host pool."""
    num_segments = segments.shape[0]
    pair = item // num_segments
    segment = item - pair * num_segments
    gpu_start = segments[segment] + ids[pair] * block_stride
    host_start = (ids[n + pair] * num_segments + segment) * chunk_words
    return gpu_start, host_start


def _gather(arena, host, segments, ids, n, block_stride, chunk_words):
    lane = cuda.threadIdx.x % WARP_SIZE
    first_warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // WARP_SIZE
    num_warps = cuda.gridDim.x * cuda.blockDim.x // WARP_SIZE
    for item in range(first_warp, n * segments.shape[0], num_warps):
        gpu_start, host_start = _item_starts(item, segments, ids, n, block_stride, chunk_words)
        _copy_run(host, host_start, arena, gpu_start, chunk_words, lane)


def _scatter(arena, host, segments, ids, n, block_stride, chunk_words):
    lane = cuda.threadIdx.x % WARP_SIZE
    first_warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // WARP_SIZE
    num_warps = cuda.gridDim.x * cuda.blockDim.x // WARP_SIZE
    for item in range(first_warp, n * segments.shape[0], num_warps):
        gpu_start, host_start = _item_starts(item, segments, ids, n, block_stride, chunk_words)
        _copy_run(arena, gpu_start, host, host_start, chunk_words, lane)


_BODIES = {"gather": _gather, "scatter": _scatter}


def signature(word: np.dtype) -> Any:
    """The one signature each kernel is compiled for, per word width."""
    words = types.Array(from_dtype(np.dtype(word)), 1, "C")
    ids = types.Array(types.int64, 1, "C")
    return types.void(words, words, ids, ids, types.int64, types.int64, types.int64)


def get_kernel(name: str, word: np.dtype) -> Any:
    """The compiled `name` ("gather" or "scatter") kernel for `word`-wide accesses."""
    key = (name, np.dtype(word))
    kernel = _compiled.get(key)
    if kernel is None:
        started = time.perf_counter()
        kernel = cuda.jit(signature(word), cache=True)(_BODIES[name])
        COMPILE_SECONDS[f"{name}[{np.dtype(word).name}]"] = time.perf_counter() - started
        _compiled[key] = kernel
    return kernel


def grid_size(num_items: int, threads_per_block: int, max_thread_blocks: int | None) -> int:
    """Thread blocks to launch: a warp per work item, rounded up to a power of two (so few distinct
    launch configurations exist), at most `max_thread_blocks` (None: no cap)."""
    warps_per_block = threads_per_block // WARP_SIZE
    needed = max(1, -(-num_items // warps_per_block))
    rounded = 1 << (needed - 1).bit_length()
    return rounded if max_thread_blocks is None else min(rounded, max_thread_blocks)
