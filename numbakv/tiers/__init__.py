"""Tiers below host memory: chunks kept in a store (a local directory, Redis/Valkey) that outlives
the host pool, checked before they are loaded.

`ChunkTier` (tier.py) is the same for every store; a `ChunkBackend` (backend.py) is one store;
`open_tier` (registry.py) opens one from a URL (`dir:PATH`, `redis://host:6379/0`).
"""

from numbakv.tiers.backend import (
    BackendUnavailable,
    ChunkBackend,
    Occupancy,
    StoredValue,
    TierOpenError,
)
from numbakv.tiers.chunk_format import CorruptChunk
from numbakv.tiers.namespace import Namespace
from numbakv.tiers.registry import open_tier, parse_tier_url, tier_config
from numbakv.tiers.tier import ChunkTier, TierCounters, TierLookup, TierSettings

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
    "TierOpenError",
    "TierSettings",
    "open_tier",
    "parse_tier_url",
    "tier_config",
]
