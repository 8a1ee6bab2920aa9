"""The backend's settings: the keys of `--hicache-storage-backend-extra-config`, checked by name.

    {"backend_name": "numbakv", "module_path": "numbakv.integrations.sglang",
     "class_name": "NumbaKVHiCacheStorage", "interface_v1": 1,
     "tier": "redis://host:6379/0", "lookup_deadline_s": 0.005}

The first four are SGLang's own, as are its prefetch settings (`prefetch_threshold`,
`prefetch_timeout_base`, `prefetch_timeout_per_ki_token`, `hicache_storage_pass_prefix_keys`).
`tier` is the URL `numbakv.tiers.open_tier` opens (`dir:PATH`, `redis://`, `rediss://`,
`valkey://`, `unix:///PATH`, `?cluster=true`); `staging_bytes` bounds the rows a batch is copied
through where pages cannot be read in place; every other key is the tier's (its query's keys may
be given here instead: `bytes_to_use`, `ttl_s`, `lookup_deadline_s`, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numbakv.checks import byte_size
from numbakv.tiers import parse_tier_url, tier_config
from numbakv.tiers.registry import DISK

SGLANG_KEYS = (
    "backend_name",
    "module_path",
    "class_name",
    "interface_v1",
    "prefetch_threshold",
    "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token",
    "hicache_storage_pass_prefix_keys",
)
"""The keys SGLang reads itself (`interface_v1`: 1 for the zero-copy `batch_get_v1`/`batch_set_v1`).
SGLang takes its prefetch settings out before it builds a backend, except on a decode server's
offload path, which passes them on: they are accepted and left to SGLang."""
OWN_KEYS = ("tier", "staging_bytes")
DEFAULT_STAGING_BYTES = 64 << 20
"""Bytes of rows per direction that pages are copied through where they cannot be read in place."""


@dataclass(frozen=True)
class BackendSettings:
    """The checked settings: the tier's URL and its other settings, which path SGLang calls, and
    the staging rows' bound."""

    tier: str
    tier_settings: dict[str, Any]
    interface_v1: bool
    staging_bytes: int


def backend_settings(extra_config: Mapping[str, Any] | None) -> BackendSettings:
    """The settings of `extra_config`; ValueError naming the key that is missing, unknown or bad.
    Nothing is opened."""
    config = dict(extra_config or {})
    tier = config.get("tier")
    if not isinstance(tier, str) or not tier:
        raise ValueError(
            "the numbakv HiCache backend needs a tier setting in "
            '--hicache-storage-backend-extra-config: "tier": "dir:/mnt/nvme/kv" or '
            f'"redis://host:6379/0", got {tier!r}'
        )
    kind = parse_tier_url(tier).kind
    known = {*SGLANG_KEYS, *OWN_KEYS, *(kind.setting_names() - {kind.location})}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"unknown numbakv HiCache setting {unknown[0]!r} for a {kind.name}; known: "
            f"{', '.join(sorted(known))}"
        )
    interface_v1 = config.get("interface_v1", 0)
    if interface_v1 not in (0, 1):  # True and False are 1 and 0
        raise ValueError(f"interface_v1 must be 0 or 1, got {interface_v1!r}")
    staging = config.get("staging_bytes", DEFAULT_STAGING_BYTES)
    staging = byte_size("staging_bytes", staging)
    tier_settings = {key: config[key] for key in set(config) - {*SGLANG_KEYS, *OWN_KEYS}}
    tier_config(tier, **tier_settings)  # every tier key and value, checked by name
    return BackendSettings(tier, tier_settings, bool(interface_v1), staging)


def tier_share(settings: BackendSettings, shares: int) -> tuple[str, dict[str, Any]]:
    """The URL and settings each of `shares` namespaces opens its tier with: a directory's
    `bytes_to_use` (from the settings or the URL's query) divided among them, so that the
    directory keeps at most what was asked in all; any other tier as given."""
    parsed = parse_tier_url(settings.tier)
    if parsed.kind is not DISK:
        return settings.tier, settings.tier_settings
    every = {**parsed.settings, **settings.tier_settings}
    every["bytes_to_use"] = byte_size("bytes_to_use", every["bytes_to_use"]) // shares
    return "dir:", every
