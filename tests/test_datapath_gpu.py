"""Round trips at real sizes on a GPU, with torch tensors as the engine's KV cache (skipped elsewhere)."""

import numpy as np
import pytest

from numbakv.datapath import HostPool, KVLayout, LayoutKind, TransferEngine

pytestmark = pytest.mark.gpu

GPU_POISON = 0x5A
HOST_POISON = 0xA5
NUM_LAYERS, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE = 32, 256, 16, 8, 128
NUM_HOST_BLOCKS = 96


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def _random_tensor(torch, shape, dtype):
    """Random bytes on the GPU viewed as `dtype` (never the poison pattern, never all zero)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(1, 255, (int(np.prod(shape)) * itemsize,), dtype=torch.uint8, device="cuda")
    raw[raw == GPU_POISON] = 1
    return raw.view(dtype).reshape(shape)


def _make_cache(torch, kind, dtype):
    if kind is LayoutKind.CROSS_LAYER:
        return [
            _random_tensor(
                torch, (NUM_BLOCKS, NUM_LAYERS, 2, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE), dtype
            )
        ]
    shape = {
        LayoutKind.FLASH_ATTN: (2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE),
        LayoutKind.FLASHINFER: (NUM_BLOCKS, 2, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE),
        LayoutKind.MLA: (NUM_BLOCKS, BLOCK_SIZE, 576),
    }[kind]
    return [_random_tensor(torch, shape, dtype) for _ in range(NUM_LAYERS)]


def _blocks_as_bytes(torch, kind, tensors, ids):
    """The oracle: blocks `ids` in host-block order (layer, then K/V) as an [n, bytes] uint8 array."""
    index = torch.as_tensor(ids, dtype=torch.int64, device="cuda")
    if kind is LayoutKind.CROSS_LAYER:
        blocks = tensors[0][index]
    elif kind is LayoutKind.FLASH_ATTN:
        blocks = torch.stack(tensors)[:, :, index].movedim(2, 0)
    else:
        blocks = torch.stack(tensors)[:, index].movedim(1, 0)
    return blocks.contiguous().view(torch.uint8).reshape(len(ids), -1).cpu().numpy()


def _kv_from(kind, tensors):
    return KVLayout.from_arrays(kind, tensors[0] if kind is LayoutKind.CROSS_LAYER else tensors)


@pytest.mark.parametrize("kind", list(LayoutKind))
@pytest.mark.parametrize("dtype_name", ["float16", "float32", "int8"])
def test_round_trip_at_real_sizes(torch, kind, dtype_name):
    rng = np.random.default_rng(0)
    tensors = _make_cache(torch, kind, getattr(torch, dtype_name))
    layout = _kv_from(kind, tensors)
    assert layout.word == np.dtype(np.uint64)
    pool = HostPool.for_layout(layout, NUM_HOST_BLOCKS)
    pool.blocks[:] = HOST_POISON
    engine = TransferEngine(layout, pool)
    count = NUM_HOST_BLOCKS - 5
    gpu_ids = rng.permutation(NUM_BLOCKS)[:count]
    host_ids = rng.permutation(NUM_HOST_BLOCKS)[:count]
    original = _blocks_as_bytes(torch, kind, tensors, np.arange(NUM_BLOCKS))

    engine.submit(1, "store", gpu_ids, host_ids, wait_event=torch.cuda.current_stream())
    assert engine.wait(1)
    np.testing.assert_array_equal(pool.blocks[host_ids], original[gpu_ids])
    untouched = np.setdiff1d(np.arange(NUM_HOST_BLOCKS), host_ids)
    assert (pool.blocks[untouched] == HOST_POISON).all()

    for tensor in tensors:
        tensor.view(torch.uint8).fill_(GPU_POISON)
    load_ids = rng.permutation(NUM_BLOCKS)[:count]
    engine.submit(2, "load", load_ids, host_ids, wait_event=torch.cuda.current_stream())
    engine.completion_event(2).wait(_numba_stream_of(torch))
    restored = _blocks_as_bytes(torch, kind, tensors, np.arange(NUM_BLOCKS))
    assert sorted(engine.get_finished()) == [(1, True), (2, True)]
    np.testing.assert_array_equal(restored[load_ids], original[gpu_ids])
    assert (restored[np.setdiff1d(np.arange(NUM_BLOCKS), load_ids)] == GPU_POISON).all()


def test_unaligned_layers_round_trip(torch):
    """Layers at odd byte offsets take the byte path on the real GPU too."""
    block_bytes = 3 * 1000
    backing = _random_tensor(torch, (1 + 4 * NUM_BLOCKS * block_bytes,), torch.uint8)
    layers = [
        backing[1 + i * NUM_BLOCKS * block_bytes : 1 + (i + 1) * NUM_BLOCKS * block_bytes].view(
            NUM_BLOCKS, 1, -1
        )
        for i in range(4)
    ]
    layout = KVLayout.from_arrays(LayoutKind.MLA, layers)
    assert layout.word == np.dtype(np.uint8)
    pool = HostPool.for_layout(layout, 16)
    engine = TransferEngine(layout, pool)
    gpu_ids = np.random.default_rng(1).permutation(NUM_BLOCKS)[:16]
    engine.submit(1, "store", gpu_ids, np.arange(16), wait_event=torch.cuda.current_stream())
    assert engine.wait(1)
    np.testing.assert_array_equal(
        pool.blocks, _blocks_as_bytes(torch, LayoutKind.MLA, layers, gpu_ids)
    )


def test_concurrent_store_and_load(torch):
    """A store and a load in flight together, on disjoint blocks, both land byte-exact."""
    tensors = _make_cache(torch, LayoutKind.FLASH_ATTN, torch.float16)
    layout = _kv_from(LayoutKind.FLASH_ATTN, tensors)
    pool = HostPool.for_layout(layout, NUM_HOST_BLOCKS)
    pool.blocks[:] = np.random.default_rng(2).integers(1, 255, pool.blocks.shape, dtype=np.uint8)
    engine = TransferEngine(layout, pool, max_thread_blocks=16)
    original_gpu = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, np.arange(NUM_BLOCKS))
    original_host = pool.blocks.copy()
    half = NUM_HOST_BLOCKS // 2
    torch.cuda.synchronize()

    engine.submit("store", "store", np.arange(half), np.arange(half))
    engine.submit("load", "load", np.arange(half, 2 * half), np.arange(half, 2 * half))
    assert engine.wait("store") and engine.wait("load")
    np.testing.assert_array_equal(pool.blocks[:half], original_gpu[:half])
    restored = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, np.arange(half, 2 * half))
    np.testing.assert_array_equal(restored, original_host[half : 2 * half])


def _numba_stream_of(torch):
    from numba import cuda

    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)
