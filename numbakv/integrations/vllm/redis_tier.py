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


class NumbaKVRedisTier(ChunkTierManager):
    """A tier on a Redis/Valkey server or cluster shared by every engine of a fleet."""

    default_locality: ClassVar[Locality] = Locality.REMOTE

    @classmethod
    def tier_url(
        cls, settings: Mapping[str, Any], *, removal_events: bool
    ) -> tuple[str, dict[str, Any]]:
        """The `url` setting; Redis evicts by its own maxmemory policy, unseen, so
        `removal_events` changes nothing."""
        if "url" not in settings:
            raise ValueError("the Redis tier needs a url setting (redis://host:6379/0)")
        rest = {key: value for key, value in settings.items() if key != "url"}
        return settings["url"], rest
