"""numbakv: a host-memory KV-cache tier for LLM inference.

The names below are imported on first use: `import numbakv` loads nothing else, so a scheduler
process never loads Numba and the metrics sidecar never loads NumPy (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("numbakv")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

_HOMES = {
    "CPUOffloadingManager": "numbakv.manager",
    "ManagerStats": "numbakv.manager",
    "KVOffloader": "numbakv.offloader",
    "POLICIES": "numbakv.policies",
    "CachePolicy": "numbakv.policies",
    "resolve_policy": "numbakv.policies",
    "BlockEvent": "numbakv.specs",
    "HostBlocks": "numbakv.specs",
    "StorePlan": "numbakv.specs",
    "Direction": "numbakv.jobs",
    "FinishedJob": "numbakv.jobs",
}

__all__ = [
    "POLICIES",
    "BlockEvent",
    "CPUOffloadingManager",
    "CachePolicy",
    "Direction",
    "FinishedJob",
    "HostBlocks",
    "KVOffloader",
    "ManagerStats",
    "StorePlan",
    "__version__",
    "resolve_policy",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'numbakv' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
