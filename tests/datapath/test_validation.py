"""Every bad submit raises a clear error before anything moves, and leaves the engine usable."""

import numpy as np
import pytest

from numbakv.datapath import HostPool, TransferEngine, host_pool, transfer
from numbakv.jobs import Direction
from tests.support.datapath_cases import HOST_POISON, finish, make_cache, outcomes

NUM_HOST_BLOCKS = 5


def type_name(value) -> str:
    return type(value).__name__


@pytest.fixture
def setup():
    rng = np.random.default_rng(3)
    cache = make_cache("flashinfer", rng, num_blocks=6)
    pool = HostPool.for_layout(cache.layout, NUM_HOST_BLOCKS)
    pool.blocks[:] = HOST_POISON
    engine = TransferEngine(cache.layout, pool, max_thread_blocks=2, threads_per_block=32)
    return cache, pool, engine


BAD_SUBMITS = [
    pytest.param(
        "store",
        [0, 6],
        [0, 1],
        IndexError,
        r"gpu_block_ids must lie in \[0, 6\), got 6",
        id="gpu-id-high",
    ),
    pytest.param(
        "load",
        [-1, 2],
        [0, 1],
        IndexError,
        r"gpu_block_ids must lie in \[0, 6\), got -1",
        id="gpu-id-negative",
    ),
    pytest.param(
        "store",
        [0, 1],
        [0, 5],
        IndexError,
        r"host_block_ids must lie in \[0, 5\), got 5",
        id="host-id-high",
    ),
    pytest.param(
        "store", [0, 1, 2], [0, 1], ValueError, "lengths must match", id="length-mismatch"
    ),
    pytest.param(
        "store",
        [0, 1],
        [3, 3],
        ValueError,
        "host_block_ids .* must be unique",
        id="duplicate-host-dest",
    ),
    pytest.param(
        "load",
        [2, 2],
        [0, 1],
        ValueError,
        "gpu_block_ids .* must be unique",
        id="duplicate-gpu-dest",
    ),
    pytest.param(
        "store",
        [0] * 12,
        [1] * 12,
        ValueError,
        "host_block_ids .* must be unique",
        id="more-ids-than-blocks",
    ),
    pytest.param(
        "store",
        np.array([0.0, 1.0]),
        [0, 1],
        TypeError,
        "gpu_block_ids must hold integers",
        id="float-ids",
    ),
    pytest.param(
        "store",
        [0, 1],
        np.array([True, False]),
        TypeError,
        "host_block_ids must hold integers",
        id="bool-ids",
    ),
    pytest.param(
        "store",
        [0, 1],
        [2, True],
        TypeError,
        "host_block_ids must hold integers, got a bool",
        id="bool-among-int-ids",
    ),
    pytest.param(
        "store", np.array([[0, 1]]), [0, 1], ValueError, "gpu_block_ids must be 1-D", id="2d-ids"
    ),
    pytest.param(
        "store",
        "01",
        [0, 1],
        TypeError,
        "gpu_block_ids must be an integer NumPy array",
        id="string-ids",
    ),
    pytest.param(
        "sideways", [0], [0], ValueError, "direction must be 'store' or 'load'", id="bad-direction"
    ),
]


@pytest.mark.parametrize(("direction", "gpu_ids", "host_ids", "error", "message"), BAD_SUBMITS)
def test_bad_submit_raises_and_moves_nothing(setup, direction, gpu_ids, host_ids, error, message):
    cache, pool, engine = setup
    gpu_before = [layer.tobytes() for layer in cache.host_copies()]
    with pytest.raises(error, match=message):
        engine.submit(1, direction, gpu_ids, host_ids)
    assert (pool.blocks == HOST_POISON).all()
    assert [layer.tobytes() for layer in cache.host_copies()] == gpu_before
    assert engine.get_finished() == []
    engine.submit(1, "store", [0], [0])  # the job id was never taken
    assert engine.wait(1) and outcomes(engine.get_finished()) == [(1, True)]


def test_bad_wait_event_raises_and_moves_nothing(setup):
    _cache, pool, engine = setup
    with pytest.raises(TypeError, match="wait_event must be a Numba event or stream"):
        engine.submit(1, "store", [0], [0], wait_event="compute")
    assert (pool.blocks == HOST_POISON).all() and engine.get_finished() == []
    for job in range(10):  # no slot leaked: more jobs than slots still go through
        engine.submit(job, "store", [job % 6], [job % 5])
    assert len(finish(engine, *range(10))) == 10


def test_duplicate_sources_are_allowed(setup):
    """Only destinations must be unique: one GPU block may be stored to two host blocks."""
    cache, pool, engine = setup
    engine.submit(1, "store", [4, 4], [0, 1])
    assert engine.wait(1)
    assert (
        pool.blocks[0].tobytes()
        == pool.blocks[1].tobytes()
        == cache.block_bytes(cache.host_copies(), 4)
    )


def test_job_id_in_flight_is_rejected_until_reported(setup):
    _cache, pool, engine = setup
    engine.submit("a", "store", [0], [0])
    with pytest.raises(ValueError, match="job_id 'a' is already in flight"):
        engine.submit("a", "store", [1], [1])
    assert (pool.blocks[1] == HOST_POISON).all()
    engine.wait("a")
    with pytest.raises(ValueError, match="already in flight"):
        engine.submit("a", "load", [1], [0])
    assert outcomes(engine.get_finished()) == [("a", True)]
    engine.submit("a", "load", [1], [0])


def test_int32_and_list_ids_are_accepted(setup):
    cache, pool, engine = setup
    engine.submit(1, "store", np.array([1, 2], dtype=np.int32), [3, 4])
    engine.submit(2, "store", np.array([5], dtype=np.uint16), np.array([0], dtype=np.int64))
    assert engine.wait(1) and engine.wait(2)
    copies = cache.host_copies()
    assert pool.blocks[4].tobytes() == cache.block_bytes(copies, 2)
    assert pool.blocks[0].tobytes() == cache.block_bytes(copies, 5)


def test_engine_rejects_a_pool_of_the_wrong_block_size(setup):
    cache, _, _ = setup
    with pytest.raises(ValueError, match="host_pool.block_bytes is 8, the layout needs"):
        TransferEngine(cache.layout, HostPool(2, 8))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"threads_per_block": 48}, ValueError, "multiple of 32 up to 1024, got 48"),
        ({"threads_per_block": 2048}, ValueError, "multiple of 32 up to 1024, got 2048"),
        (
            {"threads_per_block": 64.0},
            TypeError,
            "threads_per_block must be a positive int, got 64.0",
        ),
        (
            {"threads_per_block": "64"},
            TypeError,
            "threads_per_block must be a positive int, got '64'",
        ),
        (
            {"threads_per_block": True},
            TypeError,
            "threads_per_block must be a positive int, got True",
        ),
        ({"max_thread_blocks": 0}, ValueError, "max_thread_blocks must be a positive int, got 0"),
        (
            {"max_thread_blocks": 2.5},
            TypeError,
            "max_thread_blocks must be a positive int, got 2.5",
        ),
        (
            {"max_thread_blocks": "2"},
            TypeError,
            "max_thread_blocks must be a positive int, got '2'",
        ),
        ({"max_jobs_in_flight": 0}, ValueError, "max_jobs_in_flight must be a positive int, got 0"),
        (
            {"max_jobs_in_flight": 2.5},
            TypeError,
            "max_jobs_in_flight must be a positive int, got 2.5",
        ),
        (
            {"max_jobs_in_flight": "8"},
            TypeError,
            "max_jobs_in_flight must be a positive int, got '8'",
        ),
        ({"on_job_done": object()}, TypeError, "on_job_done must be a callable .* got object"),
    ],
)
def test_engine_rejects_bad_launch_options(setup, options, error, message):
    cache, pool, _ = setup
    with pytest.raises(error, match=message):
        TransferEngine(cache.layout, pool, **options)


def test_whole_numbers_of_numpy_are_launch_options_as_ints(setup):
    cache, pool, _ = setup
    engine = TransferEngine(
        cache.layout,
        pool,
        threads_per_block=np.int64(32),
        max_thread_blocks=np.int32(2),
        max_jobs_in_flight=np.int64(2),
    )
    assert engine.threads_per_block == dict.fromkeys(Direction, 32)
    assert engine.thread_blocks == dict.fromkeys(Direction, 2)
    assert all(type(value) is int for value in engine.threads_per_block.values())
    engine.submit(1, "store", [0], [0])
    assert engine.wait(1) and outcomes(engine.get_finished()) == [(1, True)]


@pytest.mark.parametrize(
    ("num_blocks", "block_bytes", "error", "message"),
    [
        ("4", 64, TypeError, "num_blocks must be a positive int, got '4'"),
        (4.5, 64, TypeError, "num_blocks must be a positive int, got 4.5"),
        (True, 64, TypeError, "num_blocks must be a positive int, got True"),
        (None, 64, TypeError, "num_blocks must be a positive int, got None"),
        (0, 64, ValueError, "num_blocks must be a positive int, got 0"),
        (4, 64.0, TypeError, "block_bytes must be a positive int, got 64.0"),
        (4, -8, ValueError, "block_bytes must be a positive int, got -8"),
        (2**40, 2**30, ValueError, r"must fit in this machine's memory .* = 1,180,591,6"),
    ],
)
def test_host_pool_rejects_bad_sizes(num_blocks, block_bytes, error, message):
    with pytest.raises(error, match=message):
        HostPool(num_blocks, block_bytes)


def test_host_pool_sizes_of_numpy_are_kept_as_ints():
    pool = HostPool(np.int64(4), np.int32(64))
    assert type(pool.num_blocks) is type(pool.block_bytes) is type(pool.nbytes) is int
    assert pool.blocks.shape == (4, 64) and pool.nbytes == 256


@pytest.mark.parametrize("job_id", [["req", 1], {"id": 1}, np.array([1])], ids=type_name)
def test_an_unhashable_job_id_is_a_clear_error(setup, job_id):
    _cache, pool, engine = setup
    with pytest.raises(TypeError, match="job_id must be hashable .* got " + type_name(job_id)):
        engine.submit(job_id, "store", [0], [0])
    assert (pool.blocks == HOST_POISON).all() and engine.get_finished() == []


def test_unknown_job_id(setup):
    _, _, engine = setup
    with pytest.raises(KeyError, match="unknown job_id 7"):
        engine.wait(7)
    assert engine.completion_event(7) is None  # nothing to wait for


class _TorchLike:
    """What the engine reads of torch's streams and events: their raw handles."""

    def __init__(self, **handles):
        self.__dict__.update(handles)


@pytest.mark.parametrize(
    "wait_event", [_TorchLike(cuda_stream=0), _TorchLike(cuda_event=0)], ids=["stream", "event"]
)
def test_streams_and_events_with_raw_handles_are_accepted(setup, wait_event):
    cache, pool, engine = setup
    engine.submit(1, "store", [2], [0], wait_event=wait_event)
    assert engine.wait(1)
    assert pool.blocks[0].tobytes() == cache.block_bytes(cache.host_copies(), 2)


def test_an_unhashable_direction_is_a_clear_error(setup):
    with pytest.raises(ValueError, match="direction must be 'store' or 'load'"):
        setup[2].submit(1, ["store"], [0], [0])


def test_a_host_pool_of_another_device_is_refused(setup, monkeypatch):
    """Issue 23, item 8: Numba maps a pool for the context current when it was made."""
    cache, _, _ = setup
    monkeypatch.setattr(host_pool, "current_device_id", lambda: 1)
    pool = HostPool.for_layout(cache.layout, 2)
    with pytest.raises(ValueError, match="host pool was made on CUDA device 1, the KV cache is on"):
        TransferEngine(cache.layout, pool)


def test_an_engine_built_with_another_device_current_is_refused(setup, monkeypatch):
    cache, pool, _ = setup
    monkeypatch.setattr(transfer, "current_device_id", lambda: 1)
    with pytest.raises(
        ValueError, match="KV cache is on CUDA device 0 but the current device is 1"
    ):
        TransferEngine(cache.layout, pool)
