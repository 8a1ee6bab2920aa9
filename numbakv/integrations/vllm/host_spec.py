"""The host side of a vLLM transfer job: which of numbakv's host chunks it reads or writes."""

from __future__ import annotations

import numpy as np
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec


class HostChunksSpec(CPULoadStoreSpec):
    """Host chunk ids (int64, as numbakv's manager returns them), in the order of the job's keys.

    A vLLM `CPULoadStoreSpec` (`chunk_ids`, `block_ids`), as vLLM's own CPU manager returns, over
    numbakv's array as it is. Travels from the scheduler to the workers inside vLLM's connector
    metadata; plain data.
    """

    def __init__(self, chunk_ids: np.ndarray) -> None:
        self.block_ids = chunk_ids

    def __repr__(self) -> str:
        return f"HostChunksSpec({self.block_ids.tolist()})"
