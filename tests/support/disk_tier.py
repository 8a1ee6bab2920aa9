"""The disk tier on real files for the tests: pools of random chunks (page-aligned, as pinned
host memory is) and a tier over a directory bounded to a number of files."""

from __future__ import annotations

import mmap

import numpy as np

from numbakv.tiers import ChunkTier, Namespace
from numbakv.tiers.disk import ALIGNMENT, DiskBackend, DiskSettings
from tests.support.tiers import TEST_LOOKUP_DEADLINE_S, namespace

CHUNK_BYTES = 8192
FILE_BYTES = ALIGNMENT + CHUNK_BYTES


def bytes_for(files: int, chunk_bytes: int) -> int:
    """`bytes_to_use` for this many files: a header block, the payload padded to the alignment."""
    return files * (ALIGNMENT + -(-chunk_bytes // ALIGNMENT) * ALIGNMENT)


def random_pool(rows: int, seed: int, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, chunk_bytes), dtype=np.uint8)


def aligned_pool(rows: int, seed: int, chunk_bytes: int = CHUNK_BYTES) -> np.ndarray:
    """A page-aligned pool (as pinned host memory is), so O_DIRECT moves rows in place."""
    pool = np.frombuffer(mmap.mmap(-1, rows * chunk_bytes), np.uint8).reshape(rows, chunk_bytes)
    pool[:] = random_pool(rows, seed, chunk_bytes)
    return pool


def disk_tier(root, pool, files: int = 64, ns: Namespace | None = None, **options) -> ChunkTier:
    ns = namespace() if ns is None else ns
    backend = DiskBackend(
        DiskSettings(root, bytes_for(files, pool.shape[1]), **options), ns, pool.shape[1]
    )
    return ChunkTier(backend, pool, ns, lookup_deadline_s=TEST_LOOKUP_DEADLINE_S)
