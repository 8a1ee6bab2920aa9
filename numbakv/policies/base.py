"""The contract between the manager and a cache policy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet

from numbakv.request_access import RequestAccess
from numbakv.specs import BlockHash

NOT_READY = -1
"""`ref_counts[block_id]` of a block being stored (and of a free slot)."""


class CachePolicy(ABC):
    """Organises the cached blocks and chooses eviction victims; the manager does the rest.

    A policy maps each cached hash to its host block id and keeps them in its own order. The
    manager owns `ref_counts`, indexed by block id: -1 while a block is being stored, 0 when it is
    ready and idle, n > 0 while n loads read it. A policy reads it and never writes it.
    """

    touches_before_storing: bool = True
    """Whether a request's touch comes before its new blocks go in, once per request (at its first
    store, or when it finishes if it stores none): numbakv's own policies rank, class and count a
    request's new blocks against that touch. LRU and ARC say False: they follow vLLM 0.32, which
    inserts at the store and applies the request when it finishes (`request_finished`)."""

    reads_store_misses: bool = False
    """Whether `on_store_miss` does anything: the manager keeps a request's store misses, and
    calls it, only for a policy that says True (ARC)."""

    def __init__(self, capacity: int, ref_counts: Sequence[int]) -> None:
        self.capacity = capacity
        self.ref_counts = ref_counts

    @abstractmethod
    def get(self, block_hash: BlockHash) -> int | None:
        """The block id of this hash, or None if it is not cached. Changes no recency."""

    @abstractmethod
    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        """Add new blocks (not ready yet), in order; none of the hashes is cached."""

    @abstractmethod
    def remove(self, block_hash: BlockHash) -> None:
        """Forget a cached block whose store failed."""

    @abstractmethod
    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Mark these hashes as used now; the first of them counts as the most recent.

        Hashes that are not cached are ignored (or, for policies with history, noted).
        """

    def on_store_miss(self, block_hashes: Sequence[BlockHash]) -> None:
        """New blocks a request is about to store, shown once per request, before they go in;
        called only when `reads_store_misses` is True.

        Nothing by default; ARC moves its target here when one of them is a ghost.
        """

    def request_finished(
        self,
        block_hashes: Sequence[BlockHash],
        inserted: AbstractSet[BlockHash],
        reused: AbstractSet[BlockHash],
    ) -> None:
        """A finished request's accesses, applied once, as vLLM 0.32 applies them; called only
        when `touches_before_storing` is False.

        `block_hashes` are the blocks it loaded or offered to store, in prefix order (head
        first), cached or not by now; `inserted` those it stored itself, `reused` the ready ones
        it loaded or found stored. By default all are touched, head first.
        """
        self.touch(block_hashes)

    def request_access(self, request: RequestAccess, block_hashes: Sequence[BlockHash]) -> None:
        """Blocks a running request names for the first time (loaded, found stored, or about to
        be stored, before any goes in), where it knows their token positions
        (`request.positions`, from vLLM 0.33). Nothing by default; LRU ranks them by position."""

    def request_inserted(self, request: RequestAccess, block_hashes: Sequence[BlockHash]) -> None:
        """Blocks that request just inserted (where it knows positions, as above). Nothing by
        default; LRU ranks them by position."""

    @abstractmethod
    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        """Remove and return n (hash, block id) victims: idle (ref count 0) and not `protected`.

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


def idle_entries(
    entries: Iterable[tuple[BlockHash, int]],
    ref_counts: Sequence[int],
    protected: AbstractSet[BlockHash],
) -> Iterator[tuple[BlockHash, int]]:
    """The evictable (hash, block id) entries, lazily, in the order given: idle (ref count 0) and
    not protected, the rule of every eviction. Walks that would pay for a call or a generator
    step per block (SIEVE's hand, S3-FIFO's queues, Sighting ARC's lists) test it inline."""
    return (
        (block_hash, block_id)
        for block_hash, block_id in entries
        if ref_counts[block_id] == 0 and block_hash not in protected
    )
