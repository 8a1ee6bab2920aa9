"""TransferEngine semantics: completion reporting, callbacks, dependencies, slots and faults."""

import numpy as np
import pytest
from numba import cuda

from numbakv.datapath import (
    COMPILE_SECONDS,
    DEFAULT_MAX_THREAD_BLOCKS,
    GPUFault,
    HostPool,
    TransferEngine,
    _device,
    kernels,
    transfer,
)
from numbakv.jobs import Direction
from tests.support.datapath_cases import HOST_POISON, finish, make_cache, outcomes


@pytest.fixture
def cache():
    return make_cache("flash_attn", np.random.default_rng(5), num_blocks=8)


def _engine(cache, **options):
    pool = HostPool.for_layout(cache.layout, 8)
    pool.blocks[:] = HOST_POISON
    options = {"max_thread_blocks": 2, "threads_per_block": 32, **options}
    return TransferEngine(cache.layout, pool, **options), pool


def test_every_job_is_reported_once_with_its_bytes_and_time(cache):
    done = []
    engine, _ = _engine(cache, on_job_done=done.append)
    engine.submit(1, Direction.STORE, np.arange(3), np.arange(3))
    engine.submit(2, "load", np.array([5]), np.array([0]))
    engine.submit(3, "store", np.empty(0, np.int64), np.empty(0, np.int64))
    assert finish(engine, 1, 2, 3) == [(1, True), (2, True), (3, True)]
    assert engine.get_finished() == []
    block_bytes = cache.layout.block_bytes
    assert sorted((job.job_id, job.direction, job.nbytes) for job in done) == [
        (1, Direction.STORE, 3 * block_bytes),
        (2, Direction.LOAD, block_bytes),
        (3, Direction.STORE, 0),
    ]
    assert all(job.seconds >= 0 and job.success for job in done)


def test_wait_returns_success_and_leaves_reporting_to_get_finished(cache):
    engine, _ = _engine(cache)
    engine.submit("job", "store", [0], [0])
    assert engine.wait("job") is True
    assert engine.wait("job") is True
    assert outcomes(engine.get_finished()) == [("job", True)]
    with pytest.raises(KeyError):
        engine.wait("job")


def test_more_jobs_than_slots_reuse_slots_in_order(cache):
    engine, pool = _engine(cache, max_jobs_in_flight=2)
    for job in range(6):
        engine.submit(job, "store", [job], [job])
    assert finish(engine, *range(6)) == [(job, True) for job in range(6)]
    copies = cache.host_copies()
    for job in range(6):
        assert pool.blocks[job].tobytes() == cache.block_bytes(copies, job)


def test_store_accepts_an_event_or_a_stream_to_wait_for(cache):
    """The API on the simulator (synchronous); tests/datapath/test_gpu.py checks the ordering."""
    engine, pool = _engine(cache)
    compute = cuda.stream()
    written = cuda.event()
    written.record(compute)
    engine.submit(1, "store", [1], [1], wait_event=written)
    engine.submit(2, "store", [2], [2], wait_event=compute)
    assert finish(engine, 1, 2) == [(1, True), (2, True)]
    assert pool.blocks[2].tobytes() == cache.block_bytes(cache.host_copies(), 2)


def test_load_exposes_its_completion_event(cache):
    engine, _ = _engine(cache)
    engine.submit(1, "load", [3], [0])
    compute = cuda.stream()
    engine.completion_event(1).wait(compute)
    engine.wait(1)
    assert engine.completion_event(1) is None
    assert outcomes(engine.get_finished()) == [(1, True)]


def test_completion_event_is_none_once_the_job_is_reported(cache):
    """Issue 23, item 4: it raised KeyError once get_finished had reported the job."""
    engine, _ = _engine(cache)
    engine.submit(1, "load", [3], [0])
    assert finish(engine, 1) == [(1, True)]
    assert engine.completion_event(1) is None


def test_kernels_are_compiled_once_per_word_width(cache):
    _engine(cache)
    _engine(cache)
    assert {"gather[uint64]", "scatter[uint64]"} <= set(COMPILE_SECONDS)
    assert kernels.get_kernel("gather", np.uint64) is kernels.get_kernel(
        "gather", np.dtype(np.uint64)
    )


def _fail(*_args):
    raise RuntimeError("injected driver failure")


@pytest.mark.parametrize("step", ["record", "upload", "launch"])
def test_a_failed_submit_returns_its_slot(cache, monkeypatch, step):
    """Issue 23, item 9 (issue 24, item 7): a record, upload or launch that raised after submit
    took a ring slot leaked it; after max_jobs_in_flight such failures every submit raised
    IndexError, even once the cause was gone."""
    engine, pool = _engine(cache, max_jobs_in_flight=2)
    with monkeypatch.context() as patch:
        if step == "launch":
            patch.setattr(engine._lanes[Direction.STORE], "launch", _fail)
        else:
            patch.setattr(transfer, step, _fail)
        for job in range(5):
            with pytest.raises(RuntimeError, match="injected"):
                engine.submit(job, "store", [job], [job])
    assert engine.get_finished() == []
    for job in range(5):  # the cause is gone: every job goes through, ids free again
        engine.submit(job, "store", [job], [job])
    assert finish(engine, *range(5)) == [(job, True) for job in range(5)]
    assert pool.blocks[4].tobytes() == cache.block_bytes(cache.host_copies(), 4)


def test_a_gpu_fault_raises_one_clear_error_and_reports_nothing(cache, monkeypatch):
    """Issue 23, item 7: a kernel fault (an illegal address) breaks the CUDA context for good;
    the engine says so, on every later call, instead of reporting jobs as finished."""
    done = []
    engine, _ = _engine(cache, on_job_done=done.append)
    engine.submit(1, "store", [0], [0])
    engine.submit(2, "load", [1], [1])

    def illegal_address(_event):
        raise _device.CudaAPIError(700, "CUDA_ERROR_ILLEGAL_ADDRESS")

    monkeypatch.setattr(transfer, "event_done", illegal_address)
    with pytest.raises(GPUFault, match="store job 1 failed on the GPU.*restart the process"):
        engine.get_finished()
    monkeypatch.undo()
    for call in (
        engine.get_finished,
        lambda: engine.wait(2),
        lambda: engine.submit(3, "store", [2], [2]),
    ):
        with pytest.raises(GPUFault, match="store job 1 failed"):
            call()
    assert done == []


def test_thread_blocks_are_capped_by_default_and_small_jobs_get_enough_warps():
    """Issue 23, item 5: the default holds at most 16 thread blocks whatever the job's size, and
    chunks are split into 4 KiB pieces so a job of a few blocks still has many warps in flight."""
    assert DEFAULT_MAX_THREAD_BLOCKS == 16
    chunk_words = 16 * 1024 // 8  # a 16 KiB chunk of 8-byte words
    piece = kernels.piece_words(chunk_words, np.dtype(np.uint64))
    assert piece * 8 == kernels.PIECE_BYTES
    one_gib = kernels.num_items(1024, 64, chunk_words, piece)  # 1,024 blocks x 32 layers x K, V
    assert kernels.grid_size(one_gib, 1024, DEFAULT_MAX_THREAD_BLOCKS) == 16
    per_step = kernels.num_items(16, 64, chunk_words, piece)  # the per-step job
    assert kernels.grid_size(per_step, 1024, DEFAULT_MAX_THREAD_BLOCKS) == 16
    two_blocks = kernels.num_items(2, 64, chunk_words, piece)
    assert two_blocks == 512  # 512 warps of 1 KiB in flight each, not 128
    assert kernels.grid_size(two_blocks, 1024, DEFAULT_MAX_THREAD_BLOCKS) == 16
    assert kernels.piece_words(100, np.dtype(np.uint64)) == 100  # short chunks stay whole


def test_an_engine_holds_the_default_cap(cache):
    pool = HostPool.for_layout(cache.layout, 2)
    assert TransferEngine(cache.layout, pool).max_thread_blocks == DEFAULT_MAX_THREAD_BLOCKS
