"""The spec's settings, read from vLLM's `kv_connector_extra_config` and checked before use.

Keys shared with vLLM's own CPU spec (`cpu_bytes_to_use`, `eviction_policy`, `store_threshold`,
`max_tracker_size`) mean the same; a bad value fails when vLLM builds the connector, with a message
that names the key. Imports neither vLLM nor the data path: both halves of the spec read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numbakv.manager import MAX_TRACKER_SIZE
from numbakv.policies import resolve_policy

DEFAULT_POLICY = "lru"  # vLLM's default; docs/VLLM.md recommends "sarc"
VLLM_CACHE_POLICIES = (
    "a vLLM CachePolicy runs in vLLM's own CPUOffloadingSpec or TieringOffloadingSpec, and so do "
    "numbakv's policies as vLLM CachePolicies (eviction_policy 'sarc', 's3fifo' or 'sieve' with "
    "cache_policy_module_path 'numbakv.integrations.vllm.policies')"
)
"""How to run a vLLM CachePolicy, said where numbakv's spec refuses one."""


class ConfigError(ValueError):
    """A `kv_connector_extra_config` value numbakv cannot use; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"kv_connector_extra_config[{key!r}]: {problem}")
        self.key = key


@dataclass(frozen=True)
class Settings:
    """What numbakv takes from the extra config (vLLM reads its own keys, e.g. `block_size`)."""

    cpu_bytes_to_use: int
    eviction_policy: str = DEFAULT_POLICY
    store_threshold: int = 1
    max_tracker_size: int = MAX_TRACKER_SIZE
    max_thread_blocks: int | None = None

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any]) -> Settings:
        if extra.get("cpu_bytes_to_use") is None:
            raise ConfigError(  # vLLM's own words, which its tests match
                "cpu_bytes_to_use",
                "required: cpu_bytes_to_use must be specified (the host memory for offloaded KV, "
                "in bytes)",
            )
        if extra.get("cache_policy_module_path") is not None:
            raise ConfigError(
                "cache_policy_module_path",
                "NumbaKVOffloadingSpec runs numbakv's policies itself, named by eviction_policy "
                f"alone (drop this key); {VLLM_CACHE_POLICIES}",
            )
        if extra.get("secondary_tiers"):
            raise ConfigError(
                "secondary_tiers",
                "NumbaKVOffloadingSpec has no tiers below host memory; for numbakv's disk or "
                'Redis tiers use "spec_name": "TieringOffloadingSpec" with "eviction_policy" and '
                '"cache_policy_module_path": "numbakv.integrations.vllm.policies" (docs/VLLM.md)',
            )
        if extra.get("canonical_layout"):
            raise ConfigError(
                "canonical_layout",
                "numbakv stores each worker's own pages; the canonical layout is not supported",
            )
        policy = extra.get("eviction_policy", DEFAULT_POLICY)
        try:
            resolve_policy(policy)
        except (TypeError, ValueError) as error:
            hint = f"; {VLLM_CACHE_POLICIES}" if isinstance(policy, str) else ""
            raise ConfigError("eviction_policy", f"{error}{hint}") from None
        max_thread_blocks = extra.get("max_thread_blocks")
        return cls(
            cpu_bytes_to_use=_integer(extra, "cpu_bytes_to_use", minimum=1),
            eviction_policy=policy,
            # vLLM's default 0 and 1 both mean "store every block"
            store_threshold=max(1, _integer(extra, "store_threshold", minimum=0, default=0)),
            max_tracker_size=_integer(
                extra, "max_tracker_size", minimum=1, default=MAX_TRACKER_SIZE
            ),
            max_thread_blocks=None
            if max_thread_blocks is None
            else _integer(extra, "max_thread_blocks", minimum=1),
        )


def _integer(extra: Mapping[str, Any], key: str, minimum: int, default: int = 0) -> int:
    """`extra[key]` as an int >= minimum; whole numbers written as strings or floats are accepted."""
    value = extra.get(key, default)
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ConfigError(key, f"expected an integer, got {value!r}") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"expected an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(key, f"must be >= {minimum}, got {value}")
    return value


def host_chunks(settings: Settings, kv_bytes_per_chunk: int) -> int:
    """How many offloaded chunks `cpu_bytes_to_use` holds, each `kv_bytes_per_chunk` bytes.

    As in vLLM's CPU spec, the bytes are the whole engine's: every worker's part of each chunk, or
    the one copy the node's workers share (vLLM's replicated layout).
    """
    if kv_bytes_per_chunk <= 0:
        raise ConfigError(
            "cpu_bytes_to_use", "vLLM reported no KV cache bytes per block: nothing to offload"
        )
    chunks = settings.cpu_bytes_to_use // kv_bytes_per_chunk
    if chunks < 1:
        raise ConfigError(
            "cpu_bytes_to_use",
            f"{settings.cpu_bytes_to_use} bytes hold no offloaded chunk: one chunk of KV (every "
            f"layer, every copy the workers keep) takes {kv_bytes_per_chunk} bytes",
        )
    return chunks
