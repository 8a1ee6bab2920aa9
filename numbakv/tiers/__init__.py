"""Tiers below host memory: chunks kept in a store (a local directory, Redis/Valkey) that outlives
the host pool, checked before they are loaded.

`ChunkTier` (tier.py) is the same for every store; a `ChunkBackend` (backend.py) is one store.
"""

from numbakv.tiers.backend import BackendUnavailable, ChunkBackend, Occupancy, StoredValue
from numbakv.tiers.chunk_format import CorruptChunk
from numbakv.tiers.namespace import Namespace
from numbakv.tiers.tier import ChunkTier, TierCounters, TierLookup

__all__ = [
    "BackendUnavailable",
    "ChunkBackend",
    "ChunkTier",
    "CorruptChunk",
    "Namespace",
    "Occupancy",
    "StoredValue",
    "TierCounters",
    "TierLookup",
]
