"""numbakv as vLLM's CPU offloading tier: load `NumbaKVOffloadingSpec` from this module path.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {"spec_name": "NumbaKVOffloadingSpec",
        "spec_module_path": "numbakv.integrations.vllm", "cpu_bytes_to_use": 68719476736}}'

numbakv's tiers below host memory are vLLM secondary tiers of its own `TieringOffloadingSpec`, by
the same module path: `{"type": "NumbaKVRedisTier", "module_path": "numbakv.integrations.vllm",
"url": "redis://host:6379/0"}` or `{"type": "NumbaKVDiskTier", ..., "root_dir": "/mnt/nvme/kv",
"bytes_to_use": "1TiB"}` in `secondary_tiers` (docs/TIERS.md).

The spec and the tiers are imported on first access, so `.tensors` (vLLM's canonical KV tensors as
the arrays of the worker's transfer core, `numbakv.datapath.chunks`; it needs torch, not vLLM)
stays importable where vLLM is not installed. See docs/VLLM.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each name vLLM may load by module path, and the module under this package that defines it.
_MODULES = {
    "NumbaKVOffloadingSpec": "spec",
    "NumbaKVRedisTier": "redis_tier",
    "NumbaKVDiskTier": "disk_tier",
}
__all__ = ["NumbaKVDiskTier", "NumbaKVOffloadingSpec", "NumbaKVRedisTier"]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
