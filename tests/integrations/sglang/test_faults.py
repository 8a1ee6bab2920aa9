"""Faults under numbakv's HiCache backend, against real redis-servers and a real directory: a
foreign, corrupted or truncated page is a miss; a killed or paused server is a miss within the
tier's deadline; and wrapped in SGLang's own HiCacheStorageFailureInjector the backend answers every
call, never raises, and loads no wrong byte."""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest
import redis

from tests.support import sglang_pools as pools
from tests.support.redis_servers import needs_redis, redis_server

pools.require_sglang()

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageFailureInjector

from numbakv.tiers.chunk_format import HEADER_BYTES, encode_header

PAGES = [2, 3, 5, 8]
KEYS = [f"{index:064x}" for index in range(500, 500 + len(PAGES))]
DEADLINE_S = 0.02


def zero_copy(url: str, pool, **settings):
    extra = {"tier": url, "interface_v1": 1, "lookup_deadline_s": DEADLINE_S, **settings}
    return pools.backend(pools.storage_config(extra), pool)


@pytest.fixture
def server(tmp_path):
    with redis_server(str(tmp_path)) as started:
        yield started


@needs_redis
@pytest.mark.parametrize("damage", ["corrupted", "truncated", "foreign"])
def test_a_damaged_page_is_a_miss_and_the_rest_load_byte_exact(server, damage):
    source = pools.host_pool(seed=1)
    writer = zero_copy(server.url, source)
    assert writer.batch_set_v1(KEYS, pools.page_indices(PAGES, source.page_size)) == [True] * 4
    shard = writer.pages.tiers["hicache"]
    client = redis.Redis.from_url(server.url)
    raw_key = shard.backend._prefix + KEYS[2].encode()
    value = bytearray(client.get(raw_key))
    if damage == "corrupted":
        value[HEADER_BYTES + 7] ^= 0x01
    elif damage == "truncated":
        del value[-16:]
    else:  # a page of another model, under this key
        foreign = dataclasses.replace(shard.namespace, model="another").digest
        payload = memoryview(bytes(value[HEADER_BYTES:]))
        value[:HEADER_BYTES] = encode_header(foreign, b"w" * 8, payload, KEYS[2].encode())
    client.set(raw_key, bytes(value))

    into = pools.host_pool(seed=3)
    reader = zero_copy(server.url, into)
    assert reader.batch_exists(KEYS) == 4  # the value is there until a load checks it
    assert reader.batch_get_v1(KEYS, pools.page_indices(PAGES, into.page_size)) == [
        True,
        True,
        False,
        True,
    ]
    for page in (2, 3, 8):
        assert pools.page_bytes(into, page) == pools.page_bytes(source, page)
    assert reader.batch_exists(KEYS) == 2  # a damaged page is gone until it is stored anew
    assert reader.pages.tiers["hicache"].counters.integrity_failures == 1
    writer.close()
    reader.close()


def test_a_truncated_page_file_is_a_miss(tmp_path):
    source = pools.host_pool(seed=4)
    url = f"dir:{tmp_path}"
    writer = zero_copy(url, source, bytes_to_use=1 << 24)
    assert writer.batch_set_v1(KEYS, pools.page_indices(PAGES, source.page_size)) == [True] * 4
    (path,) = [
        os.path.join(root, name)
        for root, _, names in os.walk(tmp_path)
        for name in names
        if name == KEYS[0].encode().hex()
    ]
    os.truncate(path, os.path.getsize(path) - 100)
    into = pools.host_pool(seed=5)
    reader = zero_copy(url, into, bytes_to_use=1 << 24)
    assert (
        reader.batch_get_v1(KEYS, pools.page_indices(PAGES, into.page_size)) == [False] + [True] * 3
    )
    assert [pools.page_bytes(into, p) for p in PAGES[1:]] == [
        pools.page_bytes(source, p) for p in PAGES[1:]
    ]
    writer.close()
    reader.close()


@needs_redis
def test_a_killed_server_is_a_miss_at_once_and_served_again_after_it_restarts(server):
    pool = pools.host_pool(seed=6)
    storage = zero_copy(server.url, pool, breaker_cooldown_s=0.2)
    indices = pools.page_indices(PAGES, pool.page_size)
    assert storage.batch_set_v1(KEYS, indices) == [True] * 4
    server.kill()
    started = time.perf_counter()
    assert storage.batch_exists(KEYS) == 0
    assert storage.batch_get_v1(KEYS, indices) == [False] * 4
    assert storage.batch_set_v1(KEYS, indices) == [False] * 4
    assert storage.get(KEYS[0], pool.get_dummy_flat_data_page()) is None
    assert time.perf_counter() - started < 2.0  # refused connections, then the open breaker
    server.start()
    time.sleep(0.3)  # the breaker's cooldown: its next call probes the server
    for _ in range(40):
        if storage.batch_set_v1(KEYS, indices) == [True] * 4:
            break
        time.sleep(0.05)
    assert storage.batch_exists(KEYS) == 4
    storage.close()


@needs_redis
def test_a_paused_server_is_a_miss_within_the_lookup_deadline(server):
    pool = pools.host_pool(seed=7)
    storage = zero_copy(server.url, pool, socket_timeout_s=0.5, breaker_cooldown_s=0.3)
    indices = pools.page_indices(PAGES, pool.page_size)
    assert storage.batch_set_v1(KEYS, indices) == [True] * 4
    server.cli("CLIENT", "PAUSE", "1500", "ALL")
    waited = []
    for _ in range(5):
        started = time.perf_counter()
        assert storage.batch_exists(KEYS) == 0
        waited.append(time.perf_counter() - started)
    assert np.median(waited) < DEADLINE_S + 0.05, waited
    started = time.perf_counter()
    assert storage.batch_get_v1(KEYS, indices) == [False] * 4  # bounded by socket_timeout_s
    assert time.perf_counter() - started < 0.5 + 0.5
    time.sleep(1.6)  # the pause is over: the breaker's probe finds the server again
    for _ in range(50):  # pages whose load failed are absent until written again
        if storage.batch_set_v1(KEYS, indices) == [True] * 4:
            break
        time.sleep(0.05)
    assert storage.batch_exists(KEYS) == 4
    storage.close()


@pytest.mark.parametrize("interface_v1", [1, 0])
def test_sglangs_failure_injector_finds_no_raise_and_no_wrong_byte(
    tmp_path, monkeypatch, interface_v1
):
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY", "0.002")
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.3")
    extra = {"tier": f"dir:{tmp_path}", "bytes_to_use": 1 << 24, "interface_v1": interface_v1}
    source, into = pools.host_pool(seed=8), pools.host_pool(seed=9)
    writer, reader = (pools.backend(pools.storage_config(extra), pool) for pool in (source, into))
    assert isinstance(writer, HiCacheStorageFailureInjector)
    outcomes = set()
    for batch in range(12):  # the cache controller's calls: write back, query, prefetch
        pages = [(4 * batch + i) % (source.page_num - 1) for i in range(4)]
        keys = [f"{batch:032x}{page:032x}" for page in pages]
        indices = pools.page_indices(pages, source.page_size)
        if interface_v1:
            stored = all(writer.batch_set_v1(keys, indices))
        else:
            flat = [source.get_data_page(page * source.page_size) for page in pages]
            stored = writer.batch_set(keys, flat)
        hits = reader.batch_exists(keys)
        if interface_v1:
            loaded = reader.batch_get_v1(keys[:hits], indices[: hits * source.page_size])
        else:
            targets = [into.get_dummy_flat_data_page() for _ in range(hits)]
            pages_loaded = reader.batch_get(keys[:hits], targets)
            loaded = [page is not None for page in pages_loaded]
            for page, target in zip(pages[:hits], pages_loaded):
                if target is not None:
                    into.set_from_flat_data_page(page * into.page_size, target)
        assert isinstance(hits, int) and len(loaded) == hits
        outcomes.update((stored, *loaded))
        for page, ok in zip(pages, loaded):
            if ok:
                assert pools.page_bytes(into, page) == pools.page_bytes(source, page)
    assert outcomes >= {True, False}  # the injector failed some calls, and some went through
    writer.close()
    reader.close()
