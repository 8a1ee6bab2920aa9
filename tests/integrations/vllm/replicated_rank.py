"""One worker process of a tensor-parallel engine whose KV is the same on every rank (MLA), with
numbakv's spec as vLLM's connector builds it in a worker: vLLM's distributed state over gloo, the
KV on CPU tensors, the kernels on the CUDA simulator, and vLLM's platform reading CUDA, as vLLM's
own spec tests set it (numbakv keeps one copy where vLLM's CPU tier would). Run once per rank by
test_replicated_layout.py:

    python -m tests.integrations.vllm.replicated_rank RANK WORLD_SIZE PORT ENGINE_ID REPORT

Rank r stores the chunks of `STORES[r]`; then every rank loads every chunk back into other GPU
blocks and compares them with its KV, byte for byte. REPORT gets what the test asserts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from vllm.distributed.parallel_state import get_world_group, init_distributed_environment
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)

from numbakv.datapath.shared_memory import SHARED_DIR
from numbakv.integrations.vllm import NumbaKVOffloadingSpec
from numbakv.integrations.vllm.host_spec import HostChunksSpec
from tests.support.vllm_support import offloading_config

LAYERS, NUM_BLOCKS, PAGE = 2, 12, 576  # bytes of one layer's block: a tiny MLA latent
BLOCKS_PER_CHUNK = 2
CHUNK_BYTES = LAYERS * PAGE * BLOCKS_PER_CHUNK  # one copy of a chunk
NUM_CHUNKS = 8
STORES = {0: ([0, 1, 2, 3], [5, 1]), 1: ([4, 5], [6])}  # rank: (GPU blocks, host chunks)
LOADS = ([6, 7, 8, 9, 10, 11], [5, 1, 6])  # every chunk stored, into GPU blocks 6..11


def mapped_files(engine_id: str) -> list[list[str]]:
    """This process's mappings of the engine's shared host memory: [device, inode, path]."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    fields = [line.split(maxsplit=5) for line in lines if f"numbakv-{engine_id}" in line]
    return sorted({(field[3], field[4], field[5]) for field in fields})


def main(rank: int, world_size: int, port: int, engine_id: str, report: Path) -> None:
    init_distributed_environment(
        world_size, rank, f"tcp://127.0.0.1:{port}", local_rank=rank, backend="gloo"
    )
    current_platform.is_cuda_alike = lambda: True
    current_platform.is_rocm = lambda: False
    extra = {"cpu_bytes_to_use": NUM_CHUNKS * CHUNK_BYTES, "blocks_per_chunk": BLOCKS_PER_CHUNK}
    config = offloading_config(
        extra,
        worker_kv_bytes_per_block=LAYERS * PAGE,
        replicated=True,
        engine_id=engine_id,
        rank=rank,
        world_size=world_size,
    )
    spec = NumbaKVOffloadingSpec(config)

    generator = torch.Generator().manual_seed(46)  # the same KV on every rank
    kv = torch.randint(-128, 127, (LAYERS, NUM_BLOCKS, PAGE), dtype=torch.int8, generator=generator)
    original = kv.clone()
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(kv[layer], PAGE) for layer in range(LAYERS)],
        group_data_refs=[[CanonicalKVCacheRef(layer, PAGE) for layer in range(LAYERS)]],
    )
    worker = spec.get_worker(caches)
    names_left = sorted(str(path) for path in SHARED_DIR.glob(f"numbakv-{engine_id}*"))

    blocks, chunks = STORES[rank]
    store = GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0])
    assert worker.submit_store(1, store, HostChunksSpec(np.array(chunks)))
    worker.wait({1})
    stored = [(result.job_id, result.success) for result in worker.get_finished()]
    get_world_group().barrier()  # every rank's stores have landed

    kv[:, LOADS[0]] = 0
    load = GPULoadStoreSpec(LOADS[0], group_sizes=[len(LOADS[0])], block_indices=[0])
    assert worker.submit_load(2, HostChunksSpec(np.array(LOADS[1])), load)
    worker.wait({2})
    loaded = [(result.job_id, result.success) for result in worker.get_finished()]
    report.write_text(
        json.dumps(
            {
                "replicated_layout": spec.replicated_layout,
                "num_chunks": spec.num_chunks,
                "pool_bytes": worker.transfers.host_bytes,
                "mapped": mapped_files(engine_id),
                "names_left": names_left,
                "jobs": stored + loaded,
                "byte_exact": torch.equal(kv[:, LOADS[0]], original[:, :6]),
                "untouched": torch.equal(kv[:, :6], original[:, :6]),
            }
        )
    )
    worker.shutdown()
    get_world_group().barrier()


if __name__ == "__main__":
    rank, world_size, port, engine_id, report = sys.argv[1:]
    main(int(rank), int(world_size), int(port), engine_id, Path(report))
