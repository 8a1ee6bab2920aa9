"""`NumbaKVDiskTier`: numbakv's disk tier as a secondary tier of vLLM's tiering spec.

    "secondary_tiers": [{"type": "NumbaKVDiskTier", "module_path": "numbakv.integrations.vllm",
                         "root_dir": "/mnt/nvme/kv", "bytes_to_use": 1099511627776}]

Chunk files under `root_dir`, at most `bytes_to_use` of them, evicted by `cache_policy` (any
numbakv policy; "lru" by default); engines pointed at one directory share their chunks. Evictions
are vLLM KV events (removed) where the tier's events are on. The other settings are
`ChunkTierManager`'s; see docs/TIERS.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import Locality, OffloadingEvent

from numbakv.integrations.vllm.tiers import ChunkTierManager


class NumbaKVDiskTier(ChunkTierManager):
    """A tier of chunk files in a local directory (NVMe), bounded and evicted by numbakv."""

    default_locality: ClassVar[Locality] = Locality.LOCAL

    @classmethod
    def tier_url(
        cls, settings: Mapping[str, Any], *, removal_events: bool
    ) -> tuple[str, dict[str, Any]]:
        """A bare `dir:`, the settings (`root_dir`, `bytes_to_use`, `cache_policy`) beside it,
        with the removals tracked when vLLM's KV events are on."""
        return "dir:", {**settings, "track_removals": removal_events}

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Chunks stored, and chunk files the disk index removed (evicted, damaged, gone), in the
        order that leaves each chunk's last event true of the directory now: a file removed and
        stored again since the last call is reported removed before the stores, one still gone
        after them."""
        removed = self.tier.backend.take_removed()
        back = self.tier.backend.indexed(removed)
        yield from self._removed([key for key, there in zip(removed, back) if there])
        yield from super().take_events()
        yield from self._removed([key for key, there in zip(removed, back) if not there])

    def _removed(self, keys: list) -> Iterable[OffloadingEvent]:
        if keys:
            yield OffloadingEvent(
                keys=keys, medium=self.medium, removed=True, locality=self.locality
            )
