"""The data path on a real GPU, with torch tensors as the engine's KV cache (skipped elsewhere).

Ordering tests put real work on the other stream (`torch.cuda._sleep` holds it for tens of
milliseconds) so that a missing dependency shows up as wrong bytes; overlap tests compare event
timings of jobs alone and together, so that transfers serialised with compute show up as time,
on medians of interleaved repeats (one noisy sample decides nothing).
"""

import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from numbakv import CPUOffloadingManager, KVOffloader
from numbakv.datapath import HostPool, KVLayout, LayoutKind, TransferEngine
from tests.support.datapath_cases import outcomes

pytestmark = pytest.mark.gpu

GPU_POISON = 0x5A
HOST_POISON = 0xA5
NUM_LAYERS, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE = 32, 256, 16, 8, 128  # 2 MiB blocks
NUM_HOST_BLOCKS = 96
SLEEP_CYCLES = 200_000_000  # about 0.1 s at H100 clocks: far longer than any job here
ROOT = Path(__file__).resolve().parents[2]
PATHS = ["zero_copy", "staged"]
REPEATS = 5  # timing asserts compare medians of this many interleaved runs


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


def _make_cache(torch, kind, dtype, num_layers=NUM_LAYERS):
    if kind is LayoutKind.CROSS_LAYER:
        return [
            _random_tensor(
                torch, (NUM_BLOCKS, num_layers, 2, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE), dtype
            )
        ]
    shape = {
        LayoutKind.FLASH_ATTN: (2, NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE),
        LayoutKind.FLASHINFER: (NUM_BLOCKS, 2, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE),
        LayoutKind.MLA: (NUM_BLOCKS, BLOCK_SIZE, 576),
    }[kind]
    return [_random_tensor(torch, shape, dtype) for _ in range(num_layers)]


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


def _setup(torch, num_host_blocks=NUM_HOST_BLOCKS, **options):
    """A flash-attention cache of random bytes, a pool of other random bytes, an engine."""
    tensors = _make_cache(torch, LayoutKind.FLASH_ATTN, torch.float16)
    layout = _kv_from(LayoutKind.FLASH_ATTN, tensors)
    pool = HostPool.for_layout(layout, num_host_blocks)
    pool.blocks[:] = np.random.default_rng(2).integers(1, 255, pool.blocks.shape, dtype=np.uint8)
    torch.cuda.synchronize()
    return tensors, pool, TransferEngine(layout, pool, **options)


def _numba_stream(torch, stream=None):
    from numba import cuda

    return cuda.external_stream((stream or torch.cuda.current_stream()).cuda_stream)


STAGED = "staged"
ROUND_TRIPS = [  # (layout, dtype, path, staging buffer in blocks: 32 is the default's 64 MiB)
    *[(kind, dtype, STAGED, 32) for kind in LayoutKind for dtype in ("float16", "float32", "int8")],
    *[(kind, "float16", "zero_copy", 32) for kind in LayoutKind],
    (LayoutKind.FLASH_ATTN, "float16", STAGED, 5),
    (LayoutKind.FLASH_ATTN, "int8", {"store": STAGED, "load": "zero_copy"}, 32),
    (LayoutKind.FLASH_ATTN, "int8", {"store": "zero_copy", "load": STAGED}, 32),
]


@pytest.mark.parametrize(("kind", "dtype_name", "path", "staging_blocks"), ROUND_TRIPS, ids=str)
def test_round_trip_at_real_sizes(torch, kind, dtype_name, path, staging_blocks):
    """91 blocks of 2 MiB each way: staged jobs in rounds of 32 blocks (5 in one case)."""
    rng = np.random.default_rng(0)
    tensors = _make_cache(torch, kind, getattr(torch, dtype_name))
    layout = _kv_from(kind, tensors)
    assert layout.word == np.dtype(np.uint64)
    pool = HostPool.for_layout(layout, NUM_HOST_BLOCKS)
    pool.blocks[:] = HOST_POISON
    engine = TransferEngine(
        layout, pool, path=path, staging_bytes=staging_blocks * layout.block_bytes
    )
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
    engine.completion_event(2).wait(_numba_stream(torch))
    restored = _blocks_as_bytes(torch, kind, tensors, np.arange(NUM_BLOCKS))
    assert engine.wait(2) and sorted(outcomes(engine.get_finished())) == [(1, True), (2, True)]
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


def _copies_behind_a_sleep(torch, targets, sources):
    """Work the transfers must be ordered against: a side stream that sleeps, then copies each of
    `sources` into its target. Returns the stream and an event recorded after the copies."""
    torch.cuda.synchronize()
    side, done = torch.cuda.Stream(), torch.cuda.Event()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        for target, source in zip(targets, sources):
            target.copy_(source)
        done.record()
    return side, done


@pytest.mark.parametrize("wait_on", ["stream", "event"])
def test_a_store_waits_for_what_it_is_given(torch, wait_on):
    """The blocks are rewritten on a side stream behind a long sleep; the store reads new bytes."""
    tensors, pool, engine = _setup(torch)
    newer = [_random_tensor(torch, t.shape, t.dtype) for t in tensors]
    side, written = _copies_behind_a_sleep(torch, tensors, newer)
    ids = np.arange(0, 2 * NUM_HOST_BLOCKS, 2)[:NUM_HOST_BLOCKS]
    wait_event = side if wait_on == "stream" else written
    engine.submit(1, "store", ids, np.arange(NUM_HOST_BLOCKS), wait_event=wait_event)
    assert engine.wait(1)
    expected = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, newer, ids)
    np.testing.assert_array_equal(pool.blocks, expected)


def test_transfers_do_not_wait_for_the_default_stream(torch):
    """Transfer streams are non-blocking: a store runs while torch's default stream sleeps."""
    tensors, pool, engine = _setup(torch)
    original = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, np.arange(8))
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)  # on the default stream
    busy = torch.cuda.Event()
    busy.record()
    engine.submit(1, "store", np.arange(8), np.arange(8))
    assert engine.wait(1)
    assert not busy.query(), "the store waited for the default stream"
    torch.cuda.synchronize()
    np.testing.assert_array_equal(pool.blocks[:8], original)


def test_a_load_waits_for_kernels_still_reading_its_blocks(torch):
    """A reader queued on the engine's stream before the load sees the blocks' old bytes."""
    tensors, pool, engine = _setup(torch)
    ids = np.arange(16)
    original = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, ids)
    snapshots = [torch.empty_like(t) for t in tensors]
    side, _ = _copies_behind_a_sleep(torch, snapshots, tensors)
    engine.submit(1, "load", ids, ids, wait_event=side)
    assert engine.wait(1)
    torch.cuda.synchronize()
    seen = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, snapshots, ids)
    np.testing.assert_array_equal(seen, original)
    loaded = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, ids)
    np.testing.assert_array_equal(loaded, pool.blocks[ids])


def test_reads_after_a_late_load_wait_for_its_completion_event(torch):
    """The load is held back behind a sleeping stream; the engine's stream, told to wait for the
    load's completion event, reads the loaded bytes and not the ones before."""
    tensors, pool, engine = _setup(torch)
    ids = np.arange(16)
    side, _ = _copies_behind_a_sleep(torch, [], [])
    engine.submit(1, "load", ids, ids, wait_event=side)
    engine.completion_event(1).wait(_numba_stream(torch))
    loaded = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, ids)
    np.testing.assert_array_equal(loaded, pool.blocks[ids])
    assert engine.wait(1)


@pytest.mark.parametrize("path", PATHS)
def test_each_layer_range_is_read_after_its_own_load(torch, path):
    """Four loads of 8 layers each, the first held behind a sleeping stream: the engine's stream,
    told to wait for each range's completion event and reading that range's layers right after,
    reads the loaded bytes of every range (on the host pool's side, its place in each block)."""
    tensors, pool, engine = _setup(torch, path=path)
    ids = np.arange(16)
    index = torch.as_tensor(ids, device="cuda")
    side, _ = _copies_behind_a_sleep(torch, [], [])
    starts = range(0, NUM_LAYERS, 8)
    read = []
    for number, start in enumerate(starts):
        first = side if number == 0 else None  # the rest follow it on the engine's stream
        engine.submit(number, "load", ids, ids, wait_event=first, layers=range(start, start + 8))
        engine.completion_event(number).wait(_numba_stream(torch))
        read.append(torch.stack(tensors[start : start + 8])[:, :, index].movedim(2, 0).contiguous())
    layer_bytes = pool.block_bytes // NUM_LAYERS
    for start, snapshot in zip(starts, read):
        expected = pool.blocks[ids, start * layer_bytes : (start + 8) * layer_bytes]
        np.testing.assert_array_equal(
            snapshot.view(torch.uint8).reshape(len(ids), -1).cpu().numpy(), expected
        )
    assert all(engine.wait(number) for number in range(len(starts)))


@pytest.mark.parametrize("path", PATHS)
def test_an_offloader_load_by_layer_groups_is_read_group_by_group(torch, path):
    """The same through KVOffloader: 16 blocks stored, then loaded into 16 others as one load of
    four groups of 8 layers, held behind a sleeping stream; each group's layers, read right after
    `completion_event(job, layer=...)`, are the stored bytes, and the load is reported once."""
    tensors, _, engine = _setup(torch, path=path)
    manager = CPUOffloadingManager(block_size=BLOCK_SIZE, num_blocks=NUM_HOST_BLOCKS)
    offloader = KVOffloader(manager, engine)
    sources, targets = np.arange(16), np.arange(16, 32)
    hashes = [b"block-%d" % source for source in sources]
    assert offloader.wait(offloader.store(hashes, sources))
    stored = _blocks_as_bytes(torch, LayoutKind.FLASH_ATTN, tensors, sources)
    index = torch.as_tensor(targets, device="cuda")
    side, _ = _copies_behind_a_sleep(torch, [], [])
    groups = [range(start, start + 8) for start in range(0, NUM_LAYERS, 8)]
    job = offloader.load(hashes, targets, wait_event=side, layer_groups=groups)
    read = []
    for layers in groups:
        offloader.completion_event(job, layer=layers.start).wait(_numba_stream(torch))
        layer_slice = torch.stack(tensors[layers.start : layers.stop])
        read.append(layer_slice[:, :, index].movedim(2, 0).contiguous())
    layer_bytes = stored.shape[1] // NUM_LAYERS
    for layers, snapshot in zip(groups, read):
        np.testing.assert_array_equal(
            snapshot.view(torch.uint8).reshape(len(targets), -1).cpu().numpy(),
            stored[:, layers.start * layer_bytes : layers.stop * layer_bytes],
        )
    assert offloader.wait(job)
    assert outcomes(offloader.poll())[-1] == (job, True)
    assert manager.stats().being_read == 0


def _span_ms(torch, action) -> float:
    """Milliseconds from an event recorded before `action` to one recorded after what it queued
    (`action` returns the events the default stream must wait for)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for event in action():
        event.wait(_numba_stream(torch))
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _compute(torch, matrix, repeats=40):
    for _ in range(repeats):
        matrix @ matrix
    return []


def _medians(*actions) -> list[float]:
    """Each action's median milliseconds over REPEATS rounds, the actions interleaved in each."""
    times = [[action() for action in actions] for _ in range(REPEATS)]
    return [statistics.median(column) for column in zip(*times)]


@pytest.mark.parametrize("path", PATHS)
def test_a_store_overlaps_compute_on_the_default_stream(torch, path):
    _, _, engine = _setup(torch, num_host_blocks=192, path=path)
    ids = np.arange(192)
    matrix = torch.randn((4096, 4096), dtype=torch.float16, device="cuda")
    jobs = iter(range(100))

    def store():
        job = next(jobs)
        engine.submit(job, "store", ids, ids)
        return [engine.completion_event(job)]

    def compute():
        return _compute(torch, matrix)

    _span_ms(torch, store), _span_ms(torch, compute)  # warm up
    store_ms, compute_ms, both_ms = _medians(
        lambda: _span_ms(torch, store),
        lambda: _span_ms(torch, compute),
        lambda: _span_ms(torch, lambda: compute() + store()),
    )
    assert store_ms > 2 and compute_ms > 2, (store_ms, compute_ms)
    # zero-copy's kernels share the SMs with the matmuls, so less of it hides (H200: 0.85)
    bound = 0.8 if path == STAGED else 0.9
    assert both_ms < bound * (store_ms + compute_ms), (store_ms, compute_ms, both_ms)


@pytest.mark.parametrize("path", PATHS)
def test_a_store_and_a_load_overlap(torch, path):
    _, _, engine = _setup(torch, num_host_blocks=256, path=path)
    half = np.arange(128)
    jobs = iter(range(100))

    def submit(direction, ids):
        job = next(jobs)
        engine.submit(job, direction, ids, ids)
        return [engine.completion_event(job)]

    _span_ms(torch, lambda: submit("store", half) + submit("load", half + 128))  # warm up
    store_ms, load_ms, both_ms = _medians(
        lambda: _span_ms(torch, lambda: submit("store", half)),
        lambda: _span_ms(torch, lambda: submit("load", half + 128)),
        lambda: _span_ms(torch, lambda: submit("store", half) + submit("load", half + 128)),
    )
    assert both_ms < 0.8 * (store_ms + load_ms), (store_ms, load_ms, both_ms)


@pytest.mark.parametrize("path", PATHS)
def test_launches_go_straight_to_the_driver(torch, recwarn, path):
    """The fast launch is prepared on this numba-cuda (its fallback would only warn), and the
    driver batches copies where the staged path is asked for."""
    _, _, engine = _setup(torch, num_host_blocks=8, path=path)
    assert engine.path == {"store": path, "load": path}
    assert all(lane.launch.uses_driver_launch for lane in engine._lanes.values())
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


FAULT = """
    import numpy as np
    from numba import cuda
    from numbakv.datapath import GPUFault, HostPool, KVLayout, TransferEngine

    layers = [cuda.device_array((8, 4, 64), dtype=np.uint8) for _ in range(2)]
    layout = KVLayout.from_arrays("mla", layers)
    engine = TransferEngine(layout, HostPool.for_layout(layout, 8))
    store = engine._lanes["store"].launch
    store._params[4] = 0xDEAD0000  # the arena's data pointer: a kernel fault, as a bug would make
    engine.submit(1, "store", [0, 1], [0, 1])
    for call in (lambda: engine.wait(1), engine.get_finished, lambda: engine.submit(2, "load", [0], [0])):
        try:
            call()
        except GPUFault as error:
            print("GPUFault:", error)
    """


def test_a_kernel_fault_raises_gpu_fault_on_every_later_call(torch):
    """In a child process: a faulted CUDA context cannot be used again."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAULT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the faulted child may exit badly; its output is what counts
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("GPUFault:")]
    assert len(lines) == 3, result.stdout + result.stderr
    assert all("store job 1 failed on the GPU" in line for line in lines)
