"""A stored chunk's header: what a reader checks before a byte of the payload reaches host memory.

Every value a tier stores is this fixed header, then the payload (one chunk's bytes as they lie in
a host-pool row). The checksum is XXH3-64 of the payload, fast enough to check at memory speed,
seeded by the chunk's key when the tier gives one: a whole value stored under another key (a
backend's mix-up, a copied file) fails it too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

FORMAT_VERSION = 1
MAGIC = b"NKVC"

_HEADER = struct.Struct("<4sH2x16s8sQQ")  # magic, version, namespace, writer, length, checksum
HEADER_BYTES = _HEADER.size  # 48


class CorruptChunk(Exception):
    """A stored value that must not be loaded; `reason` says which check failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """A parsed header: who wrote the chunk and what its payload must be."""

    namespace: bytes
    writer: bytes
    payload_bytes: int
    checksum: int


def checksum(payload: memoryview, key: bytes = b"") -> int:
    """XXH3-64 of the payload, read in place, seeded by the XXH3-64 of `key` (0 without one)."""
    seed = xxhash.xxh3_64_intdigest(key) if key else 0
    return xxhash.xxh3_64_intdigest(payload, seed=seed)


def encode_header(namespace: bytes, writer: bytes, payload: memoryview, key: bytes = b"") -> bytes:
    """The header for `payload`, stored under `key` by `writer` in `namespace` (a 16-byte digest)."""
    return _HEADER.pack(
        MAGIC, FORMAT_VERSION, namespace, writer, payload.nbytes, checksum(payload, key)
    )


def parse_header(header: bytes | memoryview) -> ChunkHeader:
    """Parse a header; raise CorruptChunk("format") when it is not numbakv's, or another version."""
    if len(header) < HEADER_BYTES:
        raise CorruptChunk("format")
    magic, version, namespace, writer, length, digest = _HEADER.unpack_from(header)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise CorruptChunk("format")
    return ChunkHeader(namespace, writer, length, digest)


def verify(
    header: ChunkHeader,
    namespace: bytes,
    payload: memoryview,
    found_bytes: int,
    key: bytes = b"",
    digest: int | None = None,
) -> None:
    """Raise CorruptChunk naming the first check `payload` fails: namespace, length, checksum.

    `found_bytes` is how many payload bytes the store held (a truncated value holds fewer than its
    header promises); `payload` is where they were copied from under `key`; `digest`, where given,
    is `checksum(payload, key)` computed already.
    """
    if header.namespace != namespace:
        raise CorruptChunk("namespace")
    if not header.payload_bytes == found_bytes == payload.nbytes:
        raise CorruptChunk("length")
    if (checksum(payload, key) if digest is None else digest) != header.checksum:
        raise CorruptChunk("checksum")
