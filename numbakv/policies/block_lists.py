"""Recency lists threaded through host block ids: O(1) moves with no object per block."""

from __future__ import annotations

from collections.abc import Iterator


class BlockLists:
    """Several doubly linked lists over one pool of block ids, each id in at most one list.

    Ids 0 .. blocks-1 are blocks; list k's sentinel is `blocks + k`. `newer[x]` is the next node
    towards the list's new end, `older[x]` towards its old end; a sentinel closes its list into a
    ring, so `newer[sentinel]` is the oldest block and `older[sentinel]` the newest. Two list slots
    per id replace an ordered dict's entry and node; policies inline the link steps in their hot
    loops and call these methods elsewhere.
    """

    def __init__(self, blocks: int, lists: int) -> None:
        self.blocks = blocks
        self.newer = list(range(blocks + lists))
        self.older = list(range(blocks + lists))

    def sentinel(self, index: int) -> int:
        return self.blocks + index

    def unlink(self, node: int) -> None:
        newer, older = self.newer, self.older
        before, after = older[node], newer[node]
        newer[before] = after
        older[after] = before

    def link_newer(self, node: int, anchor: int) -> None:
        """Put `node` just newer than `anchor` (a block, or a sentinel: then it is the oldest)."""
        newer, older = self.newer, self.older
        after = newer[anchor]
        newer[anchor] = node
        older[node] = anchor
        newer[node] = after
        older[after] = node

    def push_newest(self, node: int, sentinel: int) -> None:
        self.link_newer(node, self.older[sentinel])

    def push_oldest(self, node: int, sentinel: int) -> None:
        self.link_newer(node, sentinel)

    def oldest_first(self, sentinel: int) -> Iterator[int]:
        """The blocks of a list from its old end; the list must not change meanwhile."""
        newer = self.newer
        node = newer[sentinel]
        while node != sentinel:
            yield node
            node = newer[node]

    def clear(self) -> None:
        self.newer[:] = range(len(self.newer))
        self.older[:] = range(len(self.older))
