"""The host side of a vLLM transfer job: which of numbakv's host chunks it reads or writes."""

from __future__ import annotations

import numpy as np
from vllm.v1.kv_offload.base import LoadStoreSpec


class HostChunksSpec(LoadStoreSpec):
    """Host chunk ids (int64, as numbakv's manager returns them), in the order of the job's keys.

    Travels from the scheduler to the workers inside vLLM's connector metadata; plain data.
    """

    def __init__(self, chunk_ids: np.ndarray) -> None:
        self.chunk_ids = chunk_ids

    def __repr__(self) -> str:
        return f"HostChunksSpec({self.chunk_ids.tolist()})"
