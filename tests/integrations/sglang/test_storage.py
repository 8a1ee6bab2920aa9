"""numbakv's HiCache backend built by SGLang's own dynamic loader over SGLang's real host pools: both
paths byte-exact over a real directory and a real redis-server, two processes sharing pages, the
namespace, the settings, and the statistics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support.redis_servers import needs_redis, redis_cluster, redis_server
from tests.support.servers import ROOT
from tests.support.sglang_pools import (
    backend,
    host_pool,
    page_bytes,
    page_indices,
    require_sglang,
    storage_config,
)

require_sglang()

import torch
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.runtime_context import get_flags, get_parallel

from numbakv.integrations.sglang import NumbaKVHiCacheStorage
from numbakv.integrations.sglang import namespace as sglang_namespace

PAGES = [1, 4, 5, 9, 12, 20]
KEYS = [f"{index:064x}" for index in range(100, 100 + len(PAGES))]  # SGLang's keys: hex hashes


def keys(count: int, first: int = 100) -> list[str]:
    return [f"{index:064x}" for index in range(first, first + count)]


@pytest.fixture(params=["dir", pytest.param("redis", marks=needs_redis)])
def tier(request, tmp_path):
    """The extra config's tier: a real directory, or a real redis-server on loopback."""
    if request.param == "dir":
        yield {"tier": f"dir:{tmp_path / 'kv'}", "bytes_to_use": 64 << 20}
    else:
        with redis_server(str(tmp_path)) as server:
            yield {"tier": server.url}


def stored(extra: dict, pool, pages=PAGES, page_keys=KEYS, **fields):
    """A backend that stored `pages` of `pool` under `page_keys` by SGLang's zero-copy path."""
    writer = backend(storage_config({**extra, "interface_v1": 1}, **fields), pool)
    assert writer.batch_set_v1(page_keys, page_indices(pages, pool.page_size)) == [True] * len(
        pages
    )
    return writer


@pytest.mark.parametrize(
    ("layout", "mla"), [("page_first", False), ("layer_first", False), ("page_first", True)]
)
def test_both_paths_read_each_others_pages_byte_exact(tier, layout, mla):
    source = host_pool(layout, mla=mla, seed=1)
    expected = [page_bytes(source, page) for page in PAGES]
    writer = stored(tier, source, mla=mla)

    generic = backend(storage_config(tier, mla=mla), host_pool(layout, mla=mla, seed=2))
    assert generic.batch_exists(KEYS + keys(1, first=7)) == len(KEYS)
    assert generic.batch_exists(keys(1, first=7) + KEYS) == 0
    targets = [generic.mem_pool_host.get_dummy_flat_data_page() for _ in KEYS]
    loaded = generic.batch_get(KEYS, targets)
    assert [bytes(page.view(torch.uint8).numpy()) for page in loaded] == expected
    assert generic.get(keys(1, first=7)[0], targets[0]) is None

    into = host_pool(layout, mla=mla, seed=3)
    zero_copy = backend(storage_config({**tier, "interface_v1": 1}, mla=mla), into)
    others = [2, 3, 6, 10, 11, 30]
    assert zero_copy.batch_get_v1(KEYS, page_indices(others, into.page_size)) == [True] * 6
    assert [page_bytes(into, page) for page in others] == expected

    # The generic path writes what the zero-copy path reads, too.
    flat = [generic.mem_pool_host.get_data_page(p * source.page_size) for p in (7, 8)]
    assert generic.batch_set(keys(2, first=300), flat)
    assert zero_copy.batch_get_v1(keys(2, first=300), page_indices([0, 1], into.page_size)) == [
        True,
        True,
    ]
    assert [page_bytes(into, p) for p in (0, 1)] == [
        bytes(page.view(torch.uint8).numpy()) for page in flat
    ]
    for storage in (writer, generic, zero_copy):
        storage.close()


def test_page_first_mla_is_read_and_written_in_place(tmp_path):
    pool = host_pool("page_first", mla=True, seed=4)
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24, "interface_v1": 1}
    storage = backend(storage_config(extra, mla=True), pool)
    assert storage.pages.direct
    assert storage.batch_set_v1(KEYS, page_indices(PAGES, pool.page_size)) == [True] * 6
    expected = [page_bytes(pool, page) for page in PAGES]
    pool.kv_buffer.zero_()
    assert storage.batch_get_v1(KEYS, page_indices(PAGES, pool.page_size)) == [True] * 6
    assert [page_bytes(pool, page) for page in PAGES] == expected
    before = pool.kv_buffer.view(torch.uint8).clone()  # the other path is refused, pool untouched
    assert storage.batch_get(KEYS[:1], [pool.get_dummy_flat_data_page()]) == [None]
    assert torch.equal(pool.kv_buffer.view(torch.uint8), before)
    storage.close()


def test_batches_larger_than_the_staging_rows_move_in_parts(tmp_path):
    pool = host_pool("page_first", seed=5)
    chunk = len(page_bytes(pool, 0))
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24, "staging_bytes": 2 * chunk}
    writer = stored(extra, pool)
    assert writer.pages.batch == 2
    into = host_pool("page_first", seed=6)
    reader = backend(storage_config({**extra, "interface_v1": 1}), into)
    assert reader.batch_get_v1(KEYS, page_indices(PAGES, into.page_size)) == [True] * 6
    assert [page_bytes(into, p) for p in PAGES] == [page_bytes(pool, p) for p in PAGES]
    writer.close()
    reader.close()


def test_clear_drops_every_page_of_the_namespace_and_no_other(tier):
    pool = host_pool("page_first", seed=7)
    writer = stored(tier, pool)
    other = stored(tier, pool, model_name="other")
    assert writer.clear() is True
    assert writer.batch_exists(KEYS) == 0 and other.batch_exists(KEYS) == len(KEYS)
    assert writer.batch_set_v1(KEYS[:1], page_indices(PAGES[:1], pool.page_size)) == [True]
    assert writer.batch_exists(KEYS) == 1
    writer.close()
    other.close()


@pytest.mark.parametrize(
    ("reader", "found"),
    [
        ({}, True),
        ({"tp_rank": 1}, False),  # another rank's heads
        ({"tp_size": 1, "tp_rank": 0}, False),  # another TP size: other heads per rank
        ({"model_name": "other"}, False),
        ({"layout": "layer_first"}, False),
        ({"dtype": "float16"}, False),
    ],
)
def test_the_namespace_keeps_mha_pages_apart(tmp_path, reader, found):
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24}
    writer = stored(extra, host_pool(seed=7), tp_rank=0, tp_size=2)
    layout = reader.pop("layout", "page_first")
    dtype = getattr(torch, reader.pop("dtype", "bfloat16"))
    fields = {"tp_rank": 0, "tp_size": 2, **reader}
    other = backend(storage_config(extra, **fields), host_pool(layout, dtype=dtype))
    assert other.batch_exists(KEYS) == (len(KEYS) if found else 0)
    writer.close()
    other.close()


def test_mla_pages_are_shared_by_every_rank_and_tp_size(tmp_path):
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24}
    pool = host_pool(mla=True, seed=8)
    writer = stored(extra, pool, mla=True, tp_rank=0, tp_size=2)
    into = host_pool(mla=True, seed=9)
    reader = backend(
        storage_config({**extra, "interface_v1": 1}, mla=True, tp_rank=3, tp_size=4), into
    )
    assert reader.batch_get_v1(KEYS, page_indices(PAGES, into.page_size)) == [True] * 6
    assert [page_bytes(into, p) for p in PAGES] == [page_bytes(pool, p) for p in PAGES]
    writer.close()
    reader.close()


def bounded_at_four_files(tmp_path) -> dict:
    """An extra config whose directory keeps four page files in all (the bound written with a
    unit, as a user may write it)."""
    probe = backend(
        storage_config({"tier": f"dir:{tmp_path / 'probe'}", "bytes_to_use": 1 << 30}),
        host_pool("page_first"),
    )
    file_bytes = probe.pages._shards[0].tier.backend.file_bytes
    probe.close()
    assert file_bytes % 1024 == 0
    bound = f"{4 * file_bytes // 1024}KiB"
    return {"tier": f"dir:{tmp_path / 'kv'}", "bytes_to_use": bound, "interface_v1": 1}


def store_four_pages_two_a_batch(storage, pool, first_key: int) -> None:
    """Two batches of two pages: a share of two files keeps the last batch."""
    for first in (0, 2):
        pages = keys(2, first=first_key + first)
        stored = storage.batch_set_v1(pages, page_indices([first, first + 1], pool.page_size))
        assert stored == [True, True]


def page_files(tmp_path) -> int:
    return sum(len(files) for _, _, files in os.walk(tmp_path / "kv"))


def test_the_ranks_of_one_model_keep_the_directory_within_bytes_to_use(tmp_path):
    """Each TP rank's heads are a namespace of their own, a directory each: they share the
    bound, so the model's pages keep at most `bytes_to_use` in all."""
    extra = bounded_at_four_files(tmp_path)
    for rank in range(2):
        pool = host_pool("page_first", seed=rank)
        ranked = backend(storage_config(extra, tp_rank=rank, tp_size=2), pool)
        store_four_pages_two_a_batch(ranked, pool, first_key=0)
        ranked.close()
    assert page_files(tmp_path) == 4


def test_attention_dp_groups_keep_the_directory_within_bytes_to_use(tmp_path):
    """Under DP attention (two groups, set through SGLang's own test overrides), rank 0 of each
    group opens the same namespace: each keeps half the bound (before, each kept all of it, and
    the directory twice `bytes_to_use`)."""
    extra = bounded_at_four_files(tmp_path)
    pools = [host_pool("page_first", seed=dp_rank) for dp_rank in range(2)]
    with get_parallel().override(attn_dp_size=2), get_flags().dp.override(enabled=True):
        groups = [  # both open at once, as a server's groups start
            backend(storage_config(extra, dp_rank=dp_rank), pool)
            for dp_rank, pool in enumerate(pools)
        ]
    for dp_rank, (group, pool) in enumerate(zip(groups, pools)):
        store_four_pages_two_a_batch(group, pool, first_key=4 * dp_rank)
    for group in groups:
        group.close()
    assert page_files(tmp_path) == 4


def test_tp_lcm_size_shares_head_groups_between_tp4_and_tp8(tmp_path):
    """tp_lcm_size 8: rank 1 of TP 4 stores each page as two head groups, which ranks 2 and 3 of
    TP 8 load as their own pages."""
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24, "interface_v1": 1}
    wide = host_pool("page_head", heads=4, seed=10)
    lcm = {"tp_lcm_size": 8}
    writer = stored(extra, wide, tp_rank=1, tp_size=4, should_split_heads=True, **lcm)
    assert sorted(writer.pages.tiers) == ["hicache-2", "hicache-3"]
    for group, rank in enumerate((2, 3)):
        narrow = host_pool("page_head", heads=2, seed=11)
        reader = backend(storage_config(extra, tp_rank=rank, tp_size=8, **lcm), narrow)
        assert reader.batch_get_v1(KEYS, page_indices(PAGES, narrow.page_size)) == [True] * 6
        heads = slice(2 * group, 2 * group + 2)
        for page in PAGES:
            expected = wide.kv_buffer.view(torch.uint8)[:, page, heads]
            assert torch.equal(narrow.kv_buffer.view(torch.uint8)[:, page], expected)
        reader.close()
    writer.close()


def test_the_kv_cache_dtype_is_in_the_namespace(monkeypatch):
    pool = host_pool()
    config = storage_config({"tier": "dir:/unused", "bytes_to_use": 1 << 20})
    plain = sglang_namespace.page_namespace(config, pool, 0, 1024)
    monkeypatch.setattr(sglang_namespace, "server_setting", {"kv_cache_dtype": "fp8_e4m3"}.get)
    fp8 = sglang_namespace.page_namespace(config, pool, 0, 1024)
    assert plain.digest != fp8.digest and "kv_cache_dtype=fp8_e4m3" in fp8.dtype


CHILD = """
import json, sys
from tests.support.sglang_pools import backend, host_pool, page_indices, storage_config
pool = host_pool("page_first", seed=12)
storage = backend(storage_config({**json.loads(sys.argv[1]), "interface_v1": 1}), pool)
pages = [int(page) for page in sys.argv[2].split(",")]
keys = [f"{index:064x}" for index in range(100, 100 + len(pages))]
assert storage.batch_set_v1(keys, page_indices(pages, pool.page_size)) == [True] * len(pages)
storage.close()
"""


def test_two_processes_share_pages_byte_exact_and_export_tier_metrics(tier, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(tier), ",".join(map(str, PAGES))],
        cwd=ROOT,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        check=True,
        timeout=600,
    )
    into = host_pool("page_first", seed=13)
    reader = backend(storage_config({**tier, "interface_v1": 1}), into)
    assert reader.batch_get_v1(KEYS, page_indices(PAGES, into.page_size)) == [True] * 6
    source = host_pool("page_first", seed=12)
    assert [page_bytes(into, p) for p in PAGES] == [page_bytes(source, p) for p in PAGES]
    counters = reader.pages.tiers["hicache"].counters
    assert (counters.loaded_own, counters.loaded_other) == (0, 6)
    reader.close()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    labels = {"tier": "hicache", "instance": "sglang-tp0"}
    assert registry.get_sample_value("numbakv_tier_stored_chunks_total", labels) == len(PAGES)


@needs_redis
def test_a_redis_cluster_spreads_pages_over_its_nodes_byte_exact(tmp_path):
    with redis_cluster(str(tmp_path)) as nodes:
        tier = {"tier": f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true"}
        source = host_pool(seed=15)
        writer = stored(tier, source)
        assert sum(int(node.cli("DBSIZE")) > 0 for node in nodes) > 1
        into = host_pool(seed=16)
        reader = backend(storage_config({**tier, "interface_v1": 1}), into)
        assert reader.batch_get_v1(KEYS, page_indices(PAGES, into.page_size)) == [True] * 6
        assert [page_bytes(into, p) for p in PAGES] == [page_bytes(source, p) for p in PAGES]
        writer.close()
        reader.close()


def test_get_stats_gives_each_batchs_pages_once(tmp_path):
    pool = host_pool(seed=14)
    writer = stored({"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24}, pool)
    writer.batch_get_v1(KEYS[:2], page_indices([30, 31], pool.page_size))
    stats = writer.get_stats()
    assert (stats.backup_pgs, stats.prefetch_pgs) == ([6], [2])
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    assert writer.get_stats().backup_pgs == []
    writer.close()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({}, "tier"),
        ({"tier": "ftp://host/kv"}, "dir:PATH or redis://"),
        ({"tier": "dir:{tmp}", "bytes_to_use": 1 << 20, "ttl_s": 5}, "'ttl_s'"),
        ({"tier": "dir:{tmp}", "bytes_to_use": 1 << 20, "interface_v1": 2}, "interface_v1"),
        ({"tier": "dir:{tmp}", "bytes_to_use": 1 << 20, "staging_bytes": 0}, "staging_bytes"),
        ({"tier": "dir:{tmp}", "bytes_to_use": "1MiB", "staging_bytes": "2 MiBs"}, "staging_bytes"),
        ({"tier": "dir:{tmp}", "bytes_to_use": -1}, "bytes_to_use"),
        ({"tier": "dir:{tmp}"}, "bytes_to_use"),
        ({"tier": "redis://127.0.0.1:1/0", "lookup_deadline_s": "soon"}, "lookup_deadline_s"),
        ({"tier": "redis://127.0.0.1:1/0?ttl_s=never"}, "ttl_s"),
    ],
)
def test_bad_settings_raise_at_construction_naming_the_key(tmp_path, extra, named):
    extra = {
        key: value.format(tmp=tmp_path / "kv") if isinstance(value, str) else value
        for key, value in extra.items()
    }
    with pytest.raises((ValueError, TypeError), match=named):
        NumbaKVHiCacheStorage(storage_config(extra))
    assert not (tmp_path / "kv").exists()


def test_sglangs_own_prefetch_settings_are_left_to_sglang(tmp_path):
    """A decode server's offload path passes SGLang's prefetch settings on with the backend's."""
    extra = {
        "tier": f"dir:{tmp_path}",
        "bytes_to_use": 1 << 24,
        "interface_v1": 1,
        "prefetch_threshold": 256,
        "prefetch_timeout_base": 1,
        "prefetch_timeout_per_ki_token": 0.25,
        "hicache_storage_pass_prefix_keys": True,
    }
    pool = host_pool(seed=15)
    storage = backend(storage_config(extra), pool)
    assert storage.batch_set_v1(KEYS[:1], page_indices([0], pool.page_size)) == [True]
    storage.close()


def test_split_heads_need_the_zero_copy_path(tmp_path):
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 20}
    config = storage_config(extra, tp_size=4, tp_lcm_size=8, should_split_heads=True)
    with pytest.raises(ValueError, match="tp_lcm_size"):
        NumbaKVHiCacheStorage(config)


def test_a_hybrid_models_other_pools_are_refused_at_attach(tmp_path):
    pool = host_pool()
    storage = backend(storage_config({"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24}), pool)
    storage.register_mem_host_pool_v2(pool, PoolName.KV)  # what SGLang does for every model
    with pytest.raises(ValueError, match="mamba"):
        storage.register_mem_host_pool_v2(host_pool(), PoolName.MAMBA)
    storage.close()


def test_a_layout_without_byte_ranges_is_refused_naming_it(tmp_path):
    pool = host_pool()
    pool.get_page_buffer_meta = lambda indices: (_ for _ in ()).throw(ValueError("no ranges"))
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24, "interface_v1": 1}
    storage = NumbaKVHiCacheStorage(storage_config(extra))
    with pytest.raises(ValueError, match="page_first layout .* names no byte ranges"):
        storage.register_mem_pool_host(pool)
    assert np.all(storage.batch_get_v1(KEYS[:1], page_indices([0], pool.page_size)) == [False])
