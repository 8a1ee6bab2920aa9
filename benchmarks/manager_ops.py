"""Manager cost per block and per cached block, and replay time against a bare LRU loop.

    python benchmarks/manager_ops.py [--capacities 10000,100000,1000000]
        [--churned-capacities 10000,100000] [--out results/manager_ops.json]

Prints four tables and writes them as JSON. Targets (2-core machine): every operation <= 1 us per
block at 1M blocks, <= 200 bytes per cached block, and a replay no more than 2x a bare OrderedDict
LRU loop that keeps no ref counts, events or specs. Memory is measured twice: right after a fill,
and after a churned replay (the steady state: about 20 references per block of capacity, so 1M
blocks takes sarc about 10 minutes here and is left to `--churned-capacities`). The churned replay
is also timed request by request: its longest requests are the pauses an engine's scheduler sees.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
import tracemalloc
from collections import OrderedDict
from pathlib import Path

from numbakv import POLICIES, CPUOffloadingManager
from numbakv.tools.replay.core import replay_request
from numbakv.tools.traces import read_hash_chains
from numbakv.tools.workloads.core import multi_turn_chat

CHAIN = 32  # blocks per call, about one 16k-token prompt of 512-token blocks
FILLS = 6  # capacities stored before memory is measured: sarc remembers the last 5
CHURN = 12  # capacities of new blocks stored by the churned measurement


def chains_of(first: int, count: int) -> list[list[int]]:
    return [
        list(range(start, min(start + CHAIN, first + count)))
        for start in range(first, first + count, CHAIN)
    ]


def per_block_ns(action, chains: list[list[int]]) -> float:
    blocks = sum(map(len, chains))
    gc.disable()
    started = time.perf_counter_ns()
    for chain in chains:
        action(chain)
    elapsed = time.perf_counter_ns() - started
    gc.enable()
    return elapsed / blocks


def method_costs(policy: str, capacity: int) -> dict[str, float]:
    """ns per block of each method on a full cache of `capacity` blocks."""
    manager = CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy=policy)
    resident = chains_of(0, capacity)
    costs = {"store (prepare, free slots)": per_block_ns(manager.prepare_store, resident)}
    costs["complete_store"] = per_block_ns(manager.complete_store, resident)
    sample = resident[:: max(1, len(resident) // 2000)]  # ~64k blocks spread over the cache
    costs["lookup (hit)"] = per_block_ns(manager.lookup, sample)
    costs["touch"] = per_block_ns(manager.touch, sample)
    costs["prepare_load"] = per_block_ns(manager.prepare_load, sample)
    costs["complete_load"] = per_block_ns(manager.complete_load, sample)
    newcomers = chains_of(capacity, min(capacity, 64_000))
    costs["store (prepare, evicting)"] = (
        per_block_ns(
            lambda chain: manager.complete_store(
                manager.prepare_store(chain).block_hashes_to_store
            ),
            newcomers,
        )
        - costs["complete_store"]
    )  # stores complete between calls, as an engine's do
    return costs


def held_per_block(policy: str, capacity: int, chains: list[list[int]], step) -> float:
    """What a new manager holds after `step(manager, chain)` for each chain, per block of
    capacity. The chains are made beforehand: the engine's hashes are not the manager's memory."""
    gc.collect()
    tracemalloc.start()
    manager = CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy=policy)
    for chain in chains:
        step(manager, chain)
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return size / capacity


def touch_and_store(manager: CPUOffloadingManager, chain: list[int]) -> None:
    """As an engine schedules a request before saving it."""
    manager.touch(chain)
    manager.complete_store(manager.prepare_store(chain).block_hashes_to_store)


def bytes_per_cached_block(policy: str, capacity: int) -> float:
    """Right after a fill: later fills evict the earlier ones until every history is full (ghost
    lists, sarc's reuse classes), and history kept on touch (sarc's miniatures) fills as well."""
    fills = [chain for fill in range(FILLS) for chain in chains_of(fill * capacity, capacity)]
    return held_per_block(policy, capacity, fills, touch_and_store)


def churned_chains(capacity: int, seed: int = 0) -> list[list[int]]:
    """Conversations that come back: each request is either the next turn of a conversation
    opened up to 3 capacities of blocks ago (its chain so far and `CHAIN` / 2 new blocks, until
    it is 2 `CHAIN`s long) or opens one (`CHAIN` new blocks), until `CHURN` capacities of new
    blocks have been stored. Blocks come back while cached, as ghosts and after being forgotten, so
    every hash table has been grown, emptied and refilled."""
    rng = random.Random(seed)
    conversations: list[list[int]] = []
    chains, fresh = [], 0
    while fresh < CHURN * capacity:
        back = min(len(conversations), 1 + int(3 * capacity / CHAIN))
        turn = len(conversations) - 1 - int(rng.random() * back)
        if turn >= 0 and rng.random() < 0.5 and len(conversations[turn]) < 2 * CHAIN:
            chain = conversations[turn] = [*conversations[turn], *range(fresh, fresh + CHAIN // 2)]
            fresh += CHAIN // 2
        else:
            chain = list(range(fresh, fresh + CHAIN))
            conversations.append(chain)
            fresh += CHAIN
        chains.append(chain)
    return chains


def request_times(policy: str, capacity: int, chains: list[list[int]]) -> dict[str, float]:
    """Each request's replay time, garbage collector on as in an engine: the worst ones are the
    pauses a scheduler sees (a table rebuilt, a list compacted)."""
    manager = CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy=policy)
    times = []
    for chain in chains:
        started = time.perf_counter()
        replay_request(manager, chain)
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "median_us": times[len(times) // 2] * 1e6,
        "p99.9_ms": times[int(len(times) * 0.999)] * 1e3,
        "longest_ms": times[-1] * 1e3,
    }


def manager_replay_seconds(chains, policy: str, capacity: int) -> tuple[float, int]:
    manager = CPUOffloadingManager(block_size=16, num_blocks=capacity, cache_policy=policy)
    started = time.perf_counter()
    for chain in chains:
        replay_request(manager, chain)
    return time.perf_counter() - started, manager.stats().hit_blocks


def bare_replay_seconds(chains, capacity: int) -> tuple[float, int]:
    """The same replay with nothing but an OrderedDict: the floor any LRU bookkeeping sits on.
    In the replay's order: the missing tail is stored (the least recent blocks not in it make
    room, or nothing is stored), then the request's blocks become recent, the head the most."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits_total = 0
    started = time.perf_counter()
    for chain in chains:
        hits = 0
        for block in chain:
            if block not in cache:
                break
            hits += 1
        hits_total += hits
        tail = dict.fromkeys(chain[hits:])
        new = [block for block in tail if block not in cache]
        shortfall = len(cache) + len(new) - capacity
        victims = []
        if shortfall > 0:
            for block in cache:
                if block not in tail:
                    victims.append(block)
                    if len(victims) == shortfall:
                        break
        if len(victims) == max(shortfall, 0):
            for block in victims:
                del cache[block]
            cache.update(dict.fromkeys(new))
        for block in reversed(chain):
            if block in cache:
                cache.move_to_end(block)
    return time.perf_counter() - started, hits_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacities", default="10000,100000,1000000")
    parser.add_argument("--churned-capacities", default="10000,100000")
    parser.add_argument("--out", default="results/manager_ops.json")
    args = parser.parse_args()
    capacities = [int(c) for c in args.capacities.split(",")]
    report: dict = {
        "methods_ns_per_block": {},
        "bytes_per_cached_block": {},
        "bytes_per_cached_block_churned": {},
        "churned_request_times": {},
        "replay": [],
    }

    print(f"ns per block, calls of {CHAIN} blocks on a full cache")
    for policy in POLICIES:
        for capacity in capacities:
            costs = method_costs(policy, capacity)
            report["methods_ns_per_block"][f"{policy}@{capacity}"] = costs
            print(
                f"  {policy:>4} {capacity:>9,}  "
                + "  ".join(f"{k} {v:6.0f}" for k, v in costs.items())
            )

    print(f"bytes per cached block (tracemalloc, {FILLS} capacities stored)")
    for policy in POLICIES:
        for capacity in capacities:
            per_block = bytes_per_cached_block(policy, capacity)
            report["bytes_per_cached_block"][f"{policy}@{capacity}"] = per_block
            print(f"  {policy:>4} {capacity:>9,}  {per_block:6.1f}")

    # The steady state: a fill alone leaves the manager's tables at their tightest.
    print(f"after churn ({CHURN} capacities of new blocks): bytes per cached block, request times")
    for capacity in [int(c) for c in args.churned_capacities.split(",")]:
        chains = churned_chains(capacity)
        for policy in POLICIES:
            per_block = held_per_block(policy, capacity, chains, replay_request)
            times = request_times(policy, capacity, chains)
            report["bytes_per_cached_block_churned"][f"{policy}@{capacity}"] = per_block
            report["churned_request_times"][f"{policy}@{capacity}"] = times
            print(
                f"  {policy:>4} {capacity:>9,}  {per_block:6.1f} B  median "
                f"{times['median_us']:4.0f} us  p99.9 {times['p99.9_ms']:5.2f} ms  "
                f"longest {times['longest_ms']:6.1f} ms"
            )

    workloads = {"multi_turn_chat x10": [r.hash_ids for r in multi_turn_chat(sessions=15_000)]}
    workloads["mooncake_conversation"] = read_hash_chains("mooncake_conversation")  # shipped
    print("replay: manager vs bare OrderedDict LRU loop")
    for name, chains in workloads.items():
        references = sum(map(len, chains))
        for capacity in capacities:
            bare, bare_hits = bare_replay_seconds(chains, capacity)
            for policy in POLICIES:
                seconds, hits = manager_replay_seconds(chains, policy, capacity)
                if policy == "lru":
                    assert hits == bare_hits, "the bare loop and the manager disagree"
                row = {
                    "workload": name,
                    "policy": policy,
                    "capacity": capacity,
                    "references": references,
                    "hit_ratio": hits / references,
                    "manager_s": seconds,
                    "bare_lru_s": bare,
                    "ratio": seconds / bare,
                    "ns_per_reference": seconds * 1e9 / references,
                }
                report["replay"].append(row)
                print(
                    f"  {name:<22} {policy:>4} {capacity:>9,}  hit {row['hit_ratio']:.3f}  "
                    f"{seconds:6.2f} s vs bare {bare:5.2f} s  ratio {row['ratio']:.2f}  "
                    f"{row['ns_per_reference']:4.0f} ns/ref"
                )

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
