"""vLLM's own CPU offloading manager as a baseline: build it, key a trace for it, replay a request.

Needs vLLM (0.32 has the interface used here: `vllm.v1.kv_offload.cpu.manager`); importing this
module without it raises ImportError, which a benchmark turns into a skip message. The replay is
numbakv's (docs/MANAGER.md, "Replay"): the leading run of ready hits is looked up, the whole
request is touched, the rest is offered to `prepare_store`, and what it returns is completed.
Each request gets a fresh `ReqContext`, as the engine gives each request its own;
`on_request_finished` is not called, since it would touch the request a second time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, make_offload_key
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


def vllm_manager(policy: str, capacity: int) -> CPUOffloadingManager:
    """vLLM's manager over `capacity` blocks with `policy`: vLLM's own ("lru", "arc"; its factory
    looks them up first) or numbakv's, as a vLLM configuration names them."""
    return CPUOffloadingManager(
        num_chunks=capacity, cache_policy=policy, cache_policy_module_path=NUMBAKV_CACHE_POLICIES
    )


def replay_request(
    manager: CPUOffloadingManager, keys: Sequence[OffloadKey], request_id: str = "replay"
) -> tuple[int, int]:
    """One request under numbakv's replay semantics; returns (blocks hit, blocks stored)."""
    context = ReqContext(req_id=request_id)
    hits = 0
    for key in keys:
        if manager.lookup(key, context) is not LookupResult.HIT:
            break
        hits += 1
    manager.touch(keys, context)
    output = manager.prepare_store(keys[hits:], context)
    if output is None:
        return hits, 0
    manager.complete_store(output.keys_to_store, context)
    return hits, len(output.keys_to_store)
