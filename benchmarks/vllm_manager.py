"""numbakv's vLLM adapter against vLLM 0.32's own CPU offloading manager, driven as vLLM drives it.

    python benchmarks/vllm_manager.py --trace TRACE.jsonl [--capacities 2000,10000,40000] \
        [--repeats 3] [--positions] [--out results/vllm_manager.json]

Every request goes through the calls vLLM 0.32's OffloadingConnector makes of a manager, one
request at a time: on_new_request; lookup, one key at a time, up to the first miss; prepare_load
and complete_load of the hits; prepare_store of the rest (when there is a rest) and complete_store
of what it returned; on_request_finished. Managers: vLLM's CPUOffloadingManager with its LRU and
with numbakv's sarc, S3-FIFO and SIEVE as vLLM `CachePolicy`s (`numbakv.integrations.vllm.policies`),
and numbakv's adapter (`NumbaKVOffloadingManager`) with LRU and those three. Cost is wall time per
key reference, best of --repeats, the managers taking turns in one process. Targets: numbakv's LRU
through the adapter at most 0.5x vLLM's LRU; each of numbakv's policies inside vLLM's manager
within 0.001 of its hit ratio through the adapter. Without --trace, numbakv's built-in chat
workload. `--positions` gives each request's context its keys' token positions, as vLLM's
connector records them: vLLM 0.33's LRU (and numbakv's under 0.33) ranks a running request by
them. Needs vLLM (pip install 'numbakv[vllm]').
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vllm import __version__ as vllm_version
from vllm.v1.kv_offload.base import LookupResult, OffloadingManager, OffloadKey, ReqContext
from vllm_baseline import offload_chains, vllm_manager

from numbakv import CPUOffloadingManager
from numbakv.integrations.vllm.scheduler import NumbaKVOffloadingManager
from numbakv.tools.traces import read_hash_chains
from numbakv.tools.workloads import multi_turn_chat


def connector_request(
    manager: OffloadingManager,
    keys: Sequence[OffloadKey],
    request_id: str,
    positions: bool = False,
) -> int:
    """One request as vLLM 0.32's connector drives a manager; returns the keys hit. With
    `positions`, its context knows each key's end-token position (one token a key)."""
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
    if hits < len(keys):
        output = manager.prepare_store(keys[hits:], context)
        if output is not None and output.keys_to_store:
            manager.complete_store(output.keys_to_store, context)
    manager.on_request_finished(context)
    return hits


def connector_replay(
    manager: OffloadingManager, chains: Sequence[Sequence[OffloadKey]], positions: bool = False
) -> int:
    """Every request in order through `manager`; returns the total hits."""
    return sum(connector_request(manager, keys, str(i), positions) for i, keys in enumerate(chains))


def numbakv_manager(policy: str, capacity: int) -> NumbaKVOffloadingManager:
    return NumbaKVOffloadingManager(
        CPUOffloadingManager(block_size=1, num_blocks=capacity, cache_policy=policy)
    )


IN_BOTH = ("sarc", "s3fifo", "sieve")  # numbakv's policies, through its adapter and inside vLLM's

MANAGERS: dict[str, Callable[[int], OffloadingManager]] = {
    "vllm lru": lambda capacity: vllm_manager("lru", capacity),
    "numbakv lru": lambda capacity: numbakv_manager("lru", capacity),
    **{
        f"{side} {policy}": lambda capacity, build=build, policy=policy: build(policy, capacity)
        for policy in IN_BOTH
        for side, build in (("numbakv", numbakv_manager), ("vllm", vllm_manager))
    },
}


def measure(chains, capacity: int, repeats: int, positions: bool) -> dict[str, dict]:
    """Best-of-`repeats` seconds and the hits of every manager, taking turns."""
    results: dict[str, dict] = {}
    for _ in range(repeats):
        for name, build in MANAGERS.items():
            manager = build(capacity)
            started = time.perf_counter()
            hits = connector_replay(manager, chains, positions)
            seconds = time.perf_counter() - started
            best = results.setdefault(name, {"seconds": seconds, "hits": hits})
            best["seconds"] = min(best["seconds"], seconds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="Mooncake-format jsonl trace (default: built-in chat)")
    parser.add_argument("--capacities", default="2000,10000,40000", help="blocks, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--positions", action="store_true", help="requests know their keys' token positions"
    )
    parser.add_argument("--out", default="results/vllm_manager.json")
    args = parser.parse_args()
    if args.trace:
        source, chains = args.trace, read_hash_chains(args.trace)
    else:
        source, chains = "built-in chat", [r.hash_ids for r in multi_turn_chat()]
    chains = offload_chains(chains)
    references = sum(map(len, chains))
    print(
        f"{source}: {len(chains):,} requests, {references:,} key references, vLLM "
        f"{vllm_version}, positions {'on' if args.positions else 'off'}"
    )
    print(f"{'capacity':>9}  {'manager':<15} {'ns/ref':>7} {'x vllm lru':>10} {'hit ratio':>9}")
    rows = []
    for capacity in (int(text) for text in args.capacities.split(",")):
        results = measure(chains, capacity, args.repeats, args.positions)
        baseline = results["vllm lru"]["seconds"]
        for name, r in results.items():
            print(
                f"{capacity:>9,}  {name:<15} {1e9 * r['seconds'] / references:7,.0f} "
                f"{r['seconds'] / baseline:10.2f} {r['hits'] / references:9.4f}"
            )
        gaps = {
            policy: results[f"vllm {policy}"]["hits"] - results[f"numbakv {policy}"]["hits"]
            for policy in IN_BOTH
        }
        print(
            f"{capacity:>9,}  hits inside vLLM's manager - through the adapter: "
            + ", ".join(f"{p} {gap:+,} ({gap / references:+.5f})" for p, gap in gaps.items())
        )
        rows.append(
            {
                "capacity": capacity,
                "references": references,
                "lru_ratio": results["numbakv lru"]["seconds"] / baseline,
                "hit_gaps": gaps,
                **{
                    name: {
                        "seconds": r["seconds"],
                        "ns_per_reference": 1e9 * r["seconds"] / references,
                        "ratio_to_vllm_lru": r["seconds"] / baseline,
                        "hit_ratio": r["hits"] / references,
                    }
                    for name, r in results.items()
                },
            }
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "source": source,
        "vllm": vllm_version,
        "positions": args.positions,
        "repeats": args.repeats,
        "rows": rows,
    }
    out.write_text(json.dumps(summary, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
