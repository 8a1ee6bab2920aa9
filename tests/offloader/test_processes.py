"""Two engines in two processes over one tier below host memory, on the CUDA simulator: the second
loads what the first stored, byte for byte (a real directory; a real redis-server for the demo)."""

from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
import pytest

from numbakv.tools.demo.command import main as demo_main
from numbakv.tools.demo.core import DemoConfig, run_engines
from tests.support.redis_servers import needs_redis, redis_server

HOST_BLOCKS = 4
GPU_BLOCKS = 8


def engine_process(
    directory: str, seed: int, tiering: str, store: list, requests: list, flush: bool = False
) -> dict:
    """One engine: a KVOffloader over a random GPU cache and a disk tier in `directory`. It stores
    `store` (hash -> GPU block) through a host pool too small for them all, then serves
    `requests` (lists of hashes), each loaded into its last GPU blocks, and with `flush` hands
    its host memory down before it exits; returns the bytes of the blocks involved."""
    from numbakv import CPUOffloadingManager, KVOffloader
    from numbakv.datapath import HostPool, TransferEngine
    from numbakv.tiers import ChunkTier
    from numbakv.tiers.disk import DiskBackend, DiskSettings
    from tests.support.datapath_cases import make_cache
    from tests.support.tiers import namespace

    cache = make_cache("flash_attn", np.random.default_rng(seed), num_blocks=GPU_BLOCKS)
    pool = HostPool.for_layout(cache.layout, HOST_BLOCKS)
    engine = TransferEngine(cache.layout, pool, threads_per_block=32, max_thread_blocks=2)
    backend = DiskBackend(DiskSettings(directory, 2**24), namespace(), pool.block_bytes)
    tier = ChunkTier(backend, pool.blocks, namespace(), lookup_deadline_s=1.0)
    offloader = KVOffloader(
        CPUOffloadingManager(block_size=2, num_blocks=HOST_BLOCKS),
        engine,
        tier=tier,
        tiering=tiering,
    )
    before = cache.host_copies()
    for block_hash, gpu_block in store:
        offloader.wait(offloader.store([block_hash], [gpu_block]))
    loaded = {}
    for request in requests:
        hits = offloader.lookup(request)
        while hits is None:  # promotions from the tier under way
            offloader.drain()
            hits = offloader.lookup(request)
        targets = list(range(GPU_BLOCKS - hits, GPU_BLOCKS))
        if hits:
            assert offloader.wait(offloader.load(request[:hits], targets))
        after = cache.host_copies()
        loaded.update((h, cache.block_bytes(after, g)) for h, g in zip(request, targets))
    offloader.drain()
    flushed = offloader.flush_to_tier() if flush else None
    tier.close()
    return {
        "flushed": flushed,
        "stored": {h: cache.block_bytes(before, g) for h, g in store},
        "loaded": loaded,
        "own": {g: cache.block_bytes(before, g) for g in range(GPU_BLOCKS)},
        "from_others": tier.counters.loaded_other,
    }


def in_process(*args) -> dict:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as process:
        return process.submit(engine_process, *args).result()


@pytest.mark.parametrize(
    "tiering, flush", [("demote", False), ("demote", True), ("write-through", False)]
)
def test_a_second_process_loads_what_the_first_stored_byte_for_byte(tmp_path, tiering, flush):
    hashes = [b"block-%d" % i for i in range(6)]
    first = in_process(str(tmp_path), 1, tiering, list(zip(hashes, range(6))), [], flush)
    # Demotion alone leaves the last HOST_BLOCKS stored in the first engine's host memory, lost
    # at exit; a flush hands them down first.
    shared = hashes[: 6 - HOST_BLOCKS] if tiering == "demote" and not flush else hashes
    if flush:
        assert first["flushed"].stored == HOST_BLOCKS and first["flushed"].success
    second = in_process(str(tmp_path), 2, tiering, [], [shared[:3], shared[3:]])
    assert second["loaded"] == {h: first["stored"][h] for h in shared}
    assert second["from_others"] == len(shared)
    assert not set(second["loaded"].values()) & set(second["own"].values())  # its own differed


SMALL = DemoConfig(gpu_blocks=72, host_blocks=96, sessions=8)


@pytest.mark.parametrize("tiering", ["demote", "write-through"])
def test_the_demo_s_second_engine_finds_what_the_first_stored_in_a_directory(tmp_path, tiering):
    config = DemoConfig(**{**SMALL.__dict__, "tier": f"dir:{tmp_path}", "tiering": tiering})
    first, second = run_engines(config)
    assert first.mismatched == second.mismatched == 0
    assert first.tier_hits_from_others == first.tier_flush_failed == 0
    if tiering == "demote":  # host memory, full, is handed down when the first engine finishes,
        # but for the blocks promoted back from the tier, which it holds already
        assert SMALL.host_blocks - first.tier_hits <= first.tier_flushed <= SMALL.host_blocks
    else:
        assert first.tier_stored == first.computed and first.tier_flushed == 0
    assert second.computed == 0 and second.first_requests_tier_hits > 0  # all it needed
    assert second.tier_hits == second.tier_hits_from_others
    assert second.tier_flushed == 0  # every block it holds came from the tier
    assert second.verified == second.host_hits + second.tier_hits


@needs_redis
def test_the_demo_across_engines_over_redis(tmp_path, capsys):
    with redis_server(str(tmp_path)) as server:
        status = demo_main(["--tier", server.url, "--sessions", "4", "--gpu-blocks", "72"])
    out = capsys.readouterr().out
    assert status == 0, out
    engines = out.split("engine 2 of 2")
    assert "loaded that another engine stored" in engines[1] and ", 0 wrong" in engines[1]
    assert "computed 0)" in engines[1] and " 0 loaded that another" not in engines[1]


@pytest.mark.parametrize(
    "tier, expected",
    [("disk:/tmp/x", "dir:PATH or redis://"), ("dir:", "a directory"), ("s3://b", "dir:PATH")],
)
def test_a_bad_tier_is_refused_before_anything_runs(tier, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        demo_main(["--tier", tier])
    assert exit_.value.code == 2 and expected in capsys.readouterr().err


def test_a_directory_that_cannot_be_made_is_named(tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(SystemExit) as exit_:
        demo_main(["--tier", f"dir:{blocked}/kv", "--sessions", "1"])
    assert exit_.value.code == 2 and f"argument --tier: dir:{blocked}/kv" in capsys.readouterr().err
