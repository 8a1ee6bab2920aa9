"""Gather (GPU -> host) and scatter (host -> GPU) kernels over all layers (or a range of them) in
one launch.

Work item: one warp copies one piece (at most PIECE_BYTES) of one segment (one layer's chunk) of
one (gpu block, host block) pair, lanes striding over it in words so each warp instruction moves
32 consecutive words; four loads are issued before their stores to keep more requests in flight
over the link. Splitting chunks into pieces gives a small job enough warps, hence enough bytes in
flight, to fill the link. Warps walk the work items with a grid-stride loop, so the caller caps
the number of thread blocks (and SMs) a job holds.

Kernel arguments (all offsets in words):
    arena        the word view spanning every layer (KVLayout.arena)
    host         where the host blocks are: the host pool as a flat word view (HostPool.words), or
                 a device staging buffer of whole host blocks (the staged path)
    segments     int64 offsets of block 0 of each segment in the arena
    ids          int64 [gpu ids of the n pairs..., host block ids of the n pairs...]
    n            number of pairs of the job
    first        the first pair this launch moves
    count        how many pairs from `first` it moves (a staged job moves a round at a time)
    seg_first    the first segment the job moves (0, or its first layer's)
    seg_count    how many segments from `seg_first` it moves (all, or its layers')
    host_segments   segments a block holds in `host` (all in the pool, the job's in a staging
                 buffer)
    host_seg_first  the segment at a block's start in `host` (0 in the pool, `seg_first` in a
                 staging buffer, which holds only the job's)
    block_stride words between consecutive GPU blocks of one segment
    chunk_words  words per segment per block
    piece_words  words per work item (the last piece of a chunk may be shorter)
A host block is segment after segment, `host_segments * chunk_words` words. Items are pair-major,
then segment, then piece, so consecutive warps write consecutive host bytes.

Each word width is compiled once, with an explicit signature, on first use and cached on disk
(`cache=True`), so a restarted process loads it instead of compiling it again.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import cuda, from_dtype, types

WARP_SIZE = 32
PIECE_BYTES = 4096
"""Largest work item: four rounds of a warp's four 256-byte loads with 8-byte words."""

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
def _item_range(
    item, segments, ids, n, first, seg_first, seg_count, host_segments, host_seg_first,
    block_stride, chunk_words, piece_words,
):  # fmt: skip
    """Where work item `item` (counted from pair `first`) starts in the arena and among the host
    blocks, and how many words it has."""
    pieces = (chunk_words + piece_words - 1) // piece_words
    per_pair = seg_count * pieces
    pair = item // per_pair
    rest = item - pair * per_pair
    segment = rest // pieces  # among the job's
    offset = (rest - segment * pieces) * piece_words
    pair += first
    segment += seg_first
    gpu_start = segments[segment] + ids[pair] * block_stride + offset
    host_block = ids[n + pair] * host_segments + segment - host_seg_first
    return gpu_start, host_block * chunk_words + offset, min(piece_words, chunk_words - offset)


@cuda.jit(device=True)
def _num_items(count, seg_count, chunk_words, piece_words):
    return count * seg_count * ((chunk_words + piece_words - 1) // piece_words)


def _gather(
    arena, host, segments, ids, n, first, count, seg_first, seg_count, host_segments,
    host_seg_first, block_stride, chunk_words, piece_words,
):  # fmt: skip
    lane = cuda.threadIdx.x % WARP_SIZE
    first_warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // WARP_SIZE
    num_warps = cuda.gridDim.x * cuda.blockDim.x // WARP_SIZE
    for item in range(
        first_warp, _num_items(count, seg_count, chunk_words, piece_words), num_warps
    ):
        gpu_start, host_start, words = _item_range(
            item, segments, ids, n, first, seg_first, seg_count, host_segments, host_seg_first,
            block_stride, chunk_words, piece_words,
        )  # fmt: skip
        _copy_run(host, host_start, arena, gpu_start, words, lane)


def _scatter(
    arena, host, segments, ids, n, first, count, seg_first, seg_count, host_segments,
    host_seg_first, block_stride, chunk_words, piece_words,
):  # fmt: skip
    lane = cuda.threadIdx.x % WARP_SIZE
    first_warp = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) // WARP_SIZE
    num_warps = cuda.gridDim.x * cuda.blockDim.x // WARP_SIZE
    for item in range(
        first_warp, _num_items(count, seg_count, chunk_words, piece_words), num_warps
    ):
        gpu_start, host_start, words = _item_range(
            item, segments, ids, n, first, seg_first, seg_count, host_segments, host_seg_first,
            block_stride, chunk_words, piece_words,
        )  # fmt: skip
        _copy_run(arena, gpu_start, host, host_start, words, lane)


_BODIES = {"gather": _gather, "scatter": _scatter}


def signature(word: np.dtype) -> Any:
    """The one signature each kernel is compiled for, per word width."""
    words = types.Array(from_dtype(np.dtype(word)), 1, "C")
    ids = types.Array(types.int64, 1, "C")
    scalar = types.int64
    return types.void(words, words, ids, ids, *[scalar] * 10)


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


def piece_words(chunk_words: int, word: np.dtype) -> int:
    """Words per work item for chunks of `chunk_words` words of `word`."""
    return min(chunk_words, PIECE_BYTES // np.dtype(word).itemsize)


def num_items(num_pairs: int, num_segments: int, chunk_words: int, piece: int) -> int:
    """Work items of a job, as the kernels count them."""
    return num_pairs * num_segments * -(-chunk_words // piece)


def grid_size(num_items: int, threads_per_block: int, max_thread_blocks: int | None) -> int:
    """Thread blocks to launch: a warp per work item, at most `max_thread_blocks` (None: no cap)."""
    needed = max(1, -(-num_items // (threads_per_block // WARP_SIZE)))
    return needed if max_thread_blocks is None else min(needed, max_thread_blocks)
