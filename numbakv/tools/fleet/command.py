"""`python3 -m numbakv.replay --engines N`: the replay command's fleet options, their checks and
the fleet's report (numbakv.tools.replay.command hands over to it when one is given).

    python3 -m numbakv.replay TRACE --engines 4 --capacity 64GiB --disk-capacity 0,2TB \
        --shared-capacity 0,1TB --block-bytes 64MiB [--route session|round-robin] \
        [--tiering demote,write-through] [--lower-policy NAME] [--plot fleet.png] [--json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from numbakv.cascade import TIERINGS
from numbakv.policies import resolve_policy
from numbakv.tools.cli import (
    Interrupted,
    Parser,
    comma_list,
    interrupted,
    positive_int,
    print_hit_ratio,
    print_runs_json,
)
from numbakv.tools.fleet.core import FleetConfig, FleetResult, fleet_grid
from numbakv.tools.fleet.planning import (
    NONE,
    FleetSizes,
    describe_fleet,
    format_fleet_table,
    plot_fleet,
)
from numbakv.tools.fleet.routing import ROUTES, SESSION
from numbakv.tools.replay.belady import BELADY
from numbakv.tools.replay.planning import Capacity, bytes_label, parse_capacity
from numbakv.tools.ttft_profile import TTFTProfile, report_worth, with_worth

_NO_TIER = ("0", "none")


def add_fleet_arguments(parser: Parser) -> None:
    """The fleet's options; any of them turns the replay into a fleet replay."""
    fleet = parser.add_argument_group(
        "fleet", "N engines, each with its own host (and disk) tier, over one shared tier"
    )
    fleet.add_argument(
        "--engines",
        type=positive_int,
        metavar="N",
        help="replay through N engines; --capacity is then each engine's host memory "
        "(default: one engine, no fleet)",
    )
    fleet.add_argument(
        "--route",
        choices=ROUTES,
        help="how the router picks an engine: by the request's session (a hash of its first "
        f"blocks past the prefix all requests share) or round-robin (default: {SESSION})",
    )
    fleet.add_argument(
        "--disk-capacity",
        default="0",
        metavar="CAPACITIES",
        help="each engine's disk tier, comma-separated like --capacity; 0 or none: no disk "
        "(default: %(default)s)",
    )
    fleet.add_argument(
        "--shared-capacity",
        default="0",
        metavar="CAPACITIES",
        help="the tier all engines share, comma-separated like --capacity; 0 or none: no "
        "shared tier (default: %(default)s)",
    )
    fleet.add_argument(
        "--tiering",
        metavar="MODES",
        help="how stored blocks reach the lower tiers, comma-separated: demote (a block "
        "evicted from host memory moves down) or write-through (stored in every tier at once) "
        f"(default: {TIERINGS[0]})",
    )
    fleet.add_argument(
        "--lower-policy",
        metavar="NAME",
        help="the disk and shared tiers' cache policy (default: each run's --policy)",
    )


FLEET_ONLY = ("route", "tiering", "lower_policy")
"""Options that shape a fleet and mean nothing to one engine's replay."""


def wants_fleet(parser: Parser, args: argparse.Namespace) -> bool:
    """Whether the arguments ask for a fleet; a fleet's option given without one is refused."""
    if args.engines is not None or (args.disk_capacity, args.shared_capacity) != ("0", "0"):
        return True
    for name in FLEET_ONLY:
        if getattr(args, name) is not None:
            parser.error(
                f"argument --{name.replace('_', '-')}: shapes a fleet; give --engines, "
                "--disk-capacity or --shared-capacity with it"
            )
    return False


@dataclass(frozen=True)
class FleetPlan:
    """The fleets to replay, every argument checked, and the capacities as the user gave them."""

    configs: list[FleetConfig]
    sizes: list[FleetSizes]


def check_fleet(
    parser: Parser, args: argparse.Namespace, policies: Sequence[str], hosts: Sequence[Capacity]
) -> FleetPlan:
    """The grid policy x tiering x disk x shared x host capacity; exits on bad input."""
    if BELADY in policies:
        parser.bad("--policy", BELADY, "an online policy: Belady's MIN replays one cache only")
    if args.lower_policy is not None:
        try:
            resolve_policy(args.lower_policy)
        except (ValueError, TypeError):
            parser.bad("--lower-policy", args.lower_policy, "a policy --policy accepts")
    given_tiering = args.tiering or TIERINGS[0]
    tierings = comma_list(parser, "--tiering", given_tiering)
    for tiering in tierings:
        if tiering not in TIERINGS:
            parser.bad("--tiering", tiering, f"one or more of {', '.join(TIERINGS)}")
    disks = _lower_capacities(parser, "--disk-capacity", args.disk_capacity, args.block_bytes)
    shareds = _lower_capacities(parser, "--shared-capacity", args.shared_capacity, args.block_bytes)
    by_flag = {"--capacity": hosts, "--disk-capacity": disks, "--shared-capacity": shareds}
    units = {flag: {bool(c.unit) for c in given if c.blocks} for flag, given in by_flag.items()}
    if len(set().union(*units.values())) > 1:
        said = [
            f"{flag} {', '.join(c.label for c in by_flag[flag])} "
            f"({' and '.join('sizes' if unit else 'blocks' for unit in sorted(unit_set))})"
            for flag, unit_set in units.items()
            if unit_set
        ]
        parser.error(
            f"capacities mix blocks and sizes: {'; '.join(said)}; give them all in blocks or all "
            "as sizes (--capacity's default, 10000, is in blocks)"
        )
    configs, sizes = [], []
    for policy in policies:
        for tiering in tierings:
            for disk in disks:
                for shared in shareds:
                    if (disk, shared) == (NONE, NONE) and tiering != tierings[0]:
                        continue  # without lower tiers, tiering changes nothing
                    for host in hosts:
                        configs.append(
                            FleetConfig(
                                engines=args.engines or 1,
                                host_capacity=host.blocks,
                                disk_capacity=disk.blocks,
                                shared_capacity=shared.blocks,
                                policy=policy,
                                lower_policy=args.lower_policy or "",
                                tiering=tiering,
                                route=args.route or SESSION,
                                store_threshold=args.store_threshold,
                            )
                        )
                        sizes.append(FleetSizes(host, disk, shared))
    return FleetPlan(configs, sizes)


def _lower_capacities(
    parser: Parser, flag: str, text: str, block_bytes: int | None
) -> list[Capacity]:
    capacities: dict[int, Capacity] = {}
    for item in comma_list(parser, flag, text):
        if item.lower() in _NO_TIER:
            capacities.setdefault(0, NONE)
            continue
        try:
            capacity = parse_capacity(item, block_bytes)
        except ValueError as error:
            parser.error(f"argument {flag}: {error} (or 0 for none)")
        capacities.setdefault(capacity.blocks, capacity)
    return list(capacities.values())


def run_fleet(
    parser: Parser,
    args: argparse.Namespace,
    plan: FleetPlan,
    chains: Sequence[Sequence[int]],
    source: str,
    total: int,
    profile: TTFTProfile | None = None,
) -> int:
    """Replay the fleets and report them: text (or a table), what the hits are worth in seconds
    (with a profile), the plot, JSON."""
    if args.engines is not None and args.engines > len(chains):  # each past that serves nothing
        parser.bad("--engines", str(args.engines), f"at most the {len(chains):,} requests replayed")
    text = sys.stderr if args.json else sys.stdout
    status = 0
    request_hits: list | None = None if profile is None else []
    try:
        results = fleet_grid(chains, plan.configs, progress=True, request_hits=request_hits)
    except Interrupted as cut_short:
        results = cut_short.results
        done = sum(result.requests == len(chains) for result in results)
        status = interrupted(parser.prog, f"after {done} of {len(plan.configs)} fleets")
        if not results:
            return status
    sizes = plan.sizes[: len(results)]
    first = f"the first {len(chains):,} of " if len(chains) < total else ""
    print(f"trace           {source} ({first}{total:,} requests)", file=text)
    print(f"fleet           {describe_fleet(results[0].config)}", file=text)
    single = len(plan.configs) == 1 and not args.plot
    if single:
        _print_run(results[0], sizes[0], args.block_bytes, len(chains), text)
    else:
        print(format_fleet_table(results, sizes, args.block_bytes, len(chains)), file=text)
    labels = [_label(result.config, size) for result, size in zip(results, sizes)]
    worth = report_worth(profile, chains, request_hits, args.block_tokens, labels, text)
    if args.plot and not status:
        plot_fleet(results, sizes, args.plot, title=Path(source).name)
        print(f"plot            {args.plot}", file=text)
    if args.json:
        runs = [_run_json(result, size, args.block_bytes) for result, size in zip(results, sizes)]
        runs = with_worth(runs, worth)
        print_runs_json(runs, source, bool(status), single)
    return status


def _label(config: FleetConfig, size: FleetSizes) -> str:
    """A run of a fleet table, in one cell: `lru, demote, host 64 GiB, disk 2 TB, shared none`."""
    tiering = f", {config.tiering}" if config.disk_capacity or config.shared_capacity else ""
    tiers = ", ".join(f"{tier} {size.label(tier)}" for tier in ("host", "disk", "shared"))
    return f"{config.policy}{tiering}, {tiers}"


def _print_run(
    result: FleetResult, size: FleetSizes, block_bytes: int | None, requests: int, out: TextIO
) -> None:
    config = result.config
    of = f" of {bytes_label(block_bytes)}" if block_bytes else ""
    per_engine = " / ".join(f"{n:,}" for n in result.requests_per_engine)
    print(f"requests        {per_engine} per engine", file=out)
    print(f"policy          {config.policy} (lower tiers: {config.lower_tiers_policy})", file=out)
    if config.disk_capacity or config.shared_capacity:
        print(f"tiering         {config.tiering}", file=out)
    for name, tier, capacity in (
        ("host", "per engine", size.host),
        ("disk", "per engine", size.disk),
        ("shared", "in all", size.shared),
    ):
        sized = f"{capacity.label}: " if capacity.unit else ""
        held = f"{sized}{capacity.blocks:,} blocks{of} {tier}" if capacity.blocks else "none"
        print(f"{name + ' capacity':<16}{held}", file=out)
    print_hit_ratio(result, requests, out)
    for label, hits in (
        ("own host", result.host_hits),
        ("own disk", result.disk_hits),
        ("shared, own write", result.shared_own_hits),
        ("shared, another engine's write", result.shared_other_hits),
        ("missed", result.misses),
    ):
        print(f"  {label:<32}{hits:>12,}  {hits / max(result.references, 1):.4f}", file=out)
    print(
        f"lower writes    {result.disk_writes:,} blocks to disk, "
        f"{result.shared_writes:,} to the shared tier",
        file=out,
    )
    print(f"seconds         {result.seconds:.2f}", file=out)


def _run_json(result: FleetResult, size: FleetSizes, block_bytes: int | None) -> dict:
    run = {**asdict(result.config), **asdict(result)}
    del run["config"]
    run["lower_policy"] = result.config.lower_tiers_policy
    run["hits"], run["hit_ratio"] = result.hits, result.hit_ratio
    for tier in ("host", "disk", "shared"):
        capacity = getattr(size, tier)
        if capacity.unit:
            run[f"{tier}_capacity_size"] = capacity.label
    if block_bytes:
        run["block_bytes"] = block_bytes
    return run
