"""TransferEngine semantics: completion reporting, callbacks, dependencies and slot reuse."""

import numpy as np
import pytest
from numba import cuda

from numbakv.datapath import COMPILE_SECONDS, Direction, HostPool, TransferEngine, kernels
from tests.datapath_cases import HOST_POISON, make_cache


@pytest.fixture
def cache():
    return make_cache("flash_attn", np.random.default_rng(5), num_blocks=8)


def _engine(cache, **options):
    pool = HostPool.for_layout(cache.layout, 8)
    pool.blocks[:] = HOST_POISON
    return TransferEngine(
        cache.layout, pool, max_thread_blocks=2, threads_per_block=32, **options
    ), pool


def test_every_job_is_reported_once_with_its_bytes_and_time(cache):
    done = []
    engine, _ = _engine(cache, on_job_done=lambda *report: done.append(report))
    engine.submit(1, Direction.STORE, np.arange(3), np.arange(3))
    engine.submit(2, "load", np.array([5]), np.array([0]))
    engine.submit(3, "store", np.empty(0, np.int64), np.empty(0, np.int64))
    assert sorted(engine.get_finished()) == [(1, True), (2, True), (3, True)]
    assert engine.get_finished() == []
    block_bytes = cache.layout.block_bytes
    assert sorted(report[:3] for report in done) == [
        (1, Direction.STORE, 3 * block_bytes),
        (2, Direction.LOAD, block_bytes),
        (3, Direction.STORE, 0),
    ]
    assert all(seconds >= 0 and success for *_, seconds, success in done)


def test_wait_returns_success_and_leaves_reporting_to_get_finished(cache):
    engine, _ = _engine(cache)
    engine.submit("job", "store", [0], [0])
    assert engine.wait("job") is True
    assert engine.wait("job") is True
    assert engine.get_finished() == [("job", True)]
    with pytest.raises(KeyError):
        engine.wait("job")


def test_more_jobs_than_slots_reuse_slots_in_order(cache):
    engine, pool = _engine(cache, max_jobs_in_flight=2)
    for job in range(6):
        engine.submit(job, "store", [job], [job])
    assert sorted(engine.get_finished()) == [(job, True) for job in range(6)]
    copies = cache.host_copies()
    for job in range(6):
        assert pool.blocks[job].tobytes() == cache.block_bytes(copies, job)


def test_store_waits_for_an_event_or_a_stream(cache):
    engine, pool = _engine(cache)
    compute = cuda.stream()
    written = cuda.event()
    written.record(compute)
    engine.submit(1, "store", [1], [1], wait_event=written)
    engine.submit(2, "store", [2], [2], wait_event=compute)
    assert sorted(engine.get_finished()) == [(1, True), (2, True)]
    assert pool.blocks[2].tobytes() == cache.block_bytes(cache.host_copies(), 2)


def test_load_exposes_its_completion_event(cache):
    engine, _ = _engine(cache)
    engine.submit(1, "load", [3], [0])
    compute = cuda.stream()
    engine.completion_event(1).wait(compute)
    engine.wait(1)
    assert engine.completion_event(1) is None
    assert engine.get_finished() == [(1, True)]


def test_kernels_are_compiled_once_per_word_width(cache):
    _engine(cache)
    _engine(cache)
    assert {"gather[uint64]", "scatter[uint64]"} <= set(COMPILE_SECONDS)
    assert kernels.get_kernel("gather", np.uint64) is kernels.get_kernel(
        "gather", np.dtype(np.uint64)
    )
