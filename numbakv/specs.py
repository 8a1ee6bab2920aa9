"""The plain data the manager hands the worker side: picklable, with no references back into it.

These are numbakv's own types, named for what they hold. vLLM has types of its own for the same
roles (`LoadStoreSpec`, `PrepareStoreOutput`, `OffloadingEvent`, with other fields); the vLLM
integration maps numbakv's to those in one place, `numbakv.integrations.vllm.convert`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

BlockHash = Hashable
"""An opaque key naming one KV block's content (bytes or int in practice)."""

MEDIUM_CPU = "CPU"


@dataclass(eq=False, slots=True)
class HostBlocks:
    """Host block ids of one transfer, in the order of the hashes they answer (int64, as kernels take it)."""

    block_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.block_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HostBlocks):
            return NotImplemented
        return np.array_equal(self.block_ids, other.block_ids)

    __hash__ = None  # mutable array inside: not hashable


@dataclass(slots=True)
class StorePlan:
    """What `prepare_store` decided: the hashes to write, where to write them, and what it evicted.

    `evicted_block_ids` are the evicted blocks' host slots, in the order of their hashes: a tier
    below host memory copies them out (demotion) before the new blocks overwrite them.
    """

    block_hashes_to_store: list
    store_spec: HostBlocks
    block_hashes_evicted: list
    evicted_block_ids: HostBlocks = field(default_factory=HostBlocks)


@dataclass(slots=True)
class BlockEvent:
    """Blocks that became ready (`removed=False`) or left the cache (`removed=True`)."""

    block_hashes: list
    block_size: int
    medium: str
    removed: bool
