"""The contract between the manager and a cache policy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence

from numbakv.specs import BlockHash


class BlockStatus:
    """One cached block: its host slot and its reader count.

    `ref_cnt` is -1 while the block is being stored (not ready), 0 when ready and idle, and n > 0
    while n loads read it. Only ready, idle blocks may be evicted.
    """

    __slots__ = ("block_id", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = -1

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


class CachePolicy(ABC):
    """Organises the cached blocks and chooses eviction victims; the manager does the rest.

    A policy owns the map from hash to `BlockStatus` (so it can keep it in its own order) but never
    changes a status: the manager sets ref counts and frees slots.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def get(self, block_hash: BlockHash) -> BlockStatus | None:
        """The cached block of this hash, or None. Changes no recency."""

    @abstractmethod
    def insert(self, block_hash: BlockHash, block: BlockStatus) -> None:
        """Add a new block (not ready yet); the hash is not cached."""

    @abstractmethod
    def remove(self, block_hash: BlockHash) -> None:
        """Forget a cached block whose store failed."""

    @abstractmethod
    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Mark these hashes as used now; the first of them counts as the most recent.

        Hashes that are not cached are ignored (or, for policies with history, noted).
        """

    @abstractmethod
    def evict(
        self, n: int, protected: Collection[BlockHash]
    ) -> list[tuple[BlockHash, BlockStatus]]:
        """Remove and return n victims, each ready, idle (ref_cnt 0) and not in `protected`.

        The manager calls this only when at least n such blocks exist.
        """

    @abstractmethod
    def clear(self) -> None:
        """Forget every block and all history, as if new."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of cached blocks."""

    def stats(self) -> dict[str, float]:
        """Policy-specific gauges for metrics (ARC's target and list sizes); none by default."""
        return {}


def idle_victims(
    blocks: Iterable[tuple[BlockHash, BlockStatus]], protected: Collection[BlockHash]
) -> Iterable[tuple[BlockHash, BlockStatus]]:
    """The evictable entries of `blocks`, in their order: ready, idle and not protected."""
    return (
        (block_hash, block)
        for block_hash, block in blocks
        if block.ref_cnt == 0 and block_hash not in protected
    )
