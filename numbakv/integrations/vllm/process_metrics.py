"""numbakv's metrics of one vLLM process, for numbakv-sidecar: its scheduler or a worker."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm.logger import init_logger

from numbakv.metrics import (
    ManagerLike,
    OffloadMetrics,
    TierLike,
    metrics_enabled,
    multiprocess_mode,
    shared_metrics,
)

logger = init_logger("vllm.numbakv")


def start_process_metrics(
    parallel: Any,
    role: str,
    *,
    manager: ManagerLike | None = None,
    tiers: Mapping[str, TierLike] | None = None,
) -> OffloadMetrics | None:
    """Write this process's numbakv metrics to PROMETHEUS_MULTIPROC_DIR once a second, under an
    instance named by its data-parallel rank and `role`; None where metrics are off or unshared."""
    if not metrics_enabled():
        return None
    if not multiprocess_mode():
        logger.info(
            "numbakv: metrics are not exported; set PROMETHEUS_MULTIPROC_DIR to a directory "
            "for numbakv-sidecar to read (docs/VLLM.md)"
        )
        return None
    prefix = f"vllm-dp{parallel.data_parallel_index}" if parallel.data_parallel_size > 1 else "vllm"
    return shared_metrics(f"{prefix}-{role}", manager=manager, tiers=tiers)
