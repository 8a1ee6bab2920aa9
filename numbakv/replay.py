"""Replay a request trace through the manager and report its hit ratio.

    python -m numbakv.replay [TRACE] --policy lru --capacity 10000 [--json]

Each request is looked up, touched, and its missing tail stored (docs/MANAGER.md, "Replay").
Without a TRACE a built-in multi-turn chat workload is replayed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tqdm import tqdm

from numbakv.manager import CPUOffloadingManager
from numbakv.policies import POLICIES
from numbakv.traces import TraceError, read_hash_chains
from numbakv.workloads import multi_turn_chat


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


def replay(
    chains: Sequence[Sequence[int]],
    policy: str = "lru",
    capacity: int = 10_000,
    store_threshold: int = 1,
    progress: bool = False,
) -> ReplayResult:
    """Replay the chains in order, one request at a time, through a fresh manager."""
    manager = CPUOffloadingManager(
        block_size=1, num_blocks=capacity, cache_policy=policy, store_threshold=store_threshold
    )
    block_operations = 0
    started = time.perf_counter()
    for chain in tqdm(chains, disable=not progress, unit="req", leave=False):
        hits = manager.lookup(chain)
        manager.touch(chain)
        output = manager.prepare_store(chain[hits:])
        if output is not None:
            manager.complete_store(output.block_hashes_to_store)
            block_operations += len(output.block_hashes_to_store)
        block_operations += 2 * len(chain) + len(chain) - hits
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


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="numbakv-replay",
        description="Replay a Mooncake-format trace through the offloading manager.",
    )
    parser.add_argument(
        "trace", nargs="?", help="jsonl trace (default: a built-in multi-turn chat workload)"
    )
    parser.add_argument(
        "--policy", default="lru", help="registered name or module:Class (default lru)"
    )
    parser.add_argument(
        "--capacity", type=_positive, default=10_000, help="host blocks (default 10000)"
    )
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
        chains = (
            read_hash_chains(args.trace)
            if args.trace
            else [request.hash_ids for request in multi_turn_chat()]
        )
        result = replay(
            chains,
            policy=args.policy,
            capacity=args.capacity,
            store_threshold=args.store_threshold,
            progress=sys.stderr.isatty(),
        )
    except (TraceError, ValueError, TypeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    source = args.trace or "built-in multi-turn chat workload"
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
