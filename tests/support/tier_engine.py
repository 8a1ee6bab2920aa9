"""One engine's scheduler side for the tier tests: vLLM 0.32's real `TieringOffloadingSpec` on CPU
with numbakv's Redis tier as its secondary tier. Where a GPU worker would write the primary tier's
bytes, these helpers write them; they also run as a separate
process (`python -m tests.support.tier_engine`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tests.support.servers import ROOT
from tests.support.vllm_support import offloading_config

CHUNK_BYTES = 4096
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def engine(
    engine_id: str, tier_config: dict, cpu_chunks: int = 64, kv_events: bool = False
) -> TieringOffloadingSpec:
    """A tiering spec with `tier_config` as its one secondary tier, under its own engine id."""
    extra = {"cpu_bytes_to_use": cpu_chunks * CHUNK_BYTES, "secondary_tiers": [tier_config]}
    config = offloading_config(extra, worker_kv_bytes_per_block=CHUNK_BYTES)
    config = dataclasses.replace(config, engine_id=engine_id, enable_kv_cache_events=kv_events)
    return TieringOffloadingSpec(config)


def store_in_another_process(tier_config: dict, prefix: str, chunks: int, **env: str) -> int:
    """Run an engine ("writer-engine") in a child process that stores `chunks` chunks named by
    `prefix` through the tier; how many it stored."""
    writer = subprocess.run(
        [sys.executable, "-m", "tests.support.tier_engine", "--engine-id", "writer-engine"]
        + ["--tier", json.dumps(tier_config), "--prefix", prefix, "--chunks", str(chunks)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": ROOT, **env},
    )
    return json.loads(writer.stdout.splitlines()[-1])["stored"]


def chunk_bytes(key: bytes) -> np.ndarray:
    """The bytes a chunk holds: random, seeded by its key, the same in every process."""
    seed = int.from_bytes(key[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, CHUNK_BYTES, dtype=np.uint8)


def keys_of(prefix: str, count: int) -> list[bytes]:
    return [(f"{prefix}-{i:04d}".encode() * 4)[:28] + b"\0\0\0\0" for i in range(count)]


def primary_rows(spec: TieringOffloadingSpec) -> np.ndarray:
    view = spec.get_manager().primary_tier.get_kv_memoryview()
    return np.frombuffer(view, dtype=np.uint8).reshape(len(view), view.strides[0])


def settle(spec: TieringOffloadingSpec, timeout_s: float = 10) -> None:
    """Step the scheduler until no tier transfer is in flight."""
    manager = spec.get_manager()
    deadline = time.monotonic() + timeout_s
    while manager.has_pending_work():
        if time.monotonic() > deadline:
            raise TimeoutError("tier jobs still pending")
        manager.on_schedule_end(STEP)
        time.sleep(0.002)
    manager.on_schedule_end(STEP)


def store(spec: TieringOffloadingSpec, request: str, keys: list[bytes]) -> None:
    """Offload `keys` as a request would: into host memory (bytes written here), cascaded below."""
    manager = spec.get_manager()
    context = ReqContext(req_id=request)
    manager.on_new_request(context)
    output = manager.prepare_store(keys, context)
    rows = primary_rows(spec)
    for key, row in zip(output.keys_to_store, output.store_spec.chunk_ids):
        rows[row] = chunk_bytes(key)
    manager.complete_store(output.keys_to_store, context)
    manager.on_request_finished(context)
    settle(spec)


def lookup_until_resolved(
    spec: TieringOffloadingSpec, request: str, keys: list[bytes], timeout_s: float = 10
) -> dict[bytes, LookupResult]:
    """Look each key up, stepping the scheduler, until none answers RETRY or HIT_PENDING."""
    manager = spec.get_manager()
    context = ReqContext(req_id=request)
    manager.on_new_request(context)
    deadline = time.monotonic() + timeout_s
    while True:
        results = {key: manager.lookup(key, context) for key in keys}
        waiting = {LookupResult.RETRY, LookupResult.HIT_PENDING}
        if not waiting & set(results.values()):
            manager.on_request_finished(context)
            settle(spec)
            return results
        if time.monotonic() > deadline:
            raise TimeoutError(f"lookups still waiting: {set(results.values())}")
        manager.on_schedule_end(STEP)
        time.sleep(0.002)


def loaded_bytes(spec: TieringOffloadingSpec, keys: list[bytes]) -> list[np.ndarray]:
    """The host-memory bytes of `keys`, where the GPU worker would read them."""
    manager = spec.get_manager()
    context = ReqContext(req_id="read")
    manager.on_new_request(context)
    load_spec = manager.prepare_load(keys, context)
    rows = primary_rows(spec)
    found = [rows[row].copy() for row in load_spec.chunk_ids]
    manager.complete_load(keys, context)
    manager.on_request_finished(context)
    return found


def main() -> None:
    """Store a prefix's chunks from a process of its own, as another engine would."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine-id", required=True)
    parser.add_argument("--tier", required=True, help="the secondary tier's config, JSON")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--chunks", type=int, required=True)
    args = parser.parse_args()
    spec = engine(args.engine_id, json.loads(args.tier))
    store(spec, "writer", keys_of(args.prefix, args.chunks))
    tier = spec.get_manager().secondary_tiers[0].tier
    print(json.dumps({"stored": tier.counters.stored}))
    spec.get_manager().shutdown()


if __name__ == "__main__":
    main()
