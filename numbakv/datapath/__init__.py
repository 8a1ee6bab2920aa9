"""The GPU data path: mapped host pool, KV layouts, transfer kernels and the transfer engines.

Imported only when used: it pulls in Numba CUDA, which `import numbakv` must not. Where there is
no GPU it runs on Numba's CUDA simulator, chosen (and said, in one log line) before Numba CUDA is
imported.
"""

from numbakv.simulator import simulate_without_gpu

simulate_without_gpu()

from numbakv.datapath.chunks import ChunkTransfers
from numbakv.datapath.host_pool import HostPool
from numbakv.datapath.kernels import COMPILE_SECONDS
from numbakv.datapath.layouts import KVLayout, LayoutKind
from numbakv.datapath.transfer import (
    DEFAULT_MAX_THREAD_BLOCKS,
    DEFAULT_THREADS_PER_BLOCK,
    SIMULATOR_LAUNCH,
    GPUFault,
    TransferEngine,
)

__all__ = [
    "COMPILE_SECONDS",
    "DEFAULT_MAX_THREAD_BLOCKS",
    "DEFAULT_THREADS_PER_BLOCK",
    "SIMULATOR_LAUNCH",
    "ChunkTransfers",
    "GPUFault",
    "HostPool",
    "KVLayout",
    "LayoutKind",
    "TransferEngine",
]
