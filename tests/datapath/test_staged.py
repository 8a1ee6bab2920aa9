"""The staged path on the simulator: byte-exact round trips for every layout, both directions,
jobs larger than the staging buffer (rounds), and staged jobs mixed with zero-copy ones."""

import numpy as np
import pytest

from numbakv.datapath import HostPool, LayoutKind, TransferEngine, transfer
from numbakv.datapath.staging import Staging
from numbakv.jobs import Direction
from tests.support.datapath_cases import (
    GPU_POISON,
    HOST_POISON,
    finish,
    make_cache,
    small_engine,
)

NUM_HOST_BLOCKS = 7
STAGED_BOTH = {"store": "staged", "load": "staged"}
MIXED = [
    pytest.param(STAGED_BOTH, id="staged"),
    pytest.param({"store": "staged", "load": "zero_copy"}, id="staged-store"),
    pytest.param({"store": "zero_copy", "load": "staged"}, id="staged-load"),
]


def _engine(cache, path, staging_blocks=2, **options):
    return small_engine(cache, path, NUM_HOST_BLOCKS, staging_blocks, **options)


def _poisoned(cache, copies):
    return [np.full(c.nbytes, GPU_POISON, np.uint8).view(c.dtype).reshape(c.shape) for c in copies]


@pytest.mark.parametrize("kind", list(LayoutKind))
@pytest.mark.parametrize("path", MIXED)
def test_round_trip_in_rounds_every_layout(kind, path):
    """5 blocks through a buffer of 2: rounds of 2, 2 and 1, each way."""
    rng = np.random.default_rng(len(kind.value) + len(str(path)))
    cache = make_cache(kind, rng, num_blocks=8)
    engine, pool = _engine(cache, path)
    assert engine.path == {Direction(d): p for d, p in path.items()}
    original = cache.host_copies()
    gpu_ids, host_ids = rng.permutation(8)[:5], rng.permutation(NUM_HOST_BLOCKS)[:5]

    engine.submit("store", "store", gpu_ids, host_ids)
    assert finish(engine, "store") == [("store", True)]
    for gpu_id, host_id in zip(gpu_ids, host_ids):
        assert pool.blocks[host_id].tobytes() == cache.block_bytes(original, gpu_id)
    assert (np.delete(pool.blocks, host_ids, axis=0) == HOST_POISON).all()

    cache.poison()
    targets = rng.permutation(8)[:5]
    engine.submit("load", "load", targets, host_ids)
    assert finish(engine, "load") == [("load", True)]
    restored, poisoned = cache.host_copies(), _poisoned(cache, original)
    for target, source in zip(targets, gpu_ids):
        assert cache.block_bytes(restored, target) == cache.block_bytes(original, source)
    for untouched in np.setdiff1d(np.arange(8), targets):
        assert cache.block_bytes(restored, untouched) == cache.block_bytes(poisoned, untouched)


@pytest.mark.parametrize("staging_blocks", [1, 3, 64])
def test_any_buffer_size_moves_the_same_bytes(staging_blocks):
    """One block a round, rounds that do not divide the job, and a buffer larger than any job
    (held to the most pairs a job can have)."""
    rng = np.random.default_rng(staging_blocks)
    cache = make_cache("flashinfer", rng, num_blocks=8, num_layers=2)
    engine, pool = _engine(cache, STAGED_BOTH, staging_blocks)
    lanes = engine._lanes
    assert lanes[Direction.STORE].staging.capacity == min(staging_blocks, NUM_HOST_BLOCKS)
    original = cache.host_copies()
    ids = np.arange(NUM_HOST_BLOCKS)
    engine.submit(1, "store", ids, ids[::-1].copy())
    finish(engine, 1)
    assert [pool.blocks[6 - i].tobytes() for i in ids] == [
        cache.block_bytes(original, i) for i in ids
    ]


def test_staged_and_zero_copy_jobs_interleave_over_one_pool():
    """Two engines over one cache and pool, one staged and one zero-copy, jobs alternating: every
    job moves its own blocks and nothing else."""
    rng = np.random.default_rng(11)
    cache = make_cache("flash_attn", rng, num_blocks=8)
    staged, pool = _engine(cache, STAGED_BOTH)
    zero_copy = TransferEngine(
        cache.layout, pool, max_thread_blocks=2, threads_per_block=32, path="zero_copy"
    )
    original = cache.host_copies()
    for job, (engine, gpu_id) in enumerate(zip([staged, zero_copy] * 2, [3, 5, 0, 7])):
        engine.submit(job, "store", [gpu_id], [job])
        assert finish(engine, job) == [(job, True)]
    assert [pool.blocks[job].tobytes() for job in range(4)] == [
        cache.block_bytes(original, gpu_id) for gpu_id in (3, 5, 0, 7)
    ]
    cache.poison()
    zero_copy.submit("a", "load", [1, 2], [0, 1])
    staged.submit("b", "load", [6, 4], [2, 3])
    finish(zero_copy, "a"), finish(staged, "b")
    restored = cache.host_copies()
    expected = {1: 3, 2: 5, 6: 0, 4: 7}
    for target, source in expected.items():
        assert cache.block_bytes(restored, target) == cache.block_bytes(original, source)


def test_the_default_is_staged_both_ways(monkeypatch):
    """As measured on an H200: staged stores and loads; either path both ways when asked for. A
    staged default falls back to zero-copy where copies cannot be batched; asking for staged
    there is an error."""
    cache = make_cache("mla", np.random.default_rng(2))
    pool = HostPool.for_layout(cache.layout, 2)
    assert TransferEngine(cache.layout, pool).path == dict.fromkeys(Direction, "staged")
    for path in ("staged", "zero_copy"):
        assert TransferEngine(cache.layout, pool, path=path).path == dict.fromkeys(Direction, path)
    monkeypatch.setattr(transfer, "batch_copy_unsupported", lambda: "the driver is too old")
    assert TransferEngine(cache.layout, pool).path == dict.fromkeys(Direction, "zero_copy")
    with pytest.raises(ValueError, match="path 'staged' is not available here: the driver"):
        TransferEngine(cache.layout, pool, path="staged")


def test_a_staged_kernel_runs_at_hbm_speed_unless_told_otherwise():
    """At the default options a staged lane takes 1024 threads a block and a warp per piece; the
    zero-copy lanes keep theirs, and options given apply to every lane."""
    cache = make_cache("mla", np.random.default_rng(6))
    pool = HostPool.for_layout(cache.layout, 2)
    mixed = TransferEngine(cache.layout, pool, path={"store": "zero_copy", "load": "staged"})
    assert mixed.threads_per_block == {Direction.STORE: 128, Direction.LOAD: 1024}
    assert mixed.thread_blocks == {Direction.STORE: 16, Direction.LOAD: None}
    told = TransferEngine(cache.layout, pool, path="staged", max_thread_blocks=2)
    assert told.thread_blocks == dict.fromkeys(Direction, 2)
    assert told.threads_per_block == {Direction.STORE: 128, Direction.LOAD: 1024}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"path": "dma"}, r"path must be one of \('zero_copy', 'staged'\), got 'dma'"),
        (
            {"path": {"store": "staged"}},
            "path must be one of .* or a mapping of 'store' and 'load'",
        ),
        ({"path": {"store": "staged", "load": "fast"}}, "got 'fast'"),
        ({"staging_bytes": 0}, "staging_bytes must be a positive int, got 0"),
        ({"staging_bytes": 1.5}, "staging_bytes must be a positive int, got 1.5"),
    ],
)
def test_bad_path_settings_are_one_clear_error(options, message):
    cache = make_cache("mla", np.random.default_rng(3))
    with pytest.raises(ValueError, match=message):
        TransferEngine(cache.layout, HostPool.for_layout(cache.layout, 2), **options)


def test_a_copy_failing_mid_job_returns_the_slot(monkeypatch):
    """The second round's copy raises: the submit fails, its slot and job id are free again."""
    cache = make_cache("flash_attn", np.random.default_rng(4), num_blocks=8)
    engine, pool = _engine(cache, STAGED_BOTH, staging_blocks=1, max_jobs_in_flight=1)
    staging = engine._lanes[Direction.STORE].staging
    real_copy, calls = staging._copy, []

    def second_fails(pairs):
        calls.append(pairs)
        if len(calls) == 2:
            raise RuntimeError("injected copy failure")
        real_copy(pairs)

    monkeypatch.setattr(staging, "_copy", second_fails)
    with pytest.raises(RuntimeError, match="injected"):
        engine.submit(1, "store", [0, 1, 2], [0, 1, 2])
    monkeypatch.setattr(staging, "_copy", real_copy)
    engine.submit(1, "store", [4, 5], [3, 4])
    assert finish(engine, 1) == [(1, True)]
    copies = cache.host_copies()
    assert pool.blocks[4].tobytes() == cache.block_bytes(copies, 5)


def test_a_round_costs_no_allocation_of_device_or_pinned_memory(monkeypatch):
    """Staging buffers are made with the engine; a submit of many rounds allocates none."""
    cache = make_cache("mla", np.random.default_rng(5), num_blocks=8)
    engine, _ = _engine(cache, STAGED_BOTH, staging_blocks=1)
    made = []
    monkeypatch.setattr(Staging, "__init__", lambda *args: made.append(args))
    from numba import cuda

    for name in ("device_array", "pinned_array", "mapped_array", "to_device"):
        monkeypatch.setattr(cuda, name, lambda *a, _name=name, **k: made.append(_name))
    engine.submit(1, "store", np.arange(6), np.arange(6))
    engine.submit(2, "load", np.arange(6), np.arange(6))
    finish(engine, 1, 2)
    assert made == []


def test_jobs_of_changing_layer_counts_allocate_nothing_the_size_of_the_gpu_cache():
    """A layered load's groups pack different numbers of segments: each change resizes a round,
    and a job's places in the buffer are written into its pinned ids, with no array per job."""
    import tracemalloc

    cache = make_cache("flash_attn", np.random.default_rng(6), num_layers=4, num_blocks=1 << 14)
    engine, _ = _engine(cache, STAGED_BOTH, staging_blocks=4)
    staging = engine._lanes[Direction.LOAD].staging  # the submit path's own calls, timed apart
    out = np.empty(1 << 14, dtype=np.int64)
    tracemalloc.start()
    try:
        for seg_count in (2, 6, 8, 2, 4):
            staging.use(seg_count)
            staging.positions(out=out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4096  # an array of the cache's 16384 blocks is 128 KiB
    staging.use(2)  # rounds of 16 blocks of two segments each
    staging.positions(out=out[:40])
    assert out[:40].tolist() == [pair % 16 for pair in range(40)]
