"""numbakv's Redis tier under vLLM 0.32's own TieringOffloadingSpec (scheduler side, on CPU): two
engines in two processes share chunks through one real redis-server, byte for byte."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from tests.support.redis_servers import needs_redis, redis_server
from tests.support.vllm_support import require_vllm

require_vllm()

from prometheus_client import values as prometheus_values
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from numbakv.integrations.vllm import NumbaKVRedisTier
from tests.support.tier_engine import (
    chunk_bytes,
    engine,
    keys_of,
    loaded_bytes,
    lookup_until_resolved,
    store,
    store_in_another_process,
)

pytestmark = needs_redis


def redis_tier(url: str, **settings) -> dict:
    return {
        "type": "NumbaKVRedisTier",
        "module_path": "numbakv.integrations.vllm",
        "url": url,
        **settings,
    }


@pytest.fixture
def server(tmp_path):
    with redis_server(str(tmp_path)) as started:
        yield started


def test_two_engines_in_two_processes_share_a_prefix_byte_exact(server, caplog, tmp_path):
    from numbakv.service.metrics_dir import MetricsDirectory

    config = redis_tier(server.url, lookup_deadline_s=0.5)
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    shared, own = keys_of("shared", 12), keys_of("own", 4)
    assert (
        store_in_another_process(config, "shared", 12, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
        == 12
    )
    written = {
        (sample.name, sample.labels.get("tier"))
        for metric in MetricsDirectory(str(metrics_dir)).read().metrics
        for sample in metric.samples
        if sample.name == "numbakv_tier_stored_chunks_total" and sample.value == 12
    }
    assert written == {("numbakv_tier_stored_chunks_total", "NumbaKVRedisTier")}

    with caplog.at_level(logging.INFO, "numbakv.tiers"):
        reader = engine("reader-engine", config)
        manager = reader.get_manager()
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, NumbaKVRedisTier) and tier.tier_type == "NumbaKVRedisTier"
    assert f"namespace {tier.namespace.digest.hex()} (model=tiny" in caplog.text
    store(reader, "own", own)
    results = lookup_until_resolved(reader, "next-turn", shared + own + keys_of("absent", 2))
    assert [results[key] for key in shared + own] == [LookupResult.HIT] * 16
    assert [results[key] for key in keys_of("absent", 2)] == [LookupResult.MISS] * 2
    for key, found in zip(shared, loaded_bytes(reader, shared)):
        np.testing.assert_array_equal(found, chunk_bytes(key))
    counters = tier.tier.counters
    assert (counters.loaded_other, counters.loaded_own) == (
        12,
        0,
    )  # own chunks stayed in host memory
    stats = tier.get_stats().data["data"]
    assert stats["numbakv:tier_loaded_chunks"] == {("NumbaKVRedisTier", "other"): 12}
    stats = manager.get_stats().reduce()
    assert stats["vllm:kv_offload_tiering_read_bytes:('1:NumbaKVRedisTier',)"] == 12 * 4096
    manager.shutdown()


def test_a_failed_promotion_is_a_miss_until_stored_anew(server):
    import redis

    config = redis_tier(server.url, lookup_deadline_s=0.5)
    spec = engine("engine-a", config)
    keys = keys_of("p", 3)
    store(spec, "writer", keys)
    other = engine("engine-b", config)
    client = redis.Redis.from_url(server.url)
    (damaged,) = [k for k in client.keys("numbakv:*") if k.endswith(keys[1])]
    value = bytearray(client.get(damaged))
    value[100] ^= 1
    client.set(damaged, bytes(value))
    results = lookup_until_resolved(other, "r1", keys)
    assert results[keys[1]] is not LookupResult.HIT
    assert [results[keys[0]], results[keys[2]]] == [LookupResult.HIT] * 2
    assert lookup_until_resolved(other, "r2", keys[1:2])[keys[1]] is LookupResult.MISS
    tier = other.get_manager().secondary_tiers[0]
    assert tier.tier.counters.integrity_failures == 1
    spec.get_manager().shutdown()
    other.get_manager().shutdown()


def test_metric_definitions_reach_vllm():
    definitions = TieringOffloadingSpec.build_metric_definitions(
        {"secondary_tiers": [redis_tier("redis://127.0.0.1:1/0")]}
    )
    assert "numbakv:tier_integrity_failures" in definitions
    assert definitions["numbakv:tier_loaded_chunks"].labelnames == ("tier", "writer")


@pytest.mark.parametrize(
    "settings, named",
    [({"ttl": 3}, "'ttl'"), ({"lookup_deadline_s": 0}, "lookup_deadline_s"), ({}, None)],
)
def test_a_bad_or_unknown_setting_stops_the_engine_naming_it(server, settings, named):
    config = redis_tier(server.url, **settings)
    if named is None:
        del config["url"]
        named = "url"
    with pytest.raises((ValueError, TypeError), match=named):
        engine("bad-engine", config).get_manager()


def test_stored_chunks_are_kv_events_and_promotions_are_not(server):
    from vllm.v1.kv_offload.base import Medium

    config = redis_tier(server.url, lookup_deadline_s=0.5, enable_kv_events=True)
    writer = engine("events-writer", config, kv_events=True)
    keys = keys_of("ev", 3)
    store(writer, "w", keys)
    mine = [e for e in writer.get_manager().take_events() if e.medium is Medium.STORAGE]
    assert [(sorted(e.keys), e.removed) for e in mine] == [(sorted(keys), False)]
    reader = engine("events-reader", config, kv_events=True)
    assert set(lookup_until_resolved(reader, "r", keys).values()) == {LookupResult.HIT}
    assert not [e for e in reader.get_manager().take_events() if e.medium is Medium.STORAGE]
    writer.get_manager().shutdown()
    reader.get_manager().shutdown()


def test_a_tier_that_fails_to_start_closes_its_connections(server, tmp_path, monkeypatch):
    import redis

    admin = redis.Redis.from_url(server.url)
    before = len(admin.client_list())
    # metrics cannot start: multi-process mode, as if set at start, over a directory not there
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "absent"))
    monkeypatch.setattr(prometheus_values, "ValueClass", prometheus_values.MultiProcessValue())
    with pytest.raises(NotADirectoryError, match="PROMETHEUS_MULTIPROC_DIR") as refused:
        engine("engine-a", redis_tier(server.url)).get_manager()
    assert len(admin.client_list()) == before, "the refused tier's connection is open"
    del refused


CASCADE_FAILURES = "vllm:kv_offload_tiering_cascade_job_failures:('1:NumbaKVRedisTier',)"


def test_a_killed_server_costs_misses_and_failed_stores_until_it_is_back(server):
    """The server killed: the engines keep serving (lookups are misses within the deadline, stores
    fail as jobs, nothing raises, no work stays pending); restarted on its port, the tier stores
    and loads byte-exact again once the breaker has cooled down."""
    cooldown_s, deadline_s = 0.3, 0.5
    config = redis_tier(
        server.url,
        lookup_deadline_s=deadline_s,
        breaker_cooldown_s=cooldown_s,
        socket_timeout_s=0.5,
        connect_timeout_s=0.2,
    )
    writer, reader = engine("engine-a", config), engine("engine-b", config)
    stored = keys_of("before", 4)
    store(writer, "w1", stored)
    writer.get_manager().get_stats()  # what vLLM reported so far
    server.kill()

    started = time.monotonic()
    results = lookup_until_resolved(reader, "r1", stored)
    assert list(results.values()) == [LookupResult.MISS] * 4
    assert time.monotonic() - started < deadline_s + 0.5
    store(writer, "w2", keys_of("during", 3))  # in host memory; its cascade fails
    assert not writer.get_manager().has_pending_work()
    assert not reader.get_manager().has_pending_work()
    assert writer.get_manager().get_stats().reduce()[CASCADE_FAILURES] == 1
    writer_tier = writer.get_manager().secondary_tiers[0].tier
    assert writer_tier.breaker_open and writer_tier.counters.dropped_stores == 3
    assert lookup_until_resolved(writer, "r2", keys_of("during", 3)) == dict.fromkeys(
        keys_of("during", 3), LookupResult.HIT
    )  # host memory still serves

    server.start()  # on the same port, empty: the killed server kept nothing
    time.sleep(cooldown_s)
    after = keys_of("after", 3)
    store(writer, "w3", after)
    assert not writer_tier.breaker_open and writer_tier.counters.stored == 4 + 3
    results = lookup_until_resolved(reader, "r3", after)
    assert list(results.values()) == [LookupResult.HIT] * 3
    for key, found in zip(after, loaded_bytes(reader, after)):
        np.testing.assert_array_equal(found, chunk_bytes(key))
    assert not reader.get_manager().secondary_tiers[0].tier.breaker_open
    writer.get_manager().shutdown()
    reader.get_manager().shutdown()
