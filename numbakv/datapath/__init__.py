"""The GPU data path: mapped host pool, KV layouts, transfer kernels and the transfer engines.

Imported only when used: it pulls in Numba CUDA, which `import numbakv` must not.
"""

from numbakv.datapath.chunks import ChunkTransfers
from numbakv.datapath.host_pool import HostPool
from numbakv.datapath.kernels import COMPILE_SECONDS
from numbakv.datapath.layouts import KVLayout, LayoutKind
from numbakv.datapath.transfer import (
    DEFAULT_MAX_THREAD_BLOCKS,
    DEFAULT_THREADS_PER_BLOCK,
    GPUFault,
    TransferEngine,
)

__all__ = [
    "COMPILE_SECONDS",
    "DEFAULT_MAX_THREAD_BLOCKS",
    "DEFAULT_THREADS_PER_BLOCK",
    "ChunkTransfers",
    "GPUFault",
    "HostPool",
    "KVLayout",
    "LayoutKind",
    "TransferEngine",
]
