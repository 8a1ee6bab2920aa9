"""numbakv inside vLLM 0.32: the real Scheduler and a worker-role OffloadingConnector, end to end.

A prefix is stored into numbakv, evicted from the GPU prefix cache by other requests, looked up
and loaded back; every block a request attends to is checked, every layer, against what its first
writer wrote (tests/support/vllm_engine.py). The worker's kernels run on the CUDA simulator.
"""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support.vllm_support import require_vllm

require_vllm()

from vllm.v1.kv_offload.base import GPULoadStoreSpec, OffloadingWorker

from numbakv import POLICIES
from numbakv.integrations.vllm.config import ConfigError
from numbakv.integrations.vllm.host_spec import HostChunksSpec
from tests.support.vllm_engine import BLOCK_SIZE, NUM_LAYERS, Engine, extra_config

ROOT = Path(__file__).resolve().parents[3]
CHUNK_BYTES = NUM_LAYERS * 2048  # one GPU block of every layer: K and V, 16 tokens, 2 x 16 fp16
PREFIX = list(range(100, 100 + 4 * BLOCK_SIZE))  # four blocks every conversation turn resends


def fillers(engine: Engine) -> None:
    """Two long requests that need (almost) the whole GPU cache: the prefix leaves it."""
    engine.serve(list(range(5_000, 5_000 + 20 * BLOCK_SIZE)))
    engine.serve(list(range(6_000, 6_000 + 20 * BLOCK_SIZE)))


@pytest.mark.parametrize("blocks_per_chunk", [1, 2])
@pytest.mark.parametrize("policy", [*sorted(POLICIES), "numbakv.policies.lru:LRUPolicy"])
def test_a_prefix_comes_back_from_numbakv_byte_exact_after_the_gpu_evicted_it(
    tmp_path, policy, blocks_per_chunk
):
    engine = Engine(
        tmp_path,
        extra_config(
            cpu_bytes_to_use=64 * CHUNK_BYTES * blocks_per_chunk,
            eviction_policy=policy,
            blocks_per_chunk=blocks_per_chunk,
        ),
    )
    stats = engine.manager.manager.stats
    engine.serve(PREFIX + list(range(300, 300 + 2 * BLOCK_SIZE)))
    assert stats().stored_blocks == 6 // blocks_per_chunk  # the prompt's full chunks
    fillers(engine)
    assert stats().loaded_blocks == 0

    # The next turns, at once: one shares the prefix, one the whole first prompt. The second waits
    # for the first's load of the prefix, then loads only the two blocks past it.
    engine.add(PREFIX + list(range(400, 400 + 2 * BLOCK_SIZE)))
    engine.add(PREFIX + list(range(300, 300 + 3 * BLOCK_SIZE)))
    engine.run()
    assert stats().loaded_blocks * blocks_per_chunk == 6
    assert len(engine.loaded_requests) == 2
    assert engine.checked_after_load >= (4 + 6) * BLOCK_SIZE
    assert stats().being_stored == stats().being_read == 0
    assert engine.worker.transfers.jobs_in_flight == 0


def test_a_sync_load_comes_back_byte_exact_within_its_step(tmp_path):
    """vLLM 0.33 loads a hit within the step when `sync_load_budget_bytes` allows
    (`submit_load(..., expedited=True)`, then waits for it); vLLM 0.32 ignores the key and loads
    as always, reporting the load finished before the request runs."""
    sync_loads = "expedited" in inspect.signature(OffloadingWorker.submit_load).parameters
    engine = Engine(
        tmp_path, extra_config(cpu_bytes_to_use=64 * CHUNK_BYTES, sync_load_budget_bytes=1 << 20)
    )
    engine.serve(PREFIX + list(range(300, 300 + 2 * BLOCK_SIZE)))
    fillers(engine)
    checked = engine.checked_tokens
    request_id = engine.serve(PREFIX + list(range(400, 400 + 2 * BLOCK_SIZE)))
    assert engine.manager.manager.stats().loaded_blocks == 4
    assert engine.loaded_requests == (set() if sync_loads else {request_id})
    assert engine.checked_tokens >= checked + 4 * BLOCK_SIZE  # the loaded prefix, checked
    assert engine.worker.transfers.jobs_in_flight == 0


def _fail_first_store(engine: Engine) -> None:
    """The transfer engine reports the first store job it finishes as failed."""
    transfer_engine = engine.worker.transfers.engines[0]
    report, seen = transfer_engine.on_job_done, []

    def on_job_done(job):
        failed = job.direction == "store" and not seen
        seen.append(job.job_id)
        report(replace(job, success=job.success and not failed))

    transfer_engine.on_job_done = on_job_done


def test_a_failed_store_is_reported_failed_and_never_loaded(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vllm.numbakv")
    engine = Engine(tmp_path, extra_config(cpu_bytes_to_use=64 * CHUNK_BYTES))
    assert "numbakv: host tier of 64 chunks" in caplog.text  # what an operator reads in vLLM's log
    assert "kernels run on the CUDA simulator" in caplog.text
    _fail_first_store(engine)
    # vLLM 0.32's connector takes no failed job ("we currently do not support job failures"):
    # the worker reports it, the connector stops the step, and the failed chunks stay unloadable.
    with pytest.raises(AssertionError) as raised:
        engine.serve(PREFIX)
    failing = raised.traceback[-1]  # vLLM's own check, not one of this test's
    assert failing.path.parts[-2:] == ("offloading", "worker.py"), failing
    assert "transfer_result.success" in str(failing.statement)
    assert "numbakv: transfer job" in caplog.text and "failed" in caplog.text

    before = engine.words.copy()
    failed_chunks = HostChunksSpec(np.arange(4, dtype=np.int64))  # a fresh pool hands out 0, 1, ..
    load = GPULoadStoreSpec([5, 6, 7, 8], group_sizes=[4], block_indices=[0])
    assert engine.worker.submit_load(99, failed_chunks, load) is False
    assert "not stored completely" in caplog.text
    np.testing.assert_array_equal(engine.words, before)  # no GPU byte moved
    assert engine.worker.get_finished() == []


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ({}, "cpu_bytes_to_use", "required"),
        ({"cpu_bytes_to_use": CHUNK_BYTES - 1}, "cpu_bytes_to_use", "hold no offloaded chunk"),
        ({"cpu_bytes_to_use": "lots"}, "cpu_bytes_to_use", "expected an integer"),
        ({"eviction_policy": "mru"}, "eviction_policy", "unknown cache policy 'mru'"),
        ({"eviction_policy": "no.such:Policy"}, "eviction_policy", "cannot load"),
        ({"store_threshold": -1}, "store_threshold", "must be >= 0"),
        ({"max_tracker_size": 0}, "max_tracker_size", "must be >= 1"),
        ({"max_thread_blocks": 0}, "max_thread_blocks", "must be >= 1"),
        ({"cache_policy_module_path": "my.policies"}, "cache_policy_module_path", "vLLM"),
        ({"canonical_layout": True}, "canonical_layout", "not supported"),
        (
            {"secondary_tiers": [{"type": "NumbaKVDiskTier", "root_dir": "/tmp/kv"}]},
            "secondary_tiers",
            "TieringOffloadingSpec",
        ),
    ],
)
def test_bad_configuration_fails_when_vllm_builds_the_connector_and_names_the_key(
    tmp_path, extra, key, problem
):
    settings = {"cpu_bytes_to_use": 64 * CHUNK_BYTES, **extra}
    if not extra:
        del settings["cpu_bytes_to_use"]
    with pytest.raises(ConfigError, match=problem) as raised:
        Engine(tmp_path, extra_config(**settings))
    assert raised.value.key == key
    assert f"kv_connector_extra_config[{key!r}]" in str(raised.value)


METRICS_RUN = """
import sys
from pathlib import Path
from tests.support.vllm_engine import BLOCK_SIZE, Engine, extra_config

prefix = list(range(100, 100 + 4 * BLOCK_SIZE))
engine = Engine(Path(sys.argv[1]), extra_config(cpu_bytes_to_use=1 << 20, eviction_policy="arc"))
engine.serve(prefix + [1, 2, 3])
engine.serve(list(range(5_000, 5_000 + 20 * BLOCK_SIZE)))
engine.serve(list(range(6_000, 6_000 + 20 * BLOCK_SIZE)))
engine.serve(prefix + [4, 5, 6])
assert engine.loaded_requests
engine.scheduler.shutdown()
engine.worker_connector.shutdown()
"""


def test_metrics_of_the_scheduler_and_the_worker_reach_the_sidecars_directory(tmp_path):
    from numbakv.service.metrics_dir import MetricsDirectory

    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run(
        [sys.executable, "-c", METRICS_RUN, str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]

    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in MetricsDirectory(str(metrics_dir)).read().metrics
        for sample in family.samples
    }
    scheduler = (("instance", "vllm-scheduler"), ("policy", "arc"))
    assert samples["numbakv_stored_blocks_total", scheduler] >= 6
    assert samples["numbakv_loaded_blocks_total", scheduler] >= 4
    load = (("direction", "load"), ("instance", "vllm-worker0"))
    assert samples["numbakv_transfer_jobs_total", load] >= 1
    assert samples["numbakv_transfer_bytes_total", load] >= 4 * CHUNK_BYTES
