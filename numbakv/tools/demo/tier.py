"""The demo's tier below host memory: any URL `numbakv.tiers.open_tier` takes (`--tier dir:PATH`, a
local directory; `--tier redis://HOST:PORT/DB`, a Redis or Valkey server), opened over the stand-in
engine's host pool, so engines in other processes share what it stores."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import numpy as np

from numbakv.tiers import BackendUnavailable, ChunkTier, Namespace, TierOpenError, parse_tier_url
from numbakv.tiers import open_tier as open_tier_url
from numbakv.tiers.registry import DISK, REDIS, REGISTRY, tier_config
from numbakv.tiers.settings import redacted
from numbakv.tools.cli import install_hint

DISK_BYTES = 2**30
"""The directory's bound unless the URL sets bytes_to_use: plenty for the demo's small blocks,
evicted by LRU past it."""
TTL_S = 600.0
"""How long the demo's values live on a Redis/Valkey server unless the URL sets ttl_s: a stock
server (maxmemory-policy noeviction) refuses every write once full, so the demo's keys expire
instead of filling it for good."""
LOOKUP_DEADLINE_S = 0.5
"""Longer than the tier's default: on Numba's simulator a busy machine answers late, and the demo
shows what is shared, not how fast a late answer is dropped."""


def tier_spec_error(spec: str) -> str | None:
    """Why `spec` cannot name a tier (None when it can), before anything is opened."""
    scheme = spec.partition(":")[0]
    if REGISTRY.get(scheme) is REDIS and importlib.util.find_spec("redis") is None:
        return f"a {scheme}:// tier needs the 'redis' extra: {install_hint('redis')}"
    try:
        tier_config(spec, **demo_settings(spec))
    except (ValueError, TypeError) as error:
        return str(error)
    return None


def demo_settings(spec: str) -> dict[str, Any]:
    """The demo's settings of the tier `spec` names, where its URL does not set them."""
    parsed = parse_tier_url(spec)
    bound = {"bytes_to_use": DISK_BYTES} if parsed.kind is DISK else {"ttl_s": TTL_S}
    defaults = {**bound, "lookup_deadline_s": LOOKUP_DEADLINE_S}
    return {key: value for key, value in defaults.items() if key not in parsed.settings}


def open_tier(spec: str, host_rows: np.ndarray, namespace: Namespace) -> ChunkTier:
    """The tier `spec` names, reading and writing `host_rows` (the host pool, one row a block)."""
    return open_tier_url(spec, host_rows, namespace, **demo_settings(spec))


def tier_probe_error(spec: str, namespace: Namespace, chunk_bytes: int) -> str | None:
    """Why the tier `spec` names cannot serve the demo (None when it can): opened over a pool of
    one row and asked for one key before any engine starts, so a server that is not there, or a
    bound too small for one block, costs a second instead of a whole run."""
    tiers_log = logging.getLogger("numbakv.tiers")
    level = tiers_log.level
    tiers_log.setLevel(logging.ERROR)  # the answer is this function's, said once by the caller
    try:
        tier = open_tier(spec, np.zeros((1, chunk_bytes), np.uint8), namespace)
        try:
            tier.backend.exists([b"numbakv-demo-probe"])
        finally:
            tier.close()
    except (TierOpenError, BackendUnavailable, ValueError, TypeError) as error:
        return str(error)
    finally:
        tiers_log.setLevel(level)
    return None


def describe_tier(spec: str) -> str:
    """The tier as the report names it: its URL (no password) and the bound the demo gave it."""
    config = tier_config(spec, **demo_settings(spec))
    if config.kind is DISK:
        return f"{redacted(spec)}, at most {config.backend.bytes_to_use:,} bytes"
    return f"{redacted(spec)}, values expire after {config.backend.ttl_s:g} s"


def tier_failure(report: Any) -> str | None:
    """Why an engine's tier below counts as failed (a DemoReport's figures), or None: it was
    unreachable and took no store and gave no hit, or every block flushed to it at the end
    failed."""
    if report.tier_unavailable and not (report.tier_stored or report.tier_hits):
        return "the tier was unreachable: no store to it and no load from it succeeded"
    if report.tier_flush_failed and not report.tier_flushed:
        return f"every block flushed to the tier failed ({report.tier_flush_failed:,})"
    return None
