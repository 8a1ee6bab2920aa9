"""The contract of a store below host memory: whole values by key, nothing else.

A backend knows its store (a directory, a Redis server) and how to move bytes to and from it; the
tier around it (`numbakv.tiers.tier.ChunkTier`) adds headers, checks, threads and job reporting,
the same for every backend. Every method takes a batch, so a networked store answers a batch in
one round trip.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple


class BackendUnavailable(Exception):
    """The store cannot be reached now; callers treat it as a miss or a failed job."""


class TierOpenError(RuntimeError):
    """A store that cannot be opened as configured (a refused password, a database that is not
    there, a server that must answer at start and does not); the message is one line saying why."""


class StoredValue(NamedTuple):
    """What `read_into` found for one key: its header bytes and how many payload bytes it held.

    `checksum`, where given, is `chunk_format.checksum` of the payload as copied, under its key: a
    backend that reads on threads of its own computes it as each value arrives (on the thread that
    read it, or on the caller's while those threads read on), instead of the tier after the whole
    batch.
    """

    header: bytes
    payload_bytes: int
    checksum: int | None = None


class Occupancy(NamedTuple):
    """How many chunks a store holds now, and the most it may hold."""

    used: int
    capacity: int


class ChunkBackend(ABC):
    """Stores values (a header, then a payload) under byte-string keys, in batches."""

    chunk_bytes: int | None = None
    """The one payload length the backend takes (its files are sized for it), or None for any;
    a tier checks it against its host pool's rows."""
    max_key_bytes: int | None = None
    """The longest key the store takes (a file name's room, say), or None for any; a tier
    refuses a longer one when the job is submitted."""

    @abstractmethod
    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        """Which keys hold a value (one round trip for a networked store)."""

    @abstractmethod
    def write(
        self, keys: Sequence[bytes], headers: Sequence[bytes], payloads: Sequence[memoryview]
    ) -> list[bool]:
        """Store header + payload under each key; False where the store refused it (full).

        A value becomes visible whole or not at all: a reader never sees a half-written one.
        """

    @abstractmethod
    def read_into(
        self, keys: Sequence[bytes], payloads: Sequence[memoryview], header_bytes: int
    ) -> list[StoredValue | BackendUnavailable | None]:
        """Copy each key's payload into `payloads[i]` (at most its length); None where absent.

        The first `header_bytes` of a value are its header, returned as is for the caller to check.
        Where the store did not answer for one key (a cluster node down, an error reply) its entry
        is a BackendUnavailable: a failed load that, unlike None, says nothing of the key.
        """

    @abstractmethod
    def delete(self, keys: Sequence[bytes]) -> None:
        """Remove the keys' values, if present."""

    @abstractmethod
    def clear(self) -> int:
        """Remove every value of this backend's namespace, whoever stored it (engines sharing the
        store share the namespace); how many were removed."""

    def touch(self, keys: Sequence[bytes]) -> None:
        """Mark the keys as used now, the first as the most recent, for a store that evicts by
        its own policy (the disk tier); in memory only, never I/O. Others ignore it."""

    def occupancy(self) -> Occupancy | None:
        """The chunks the store holds and may hold, where the backend bounds it itself (the disk
        tier's index); None where something else does (a Redis server's ``maxmemory``, in bytes,
        shared with other writers). A backend answers None always or never; in memory, never I/O."""
        return None

    def close(self) -> None:
        """Release connections, files and threads."""
