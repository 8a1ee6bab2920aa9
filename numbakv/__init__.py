"""numbakv: a host-memory KV-cache tier for LLM inference.

The manager side (this namespace) needs only NumPy; the GPU data path lives in `numbakv.datapath`
and is imported only when used, so a scheduler process or the metrics sidecar never loads Numba.
"""

from numbakv.manager import CPUOffloadingManager, ManagerStats
from numbakv.offloader import KVOffloader
from numbakv.policies import POLICIES, CachePolicy, resolve_policy
from numbakv.specs import BlockEvent, HostBlocks, StorePlan

__all__ = [
    "POLICIES",
    "BlockEvent",
    "CPUOffloadingManager",
    "CachePolicy",
    "HostBlocks",
    "KVOffloader",
    "ManagerStats",
    "StorePlan",
    "resolve_policy",
]
