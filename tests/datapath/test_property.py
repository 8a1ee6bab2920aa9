"""Property: for any layout geometry, dtype and batch, a store then a load is byte-exact."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numbakv.datapath import HostPool, LayoutKind, TransferEngine
from tests.support.datapath_cases import HOST_POISON, finish, make_cache


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(list(LayoutKind)),
    dtype=st.sampled_from([np.int8, np.float16, np.float32, np.float64]),
    num_layers=st.integers(1, 3),
    num_blocks=st.integers(1, 6),
    head_size=st.integers(1, 9),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_store_then_load_is_byte_exact(kind, dtype, num_layers, num_blocks, head_size, seed, data):
    rng = np.random.default_rng(seed)
    cache = make_cache(
        kind,
        rng,
        num_layers=num_layers,
        num_blocks=num_blocks,
        block_size=2,
        num_heads=1,
        head_size=head_size,
        dtype=dtype,
    )
    num_host_blocks = data.draw(st.integers(1, 6))
    pool = HostPool.for_layout(cache.layout, num_host_blocks)
    pool.blocks[:] = HOST_POISON
    engine = TransferEngine(cache.layout, pool, max_thread_blocks=2, threads_per_block=32)
    count = data.draw(st.integers(0, min(num_blocks, num_host_blocks)))
    gpu_ids = rng.permutation(num_blocks)[:count]
    host_ids = rng.permutation(num_host_blocks)[:count]
    original = cache.host_copies()

    engine.submit(1, "store", gpu_ids, host_ids)
    assert engine.wait(1)
    cache.poison()
    engine.submit(2, "load", gpu_ids[::-1].copy(), host_ids)
    assert finish(engine, 2) == [(1, True), (2, True)]

    restored = cache.host_copies()
    for gpu_id, source_id in zip(gpu_ids[::-1], gpu_ids):
        assert cache.block_bytes(restored, gpu_id) == cache.block_bytes(original, source_id)
    assert (np.delete(pool.blocks, host_ids, axis=0) == HOST_POISON).all()
