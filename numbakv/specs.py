"""The plain data the manager hands the worker side: picklable, with no references back into it."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

BlockHash = Hashable
"""An opaque key naming one KV block's content (bytes or int in practice)."""

MEDIUM_CPU = "CPU"


@dataclass(eq=False, slots=True)
class LoadStoreSpec:
    """Host block ids of one transfer, in the order of the hashes they answer (int64, as kernels take it)."""

    block_ids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.block_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LoadStoreSpec):
            return NotImplemented
        return np.array_equal(self.block_ids, other.block_ids)

    __hash__ = None  # mutable array inside: not hashable

    @staticmethod
    def medium() -> str:
        return MEDIUM_CPU


@dataclass(slots=True)
class PrepareStoreOutput:
    """What `prepare_store` decided: the hashes to write, where to write them, and what it evicted."""

    block_hashes_to_store: list
    store_spec: LoadStoreSpec
    block_hashes_evicted: list


@dataclass(slots=True)
class OffloadingEvent:
    """Blocks that became ready (`removed=False`) or left the cache (`removed=True`)."""

    block_hashes: list
    block_size: int
    medium: str
    removed: bool
