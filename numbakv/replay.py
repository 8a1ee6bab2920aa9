"""Replay a request trace through the manager and report its hit ratio.

    python -m numbakv.replay [TRACE] --policy lru --capacity 10000 [--json]
    python -m numbakv.replay TRACE --policy lru,arc,sarc --capacity 16GiB,64GiB --block-bytes N \
        [--plot hit_ratio.png] [--json]

Each request is looked up, touched, and its missing tail stored (docs/MANAGER.md, "Replay"). Without a
TRACE a built-in multi-turn chat workload is replayed. `--policy belady` replays Belady's MIN, the
clairvoyant bound. With several policies or capacities (or --plot) the CLI plans capacity: it prints a table of
hit ratios (Belady's row on top), optionally plots them, and `--json` ends with one object
`{"runs": [...]}` holding every run's result.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tqdm import tqdm

from numbakv.belady import belady_hits
from numbakv.manager import CPUOffloadingManager
from numbakv.policies import POLICIES, resolve_policy
from numbakv.traces import TraceError, read_hash_chains
from numbakv.workloads import multi_turn_chat

BELADY = "belady"  # replay-only: the clairvoyant reference, not a policy of the manager


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    capacity: int
    requests: int
    references: int
    hits: int
    hit_ratio: float
    evictions: int
    stores_skipped: int
    block_operations: int
    seconds: float

    @property
    def block_operations_per_second(self) -> float:
        return self.block_operations / self.seconds if self.seconds > 0 else float("inf")


def replay_request(manager: CPUOffloadingManager, chain: Sequence[int]) -> tuple[int, int]:
    """One request under the trace's replay semantics: look it up, touch it, store its missing
    tail. Returns (blocks hit, blocks stored)."""
    hits = manager.lookup(chain)
    manager.touch(chain)
    output = manager.prepare_store(chain[hits:])
    if output is None:
        return hits, 0
    manager.complete_store(output.block_hashes_to_store)
    return hits, len(output.block_hashes_to_store)


def replay(
    chains: Sequence[Sequence[int]],
    policy: str = "lru",
    capacity: int = 10_000,
    store_threshold: int = 1,
    progress: bool = False,
) -> ReplayResult:
    """Replay the chains in order, one request at a time, through a fresh manager.

    `policy="belady"` replays Belady's MIN instead (clairvoyant; no manager involved).
    """
    if policy == BELADY:
        return _replay_belady(chains, capacity)
    manager = CPUOffloadingManager(
        block_size=1, num_blocks=capacity, cache_policy=policy, store_threshold=store_threshold
    )
    block_operations = 0
    started = time.perf_counter()
    for chain in tqdm(chains, disable=not progress, unit="req", leave=False):
        hits, stored = replay_request(manager, chain)
        block_operations += 2 * len(chain) + len(chain) - hits + stored
    seconds = time.perf_counter() - started
    stats = manager.stats()
    references = stats.hit_blocks + stats.missed_blocks
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        requests=len(chains),
        references=references,
        hits=stats.hit_blocks,
        hit_ratio=stats.hit_blocks / references if references else 0.0,
        evictions=stats.evicted_blocks,
        stores_skipped=stats.stores_skipped,
        block_operations=block_operations,
        seconds=seconds,
    )


def _replay_belady(chains: Sequence[Sequence[int]], capacity: int) -> ReplayResult:
    started = time.perf_counter()
    hits, references, evictions = belady_hits(chains, capacity)
    return ReplayResult(
        policy=BELADY,
        capacity=capacity,
        requests=len(chains),
        references=references,
        hits=hits,
        hit_ratio=hits / references if references else 0.0,
        evictions=evictions,
        stores_skipped=0,
        block_operations=references,
        seconds=time.perf_counter() - started,
    )


def replay_grid(
    chains: Sequence[Sequence[int]],
    policies: Sequence[str],
    capacities: Sequence[int],
    store_threshold: int = 1,
    progress: bool = False,
) -> list[ReplayResult]:
    """One replay per policy and capacity, policy by policy, capacities in the order given."""
    return [
        replay(chains, policy, capacity, store_threshold, progress)
        for policy in policies
        for capacity in capacities
    ]


BYTE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_capacity(text: str, block_bytes: int | None = None) -> int:
    """Blocks from `10000`, or from a byte size such as `64GiB` or `1.5TB` given `block_bytes`."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"bad capacity {text!r}: expected blocks (10000) or a size (64GiB)")
    number, unit = match.groups()
    if not unit:
        if "." in number:
            raise ValueError(f"bad capacity {text!r}: a number of blocks must be whole")
        blocks = int(number)
    else:
        if unit.upper() not in BYTE_UNITS:
            raise ValueError(
                f"bad capacity {text!r}: unit {unit!r} is not one of {', '.join(BYTE_UNITS)}"
            )
        if block_bytes is None:
            raise ValueError(f"capacity {text!r} is in bytes: give --block-bytes too")
        blocks = int(float(number) * BYTE_UNITS[unit.upper()]) // block_bytes
    if blocks < 1:
        raise ValueError(f"capacity {text!r} is less than one block")
    return blocks


def format_table(results: Sequence[ReplayResult]) -> str:
    """Hit ratios, one row per policy and one column per capacity, then seconds per reference."""
    policies = list(dict.fromkeys(result.policy for result in results))
    capacities = list(dict.fromkeys(result.capacity for result in results))
    by_run = {(result.policy, result.capacity): result for result in results}
    width = max(10, *(len(f"{capacity:,}") + 2 for capacity in capacities))
    name_width = max(8, *(len(policy) for policy in policies)) + 2
    lines = [
        "hit ratio by capacity (blocks)",
        "policy".ljust(name_width)
        + "".join(f"{capacity:,}".rjust(width) for capacity in capacities)
        + "us/ref".rjust(9),
    ]
    for policy in policies:
        runs = [by_run[policy, capacity] for capacity in capacities if (policy, capacity) in by_run]
        seconds = sum(run.seconds for run in runs)
        references = sum(run.references for run in runs)
        cells = "".join(
            f"{by_run[policy, capacity].hit_ratio:.4f}".rjust(width)
            if (policy, capacity) in by_run
            else "-".rjust(width)
            for capacity in capacities
        )
        lines.append(
            policy.ljust(name_width) + cells + f"{1e6 * seconds / max(references, 1):9.2f}"
        )
    return "\n".join(lines)


def plot_hit_ratios(results: Sequence[ReplayResult], path: str, title: str = "") -> None:
    """Write a PNG of hit ratio against capacity, one line per policy (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'numbakv[plot]' (or pip install matplotlib)"
        ) from None
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    for policy in dict.fromkeys(result.policy for result in results):
        runs = sorted((r for r in results if r.policy == policy), key=lambda r: r.capacity)
        style = {"color": "black", "linestyle": "--"} if policy == BELADY else {}
        axes.plot(
            [run.capacity for run in runs],
            [run.hit_ratio for run in runs],
            marker="o",
            markersize=3,
            label=policy,
            **style,
        )
    axes.set_xscale("log")
    axes.set_xlabel("capacity (blocks)")
    axes.set_ylabel("hit ratio (block references)")
    axes.set_ylim(bottom=0)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    if title:
        axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print the usage block too
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="numbakv-replay",
        description="Replay a Mooncake-format trace through the offloading manager.",
    )
    parser.add_argument(
        "trace", nargs="?", help="jsonl trace (default: a built-in multi-turn chat workload)"
    )
    parser.add_argument(
        "--policy",
        type=_names,
        default=["lru"],
        help="registered name, module:Class, or belady; several separated by commas (default lru)",
    )
    parser.add_argument(
        "--capacity",
        type=_names,
        default=["10000"],
        help="host blocks, or bytes with a unit (64GiB) and --block-bytes; comma-separated list",
    )
    parser.add_argument(
        "--block-bytes", type=_positive, help="bytes of one KV block, for capacities in bytes"
    )
    parser.add_argument("--plot", metavar="PNG", help="plot hit ratio against capacity to a PNG")
    parser.add_argument(
        "--store-threshold", type=_positive, default=1, help="admit a block after N sightings"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON object on stdout")
    parser.add_argument(
        "--list-policies", action="store_true", help="print the registered policies"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_policies:
        print("\n".join(POLICIES))
        return 0
    try:
        capacities = [parse_capacity(text, args.block_bytes) for text in args.capacity]
        policies = args.policy
        for policy in policies:
            if policy != BELADY:
                try:
                    resolve_policy(policy)
                except ValueError as error:
                    raise ValueError(f"{error}, or {BELADY!r} (replays only)") from None
        if not policies or not capacities:
            raise ValueError("give at least one policy and one capacity")
        chains = (
            read_hash_chains(args.trace)
            if args.trace
            else [request.hash_ids for request in multi_turn_chat()]
        )
        source = args.trace or "built-in multi-turn chat workload"
        if len(policies) == 1 and len(capacities) == 1 and not args.plot:
            result = replay(
                chains,
                policy=policies[0],
                capacity=capacities[0],
                store_threshold=args.store_threshold,
                progress=sys.stderr.isatty(),
            )
        else:
            if BELADY not in policies:
                policies = [BELADY, *policies]
            results = replay_grid(
                chains, policies, capacities, args.store_threshold, sys.stderr.isatty()
            )
            print(f"trace  {source}")
            print(format_table(results))
            if args.plot:
                plot_hit_ratios(results, args.plot, title=source.rsplit("/", 1)[-1])
                print(f"plot   {args.plot}")
            if args.json:
                print(json.dumps({"runs": [asdict(result) for result in results]}))
            return 0
    except (TraceError, ValueError, TypeError, RuntimeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(f"trace           {source}")
    print(f"policy          {result.policy}, capacity {result.capacity:,} blocks")
    print(
        f"hit ratio       {result.hit_ratio:.4f}  ({result.hits:,} of {result.references:,} block references)"
    )
    print(f"evictions       {result.evictions:,}")
    print(f"stores skipped  {result.stores_skipped:,}")
    print(
        f"speed           {result.block_operations_per_second:,.0f} block operations/s "
        f"({result.requests:,} requests in {result.seconds:.2f} s)"
    )
    if args.json:
        print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
