"""vLLM's replicated layout (MLA under tensor parallelism on one node): numbakv keeps one host copy
for the node's workers, every rank reads what any rank wrote, and the host tier is sized for one
copy (docs/VLLM.md, "One copy of MLA's KV")."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.vllm_support import require_vllm

require_vllm()

from numbakv.integrations.vllm import NumbaKVOffloadingSpec
from tests.integrations.vllm import replicated_rank as ranks
from tests.support.vllm_support import offloading_config

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_workers_share_one_host_copy_and_load_it_byte_exact(tmp_path):
    engine_id = f"test-{uuid.uuid4().hex}"
    port = _free_port()
    reports = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    environment = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "HF_HUB_OFFLINE": "1"}
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integrations.vllm.replicated_rank",
                str(rank),
                "2",
                str(port),
                engine_id,
                str(report),
            ],
            cwd=ROOT,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, report in enumerate(reports)
    ]
    outputs = [worker.communicate(timeout=540)[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output[-4000:]
    first, second = (json.loads(report.read_text()) for report in reports)

    assert first["replicated_layout"] and second["replicated_layout"]
    assert first["num_chunks"] == ranks.NUM_CHUNKS  # one copy: not NUM_CHUNKS / 2
    assert first["pool_bytes"] == second["pool_bytes"] == ranks.NUM_CHUNKS * ranks.CHUNK_BYTES
    # One copy: both processes map the same file (device, inode), its name already removed.
    assert len(first["mapped"]) == 1 and first["mapped"] == second["mapped"]
    assert first["mapped"][0][2].endswith("(deleted)")
    assert first["names_left"] == second["names_left"] == []
    for report in (first, second):
        assert report["jobs"] == [[1, True], [2, True]]
        assert report["byte_exact"] and report["untouched"]
    assert not list(Path("/dev/shm").glob(f"numbakv-{engine_id}*"))


@pytest.mark.parametrize(("cuda", "rocm", "shared"), [(True, False, True), (True, True, False)])
def test_the_tier_holds_one_copy_only_where_the_workers_share_memory(
    monkeypatch, cuda, rocm, shared
):
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: cuda)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: rocm)
    # DeepSeek-V3 at TP=8: 61 layers of a 576-element bf16 latent, 64-token blocks (docs/VLLM.md).
    block_bytes = 61 * 576 * 2 * 64
    config = offloading_config(
        {"cpu_bytes_to_use": 64 * 2**30},
        worker_kv_bytes_per_block=block_bytes,
        replicated=True,
        world_size=8,
    )
    spec = NumbaKVOffloadingSpec(config)
    assert spec.replicated_layout is shared
    assert spec.cpu_page_size_per_worker == block_bytes
    assert spec.kv_bytes_per_chunk == block_bytes * (1 if shared else 8)
    assert spec.num_chunks == (15_279 if shared else 1_909)
