"""The grouped-chunk transfer core of vLLM's worker: vLLM's chunk placement, byte for byte.

`ChunkTransfers` needs neither vLLM nor torch: the canonical tensors are Numba device arrays
here, so these tests run on the simulator and on a GPU alike.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from numbakv.datapath import ChunkTransfers
from tests.support.datapath_cases import GPU_POISON, HOST_POISON, outcomes, random_array

NUM_GPU_BLOCKS = 16
NUM_CHUNKS = 12
SIMULATOR = {"threads_per_block": 32, "max_thread_blocks": 2}

# KV cache groups as vLLM describes them: per group, (canonical tensor, page bytes used) per layer.
# Tensors 1 and 4 are padded (80-byte rows, 64 used); the layers of a group share one row size.
TENSOR_BYTES = (64, 80, 64, 40, 80)
GROUPINGS = {
    "one group": [[(0, 64), (2, 64)]],
    "one padded group": [[(1, 64), (4, 64)]],
    "two groups, one pool": [[(0, 64), (2, 64)], [(1, 64), (4, 64)]],
    "two groups on the same tensors": [[(1, 64), (4, 64)], [(1, 64), (4, 64)]],
    "two groups, two pools": [[(0, 64), (2, 64)], [(3, 40)]],
}


def _tensors(rng: np.random.Generator) -> list:
    return [
        cuda.to_device(random_array(rng, (NUM_GPU_BLOCKS, size), np.uint8)) for size in TENSOR_BYTES
    ]


def _on_host(tensors) -> list[np.ndarray]:
    return [tensor.copy_to_host() for tensor in tensors]


def _transfers(tensors, groups, blocks_per_chunk, **options) -> ChunkTransfers:
    transfers = ChunkTransfers(
        tensors, groups, blocks_per_chunk, NUM_CHUNKS, engine_options=SIMULATOR, **options
    )
    for pool in transfers.pools.values():
        pool.blocks[:] = HOST_POISON
    return transfers


def vllm_placement(group_sizes, block_indices, chunk_ids, blocks_per_chunk):
    """vLLM's CPU worker, block by block: the (group, index in the job's GPU ids, chunk,
    block within the chunk) of every block; a group's first chunk may be entered part-way."""
    placement, gpu_at, chunk_at = [], 0, 0
    for group, (size, first) in enumerate(zip(group_sizes, block_indices)):
        if size == 0:
            continue
        skip = first % blocks_per_chunk
        for i in range(size):
            chunk, within = divmod(skip + i, blocks_per_chunk)
            placement.append((group, gpu_at + i, chunk_ids[chunk_at + chunk], within))
        gpu_at += size
        chunk_at += -(-(skip + size) // blocks_per_chunk)
    return placement, chunk_at


@st.composite
def jobs(draw):
    grouping = draw(st.sampled_from(sorted(GROUPINGS)))
    groups = GROUPINGS[grouping]
    blocks_per_chunk = draw(st.integers(1, 3))
    sizes = [draw(st.integers(0, 4)) for _ in groups]
    firsts = [draw(st.integers(0, 5)) for _ in groups]
    chunks_needed = sum(
        -(-(first % blocks_per_chunk + size) // blocks_per_chunk)
        for size, first in zip(sizes, firsts)
        if size
    )
    chunk_ids = draw(st.permutations(range(NUM_CHUNKS)))[:chunks_needed]
    store_ids = draw(st.permutations(range(NUM_GPU_BLOCKS)))[: sum(sizes)]
    load_ids = draw(st.permutations(range(NUM_GPU_BLOCKS)))[: sum(sizes)]
    return groups, blocks_per_chunk, sizes, firsts, chunk_ids, store_ids, load_ids


@settings(max_examples=40, deadline=None)
@given(jobs(), st.integers(0, 2**32 - 1))
def test_store_then_load_places_every_block_as_vllm_does(job, seed):
    groups, blocks_per_chunk, sizes, firsts, chunk_ids, store_ids, load_ids = job
    tensors = _tensors(np.random.default_rng(seed))
    original = _on_host(tensors)
    transfers = _transfers(tensors, groups, blocks_per_chunk)
    placement, _ = vllm_placement(sizes, firsts, chunk_ids, blocks_per_chunk)
    chunk_array = np.array(chunk_ids, dtype=np.int64)

    transfers.submit(1, "store", np.array(store_ids, np.int32), sizes, firsts, chunk_array)
    transfers.wait([1])
    (stored,) = transfers.get_finished()
    assert stored.job_id == 1 and stored.success
    for group, at, chunk, within in placement:
        pool = transfers.pools[transfers.layouts[group].block_bytes]
        expected = b"".join(
            original[t][store_ids[at], :page].tobytes() for t, page in groups[group]
        )
        assert pool.blocks[chunk * blocks_per_chunk + within].tobytes() == expected

    for tensor in tensors:
        tensor[:] = GPU_POISON
    transfers.submit(2, "load", np.array(load_ids, np.int32), sizes, firsts, chunk_array)
    transfers.wait([2])
    assert [job.job_id for job in transfers.get_finished()] == [2]
    expected = [np.full_like(tensor, GPU_POISON) for tensor in original]
    for group, at, _, _ in placement:
        for t, page in groups[group]:
            expected[t][load_ids[at], :page] = original[t][store_ids[at], :page]
    for tensor, want in zip(_on_host(tensors), expected):  # padding, other groups untouched
        np.testing.assert_array_equal(tensor, want)


def test_groups_with_equal_blocks_share_one_pool_and_the_rest_get_their_own():
    rng = np.random.default_rng(0)
    assert len(_transfers(_tensors(rng), GROUPINGS["two groups, one pool"], 2).pools) == 1
    transfers = _transfers(_tensors(rng), GROUPINGS["two groups, two pools"], 2)
    assert sorted(transfers.pools) == [40, 128]
    assert transfers.host_bytes == NUM_CHUNKS * 2 * (40 + 128)
    assert len(_transfers(_tensors(rng), GROUPINGS["two groups on the same tensors"], 2).pools) == 1


BOTH = ("store", "load")


@pytest.mark.parametrize(
    ("sizes", "firsts", "chunk_ids", "gpu_ids", "directions", "error", "match"),
    [
        ([2], [0], [0, 1], [0, 1, 2], BOTH, ValueError, "do not add up"),
        ([2, 1], [0, 0], [0, 1], [0, 1, 2], BOTH, ValueError, "1 KV cache group"),
        ([2], [0], [0], [0, 1], BOTH, ValueError, "fill 2 host chunks, the job names 1"),
        ([2], [0], [0, 1, 2], [0, 1], BOTH, ValueError, "fill 2 host chunks, the job names 3"),
        ([2], [0], [0, NUM_CHUNKS], [0, 1], BOTH, IndexError, "chunk_ids must lie"),
        ([2], [0], [0, 1], [0, NUM_GPU_BLOCKS], BOTH, IndexError, "gpu_block_ids"),
        ([2], [0], [3, 3], [0, 1], ("store",), ValueError, "host_block_ids .* unique"),
        ([2], [0], [3, 4], [1, 1], ("load",), ValueError, "gpu_block_ids .* unique"),
    ],
)
def test_a_job_that_does_not_fit_is_refused_before_anything_moves(
    sizes, firsts, chunk_ids, gpu_ids, directions, error, match
):
    tensors = _tensors(np.random.default_rng(1))
    original = _on_host(tensors)
    transfers = _transfers(tensors, GROUPINGS["one group"], 1)
    for direction in directions:
        with pytest.raises(error, match=match):
            transfers.submit(7, direction, np.array(gpu_ids), sizes, firsts, np.array(chunk_ids))
        assert transfers.jobs_in_flight == 0
    (pool,) = transfers.pools.values()
    assert (pool.blocks == HOST_POISON).all()
    for tensor, before in zip(_on_host(tensors), original):
        np.testing.assert_array_equal(tensor, before)
    transfers.submit(7, "store", np.array([0, 1]), [2], [0], np.array([0, 1]))  # the id is free
    transfers.drain()
    assert [job.job_id for job in transfers.get_finished()] == [7]


def _failing_first_job(engine) -> None:
    """Make `engine` report its next finished job as failed (how a transfer engine says so)."""
    report = engine.on_job_done
    failed = []

    def on_job_done(job):
        report(replace(job, success=job.success and bool(failed)))
        failed.append(job.job_id)

    engine.on_job_done = on_job_done


def test_a_failed_store_is_reported_and_its_chunks_are_not_loadable_until_stored_again():
    tensors = _tensors(np.random.default_rng(2))
    transfers = _transfers(tensors, GROUPINGS["one group"], 2)
    _failing_first_job(transfers.engines[0])
    chunks = np.array([4, 5])
    transfers.submit(1, "store", np.array([0, 1, 2]), [3], [0], chunks)
    transfers.drain()
    assert outcomes(transfers.get_finished()) == [(1, False)]

    before = _on_host(tensors)
    for load in ([5], [4, 5]):
        with pytest.raises(ValueError, match=r"host chunks \[5\]|host chunks \[4, 5\]"):
            transfers.submit(2, "load", np.arange(len(load)), [len(load)], [0], np.array(load))
    for tensor, unchanged in zip(_on_host(tensors), before):
        np.testing.assert_array_equal(tensor, unchanged)
    transfers.submit(3, "load", np.array([0, 1]), [2], [0], np.array([6]))  # other chunks load

    transfers.submit(4, "store", np.array([3, 4, 5, 6]), [4], [0], chunks)
    transfers.drain()
    assert outcomes(transfers.get_finished()) == [(3, True), (4, True)]
    transfers.submit(5, "load", np.array([8, 9, 10, 11]), [4], [0], chunks)
    transfers.drain()
    after = _on_host(tensors)
    for t in (0, 2):
        np.testing.assert_array_equal(after[t][8:12], before[t][3:7])


def test_a_job_of_two_groups_is_one_job_to_the_metrics():
    done = []
    transfers = _transfers(
        _tensors(np.random.default_rng(6)),
        GROUPINGS["two groups, two pools"],
        1,
        on_job_done=done.append,
    )
    transfers.submit(1, "store", np.array([0, 1, 2]), [2, 1], [0, 0], np.array([3, 4, 5]))
    transfers.drain()
    block_bytes = [layout.block_bytes for layout in transfers.layouts]
    assert [(job.job_id, job.direction, job.nbytes) for job in done] == [
        (1, "store", 2 * block_bytes[0] + block_bytes[1])
    ]
    assert done[0].success is True


def test_a_later_group_that_does_not_fit_is_refused_before_any_group_moves():
    done = []
    transfers = _transfers(
        _tensors(np.random.default_rng(3)),
        GROUPINGS["two groups, two pools"],
        1,
        on_job_done=done.append,
    )
    with pytest.raises(IndexError, match="gpu_block_ids"):  # group 1 names a block past the end
        transfers.submit(
            1, "store", np.array([0, NUM_GPU_BLOCKS]), [1, 1], [0, 0], np.array([2, 3])
        )
    assert transfers.jobs_in_flight == 0 and transfers.get_finished() == [] and done == []
    assert all((pool.blocks == HOST_POISON).all() for pool in transfers.pools.values())


def test_a_job_refused_half_way_waits_for_its_queued_part_and_reports_nothing(monkeypatch):
    done = []
    transfers = _transfers(
        _tensors(np.random.default_rng(3)),
        GROUPINGS["two groups, two pools"],
        1,
        on_job_done=done.append,
    )

    def driver_error(*_args):
        raise RuntimeError("injected driver failure")

    # Group 0's part is queued; group 1's engine fails to queue its part.
    monkeypatch.setattr(transfers.engines[1], "enqueue", driver_error)
    with pytest.raises(RuntimeError, match="injected"):
        transfers.submit(1, "store", np.array([0, 1]), [1, 1], [0, 0], np.array([2, 3]))
    assert transfers.jobs_in_flight == 0
    assert transfers.get_finished() == [] and done == []
    with pytest.raises(ValueError, match="not stored completely"):  # group 0 wrote chunk 2
        transfers.submit(2, "load", np.array([0]), [1, 0], [0, 0], np.array([2]))


def test_a_job_refused_half_way_can_be_submitted_again_under_its_id(monkeypatch):
    transfers = _transfers(
        _tensors(np.random.default_rng(3)), GROUPINGS["two groups, two pools"], 1
    )

    def driver_error(*_args):
        raise RuntimeError("injected driver failure")

    monkeypatch.setattr(transfers.engines[1], "enqueue", driver_error)
    with pytest.raises(RuntimeError, match="injected"):
        transfers.submit(1, "store", np.array([0, 1]), [1, 1], [0, 0], np.array([2, 3]))
    monkeypatch.undo()  # the driver is back
    transfers.submit(1, "store", np.array([0, 1]), [1, 1], [0, 0], np.array([2, 3]))
    transfers.wait([1])
    assert [(job.job_id, job.success) for job in transfers.get_finished()] == [(1, True)]


def test_a_store_its_only_engine_fails_to_queue_leaves_its_chunks_unloadable(monkeypatch):
    """A staged store can have written some rounds before the one that failed."""
    transfers = _transfers(_tensors(np.random.default_rng(5)), GROUPINGS["one group"], 1)

    def driver_error(*_args):
        raise RuntimeError("injected driver failure")

    monkeypatch.setattr(transfers.engines[0], "enqueue", driver_error)
    with pytest.raises(RuntimeError, match="injected"):
        transfers.submit(1, "store", np.array([0, 1]), [2], [0], np.array([2, 3]))
    assert transfers.jobs_in_flight == 0 and transfers.get_finished() == []
    with pytest.raises(ValueError, match="not stored completely"):
        transfers.submit(2, "load", np.array([0]), [1], [0], np.array([3]))


@pytest.mark.parametrize("gpu_ids", [np.empty(0, dtype=np.int64), []], ids=["array", "list"])
def test_an_empty_job_is_reported_like_any_other(gpu_ids):
    transfers = _transfers(_tensors(np.random.default_rng(4)), GROUPINGS["one group"], 1)
    transfers.submit(1, "load", gpu_ids, [0], [0], np.empty(0, dtype=np.int64))
    transfers.wait({1, 99})  # unknown jobs are skipped
    assert transfers.get_finished()[0].job_id == 1
    assert transfers.jobs_in_flight == 0


def test_every_job_waits_for_the_compute_stream():
    streams = []

    def compute_stream():
        streams.append(cuda.stream())
        return streams[-1]

    transfers = _transfers(
        _tensors(np.random.default_rng(5)), GROUPINGS["one group"], 1, compute_stream=compute_stream
    )
    engine, waited_for = transfers.engines[0], []
    enqueue = engine.enqueue

    def recording_enqueue(*args):
        waited_for.append(args[-1])
        return enqueue(*args)

    engine.enqueue = recording_enqueue
    transfers.submit(1, "store", np.array([0]), [1], [0], np.array([0]))
    transfers.submit(2, "load", np.array([1]), [1], [0], np.array([0]))
    transfers.drain()
    assert waited_for == streams and len(streams) == 2
    assert [job.success for job in transfers.get_finished()] == [True, True]


@pytest.mark.parametrize(
    ("groups", "match"),
    [
        ([[(0, 64), (3, 40)]], "group 0: layer 1 has shape"),
        ([[(0, 64), (1, 64)]], "group 0: layer 1 has strides"),
        ([[(0, 64)], [(9, 64)]], "group 1 names tensor 9"),
        ([[(3, 64)]], r"group 0: tensor 3 has shape \(16, 40\)"),
        ([[]], "group 0 names no tensor"),
        ([], "no KV cache group"),
    ],
)
def test_groups_that_cannot_be_laid_out_are_refused_with_the_group_named(groups, match):
    with pytest.raises(ValueError, match=match):
        _transfers(_tensors(np.random.default_rng(6)), groups, 1)


@pytest.mark.parametrize(
    ("sizes", "firsts", "error", "match"),
    [
        ([-1, 3], [0, 0], ValueError, r"group_sizes\[0\] must be an int >= 0, got -1"),
        ([True, True], [0, 0], TypeError, r"group_sizes\[0\] must be an int >= 0, got True"),
        ([1.0, 1.0], [0, 0], TypeError, r"group_sizes\[0\] must be an int >= 0, got 1.0"),
        ([1, "1"], [0, 0], TypeError, r"group_sizes\[1\] must be an int >= 0, got '1'"),
        (np.array([1.0, 1.0]), [0, 0], TypeError, r"group_sizes\[0\] must be an int >= 0"),
        (np.array([True, True]), [0, 0], TypeError, r"group_sizes\[0\] must be an int >= 0"),
        ([1, 1], [-1, 0], ValueError, r"block_indices\[0\] must be an int >= 0, got -1"),
        ([1, 1], [0, 0.5], TypeError, r"block_indices\[1\] must be an int >= 0, got 0.5"),
    ],
)
def test_group_sizes_and_block_indices_must_be_whole_numbers_naming_the_group(
    sizes, firsts, error, match
):
    tensors = _tensors(np.random.default_rng(7))
    original = _on_host(tensors)
    transfers = _transfers(tensors, GROUPINGS["two groups, one pool"], 1)
    with pytest.raises(error, match=match):
        transfers.submit(1, "store", np.array([10, 11]), sizes, firsts, np.array([5, 6]))
    assert transfers.jobs_in_flight == 0
    (pool,) = transfers.pools.values()
    assert (pool.blocks == HOST_POISON).all()
    for tensor, before in zip(_on_host(tensors), original):
        np.testing.assert_array_equal(tensor, before)
    transfers.submit(1, "store", np.array([10, 11]), np.array([1, 1]), (0, 0), np.array([5, 6]))
    transfers.drain()
    assert outcomes(transfers.get_finished()) == [(1, True)]


@pytest.mark.parametrize(
    ("blocks_per_chunk", "num_chunks", "options", "error", "match"),
    [
        ("2", 12, {}, TypeError, "blocks_per_chunk must be a positive int, got '2'"),
        (2.0, 12, {}, TypeError, "blocks_per_chunk must be a positive int, got 2.0"),
        (0, 12, {}, ValueError, "blocks_per_chunk must be a positive int, got 0"),
        (2, 12.5, {}, TypeError, "num_chunks must be a positive int, got 12.5"),
        (2, True, {}, TypeError, "num_chunks must be a positive int, got True"),
        (2, 12, {"on_job_done": "metrics"}, TypeError, "on_job_done must be a callable .* str"),
        (2, 12, {"engine_options": {"threads_per_block": 48}}, ValueError, "multiple of 32 .* 48"),
        (2, 12, {"engine_options": {"max_thread_blocks": 0}}, ValueError, "max_thread_blocks"),
        (2, 12, {"engine_options": {"path": "dma"}}, ValueError, "path must be one of"),
        (2, 12, {"engine_options": {"staging_bytes": "64MiB"}}, TypeError, "staging_bytes"),
        (2, 12, {"engine_options": {"max_jobs_in_flight": -1}}, ValueError, "max_jobs_in_flight"),
        (2, 12, {"engine_options": {"threads": 64}}, TypeError, "unknown option 'threads'"),
        (2, 12, {"engine_options": {"on_job_done": print}}, TypeError, "unknown option 'on_job"),
        (2, 12, {"engine_options": [("path", "staged")]}, TypeError, "must be a mapping, got list"),
    ],
)
def test_bad_chunk_settings_are_refused_before_any_pool_is_made(
    blocks_per_chunk, num_chunks, options, error, match
):
    def no_pool(num_blocks, block_bytes):
        raise AssertionError("a host pool was made")

    with pytest.raises(error, match=match):
        ChunkTransfers(
            _tensors(np.random.default_rng(8)),
            GROUPINGS["one group"],
            blocks_per_chunk,
            num_chunks,
            host_pool=no_pool,
            **{"engine_options": SIMULATOR, **options},
        )


def test_an_unhashable_job_id_is_refused_naming_it():
    transfers = _transfers(_tensors(np.random.default_rng(9)), GROUPINGS["one group"], 1)
    with pytest.raises(TypeError, match="job_id must be hashable .* got list"):
        transfers.submit([1], "store", np.array([0]), [1], [0], np.array([0]))
    assert transfers.jobs_in_flight == 0
