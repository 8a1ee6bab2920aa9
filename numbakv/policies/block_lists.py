"""Recency lists threaded through host block ids: O(1) moves with no object per block."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence


class BlockLists:
    """Several doubly linked lists over one pool of block ids, each id in at most one list.

    Ids 0 .. blocks-1 are blocks; list k's sentinel is `blocks + k`. `newer[x]` is the next node
    towards the list's new end, `older[x]` towards its old end; a sentinel closes its list into a
    ring, so `newer[sentinel]` is the oldest block and `older[sentinel]` the newest. Two list slots
    per id replace an ordered dict's entry and node.

    The `_all` methods move a whole batch in one call, so that a policy pays no call per block;
    where a hot loop does other work per block as it links, it inlines the steps instead.
    """

    def __init__(self, blocks: int, lists: int) -> None:
        self.blocks = blocks
        self.newer = list(range(blocks + lists))
        self.older = list(range(blocks + lists))

    def sentinel(self, index: int) -> int:
        return self.blocks + index

    def unlink(self, node: int) -> None:
        self.unlink_all((node,))

    def unlink_all(self, nodes: Iterable[int]) -> None:
        """Take these nodes, each linked and named once, out of their lists."""
        newer, older = self.newer, self.older
        for node in nodes:
            before, after = older[node], newer[node]
            newer[before] = after
            older[after] = before

    def link_newer_all(self, nodes: Sequence[int], anchor: int) -> None:
        """Put unlinked `nodes` just newer than `anchor` (a block, or a sentinel: then the first
        is the oldest), in order: the last is the newest."""
        if not nodes:
            return
        newer, older = self.newer, self.older
        after = newer[anchor]
        previous = anchor
        for node in nodes:
            newer[previous] = node
            older[node] = previous
            previous = node
        newer[previous] = after
        older[after] = previous

    def push_newest(self, node: int, sentinel: int) -> None:
        self.link_newer_all((node,), self.older[sentinel])

    def push_newest_all(self, nodes: Sequence[int], sentinel: int) -> None:
        """Put unlinked `nodes` at the new end of a list, in order: the last is the newest."""
        self.link_newer_all(nodes, self.older[sentinel])

    def push_oldest(self, node: int, sentinel: int) -> None:
        self.link_newer_all((node,), sentinel)

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
