"""`NumbaKVOffloadingSpec`: numbakv as the CPU tier of vLLM's OffloadingConnector.

vLLM builds one spec in its scheduler and one in each worker, from the connector's extra config;
the scheduler asks for `get_manager()`, each worker for `get_worker(kv_caches)`. The data path is
imported only by `get_worker`, so the scheduler process never loads Numba CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vllm import __version__ as vllm_version
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    OffloadingMetricMetadata,
    OffloadingSpec,
    OffloadingWorker,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from numbakv.integrations.vllm.compat import FAILED_STORE_EVENTS, CPUOffloadingInfo
from numbakv.integrations.vllm.config import Settings, host_chunks
from numbakv.integrations.vllm.process_metrics import start_process_metrics
from numbakv.integrations.vllm.scheduler import NumbaKVOffloadingManager
from numbakv.manager import CPUOffloadingManager
from numbakv.metrics import OffloadMetrics
from numbakv.simulator import simulate_without_gpu

logger = init_logger("vllm.numbakv")  # under vLLM's logger: its handler, format and level

TESTED_VLLM = frozenset({"0.32.0", "0.33.0"})
"""The vLLM releases numbakv's tests run against (the `vllm` extra admits these)."""


class NumbaKVOffloadingSpec(OffloadingSpec):
    """Sizes numbakv's host tier from vLLM's config and builds its manager and workers."""

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        """vLLM's own CPU-tier metrics (`vllm:kv_offload_cpu_*`): the manager reports them."""
        return CPUOffloadingSpec.build_metric_definitions(extra_config)

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        """vLLM 0.33's `vllm:kv_offload_config_info` labels: those of vLLM's own CPU tier."""
        return () if CPUOffloadingInfo is None else CPUOffloadingInfo.config_info_keys()

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        if vllm_version not in TESTED_VLLM:
            logger.warning(
                "numbakv's vLLM spec is tested with vLLM %s; this is vLLM %s",
                " and ".join(sorted(TESTED_VLLM)),
                vllm_version,
            )
        self.settings = Settings.from_extra_config(self.extra_config)
        # As in vLLM's CPU spec, every worker keeps its own part of each chunk, unless vLLM marks
        # the layout replicated (every rank's KV the same: MLA under tensor parallelism on one
        # node) and the workers can share memory: then the node keeps one copy, which they share.
        self.replicated_layout = config.replicated_layout and shares_host_memory()
        copies = 1 if self.replicated_layout else config.parallel.world_size
        self.cpu_page_size_per_worker = config.worker_kv_bytes_per_block * self.blocks_per_chunk
        self.kv_bytes_per_chunk = self.cpu_page_size_per_worker * copies
        self.num_chunks = host_chunks(self.settings, self.kv_bytes_per_chunk)
        self._manager: NumbaKVOffloadingManager | None = None
        self._worker: OffloadingWorker | None = None

    def get_manager(self) -> NumbaKVOffloadingManager:
        if self._manager is None:
            settings = self.settings
            # A model without KV cache groups never stores a chunk: its events' token count
            # (the manager's block size) is then never read.
            tokens_per_block = self.tokens_per_block[0] if self.tokens_per_block else 1
            self._manager = build_scheduler_manager(
                settings,
                self.num_chunks,
                tokens_per_block * self.blocks_per_chunk,
                self.kv_events_config.enable_kv_cache_events,
                lambda manager: start_process_metrics(
                    self.config.parallel, "scheduler", manager=manager
                ),
                self._config_info(),
            )
            logger.info(
                "numbakv: host tier of %d chunks (%.2f GiB %s), policy %s, store threshold %d",
                self.num_chunks,
                self.num_chunks * self.kv_bytes_per_chunk / 2**30,
                f"in one copy for the node's {self.config.parallel.world_size} workers"
                if self.replicated_layout
                else "for all workers",
                settings.eviction_policy,
                settings.store_threshold,
            )
        return self._manager

    def _config_info(self) -> dict[str, Any]:
        """The host tier's sizes as vLLM's CPU tier reports them (none before vLLM 0.33)."""
        if CPUOffloadingInfo is None:
            return {}
        info = CPUOffloadingInfo.from_config(self.config, self.num_chunks, self.kv_bytes_per_chunk)
        return dict(info.as_config_info())

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            on_simulator = simulate_without_gpu()  # before the data path first imports Numba CUDA
            from numbakv.integrations.vllm.worker import NumbaKVOffloadingWorker

            self._worker = NumbaKVOffloadingWorker.create(
                kv_caches,
                self.blocks_per_chunk,
                self.num_chunks,
                self.settings,
                on_simulator,
                self.num_chunks * self.cpu_page_size_per_worker,
                start_process_metrics(self.config.parallel, f"worker{self.config.parallel.rank}"),
                shared_by=self.config.engine_id if self.replicated_layout else None,
            )
        return self._worker


def shares_host_memory() -> bool:
    """Whether the workers can map one host copy between them: where vLLM's CPU tier shares its
    region, on CUDA (not ROCm; numbakv's kernels run on no other accelerator)."""
    return current_platform.is_cuda_alike() and not current_platform.is_rocm()


def build_scheduler_manager(
    settings: Settings,
    num_chunks: int,
    block_size: int,
    enable_events: bool,
    metrics: Callable[[CPUOffloadingManager], OffloadMetrics | None] = lambda manager: None,
    config_info: Mapping[str, Any] | None = None,
) -> NumbaKVOffloadingManager:
    """numbakv's manager under vLLM's interface, as the spec builds it in vLLM's scheduler (and
    vLLM's own manager tests build it, through tests/integrations/vllm/peer). `config_info`: the
    labels of vLLM 0.33's `vllm:kv_offload_config_info`."""
    manager = CPUOffloadingManager(
        block_size=block_size,
        num_blocks=num_chunks,
        cache_policy=settings.eviction_policy,
        enable_events=enable_events,
        store_threshold=settings.store_threshold,
        max_tracker_size=settings.max_tracker_size,
    )
    return NumbaKVOffloadingManager(
        manager,
        metrics(manager),
        config_info=config_info,
        failed_store_events=enable_events and FAILED_STORE_EVENTS,
    )
