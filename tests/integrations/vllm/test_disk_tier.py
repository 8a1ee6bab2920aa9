"""numbakv's disk tier under vLLM 0.32's own TieringOffloadingSpec (scheduler side, on CPU): two
engines in two processes share one directory byte for byte; the bound evicts by numbakv's policy,
with vLLM's touches, and reports evictions as KV events."""

from __future__ import annotations

import dataclasses
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.support.vllm_support import offloading_config, require_vllm

require_vllm()

from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from numbakv.integrations.vllm import NumbaKVDiskTier
from numbakv.integrations.vllm.tiers import namespace_of
from numbakv.tiers import open_tier
from numbakv.tiers.disk import ALIGNMENT
from tests.support.tier_engine import (
    CHUNK_BYTES,
    STEP,
    chunk_bytes,
    engine,
    keys_of,
    loaded_bytes,
    lookup_until_resolved,
    store,
    store_in_another_process,
)

FILE_BYTES = ALIGNMENT + CHUNK_BYTES


def disk_tier(root, files: int = 64, **settings) -> dict:
    return {
        "type": "NumbaKVDiskTier",
        "module_path": "numbakv.integrations.vllm",
        "root_dir": str(root),
        "bytes_to_use": files * FILE_BYTES,
        "lookup_deadline_s": 0.5,
        **settings,
    }


def test_two_engines_in_two_processes_share_a_directory_byte_exact(tmp_path):
    config = disk_tier(tmp_path)
    shared, own = keys_of("shared", 12), keys_of("own", 4)
    assert store_in_another_process(config, "shared", 12) == 12

    reader = engine("reader-engine", config)
    manager = reader.get_manager()
    (tier,) = manager.secondary_tiers
    assert isinstance(tier, NumbaKVDiskTier) and tier.tier.backend.used_files() == 12
    store(reader, "own", own)
    results = lookup_until_resolved(reader, "next-turn", shared + own + keys_of("absent", 2))
    assert [results[key] for key in shared + own] == [LookupResult.HIT] * 16
    assert [results[key] for key in keys_of("absent", 2)] == [LookupResult.MISS] * 2
    for key, found in zip(shared, loaded_bytes(reader, shared)):
        np.testing.assert_array_equal(found, chunk_bytes(key))
    assert (tier.tier.counters.loaded_other, tier.tier.counters.loaded_own) == (12, 0)
    assert tier.tier.backend.used_files() == 16
    manager.shutdown()


def engine_with_events(root, engine_id: str, files: int = 64):
    """An engine with vLLM's KV events on over a disk tier of `files` files: its spec, its
    scheduler-side manager and its disk tier."""
    extra = {
        "cpu_bytes_to_use": 64 * CHUNK_BYTES,
        "secondary_tiers": [disk_tier(root, files=files, enable_kv_events=True)],
    }
    config = offloading_config(extra, worker_kv_bytes_per_block=CHUNK_BYTES)
    spec = TieringOffloadingSpec(
        dataclasses.replace(config, engine_id=engine_id, enable_kv_cache_events=True)
    )
    manager = spec.get_manager()
    (tier,) = manager.secondary_tiers
    return spec, manager, tier


def test_the_bound_evicts_by_policy_with_vllms_touches_and_reports_removals(tmp_path):
    spec, manager, tier = engine_with_events(tmp_path, "events", files=3)
    first, last = keys_of("a", 3), keys_of("b", 1)
    store(spec, "r1", first)
    list(manager.take_events())
    manager.touch(first[:1], ReqContext(req_id="r2"))  # LRU: first[1] is now the oldest
    store(spec, "r3", last)
    removed = [e.keys for e in manager.take_events() if e.removed and e.medium == tier.medium]
    assert removed == [[first[1]]]
    assert not os.path.exists(tier.tier.backend._path(first[1]))
    assert tier.tier.backend.used_files() == 3
    manager.shutdown()


def test_a_file_removed_then_stored_again_is_reported_in_that_order(tmp_path):
    """Events are read in batches: a chunk evicted and stored again in one batch must end on
    its store, and the chunk its store evicted on its removal."""
    spec, manager, tier = engine_with_events(tmp_path, "order", files=3)
    first, last = keys_of("a", 3), keys_of("d", 1)
    store(spec, "r1", first)
    list(manager.take_events())
    store(spec, "r2", last)  # evicts first[0]
    tier.submit_store(manager.create_store_job(first[:1], ReqContext(req_id="r3"), 0))
    tier.tier.drain()  # first[0] back, evicting first[1]
    manager.on_schedule_end(STEP)
    events = [(e.removed, list(e.keys)) for e in manager.take_events() if e.medium == tier.medium]
    last_event = {key: removed for removed, keys in events for key in keys}
    assert last_event == {first[0]: False, first[1]: True, last[0]: False}
    assert tier.tier.backend.exists(first[:2]) == [True, False]
    manager.shutdown()


def test_a_store_collected_after_its_file_went_announces_nothing(tmp_path):
    """The store's job is collected a step after its file's removal was announced: announcing it
    then made the chunk's last event a store, of a file no longer there."""
    spec, manager, tier = engine_with_events(tmp_path, "late", files=3)
    chunks = keys_of("l", 2)
    store(spec, "r1", chunks)
    list(manager.take_events())
    tier.submit_store(manager.create_store_job(chunks, ReqContext(req_id="r2"), 0))
    tier.tier.drain()  # done, not yet collected
    tier.tier.backend.delete(chunks[:1])  # its file goes (damaged, say)
    removed = [e.keys for e in manager.take_events() if e.medium == tier.medium and e.removed]
    assert removed == [chunks[:1]]
    manager.on_schedule_end(STEP)  # collects the store
    stored = [e.keys for e in manager.take_events() if e.medium == tier.medium]
    assert stored == [chunks[1:]]
    manager.shutdown()


def test_a_store_that_failed_in_part_announces_nothing(tmp_path, monkeypatch):
    """As vLLM's own file tier: a store job with a failed chunk emits no event at all."""
    spec, manager, tier = engine_with_events(tmp_path, "partial")
    keys = keys_of("p", 2)
    write_file = tier.tier.backend._write_file
    monkeypatch.setattr(
        tier.tier.backend,
        "_write_file",
        lambda key, *rest: key != keys[1] and write_file(key, *rest),
    )
    store(spec, "r1", keys)
    stored = [e.keys for e in manager.take_events() if e.medium == tier.medium and not e.removed]
    assert stored == [] and tier.tier.counters.dropped_stores == 1
    monkeypatch.undo()
    store(spec, "r2", keys_of("q", 2))
    stored = [e.keys for e in manager.take_events() if e.medium == tier.medium and not e.removed]
    assert stored == [keys_of("q", 2)]
    manager.shutdown()


def test_a_damaged_file_is_a_failed_promotion_then_a_miss(tmp_path):
    config = disk_tier(tmp_path)
    writer = engine("engine-a", config)
    keys = keys_of("p", 3)
    store(writer, "writer", keys)
    backend = writer.get_manager().secondary_tiers[0].tier.backend
    path = backend._path(keys[1])
    with open(path, "r+b") as file:
        file.seek(backend.payload_offset + 100)
        byte = file.read(1)
        file.seek(backend.payload_offset + 100)
        file.write(bytes([byte[0] ^ 1]))
    reader = engine("engine-b", config)
    results = lookup_until_resolved(reader, "r1", keys)
    assert results[keys[1]] is not LookupResult.HIT
    assert [results[keys[0]], results[keys[2]]] == [LookupResult.HIT] * 2
    assert lookup_until_resolved(reader, "r2", keys[1:2])[keys[1]] is LookupResult.MISS
    assert reader.get_manager().secondary_tiers[0].tier.counters.integrity_failures == 1
    assert not os.path.exists(path)
    writer.get_manager().shutdown()
    reader.get_manager().shutdown()


@pytest.mark.parametrize(
    "change, named",
    [
        ({"root": "/x"}, "'root'"),
        ({"bytes_to_use": 10}, "bytes_to_use"),
        ({"bytes_to_use": "1 TiBs"}, "bytes_to_use: got '1 TiBs': unit 'TiBs'"),
        ({"root_dir": ""}, "root_dir"),
        ({"cache_policy": "fifo"}, "fifo"),
        ({"root_dir": None}, "root_dir"),
    ],
)
def test_a_bad_or_unknown_setting_stops_the_engine_naming_it(tmp_path, change, named):
    config = {**disk_tier(tmp_path), **change}
    if change.get("root_dir", "") is None:
        del config["root_dir"]
    with pytest.raises((ValueError, TypeError), match=named):
        engine("bad-engine", config).get_manager()


def test_the_documented_combination_numbakvs_policy_above_numbakvs_disk_tier(tmp_path):
    """docs/VLLM.md: vLLM's tiering spec, sarc for its CPU tier, the disk tier below it."""
    from numbakv.integrations.vllm.policies import SightingARCCachePolicy

    extra = {
        "cpu_bytes_to_use": 8 * CHUNK_BYTES,
        "eviction_policy": "sarc",
        "cache_policy_module_path": "numbakv.integrations.vllm.policies",
        "secondary_tiers": [disk_tier(tmp_path, bytes_to_use=f"{64 * FILE_BYTES // 1024}KiB")],
    }
    config = offloading_config(extra, worker_kv_bytes_per_block=CHUNK_BYTES)
    spec = TieringOffloadingSpec(dataclasses.replace(config, engine_id="combination"))
    manager = spec.get_manager()
    assert isinstance(manager.primary_tier._policy, SightingARCCachePolicy)
    assert isinstance(manager.secondary_tiers[0], NumbaKVDiskTier)
    assert manager.secondary_tiers[0].tier.backend.capacity_files == 64
    keys = keys_of("c", 12)  # more than the CPU tier holds: the first ones live on disk only
    for start in range(0, 12, 4):
        store(spec, f"r{start}", keys[start : start + 4])
    assert manager.primary_tier.lookup(keys[0], ReqContext(req_id="x")) is LookupResult.MISS
    results = lookup_until_resolved(spec, "again", keys[:4])
    assert list(results.values()) == [LookupResult.HIT] * 4
    for key, found in zip(keys, loaded_bytes(spec, keys[:4])):
        np.testing.assert_array_equal(found, chunk_bytes(key))
    manager.shutdown()


def wait_for_job(tier, job_id: int) -> JobResult:
    for _ in range(1000):
        results = {result.job_id: result for result in tier.get_finished_jobs()}
        if job_id in results:
            return results[job_id]
        tier.tier.drain()
    raise AssertionError(f"job {job_id} never reported")


def test_a_failed_load_beside_a_newer_probe_of_its_chunk_keeps_the_scheduler_going(tmp_path):
    """A request finished while its promotion still ran; a new request asks for the chunk again.
    The failed load must not resolve the new probe behind vLLM's back (0.32's mark_miss did, and
    the step's flush then failed its phase assertion)."""
    writer = engine("engine-a", disk_tier(tmp_path))
    (key,) = keys_of("late", 1)
    store(writer, "writer", [key])
    reader = engine("engine-b", disk_tier(tmp_path))
    (tier,) = reader.get_manager().secondary_tiers
    assert lookup_until_resolved(reader, "first", [key])[key] is LookupResult.HIT
    os.unlink(tier.tier.backend._path(key))  # gone before the promotion reads it
    tier.on_request_finished(ReqContext(req_id="first"))
    assert tier.lookup(key, ReqContext(req_id="second")) is LookupResult.RETRY  # a new probe
    job = TransferJob(1, [key], np.array([0]), is_promotion=True, req_context=ReqContext("first"))
    tier.submit_load(job)
    assert not wait_for_job(tier, 1).success
    tier.on_schedule_end(STEP)  # flushes the new probe
    for _ in range(1000):
        found = tier.lookup(key, ReqContext(req_id="second"))
        if found is not LookupResult.RETRY:
            break
        tier.on_schedule_end(STEP)
        time.sleep(0.01)
    assert found is LookupResult.MISS
    writer.get_manager().shutdown()
    reader.get_manager().shutdown()


@pytest.mark.parametrize("chunk_ids", [[3, 3], [3, 1 << 40]], ids=["repeated", "out of range"])
def test_a_refused_job_is_a_failed_job_and_leaves_no_pending_work(tmp_path, chunk_ids):
    """As vLLM's own tiers do: the scheduler has pinned the chunks, and releases them only on a
    job's result."""
    (tier,) = engine("engine-a", disk_tier(tmp_path)).get_manager().secondary_tiers
    keys = keys_of("refused", 2)
    job = TransferJob(1, keys, np.array(chunk_ids), is_promotion=True, req_context=ReqContext("r"))
    tier.submit_load(job)
    assert tier.has_pending_work()
    (result,) = tier.get_finished_jobs()
    assert (result.job_id, result.success) == (1, False)
    assert not tier.has_pending_work()
    tier.shutdown()


@pytest.mark.skipif(
    not hasattr(TieringOffloadingSpec, "config_info_keys"), reason="vLLM 0.32 has no config_info"
)
def test_vllm_config_info_names_the_tiers_namespace_chunk_and_capacity(tmp_path):
    spec = engine("info-engine", disk_tier(tmp_path, files=8))
    keys = TieringOffloadingSpec.config_info_keys(spec.extra_config)
    _, disk = spec.get_manager().config_info()
    assert {"numbakv_namespace", "numbakv_chunk_bytes", "numbakv_capacity_chunks"} <= set(keys)
    (tier,) = spec.get_manager().secondary_tiers
    assert disk["numbakv_namespace"] == tier.namespace.digest.hex()
    assert (disk["numbakv_chunk_bytes"], disk["numbakv_capacity_chunks"]) == (CHUNK_BYTES, 8)
    spec.get_manager().shutdown()


def test_engines_whose_rows_differ_share_no_chunk_and_delete_none(tmp_path):
    """vLLM lays one chunk per rank in a row, or one for all ranks where it replicates the
    layout (MLA): same model, other bytes. Each engine must miss the other's chunks, not load
    them, fail their length check and delete them."""
    base = offloading_config(
        {"cpu_bytes_to_use": 1 << 20}, worker_kv_bytes_per_block=4096, world_size=2
    )
    configs = [
        dataclasses.replace(base, canonical_layout=True, replicated_layout=r) for r in (1, 0)
    ]
    namespaces = [
        namespace_of(SimpleNamespace(config=c), row) for c, row in zip(configs, (4096, 8192))
    ]
    assert namespaces[0].digest != namespaces[1].digest
    rows_a = np.random.default_rng(0).integers(0, 256, (2, 4096), dtype=np.uint8)
    a, b = (
        open_tier(f"dir:{tmp_path}", rows, ns, bytes_to_use=1 << 24)
        for rows, ns in ((rows_a, namespaces[0]), (np.zeros((2, 8192), np.uint8), namespaces[1]))
    )
    a.submit_store(1, [b"k" * 32], [0])
    a.drain()
    assert a.take_finished()[0].success
    assert b.contains([b"k" * 32]) == [False] and a.contains([b"k" * 32]) == [True]
    a.close(), b.close()


def test_a_config_without_kv_cache_groups_starts(tmp_path):
    config = offloading_config(
        {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [disk_tier(tmp_path)]}
    )
    manager = TieringOffloadingSpec(dataclasses.replace(config, groups=())).get_manager()
    manager.shutdown()
