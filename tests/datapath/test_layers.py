"""Jobs over a range of layers, on the simulator: each moves exactly its layers' bytes between the
GPU blocks and their place in the host blocks, on both paths, through staging rounds of any size;
loads of consecutive ranges rebuild every layer; a bad range is one line before anything moves."""

import itertools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numbakv.datapath import LayoutKind
from tests.support.datapath_cases import (
    GPU_POISON,
    HOST_POISON,
    finish,
    make_cache,
    small_engine,
)

NUM_LAYERS = 3
NUM_BLOCKS = 8
NUM_HOST_BLOCKS = 6
PER_LAYER = [LayoutKind.FLASH_ATTN, LayoutKind.FLASHINFER, LayoutKind.MLA]
PATHS = ["zero_copy", "staged", {"store": "staged", "load": "zero_copy"}]


def _engine(cache, path, staging_blocks=2):
    return small_engine(cache, path, NUM_HOST_BLOCKS, staging_blocks)


def _layer_bytes(cache, copies, block, layers):
    """The oracle: `layers` of one block, in host-block order, straight from NumPy."""
    if cache.kind is LayoutKind.FLASH_ATTN:
        return b"".join(copies[layer][kv, block].tobytes() for layer in layers for kv in range(2))
    return b"".join(copies[layer][block].tobytes() for layer in layers)


def _host_part(cache, pool, host_id, layers):
    """`layers`' bytes of one host block: the layout's segments of those layers."""
    per_layer = cache.layout.num_segments // cache.layout.num_layers * cache.layout.chunk_bytes
    return pool.blocks[host_id, layers.start * per_layer : layers.stop * per_layer].tobytes()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(PER_LAYER),
    path=st.sampled_from(PATHS),
    staging_blocks=st.integers(1, 4),
    cuts=st.sets(st.integers(1, NUM_LAYERS - 1)),
    seed=st.integers(0, 2**16),
)
def test_loads_of_consecutive_layer_ranges_rebuild_every_block(
    kind, path, staging_blocks, cuts, seed
):
    """Whole blocks stored; the GPU wiped; loaded back a range of layers a job (the cuts), into
    other GPU blocks, through staging rounds of 1 to 4 blocks: every layer byte-exact, the other
    GPU blocks untouched."""
    rng = np.random.default_rng(seed)
    cache = make_cache(kind, rng, num_layers=NUM_LAYERS, num_blocks=NUM_BLOCKS)
    engine, _ = _engine(cache, path, staging_blocks)
    original = cache.host_copies()
    sources = rng.permutation(NUM_BLOCKS)[:5]
    host_ids = rng.permutation(NUM_HOST_BLOCKS)[:5]
    engine.submit("store", "store", sources, host_ids)
    finish(engine, "store")
    cache.poison()
    poisoned = cache.host_copies()
    targets = rng.permutation(NUM_BLOCKS)[:5]
    bounds = [0, *sorted(cuts), NUM_LAYERS]
    for start, stop in itertools.pairwise(bounds):
        engine.submit(start, "load", targets, host_ids, layers=range(start, stop))
    assert finish(engine, *bounds[:-1]) == [(start, True) for start in bounds[:-1]]
    restored = cache.host_copies()
    for target, source in zip(targets, sources):
        assert cache.block_bytes(restored, target) == cache.block_bytes(original, source)
    for other in np.setdiff1d(np.arange(NUM_BLOCKS), targets):
        assert cache.block_bytes(restored, other) == cache.block_bytes(poisoned, other)


@pytest.mark.parametrize("kind", PER_LAYER)
@pytest.mark.parametrize("path", PATHS)
def test_a_job_of_some_layers_moves_those_layers_only(kind, path):
    """A store of layer 1 writes its place in each host block and nothing else of the pool; a load
    of layers 1-2 restores those layers and leaves layer 0 as the GPU had it."""
    rng = np.random.default_rng(len(kind.value))
    cache = make_cache(kind, rng, num_layers=NUM_LAYERS, num_blocks=NUM_BLOCKS)
    engine, pool = _engine(cache, path)
    original = cache.host_copies()
    gpu_ids, host_ids = np.array([6, 1, 3]), np.array([4, 0, 2])

    engine.submit("one", "store", gpu_ids, host_ids, layers=range(1, 2))
    finish(engine, "one")
    for gpu_id, host_id in zip(gpu_ids, host_ids):
        assert _host_part(cache, pool, host_id, range(1, 2)) == _layer_bytes(
            cache, original, gpu_id, [1]
        )
        block = pool.blocks[host_id].copy()
        per_layer = cache.layout.block_bytes // NUM_LAYERS
        block[per_layer : 2 * per_layer] = HOST_POISON
        assert (block == HOST_POISON).all()
    assert (np.delete(pool.blocks, host_ids, axis=0) == HOST_POISON).all()

    engine.submit("all", "store", gpu_ids, host_ids)
    finish(engine, "all")
    cache.poison()
    engine.submit("later", "load", gpu_ids, host_ids, layers=range(1, NUM_LAYERS))
    finish(engine, "later")
    restored = cache.host_copies()
    for gpu_id in gpu_ids:
        assert _layer_bytes(cache, restored, gpu_id, [1, 2]) == _layer_bytes(
            cache, original, gpu_id, [1, 2]
        )
        assert set(_layer_bytes(cache, restored, gpu_id, [0])) == {GPU_POISON}


def test_a_jobs_bytes_are_its_layers():
    cache = make_cache("flash_attn", np.random.default_rng(3), num_layers=NUM_LAYERS)
    engine, _ = _engine(cache, "staged")
    engine.submit("two", "store", [0, 1, 2], [0, 1, 2], layers=range(2))
    engine.wait("two")
    (job,) = engine.get_finished()
    assert job.nbytes == 3 * 2 * cache.layout.block_bytes // NUM_LAYERS


@pytest.mark.parametrize(
    ("layers", "error", "message"),
    [
        (range(0), ValueError, "layers must be a non-empty range within [0, 3) with step 1"),
        (range(2, 1), ValueError, "got range(2, 1)"),
        (range(1, 4), ValueError, "got range(1, 4)"),
        (range(-1, 2), ValueError, "got range(-1, 2)"),
        (range(0, 3, 2), ValueError, "got range(0, 3, 2)"),
        ([0, 1], TypeError, "layers must be a range of layer indices, got list"),
        (slice(0, 2), TypeError, "got slice"),
    ],
)
def test_a_bad_layer_range_is_one_line_and_queues_nothing(layers, error, message):
    cache = make_cache("mla", np.random.default_rng(4), num_layers=NUM_LAYERS)
    engine, pool = _engine(cache, "zero_copy")
    with pytest.raises(error, match=re.escape(message)):
        engine.submit("bad", "store", [0], [0], layers=layers)
    assert (pool.blocks == HOST_POISON).all()
    engine.submit("bad", "store", [0], [0])  # the id was never taken
    assert finish(engine, "bad") == [("bad", True)]


def test_a_cross_layer_block_in_one_run_moves_whole():
    """A contiguous cross-layer block is one segment: a range of its layers is refused by name;
    every layer (`range(0, 3)`, or None) moves as before."""
    cache = make_cache("cross_layer", np.random.default_rng(5), num_layers=NUM_LAYERS)
    engine, pool = _engine(cache, "staged")
    with pytest.raises(ValueError, match="holds all 3 layers of a block in one contiguous run"):
        engine.submit(0, "store", [0], [0], layers=range(2))
    engine.submit(1, "store", [0], [0], layers=None)
    engine.submit(2, "store", [1], [1], layers=range(NUM_LAYERS))
    assert finish(engine, 1, 2) == [(1, True), (2, True)]
    copies = cache.host_copies()
    assert [pool.blocks[i].tobytes() for i in (0, 1)] == [
        cache.block_bytes(copies, i) for i in (0, 1)
    ]
