"""The plumbing every policy keyed by one map hash -> host block id shares, written once."""

from __future__ import annotations

from collections.abc import Sequence

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash


class BlockTable(CachePolicy):
    """Keeps the cached blocks in `_where`, a map hash -> block id (a dict unless the subclass
    passes another, as LRU passes its `OrderedDict`), and counts them.

    `get` is the map's own `get`, bound once: the manager's hottest call runs at C speed.
    """

    def __init__(
        self,
        capacity: int,
        ref_counts: Sequence[int],
        where: dict[BlockHash, int] | None = None,
    ) -> None:
        super().__init__(capacity, ref_counts)
        self._where: dict[BlockHash, int] = {} if where is None else where
        self.get = self._where.get

    def get(self, block_hash: BlockHash) -> int | None:
        return self._where.get(block_hash)

    def clear(self) -> None:
        self._where.clear()

    def __len__(self) -> int:
        return len(self._where)
