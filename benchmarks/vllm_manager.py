"""numbakv's spec against vLLM 0.32's own CPU offloading manager, driven as vLLM's connector drives it.

    python benchmarks/vllm_manager.py [--trace TRACE] [--capacities 2000,10000,40000] \
        [--policies lru,arc,sarc,s3fifo,sieve] [--store-thresholds 1,2] [--repeats 3] \
        [--positions] [--out results/vllm_manager.json]

Every request makes the calls vLLM 0.32's OffloadingConnector makes of a manager, one request at
a time (`vllm_baseline.replay_request`: begin, look up key by key to the first miss, load the
hits, store the rest, finish). Two sides, each policy at each capacity and `store_threshold`:
vLLM's `CPUOffloadingManager` (its own LRU and ARC; numbakv's sarc, S3-FIFO and SIEVE as vLLM
`CachePolicy`s from `numbakv.integrations.vllm.policies`), and numbakv's manager as
`NumbaKVOffloadingSpec` builds it in vLLM's scheduler (`build_scheduler_manager`). Printed and
written: hit ratios, keys stored, CPU time per key reference (best of --repeats, every manager
taking turns in one process; time.process_time, which leaves out the time the process waits for a
core on a shared machine) and its ratio to vLLM's LRU at the same threshold. Checked: with
LRU and ARC numbakv hits and stores exactly as vLLM does (exit status 1 where it does not).
Without --trace, numbakv's built-in chat workload. `--positions` gives each request's context its
keys' token positions, as vLLM's connector records them: vLLM 0.33's LRU (and numbakv's under 0.33)
ranks a running request by them. Needs vLLM (docs/VLLM.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from vllm import __version__ as vllm_version
from vllm.v1.kv_offload.base import OffloadingManager, OffloadKey
from vllm_baseline import offload_chains, replay_request, vllm_manager

from numbakv.integrations.vllm.config import Settings
from numbakv.integrations.vllm.scheduler import NumbaKVOffloadingManager
from numbakv.integrations.vllm.spec import build_scheduler_manager
from numbakv.tools.traces import read_hash_chains
from numbakv.tools.workloads.core import multi_turn_chat

SIDES = ("vllm", "numbakv")
VLLMS_OWN = ("lru", "arc")  # the policies vLLM ships: numbakv must answer as they do


class Totals(NamedTuple):
    hits: int
    stored: int


def connector_replay(
    manager: OffloadingManager, chains: Sequence[Sequence[OffloadKey]], positions: bool = False
) -> Totals:
    """Every request in order through `manager`, as vLLM's connector drives it."""
    hits = stored = 0
    for i, keys in enumerate(chains):
        hit, store = replay_request(manager, keys, str(i), positions)
        hits += hit
        stored += store
    return Totals(hits, stored)


def numbakv_manager(
    policy: str, capacity: int, store_threshold: int = 1
) -> NumbaKVOffloadingManager:
    """numbakv's manager of `capacity` chunks, as its spec builds it from these settings."""
    settings = Settings.from_extra_config(
        {
            "cpu_bytes_to_use": capacity,
            "eviction_policy": policy,
            "store_threshold": store_threshold,
        }
    )
    return build_scheduler_manager(settings, capacity, block_size=1, enable_events=False)


BUILDERS = {"vllm": vllm_manager, "numbakv": numbakv_manager}


class Case(NamedTuple):
    side: str
    policy: str
    store_threshold: int


def measure(
    chains, capacity: int, cases: Sequence[Case], repeats: int, positions: bool
) -> dict[Case, dict]:
    """Best-of-`repeats` CPU seconds, hits and keys stored of every case, taking turns."""
    results: dict[Case, dict] = {}
    for _ in range(repeats):
        for case in cases:
            manager = BUILDERS[case.side](case.policy, capacity, case.store_threshold)
            gc.collect()
            started = time.process_time()
            totals = connector_replay(manager, chains, positions)
            seconds = time.process_time() - started
            best = results.setdefault(case, {"seconds": seconds, **totals._asdict()})
            best["seconds"] = min(best["seconds"], seconds)
    return results


def rows_of(results: dict[Case, dict], capacity: int, references: int) -> list[dict]:
    """One row per case, with its time relative to vLLM's LRU at the same threshold."""
    rows = []
    for case, r in results.items():
        baseline = results.get(Case("vllm", "lru", case.store_threshold))
        rows.append(
            {
                "capacity": capacity,
                **case._asdict(),
                **r,
                "hit_ratio": r["hits"] / references,
                "ns_per_reference": 1e9 * r["seconds"] / references,
                "ratio_to_vllm_lru": r["seconds"] / baseline["seconds"] if baseline else None,
            }
        )
    return rows


def check(rows: list[dict]) -> list[str]:
    """Where numbakv's LRU or ARC parts from vLLM's: they must hit and store exactly as vLLM's, at
    every threshold (numbakv's own policies differ in when a request counts: docs/VLLM.md)."""
    by_case = {(r["capacity"], r["store_threshold"], r["policy"], r["side"]): r for r in rows}
    problems = []
    for (capacity, threshold, policy, side), numbakv in by_case.items():
        vllm = by_case.get((capacity, threshold, policy, "vllm"))
        if side != "numbakv" or policy not in VLLMS_OWN or vllm is None:
            continue
        if (numbakv["hits"], numbakv["stored"]) != (vllm["hits"], vllm["stored"]):
            problems.append(
                f"{policy} at {capacity:,} chunks, store_threshold {threshold}: numbakv hits "
                f"{numbakv['hits']:,} and stores {numbakv['stored']:,}, "
                f"vLLM {vllm['hits']:,} and {vllm['stored']:,}"
            )
    return problems


def format_table(rows: list[dict]) -> str:
    """A markdown table: per capacity, threshold and policy, both sides side by side."""
    by_case = {(r["capacity"], r["store_threshold"], r["policy"], r["side"]): r for r in rows}
    lines = [
        "| chunks | store_threshold | policy | hit ratio: vLLM / numbakv | hits, numbakv - vLLM | "
        + "stored: vLLM / numbakv | ns/ref: vLLM / numbakv | x vLLM LRU: vLLM / numbakv |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for capacity, threshold, policy in dict.fromkeys(key[:3] for key in by_case):
        vllm, numbakv = (by_case[capacity, threshold, policy, side] for side in SIDES)
        lines.append(
            f"| {capacity:,} | {threshold} | {policy} "
            f"| {vllm['hit_ratio']:.4f} / {numbakv['hit_ratio']:.4f} "
            f"| {numbakv['hits'] - vllm['hits']:+,} "
            f"| {vllm['stored']:,} / {numbakv['stored']:,} "
            f"| {vllm['ns_per_reference']:,.0f} / {numbakv['ns_per_reference']:,.0f} "
            f"| {_ratio(vllm)} / {_ratio(numbakv)} |"
        )
    return "\n".join(lines)


def _ratio(row: dict) -> str:
    return "-" if row["ratio_to_vllm_lru"] is None else f"{row['ratio_to_vllm_lru']:.2f}"


def _integers(text: str) -> list[int]:
    return [int(item) for item in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="Mooncake-format jsonl trace or its shipped name")
    parser.add_argument("--capacities", type=_integers, default=[2000, 10000, 40000])
    parser.add_argument("--policies", default="lru,arc,sarc,s3fifo,sieve")
    parser.add_argument("--store-thresholds", type=_integers, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--positions", action="store_true", help="requests know their keys' token positions"
    )
    parser.add_argument("--out", default="results/vllm_manager.json")
    args = parser.parse_args(argv)
    if args.trace:
        source, chains = args.trace, read_hash_chains(args.trace)
    else:
        source, chains = "built-in chat", [r.hash_ids for r in multi_turn_chat()]
    chains = offload_chains(chains)
    references = sum(map(len, chains))
    print(
        f"{source}: {len(chains):,} requests, {references:,} key references, vLLM "
        f"{vllm_version}, positions {'on' if args.positions else 'off'}; "
        f"best of {args.repeats} CPU times"
    )
    cases = [
        Case(side, policy, threshold)
        for threshold in args.store_thresholds
        for policy in args.policies.split(",")
        for side in SIDES
    ]
    rows = []
    for capacity in args.capacities:
        results = measure(chains, capacity, cases, args.repeats, args.positions)
        rows += rows_of(results, capacity, references)
    print(format_table(rows))
    problems = check(rows)
    print("\n".join(problems) or "numbakv's LRU and ARC hit and store exactly as vLLM's")
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
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
