"""numbakv's manager against vLLM's own, side by side: replay cost, hit ratio, memory per block.

    python benchmarks/manager_vs_vllm.py [TRACE] [--capacities 2000,10000,40000] [--repeats 3] \
        [--out results/manager_vs_vllm.json]

Replays a Mooncake-format trace (default: the shipped conversation trace) through
vLLM's `CPUOffloadingManager` with its LRU and ARC policies and with numbakv's sarc, S3-FIFO and
SIEVE (`numbakv.integrations.vllm.policies`), and through numbakv's with each of its policies, one
process, the same `OffloadKey` bytes for every manager, the replay semantics of docs/MANAGER.md
("Replay"). Timing is the best of `--repeats` rounds, each round running every
manager once in turn, in CPU seconds of this process (time.process_time: on a shared machine it
leaves out the time the process waits for a core). Bytes per cached block: tracemalloc over a
separate replay, the manager's memory at its end over the capacity (ghost lists included).
Prints one table, ratios to vLLM's LRU, and writes it as JSON. Needs vLLM (0.32 has the manager
used here); without it, says so and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

from numbakv import CPUOffloadingManager
from numbakv.tools.replay.core import replay_request
from numbakv.tools.traces import read_hash_chains

NUMBAKV_POLICIES = ("lru", "arc", "s3fifo", "sieve", "sarc")
VLLM_POLICIES = ("lru", "arc", "s3fifo", "sieve", "sarc")  # the last three are numbakv's
BASELINE = ("vllm", "lru")


def runners(vllm) -> dict[tuple[str, str], tuple[Callable, Callable]]:
    """(manager, policy) -> (make a manager of a capacity, replay one request through it)."""
    table = {
        ("vllm", p): (lambda c, p=p: vllm.vllm_manager(p, c), vllm.replay_request)
        for p in VLLM_POLICIES
    }
    for policy in NUMBAKV_POLICIES:
        table["numbakv", policy] = (
            lambda c, p=policy: CPUOffloadingManager(1, c, p),
            replay_request,
        )
    return table


def replay_seconds(make, step, keys: Sequence[Sequence[bytes]], capacity: int) -> tuple[float, int]:
    """CPU seconds of one whole replay through a fresh manager, and its hits."""
    manager = make(capacity)
    gc.collect()
    started = time.process_time()
    hits = 0
    for request in keys:
        hits += step(manager, request)[0]
    return time.process_time() - started, hits


def bytes_per_block(make, step, keys: Sequence[Sequence[bytes]], capacity: int) -> float:
    """What the manager holds after a replay (the keys excepted: they are the engine's), per
    block of capacity."""
    gc.collect()
    tracemalloc.start()
    manager = make(capacity)
    for request in keys:
        step(manager, request)
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del manager
    return size / capacity


def measure(keys, capacities: Sequence[int], repeats: int, vllm) -> list[dict]:
    references = sum(map(len, keys))
    rows = []
    for capacity in capacities:
        cases = runners(vllm)
        best = dict.fromkeys(cases, float("inf"))
        hits = {}
        for _ in range(repeats):
            for case, (make, step) in cases.items():
                seconds, hits[case] = replay_seconds(make, step, keys, capacity)
                best[case] = min(best[case], seconds)
        for case, (make, step) in cases.items():
            rows.append(
                {
                    "manager": case[0],
                    "policy": case[1],
                    "capacity": capacity,
                    "us_per_reference": best[case] * 1e6 / references,
                    "ratio_to_vllm_lru": best[case] / best[BASELINE],
                    "hits": hits[case],
                    "hit_ratio": hits[case] / references,
                    "bytes_per_cached_block": bytes_per_block(make, step, keys, capacity),
                }
            )
    return rows


def format_table(rows: list[dict]) -> str:
    capacities = list(dict.fromkeys(row["capacity"] for row in rows))
    by_case = {(row["manager"], row["policy"], row["capacity"]): row for row in rows}
    header = "| manager | policy | " + " | ".join(
        f"{c:,}: us/ref | x vLLM LRU | hit ratio | B/block" for c in capacities
    )
    lines = [header + " |", "|---|---|" + "---|---|---|---|" * len(capacities)]
    for manager, policy in dict.fromkeys((row["manager"], row["policy"]) for row in rows):
        cells = []
        for capacity in capacities:
            row = by_case[manager, policy, capacity]
            cells.append(
                f"{row['us_per_reference']:.2f} | {row['ratio_to_vllm_lru']:.2f} | "
                f"{row['hit_ratio']:.4f} | {row['bytes_per_cached_block']:,.0f}"
            )
        lines.append(f"| {manager} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default="mooncake_conversation")
    parser.add_argument("--capacities", default="2000,10000,40000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/manager_vs_vllm.json")
    args = parser.parse_args(argv)
    try:
        import vllm_baseline as vllm
    except ImportError as error:
        print(f"skipped: vLLM is not importable here ({error}); install it to compare")
        return 0
    chains = read_hash_chains(args.trace)
    keys = vllm.offload_chains(chains)
    capacities = [int(c) for c in args.capacities.split(",")]
    rows = measure(keys, capacities, args.repeats, vllm)
    print(
        f"{args.trace}: {len(keys):,} requests, {sum(map(len, keys)):,} block references; "
        f"best of {args.repeats}, CPU time of this process"
    )
    print(format_table(rows))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"trace": args.trace, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
