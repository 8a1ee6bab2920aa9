"""`NumbaKVDiskTier`: numbakv's disk tier as a secondary tier of vLLM's tiering spec.

    "secondary_tiers": [{"type": "NumbaKVDiskTier", "module_path": "numbakv.integrations.vllm",
                         "root_dir": "/mnt/nvme/kv", "bytes_to_use": "1TiB"}]

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
        after them. A store is announced when vLLM collects its job, which may be after its file
        was removed and announced so: a chunk no longer indexed then is left out of it."""
        backend = self.tier.backend
        removed = backend.take_removed()
        back = backend.indexed(removed)
        yield from self._removed([key for key, there in zip(removed, back) if there])
        for event in super().take_events():
            kept = [key for key, there in zip(event.keys, backend.indexed(event.keys)) if there]
            if kept:
                yield OffloadingEvent(
                    keys=kept, medium=event.medium, removed=False, locality=event.locality
                )
        yield from self._removed([key for key, there in zip(removed, back) if not there])

    def _removed(self, keys: list) -> Iterable[OffloadingEvent]:
        if keys:
            yield OffloadingEvent(
                keys=keys, medium=self.medium, removed=True, locality=self.locality
            )
