"""vLLM's worker side: its `OffloadingWorker` interface over numbakv's kernels.

The work is the data path's `ChunkTransfers`; this adapter reaches vLLM's KV tensors zero-copy,
turns vLLM's specs into its calls and its finished jobs into vLLM's `TransferResult`s. A job that
cannot be queued is refused (`False`, nothing moved); a failed job is reported `success=False`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

from numbakv.datapath import SIMULATOR_LAUNCH, ChunkTransfers, HostPool
from numbakv.datapath.shared_memory import SHARED_DIR
from numbakv.integrations.vllm.config import Settings
from numbakv.integrations.vllm.host_spec import HostChunksSpec
from numbakv.integrations.vllm.tensors import torch_block_arrays
from numbakv.jobs import Direction
from numbakv.metrics import OffloadMetrics

logger = init_logger("vllm.numbakv")  # under vLLM's logger: its handler, format and level


class NumbaKVOffloadingWorker(OffloadingWorker):
    """Submits vLLM's store and load jobs to numbakv's transfer engines and reports them."""

    def __init__(self, transfers: ChunkTransfers, metrics: OffloadMetrics | None = None) -> None:
        self.transfers = transfers
        self.metrics = metrics

    @classmethod
    def create(
        cls,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_chunks: int,
        settings: Settings,
        on_simulator: bool,
        host_budget: int,
        metrics: OffloadMetrics | None = None,
        shared_by: str | None = None,
    ) -> NumbaKVOffloadingWorker:
        """Reach vLLM's KV caches zero-copy and pin host pools of `num_chunks` chunks, meant to
        take `host_budget` bytes (this worker's share of `cpu_bytes_to_use`).

        `shared_by`: the engine id whose workers on this node share the pools, one copy for all
        (vLLM's replicated layout), instead of each pinning its own.
        """
        arrays, compute_stream = torch_block_arrays(
            [entry.tensor for entry in kv_caches.tensors],
            [entry.page_size_bytes for entry in kv_caches.tensors],
            on_simulator,
        )
        options = dict(SIMULATOR_LAUNCH) if on_simulator else {}
        if settings.max_thread_blocks is not None:
            options["max_thread_blocks"] = settings.max_thread_blocks
        transfers = ChunkTransfers(
            arrays,
            [
                [(ref.tensor_idx, ref.page_size_bytes) for ref in refs]
                for refs in kv_caches.group_data_refs
            ],
            blocks_per_chunk,
            num_chunks,
            compute_stream=compute_stream,
            engine_options=options,
            on_job_done=None if metrics is None else metrics.on_job_done,
            host_pool=HostPool if shared_by is None else shared_host_pools(shared_by),
        )
        logger.info(
            "numbakv: %d KV cache group(s), %d host chunks of %d block(s) in %.2f GiB of pinned "
            "host memory%s; kernels run on %s",
            len(transfers.layouts),
            num_chunks,
            blocks_per_chunk,
            transfers.host_bytes / 2**30,
            "" if shared_by is None else ", one copy that this node's workers share",
            "the CUDA simulator" if on_simulator else "the GPU",
        )
        if transfers.host_bytes > host_budget:
            logger.warning(
                "numbakv: the KV cache groups' blocks come in %d sizes, and each size has its own "
                "host pool: %.2f GiB pinned where cpu_bytes_to_use gives this worker %.2f GiB",
                len(transfers.pools),
                transfers.host_bytes / 2**30,
                host_budget / 2**30,
            )
        return cls(transfers, metrics)

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        return self._submit(job_id, Direction.STORE, src_spec, dst_spec)

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        """Queue a load. `expedited` (vLLM 0.33's sync loads, which vLLM waits for within the
        step) changes nothing: every load runs in submission order on the load stream."""
        return self._submit(job_id, Direction.LOAD, dst_spec, src_spec)

    def _submit(
        self, job_id: int, direction: Direction, gpu: LoadStoreSpec, host: LoadStoreSpec
    ) -> bool:
        try:
            if not isinstance(gpu, GPULoadStoreSpec) or not isinstance(host, HostChunksSpec):
                raise TypeError(
                    "expected a GPULoadStoreSpec and numbakv's HostChunksSpec, got "
                    f"{type(gpu).__name__} and {type(host).__name__}"
                )
            self.transfers.submit(
                job_id, direction, gpu.block_ids, gpu.group_sizes, gpu.block_indices, host.chunk_ids
            )
        except (ValueError, IndexError, TypeError) as error:
            logger.error(
                "numbakv: %s job %d refused, nothing moved: %s", direction.value, job_id, error
            )
            return False
        return True

    def get_finished(self) -> list[TransferResult]:
        results = []
        for job in self.transfers.get_finished():
            if not job.success:
                logger.error("numbakv: transfer job %d failed", job.job_id)
            results.append(TransferResult(job.job_id, job.success, job.nbytes, job.seconds))
        return results

    def wait(self, job_ids: Collection[int]) -> None:
        self.transfers.wait(job_ids)

    def shutdown(self) -> None:
        """Let every job in flight finish (the host pool must outlive them), then stop metrics."""
        self.transfers.drain()
        if self.metrics is not None:
            self.metrics.close()


def shared_host_pools(engine_id: str) -> Callable[[int, int], HostPool]:
    """Host pools that the engine's workers on this node share, one per block size, each named by
    the engine; the names go once every worker has mapped them (vLLM's barrier of its workers)."""
    prefix = SHARED_DIR / f"numbakv-{re.sub(r'[^A-Za-z0-9_.-]', '_', engine_id)}"
    barrier = _workers_barrier()

    def shared_pool(num_blocks: int, block_bytes: int) -> HostPool:
        return HostPool(
            num_blocks, block_bytes, shared=f"{prefix}-{block_bytes}.kv", barrier=barrier
        )

    return shared_pool


def _workers_barrier() -> Callable[[], None] | None:
    """vLLM's barrier of all its workers (the one its CPU tier waits at before removing its
    region's name); None where vLLM's distributed state is not set up (a test's workers)."""
    import torch.distributed

    if not torch.distributed.is_initialized():
        return None
    from vllm.distributed.parallel_state import get_world_group

    return get_world_group().barrier
