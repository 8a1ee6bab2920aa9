"""Byte-exact store/load round trips on the simulator, for every layout, dtype and access width."""

import numpy as np
import pytest
from numba import cuda

from numbakv.datapath import HostPool, KVLayout, LayoutKind, TransferEngine, kernels
from tests.support.datapath_cases import (
    GPU_POISON,
    HOST_POISON,
    KVCache,
    make_cache,
    outcomes,
    random_array,
)

NUM_HOST_BLOCKS = 6


def _engine(cache: KVCache) -> tuple[TransferEngine, HostPool]:
    pool = HostPool.for_layout(cache.layout, NUM_HOST_BLOCKS)
    pool.blocks[:] = HOST_POISON
    return TransferEngine(cache.layout, pool, max_thread_blocks=3, threads_per_block=32), pool


def _round_trip(cache: KVCache, rng: np.random.Generator, count: int) -> None:
    """Store `count` random GPU blocks to random host blocks, wipe the GPU, load them elsewhere."""
    engine, pool = _engine(cache)
    original = cache.host_copies()
    gpu_ids = rng.permutation(cache.layout.num_blocks)[:count]
    host_ids = rng.permutation(NUM_HOST_BLOCKS)[:count]

    engine.submit("store", "store", gpu_ids, host_ids)
    assert engine.wait("store")
    for gpu_id, host_id in zip(gpu_ids, host_ids):
        assert pool.blocks[host_id].tobytes() == cache.block_bytes(original, gpu_id)
    untouched = np.setdiff1d(np.arange(NUM_HOST_BLOCKS), host_ids)
    assert (pool.blocks[untouched] == HOST_POISON).all()

    cache.poison()
    load_gpu_ids = rng.permutation(cache.layout.num_blocks)[:count]
    engine.submit("load", "load", load_gpu_ids, host_ids)
    assert engine.wait("load")
    assert sorted(outcomes(engine.get_finished())) == [("load", True), ("store", True)]

    restored = cache.host_copies()
    poisoned = [
        np.full(l.nbytes, GPU_POISON, np.uint8).view(l.dtype).reshape(l.shape) for l in original
    ]
    for gpu_id, source_id in zip(load_gpu_ids, gpu_ids):
        assert cache.block_bytes(restored, gpu_id) == cache.block_bytes(original, source_id)
    for gpu_id in np.setdiff1d(np.arange(cache.layout.num_blocks), load_gpu_ids):
        assert cache.block_bytes(restored, gpu_id) == cache.block_bytes(poisoned, gpu_id)


@pytest.mark.parametrize("kind", list(LayoutKind))
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
def test_round_trip_every_layout_and_dtype(kind, dtype):
    rng = np.random.default_rng(abs(hash((kind.value, np.dtype(dtype).name))) % 2**32)
    cache = make_cache(kind, rng, dtype=dtype)
    assert cache.layout.word == np.dtype(np.uint64)
    _round_trip(cache, rng, count=4)


@pytest.mark.parametrize("count", [0, 1, NUM_HOST_BLOCKS])
def test_round_trip_empty_single_and_full_batches(count):
    rng = np.random.default_rng(count)
    _round_trip(make_cache(LayoutKind.FLASH_ATTN, rng), rng, count)


@pytest.mark.parametrize(
    ("dtype", "head_size", "word"),
    [(np.int8, 3, np.uint8), (np.float16, 3, np.uint16), (np.float32, 3, np.uint32)],
)
def test_narrow_accesses_when_sizes_are_not_8_byte_multiples(dtype, head_size, word):
    rng = np.random.default_rng(7)
    cache = make_cache(LayoutKind.MLA, rng, block_size=1, head_size=head_size, dtype=dtype)
    assert cache.layout.word == np.dtype(word)
    _round_trip(cache, rng, count=3)


def test_unaligned_layer_addresses_fall_back_to_bytes():
    """Layers at odd addresses (views into one byte buffer) force the byte path; bytes stay exact."""
    rng = np.random.default_rng(11)
    num_blocks, head_size = 6, 8
    layer_bytes = num_blocks * head_size * 4
    backing = cuda.to_device(random_array(rng, (1 + 3 * layer_bytes,), np.uint8))
    layers = [
        backing[1 + i * layer_bytes : 1 + (i + 1) * layer_bytes].reshape(
            num_blocks, 1, head_size * 4
        )
        for i in range(3)
    ]
    layout = KVLayout.from_arrays(LayoutKind.MLA, layers)
    assert layout.word == np.dtype(np.uint8)
    _round_trip(KVCache(LayoutKind.MLA, layers, layout), rng, count=3)


def test_padded_layers_move_only_their_logical_bytes():
    """A non-contiguous view (head_size padded in memory) moves row by row and skips the padding."""
    rng = np.random.default_rng(13)
    padded = [cuda.to_device(random_array(rng, (2, 5, 2, 2, 6), np.float16)) for _ in range(2)]
    layers = [array[:, :, :, :, :4] for array in padded]
    layout = KVLayout.from_arrays(LayoutKind.FLASH_ATTN, layers)
    assert layout.chunk_bytes == 4 * 2 and layout.num_segments == 2 * 2 * 2 * 2
    assert layout.block_bytes == 2 * 2 * 2 * 2 * 4 * 2
    padding_before = [array.copy_to_host()[..., 4:].tobytes() for array in padded]
    _round_trip(KVCache(LayoutKind.FLASH_ATTN, layers, layout), rng, count=3)
    for array, before in zip(padded, padding_before):
        # cache.poison() wrote only the views; the padding must never have been touched by kernels
        assert array.copy_to_host()[..., 4:].tobytes() == before


def test_layers_sharing_one_allocation():
    """vLLM-style: per-layer views of one big buffer work like separate allocations."""
    rng = np.random.default_rng(17)
    big = cuda.to_device(random_array(rng, (4, 2, 6, 2, 2, 4), np.float16))
    layers = [big[i] for i in range(4)]
    layout = KVLayout.from_arrays(LayoutKind.FLASH_ATTN, layers)
    _round_trip(KVCache(LayoutKind.FLASH_ATTN, layers, layout), rng, count=5)


def test_host_pool_reports_size_and_pinning_time():
    pool = HostPool(num_blocks=3, block_bytes=40)
    assert pool.nbytes == 120 and pool.blocks.shape == (3, 40) and pool.pin_seconds >= 0
    with pytest.raises(ValueError, match="positive"):
        HostPool(num_blocks=0, block_bytes=40)


@pytest.mark.parametrize(
    ("dtype", "head_size", "chunk_words", "pieces"),
    [
        (np.float32, 330, 165, 1),  # the four-at-a-time loop, then the one-at-a-time tail
        (np.float32, 600, 300, 1),
        (np.float32, 1100, 550, 2),  # over 4 KiB: two work items, the second short
        (np.int8, 4099, 4099, 2),  # the byte path: a 4 KiB piece and 3 bytes
        (np.float64, 1024, 1024, 2),  # exactly two pieces
    ],
)
def test_long_chunks_stay_exact(dtype, head_size, chunk_words, pieces):
    rng = np.random.default_rng(head_size)
    cache = make_cache(
        LayoutKind.MLA,
        rng,
        num_layers=2,
        num_blocks=4,
        block_size=1,
        head_size=head_size,
        dtype=dtype,
    )
    layout = cache.layout
    assert layout.chunk_bytes // layout.word.itemsize == chunk_words
    assert -(-chunk_words // kernels.piece_words(chunk_words, layout.word)) == pieces
    _round_trip(cache, rng, count=3)
