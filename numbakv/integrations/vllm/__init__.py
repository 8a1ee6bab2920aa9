"""numbakv as vLLM's CPU offloading tier: load `NumbaKVOffloadingSpec` from this module path.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "OffloadingConnector",
        "kv_role": "kv_both", "kv_connector_extra_config": {"spec_name": "NumbaKVOffloadingSpec",
        "spec_module_path": "numbakv.integrations.vllm", "cpu_bytes_to_use": 68719476736}}'

The spec is imported on first access, so the worker's transfer core (`.transfers`, which needs
neither vLLM nor its scheduler) stays importable where vLLM is not installed. See docs/VLLM.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NumbaKVOffloadingSpec"]


def __getattr__(name: str) -> Any:
    if name == "NumbaKVOffloadingSpec":
        from numbakv.integrations.vllm.spec import NumbaKVOffloadingSpec

        return NumbaKVOffloadingSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
