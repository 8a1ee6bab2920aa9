"""Whether the vLLM tests run: they skip where vLLM is not installed, and fail there in CI.

.ci/run installs the `vllm` extra into a second virtual environment and runs the vLLM tests there
with NUMBAKV_REQUIRE_VLLM=1, so a vLLM that does not import fails CI instead of skipping it.
"""

from __future__ import annotations

from tests.support.engines import require_engine

REQUIRE_VLLM = "NUMBAKV_REQUIRE_VLLM"


def require_vllm() -> None:
    """Skip the calling test module unless vLLM imports (fail instead under NUMBAKV_REQUIRE_VLLM=1)."""
    require_engine("vllm", "vLLM", "vllm", REQUIRE_VLLM)


def offloading_config(
    extra: dict,
    worker_kv_bytes_per_block: int = 4096,
    events: bool = False,
    replicated: bool = False,
    engine_id: str = "engine",
    **parallel,
):
    """vLLM's OffloadingConfig for one group of 16-token blocks, as the connector builds it
    (`events`: vLLM's KV cache events on; `replicated`: every rank's KV the same, as vLLM marks
    it for MLA under tensor parallelism on one node)."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    topology = {"rank": 0, "world_size": 1, "data_parallel_index": 0, "data_parallel_size": 1}
    topology.update(parallel)
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(16, ("layer",), 0),),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=events,
        extra_config={"spec_name": "NumbaKVOffloadingSpec", **extra},
        engine_id=engine_id,
        model=OffloadingModelConfig("tiny", "float16"),
        cache=OffloadingCacheConfig(
            tokens_per_hash=16, blocks_per_chunk=extra.get("blocks_per_chunk", 1)
        ),
        parallel=OffloadingParallelConfig(
            tp_size=topology["world_size"],
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
            **topology,
        ),
        replicated_layout=replicated,
    )
