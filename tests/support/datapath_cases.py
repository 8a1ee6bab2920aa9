"""Shared helpers for the data-path tests: engine-like KV caches of random bytes and their oracle."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from numbakv.datapath import HostPool, KVLayout, LayoutKind, TransferEngine

GPU_POISON = 0x5A
HOST_POISON = 0xA5


@dataclass
class KVCache:
    """Per-layer (or one cross-layer) device arrays, plus the layout built from them."""

    kind: LayoutKind
    arrays: list
    layout: KVLayout

    def host_copies(self) -> list[np.ndarray]:
        return [array.copy_to_host() for array in self.arrays]

    def block_bytes(self, copies: list[np.ndarray], block: int) -> bytes:
        """The oracle: a block's bytes in host-block order (layer, then K/V), straight from NumPy."""
        if self.kind is LayoutKind.FLASH_ATTN:
            return b"".join(layer[kv, block].tobytes() for layer in copies for kv in range(2))
        return b"".join(layer[block].tobytes() for layer in copies)

    def poison(self) -> None:
        """Fill the arrays (strided views too, through Numba's assignment) with the GPU poison."""
        for array in self.arrays:
            array[:] = np.frombuffer(bytes([GPU_POISON]) * array.dtype.itemsize, array.dtype)[0]


def finish(engine, *job_ids) -> list:
    """Wait for `job_ids`, then everything `get_finished` reports as (job id, success), sorted (a
    GPU runs jobs asynchronously: a job is reported only once it has finished)."""
    for job_id in job_ids:
        engine.wait(job_id)
    return sorted(outcomes(engine.get_finished()))


def outcomes(jobs) -> list:
    """Finished jobs as (job id, success)."""
    return [(job.job_id, job.success) for job in jobs]


def random_array(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
    """Random bytes (never all zero, never the poison pattern) viewed as `dtype`."""
    dtype = np.dtype(dtype)
    raw = rng.integers(1, 255, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    raw[raw == GPU_POISON] = 1
    raw[raw == HOST_POISON] = 2
    return raw.view(dtype).reshape(shape)


def make_cache(
    kind: LayoutKind | str,
    rng: np.random.Generator,
    *,
    num_layers: int = 3,
    num_blocks: int = 8,
    block_size: int = 2,
    num_heads: int = 2,
    head_size: int = 4,
    dtype=np.float16,
) -> KVCache:
    kind = LayoutKind(kind)
    if kind is LayoutKind.CROSS_LAYER:
        shape = (num_blocks, num_layers, 2, block_size, num_heads, head_size)
        arrays = [cuda.to_device(random_array(rng, shape, dtype))]
        return KVCache(kind, arrays, KVLayout.from_arrays(kind, arrays[0]))
    shape = {
        LayoutKind.FLASH_ATTN: (2, num_blocks, block_size, num_heads, head_size),
        LayoutKind.FLASHINFER: (num_blocks, 2, block_size, num_heads, head_size),
        LayoutKind.MLA: (num_blocks, block_size, head_size),
    }[kind]
    arrays = [cuda.to_device(random_array(rng, shape, dtype)) for _ in range(num_layers)]
    return KVCache(kind, arrays, KVLayout.from_arrays(kind, arrays))


def small_engine(cache: KVCache, path, num_host_blocks: int, staging_blocks: int = 2, **options):
    """An engine over `cache` and a pool of `num_host_blocks` filled with the host poison, at the
    simulator's small launch shape, with a staging buffer of `staging_blocks` whole blocks."""
    pool = HostPool.for_layout(cache.layout, num_host_blocks)
    pool.blocks[:] = HOST_POISON
    engine = TransferEngine(
        cache.layout,
        pool,
        max_thread_blocks=2,
        threads_per_block=32,
        path=path,
        staging_bytes=staging_blocks * cache.layout.block_bytes,
        **options,
    )
    return engine, pool


class EngineInFront:
    """What the offloader needs of an engine that a fake leaves to the real one."""

    def __init__(self, engine):
        self.engine = engine

    num_host_blocks = property(lambda self: self.engine.num_host_blocks)
    host_pool = property(lambda self: self.engine.host_pool)
    layout = property(lambda self: self.engine.layout)

    def check_gpu_ids(self, direction, gpu_block_ids):
        return self.engine.check_gpu_ids(direction, gpu_block_ids)

    def check_wait_event(self, wait_event):
        self.engine.check_wait_event(wait_event)

    def completion_event(self, job_id):
        return self.engine.completion_event(job_id)

    def enqueue(self, *args, **options):
        self.engine.enqueue(*args, **options)

    def wait(self, job_id):
        return self.engine.wait(job_id)
