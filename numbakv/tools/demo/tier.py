"""The demo's tier below host memory: `--tier dir:PATH` (a local directory) or `--tier
redis://HOST:PORT/DB` (a Redis or Valkey server), opened as a `ChunkTier` over the stand-in
engine's host pool, so engines in other processes share what it stores."""

from __future__ import annotations

import importlib.util

import numpy as np

from numbakv.tiers import ChunkTier, Namespace
from numbakv.tools.cli import install_hint

DIR_PREFIX = "dir:"
REDIS_SCHEMES = ("redis://", "rediss://")
DISK_BYTES = 2**30
"""The directory's bound: plenty for the demo's small blocks, evicted by LRU past it."""
LOOKUP_DEADLINE_S = 0.5
"""Longer than the tier's default: on Numba's simulator a busy machine answers late, and the demo
shows what is shared, not how fast a late answer is dropped."""


class TierOpenError(Exception):
    """The tier named could not be opened; the message says why."""


def tier_spec_error(spec: str) -> str | None:
    """Why `spec` cannot name a tier (None when it can), before anything is opened."""
    if spec.startswith(DIR_PREFIX):
        return None if spec[len(DIR_PREFIX) :] else "dir: followed by a directory"
    if spec.startswith(REDIS_SCHEMES):
        if importlib.util.find_spec("redis") is None:
            return f"a redis:// tier, with the 'redis' extra installed ({install_hint('redis')})"
        return None
    return "dir:PATH or redis://HOST:PORT/DB"


def demo_namespace(
    num_layers: int, block_size: int, num_kv_heads: int, head_size: int, item_bytes: int
) -> Namespace:
    """What the demo's host blocks mean: engines with the same sizes read each other's."""
    return Namespace(
        model="numbakv-demo",
        revision="",
        dtype="float16",
        tokens_per_block=block_size,
        blocks_per_chunk=1,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        page_bytes=block_size * num_kv_heads * head_size * item_bytes,
        layout="numbakv:flash_attn-host-block",
    )


def open_tier(spec: str, host_rows: np.ndarray, namespace: Namespace) -> ChunkTier:
    """The tier `spec` names, reading and writing `host_rows` (the host pool, one row a block)."""
    try:
        if spec.startswith(DIR_PREFIX):
            from numbakv.tiers.disk import DiskBackend

            path = spec[len(DIR_PREFIX) :]
            backend = DiskBackend(path, namespace, host_rows.shape[1], DISK_BYTES)
        else:
            from numbakv.tiers.redis import RedisBackend, RedisSettings

            backend = RedisBackend(RedisSettings(url=spec), namespace.digest)
    except (OSError, RuntimeError, ValueError) as error:  # unwritable, or a refused server
        raise TierOpenError(f"{spec}: {error}") from None
    return ChunkTier(backend, host_rows, namespace, lookup_deadline_s=LOOKUP_DEADLINE_S)
