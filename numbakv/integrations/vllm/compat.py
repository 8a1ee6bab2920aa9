"""What the running vLLM release offers where 0.32 and 0.33 differ; numbakv follows it.

The spec and its adapters ask here instead of comparing version strings, so each difference is
decided once, from vLLM's own classes (docs/VLLM.md, "Versions").
"""

from __future__ import annotations

from dataclasses import fields

from vllm.v1.kv_offload.base import OffloadingEvent
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

try:
    from vllm.v1.kv_offload.cpu.common import CPUOffloadingInfo
except ImportError:  # vLLM 0.32: no `vllm:kv_offload_config_info` metric
    CPUOffloadingInfo = None

FAILED_STORE_EVENTS = "metadata_only" in {field.name for field in fields(OffloadingEvent)}
"""vLLM 0.33: a failed store is announced as a `metadata_only` removal, so that the connector's
event tracker forgets what it noted for those keys (0.32 announces nothing)."""

RANKS_BY_POSITION = hasattr(CachePolicy, "on_request_access")
"""vLLM 0.33: its LRU ranks a running request's blocks by token position, the tail first
(`ReqContext` positions); numbakv's LRU does too when the adapter hands it the positions."""
