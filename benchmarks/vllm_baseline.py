"""vLLM's own CPU offloading manager as a baseline: build it, key a trace for it, replay a request.

Needs vLLM (0.32 has the interface used here: `vllm.v1.kv_offload.cpu.manager`); importing this
module without it raises ImportError, which a benchmark turns into a skip message. A request
is replayed as vLLM 0.32's OffloadingConnector drives a manager, which is numbakv's replay too
(docs/MANAGER.md, "Replay"): `on_new_request`; `lookup` one key at a time up to the first miss;
`prepare_load` and `complete_load` of the hits; `prepare_store` of the rest and `complete_store`
of what it returned; `on_request_finished`. Each request gets a fresh `ReqContext`, as the
engine gives each request its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

HASH_BYTES = 32  # vLLM's block hashes are SHA-256 digests
GROUP = 0  # one KV cache group, as for a plain decoder


def offload_key(block_id: int, group: int = GROUP) -> OffloadKey:
    """The OffloadKey of a trace block id: the id as a HASH_BYTES big-endian hash, then the group."""
    return make_offload_key(block_id.to_bytes(HASH_BYTES, "big"), group)


def offload_chains(chains: Iterable[Sequence[int]]) -> list[list[OffloadKey]]:
    """Every request's block ids as OffloadKeys; equal ids share one key object."""
    keys: dict[int, OffloadKey] = {}
    return [
        [
            keys[block_id] if block_id in keys else keys.setdefault(block_id, offload_key(block_id))
            for block_id in chain
        ]
        for chain in chains
    ]


NUMBAKV_CACHE_POLICIES = "numbakv.integrations.vllm.policies"
"""Where vLLM's policy factory finds numbakv's policies ("sarc", "s3fifo", "sieve")."""


def vllm_manager(policy: str, capacity: int, store_threshold: int = 1) -> CPUOffloadingManager:
    """vLLM's manager over `capacity` blocks with `policy`: vLLM's own ("lru", "arc"; its factory
    looks them up first) or numbakv's, as a vLLM configuration names them."""
    return CPUOffloadingManager(
        num_chunks=capacity,
        cache_policy=policy,
        cache_policy_module_path=NUMBAKV_CACHE_POLICIES,
        store_threshold=store_threshold,
    )


def replay_request(
    manager: OffloadingManager,
    keys: Sequence[OffloadKey],
    request_id: str = "replay",
    positions: bool = False,
) -> tuple[int, int]:
    """One request as vLLM 0.32's connector drives any manager; returns (keys hit, keys stored).
    With `positions`, its context knows each key's end-token position (one token a key)."""
    context = ReqContext(req_id=request_id)
    if positions:
        for position, key in enumerate(keys, 1):
            context.set_offload_key_position(key, position)
    manager.on_new_request(context)
    hits = 0
    for key in keys:
        if manager.lookup(key, context) is not LookupResult.HIT:
            break
        hits += 1
    if hits:
        manager.prepare_load(keys[:hits], context)
        manager.complete_load(keys[:hits], context)
    stored = 0
    if hits < len(keys):
        output = manager.prepare_store(keys[hits:], context)
        if output is not None and output.keys_to_store:
            manager.complete_store(output.keys_to_store, context)
            stored = len(output.keys_to_store)
    manager.on_request_finished(context)
    return hits, stored
