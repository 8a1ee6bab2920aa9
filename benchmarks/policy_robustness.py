"""Where sarc loses to the better of LRU and ARC, on generated traffic nobody tuned it to.

    python benchmarks/policy_robustness.py [--workloads 24] [--seed 0] [--out results/policy_robustness.json]
    python benchmarks/policy_robustness.py --smoke   # three tiny workloads, seconds

Draws workloads from `numbakv.workloads` with random parameters (`DRAWS`: session length, number of
shared prompts, document library size and popularity, traffic mix), replays LRU, ARC and sarc on
each at every capacity, and prints sarc's hits minus the better of the other two. A draw is
reproducible from (--seed, its index). One process per core.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from numbakv.tools.replay.core import replay_grid
from numbakv.tools.workloads.core import WORKLOADS

CAPACITIES = (1000, 2000, 5000, 10_000, 20_000, 30_000, 40_000)
RIVALS = ("lru", "arc")
# The menus each parameter is drawn from; `chat` for a third of the draws, `mixed` for the rest.
DRAWS = {
    "chat": {
        "sessions": (800, 1500, 3000),
        "system_prompts": (2, 8, 32),
        "mean_turns": (1.5, 3, 6, 12),
    },
    "mixed": {
        "system_prompts": (4, 16, 64),
        "documents": (500, 3000, 10_000),
        "zipf_exponent": (0.7, 0.9, 1.1, 1.3),
        "session_share": (0.1, 0.3, 0.5, 0.7),
        "document_share": (0.0, 0.1, 0.3),
        "mean_turns": (2, 5, 10),
    },
}
MIXED_REQUESTS = 8000
SMOKE = {"workloads": 3, "capacities": (50, 200), "sessions": 40, "requests": 200}


def draw(
    seed: int, index: int, sessions: int | None = None, requests: int = MIXED_REQUESTS
) -> tuple[str, dict]:
    """The `index`-th workload of `seed`: (kind, generator parameters)."""
    rng = np.random.default_rng([seed, index])
    kind = "chat" if rng.random() < 1 / 3 else "mixed"
    params = {name: menu[int(rng.integers(len(menu)))] for name, menu in DRAWS[kind].items()}
    if kind == "chat" and sessions is not None:
        params["sessions"] = sessions
    if kind == "mixed":
        params["requests"] = requests
        # Leave at least 10% one-off prompts.
        params["document_share"] = round(
            min(params["document_share"], 0.9 - params["session_share"]), 2
        )
    params["seed"] = index
    return kind, params


def margins(job: tuple[str, dict, tuple[int, ...]]) -> dict:
    """Replay one workload; sarc's hits minus the better rival's, per capacity."""
    kind, params, capacities = job
    chains = [request.hash_ids for request in WORKLOADS[kind](**params)]
    results = replay_grid(chains, (*RIVALS, "sarc"), capacities)
    hits = {(result.policy, result.capacity): result.hits for result in results}
    margins = {
        str(capacity): hits["sarc", capacity] - max(hits[rival, capacity] for rival in RIVALS)
        for capacity in capacities
    }
    return {"kind": kind, "params": params, "references": sum(map(len, chains)), "margins": margins}


def run(
    workloads: int,
    seed: int,
    capacities: tuple[int, ...],
    out: Path | None,
    sessions: int | None = None,
    requests: int = MIXED_REQUESTS,
) -> dict:
    jobs = [(*draw(seed, index, sessions, requests), capacities) for index in range(workloads)]
    with ProcessPoolExecutor() as pool:  # one process per core
        rows = list(pool.map(margins, jobs))
    print(f"sarc's hits minus the better of {' and '.join(RIVALS)}, seed {seed}")
    print(f"{'#':>3} {'kind':6} {'references':>10} " + " ".join(f"{c:>8,}" for c in capacities))
    for index, row in enumerate(rows):
        cells = " ".join(f"{row['margins'][str(c)]:>+8,}" for c in capacities)
        print(f"{index:>3} {row['kind']:6} {row['references']:>10,} {cells}  {row['params']}")
    losses = [
        (margin / row["references"], index)
        for index, row in enumerate(rows)
        for margin in row["margins"].values()
        if margin < 0
    ]
    summary = {
        "workloads_with_a_loss": len({index for _, index in losses}),
        "losing_cells": len(losses),
        "cells": len(rows) * len(capacities),
        "worst_loss_points": round(100 * min(losses)[0], 3) if losses else 0.0,
    }
    print(
        f"{summary['workloads_with_a_loss']} of {len(rows)} workloads lose somewhere; "
        f"{summary['losing_cells']} of {summary['cells']} cells; "
        f"worst {summary['worst_loss_points']} points of hit ratio"
    )
    report = {"seed": seed, "capacities": list(capacities), "rows": rows, "summary": summary}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/policy_robustness.json"))
    parser.add_argument("--smoke", action="store_true", help="tiny workloads and caches")
    args = parser.parse_args()
    if args.smoke:
        run(seed=args.seed, out=args.out, **SMOKE)
    else:
        run(args.workloads, args.seed, CAPACITIES, args.out)


if __name__ == "__main__":
    main()
