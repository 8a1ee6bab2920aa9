"""`NumbaKVRedisTier`: numbakv's Redis/Valkey tier as a secondary tier of vLLM's tiering spec.

    "secondary_tiers": [{"type": "NumbaKVRedisTier", "module_path": "numbakv.integrations.vllm",
                         "url": "redis://host:6379/0"}]

Every engine pointed at the same server shares its chunks (when their namespaces match). The
settings are `numbakv.tiers.redis.RedisSettings`' and `ChunkTierManager`'s; see docs/TIERS.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import Locality

from numbakv.integrations.vllm.tiers import ChunkTierManager
from numbakv.tiers import ChunkBackend, Namespace
from numbakv.tiers.redis import RedisBackend, RedisSettings


class NumbaKVRedisTier(ChunkTierManager):
    """A tier on a Redis/Valkey server or cluster shared by every engine of a fleet."""

    default_locality: ClassVar[Locality] = Locality.REMOTE

    @classmethod
    def open_backend(
        cls,
        settings: Mapping[str, Any],
        namespace: Namespace,
        *,
        chunk_bytes: int,
        removal_events: bool,
    ) -> ChunkBackend:
        """Redis evicts by its own maxmemory policy, unseen: neither argument changes it."""
        return RedisBackend(RedisSettings.from_mapping(settings), namespace.digest)
