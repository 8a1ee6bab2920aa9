"""`python3 -m numbakv.replay`: replay a request trace through the manager and report its hit
ratio, or plan capacity.

    python3 -m numbakv.replay [TRACE] --policy lru --capacity 10000 [--json]
    python3 -m numbakv.replay TRACE --policy lru,sarc --capacity 64GiB,256GiB --block-bytes 64MiB \
        [--plot hit_ratio.png] [--json]

Each request is looked up, touched, and its missing tail stored (docs/MANAGER.md, "Replay"). TRACE
is a Mooncake-format jsonl file or the shipped sample `mooncake_conversation`; without one a
built-in multi-turn chat workload is replayed. With several policies or capacities (or --plot) it
plans capacity: a table of hit ratios by capacity, in the unit the capacities were given in, and
optionally a plot. `--policy belady` adds Belady's MIN, the clairvoyant bound. `--json` prints one
JSON document on stdout and the human-readable text on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from numbakv.checks import whole_bytes
from numbakv.policies import POLICIES, resolve_policy
from numbakv.tools.cli import (
    Interrupted,
    Parser,
    comma_list,
    interrupted,
    missing_extra,
    output_file,
    positive_int,
    print_hit_ratio,
    print_json,
    print_runs_json,
)
from numbakv.tools.fleet.command import add_fleet_arguments, check_fleet, run_fleet, wants_fleet
from numbakv.tools.replay.belady import BELADY, first_prefix_conflict
from numbakv.tools.replay.core import ReplayResult, replay_grid
from numbakv.tools.replay.planning import (
    BELADY_NOTE,
    Capacity,
    bytes_label,
    format_table,
    parse_capacity,
    plot_hit_ratios,
)
from numbakv.tools.traces import SAMPLE_TRACES, TraceError, check_trace, read_hash_chains
from numbakv.tools.ttft_profile import (
    add_ttft_arguments,
    read_profile,
    report_worth,
    with_worth,
)
from numbakv.tools.workloads.core import multi_turn_chat

PLOT_FORMATS = (".png", ".svg", ".pdf")
BUILT_IN = "built-in multi-turn chat workload"


def _policy_names() -> str:
    return ", ".join(POLICIES) + f", {BELADY} (replay only: the clairvoyant bound)"


def _parser() -> Parser:
    samples = ", ".join(SAMPLE_TRACES)
    parser = Parser(
        prog="numbakv-replay",
        description="Replay a Mooncake-format trace through the offloading manager and report "
        "its hit ratio; with several policies or capacities, a capacity-planning table.",
    )
    parser.add_argument(
        "trace",
        nargs="?",
        metavar="TRACE",
        help=f"jsonl trace file, or the name of a shipped sample ({samples}) "
        "(default: a built-in multi-turn chat workload)",
    )
    parser.add_argument(
        "--requests",
        type=positive_int,
        metavar="N",
        help="replay only the first N requests of the trace (default: all)",
    )
    parser.add_argument(
        "--policy",
        default="lru",
        help=f"cache policies, comma-separated: {_policy_names()}, "
        "or an import path module:Class (default: %(default)s)",
    )
    parser.add_argument(
        "--capacity",
        default="10000",
        help="host capacities, comma-separated: blocks (10000) or sizes with a unit (64GiB, 1.5TB; "
        "needs --block-bytes) (default: %(default)s)",
    )
    parser.add_argument(
        "--block-bytes",
        type=_block_bytes,
        metavar="SIZE",
        help="bytes of one KV block, all layers, K and V, for capacities given as sizes: "
        "2097152 or 2MiB (default: none)",
    )
    parser.add_argument(
        "--store-threshold",
        type=positive_int,
        default=1,
        metavar="N",
        help="store a block only once it has been offered for storing N times (vLLM's "
        "store_threshold; default: %(default)s)",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE",
        type=output_file,
        help="draw hit ratio against capacity to FILE (.png, .svg or .pdf; needs the 'plot' "
        "extra) (default: no plot)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document on stdout, the human-readable text on stderr "
        "(default: text on stdout)",
    )
    parser.add_argument(
        "--list-policies", action="store_true", help="list the policies --policy accepts and exit"
    )
    add_ttft_arguments(parser)
    add_fleet_arguments(parser)
    return parser


def _block_bytes(text: str) -> int:
    try:
        return whole_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@dataclass(frozen=True)
class _Plan:
    """What the arguments ask for, every one checked."""

    trace: Path | None
    policies: list[str]
    capacities: list[Capacity]


def _check(parser: Parser, args: argparse.Namespace) -> _Plan:
    policies = comma_list(parser, "--policy", args.policy)
    for policy in policies:
        if policy == BELADY:
            continue
        try:
            resolve_policy(policy)
        except (ValueError, TypeError) as error:
            if ":" in policy:
                parser.error(f"argument --policy: {error}")
            parser.bad("--policy", policy, f"one of {_policy_names()}, or module:Class")
    capacities: dict[int, Capacity] = {}
    for text in comma_list(parser, "--capacity", args.capacity):
        try:
            capacity = parse_capacity(text, args.block_bytes)
        except ValueError as error:
            parser.error(f"argument --capacity: {error}")
        capacities.setdefault(capacity.blocks, capacity)
    if len({bool(capacity.unit) for capacity in capacities.values()}) > 1:
        parser.bad("--capacity", args.capacity, "all in blocks or all as sizes, not a mix")
    if args.plot:
        if Path(args.plot).suffix.lower() not in PLOT_FORMATS:
            parser.bad("--plot", args.plot, f"a file name ending in {', '.join(PLOT_FORMATS)}")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            missing_extra(parser.prog, "--plot", "plot")
    trace = None
    if args.trace is not None:
        try:
            trace = check_trace(args.trace)
        except TraceError as error:
            parser.error(f"argument TRACE: {error}")
    return _Plan(trace, policies, list(capacities.values()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_policies:
        _list_policies(args.json)
        return 0
    plan = _check(parser, args)
    profile = read_profile(parser, args)
    fleet = (
        check_fleet(parser, args, plan.policies, plan.capacities)
        if wants_fleet(parser, args)
        else None
    )
    text = sys.stderr if args.json else sys.stdout
    source = args.trace or BUILT_IN
    try:
        if plan.trace is not None:
            chains = read_hash_chains(plan.trace, progress=True)
        else:
            chains = [request.hash_ids for request in multi_turn_chat()]
        total = len(chains)
        chains = chains[: args.requests]
    except TraceError as error:
        parser.exit(2, f"{parser.prog}: error: argument TRACE: {error}\n")
    except KeyboardInterrupt:
        return interrupted(parser.prog, "while reading the trace; nothing was replayed")
    conflict = first_prefix_conflict(chains) if BELADY in plan.policies else None
    if conflict is not None:
        request, position = conflict
        parser.exit(
            2,
            f"{parser.prog}: error: argument --policy: belady is a bound only where each block id "
            f"implies its prefix; in request {request + 1:,}, id {chains[request][position]} "
            f"(position {position}) follows another prefix than before\n",
        )
    if fleet is not None:
        return run_fleet(parser, args, fleet, chains, source, total, profile)
    status = 0
    request_hits: list | None = None if profile is None else []
    try:
        results = replay_grid(
            chains,
            plan.policies,
            [c.blocks for c in plan.capacities],
            args.store_threshold,
            True,
            request_hits,
        )
    except Interrupted as cut_short:
        results = cut_short.results
        runs = len(plan.policies) * len(plan.capacities)
        status = interrupted(parser.prog, _partial(results, runs, len(chains)))
        if not results:
            return status
    first = f"the first {len(chains):,} of " if len(chains) < total else ""
    print(f"trace           {source} ({first}{total:,} requests)", file=text)
    single = len(plan.policies) == 1 and len(plan.capacities) == 1 and not args.plot
    if single:
        _print_run(results[0], plan.capacities[0], args.block_bytes, len(chains), text)
    else:
        table = format_table(results, plan.policies, plan.capacities, args.block_bytes, len(chains))
        print(table, file=text)
    by_blocks = {capacity.blocks: capacity for capacity in plan.capacities}
    labels = [f"{r.policy} at {by_blocks[r.capacity].label}" for r in results]
    worth = report_worth(profile, chains, request_hits, args.block_tokens, labels, text)
    if args.plot and not status:
        plot_hit_ratios(results, plan.capacities, args.plot, title=Path(source).name)
        print(f"plot            {args.plot}", file=text)
    if args.json:
        runs = [
            _run_json(result, by_blocks[result.capacity], args.block_bytes) for result in results
        ]
        runs = with_worth(runs, worth)
        print_runs_json(runs, source, bool(status), single)
    return status


def _partial(results: list[ReplayResult], runs: int, requests: int) -> str:
    """What an interrupted replay leaves: `after 2 of 6 runs; lru at 100 blocks stopped ...`."""
    done = sum(result.requests == requests for result in results)
    text = f"after {done} of {runs} runs"
    if results and results[-1].requests < requests:
        cut = results[-1]
        text += (
            f"; {cut.policy} at {cut.capacity:,} blocks stopped after {cut.requests:,} of "
            f"{requests:,} requests, its figures are partial"
        )
    return text


def _print_run(
    result: ReplayResult, capacity: Capacity, block_bytes: int | None, requests: int, out: TextIO
) -> None:
    policy = f"{BELADY_NOTE}" if result.policy == BELADY else result.policy
    size = f"{capacity.label}: " if capacity.unit else ""
    of = f" of {bytes_label(block_bytes)}" if block_bytes else ""
    print(f"policy          {policy}", file=out)
    blocks = "block" if result.capacity == 1 else "blocks"
    print(f"capacity        {size}{result.capacity:,} {blocks}{of}", file=out)
    print_hit_ratio(result, requests, out)
    print(f"evictions       {result.evictions:,}", file=out)
    print(f"stores skipped  {result.stores_skipped:,}", file=out)
    print(
        f"speed           {result.block_operations_per_second:,.0f} block operations/s "
        f"({result.requests:,} requests in {result.seconds:.2f} s)",
        file=out,
    )


def _run_json(result: ReplayResult, capacity: Capacity, block_bytes: int | None) -> dict:
    run = asdict(result)
    if capacity.unit:
        run["capacity_size"] = capacity.label
    if block_bytes:
        run["block_bytes"] = block_bytes
        run["capacity_bytes"] = result.capacity * block_bytes
    return run


def _list_policies(as_json: bool) -> None:
    policies = [
        {"name": name, "replay_only": False, "about": (cls.__doc__ or "").strip().split("\n")[0]}
        for name, cls in POLICIES.items()
    ]
    policies.append(
        {
            "name": BELADY,
            "replay_only": True,
            "about": "Belady's MIN, the clairvoyant bound: it knows every future request",
        }
    )
    if as_json:
        print_json({"policies": policies})
        return
    width = max(len(policy["name"]) for policy in policies) + 2
    for policy in policies:
        mark = " [replay only]" if policy["replay_only"] else ""
        print(f"{policy['name']:<{width}}{policy['about']}{mark}")
