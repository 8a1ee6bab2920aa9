"""The whole path, end to end: a paged GPU KV cache too small for its workload, offloaded and back.

    python -m numbakv.demo [--trace FILE] [--policy lru] [--mode eager|lazy] [sizes...] [--json]
        [--tier dir:PATH | redis://HOST:PORT/DB [--tiering demote|write-through]]

The command line and the report of the demo (numbakv.tools.demo.core): one engine, or with --tier
two engines in two processes, one after the other, over one tier below host memory.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import TextIO

from numbakv.cascade import TIERINGS
from numbakv.policies import POLICIES, resolve_policy
from numbakv.tiers.backend import TierOpenError
from numbakv.tiers.settings import redacted
from numbakv.tools.cli import INTERRUPTED, Interrupted, Parser, positive_int, print_json
from numbakv.tools.demo.core import (
    DEFAULT_GPU_BLOCKS,
    ENGINES,
    FIRST_REQUESTS,
    DemoConfig,
    DemoConfigError,
    DemoReport,
    block_bytes_of,
    namespace_of,
    run,
    run_engines,
)
from numbakv.tools.demo.tier import (
    TTL_S,
    describe_tier,
    tier_failure,
    tier_probe_error,
    tier_spec_error,
)
from numbakv.tools.replay.belady import BELADY
from numbakv.tools.replay.planning import bytes_label
from numbakv.tools.traces import SAMPLE_TRACES, TraceError, check_trace


def _print(report: DemoReport, config: DemoConfig, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    hits = report.gpu_hits + report.host_hits + report.tier_hits
    source = config.trace or f"built-in multi-turn chat, {config.sessions} sessions"
    first = f", its first {config.requests:,} requests" if config.requests else ""
    print(f"workload       {source}{first}", file=out)
    print(
        f"cache          {report.gpu_blocks} GPU blocks, {config.host_blocks} host blocks "
        f"({config.policy}, {config.mode} offload), {report.block_bytes:,} bytes a block",
        file=out,
    )
    print(f"requests       {report.requests:,}, {report.references:,} block references", file=out)
    tier = f" + tier below {report.tier_hits:,}" if config.tier else ""
    print(
        f"hit ratio      {hits / max(1, report.references):.3f}  (GPU {report.gpu_hits:,} + "
        f"host tier {report.host_hits:,}{tier}; computed {report.computed:,})",
        file=out,
    )
    if config.tier:
        failed = f", {report.tier_flush_failed:,} failed" if report.tier_flush_failed else ""
        print(
            f"tier below     {describe_tier(config.tier)} ({config.tiering}): "
            f"{report.tier_stored:,} blocks "
            f"stored ({report.tier_flushed:,} flushed from host memory at the end{failed}), "
            f"{report.tier_hits_from_others:,} loaded that another engine stored; "
            f"{report.first_requests_tier_hits:,} hits in the first {FIRST_REQUESTS} requests",
            file=out,
        )
    for direction, name in (("store", "GPU -> host"), ("load", "host -> GPU")):
        seconds, moved = report.transfer_seconds[direction], report.bytes_moved[direction]
        # The simulator's events have no clock: no time, no rate (rather than "0 GB/s").
        rate = f", {moved / seconds / 1e9:.3g} GB/s" if seconds else ""
        print(
            f"{name:<14} {report.blocks_moved[direction]:,} blocks, {moved / 2**20:,.1f} MiB{rate}",
            file=out,
        )
    print(
        f"byte check     {report.verified:,} loaded blocks verified, {report.mismatched} wrong",
        file=out,
    )
    print(f"time           {report.seconds:.1f} s", file=out)


DEFAULTS_SAID = {
    "gpu_blocks": f"{DEFAULT_GPU_BLOCKS}, or the longest request's blocks if it has more",
}
SIZES = {
    "num_layers": "attention layers",
    "block_size": "tokens per KV block",
    "num_kv_heads": "KV heads per layer",
    "head_size": "values per head",
    "gpu_blocks": "blocks of the GPU KV cache, at least the longest request's",
    "host_blocks": "blocks of the host tier",
    "sessions": "chat sessions of the built-in workload",
}


def _parser() -> Parser:
    defaults = DemoConfig()
    samples = ", ".join(SAMPLE_TRACES)
    parser = Parser(prog="numbakv-demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace",
        metavar="TRACE",
        help=f"Mooncake-format jsonl trace, or the name of a shipped sample ({samples}) "
        "(default: the built-in chat workload)",
    )
    parser.add_argument(
        "--requests",
        type=positive_int,
        metavar="N",
        help="serve only the first N requests of the workload (default: all)",
    )
    parser.add_argument(
        "--policy",
        default=defaults.policy,
        help=f"host-tier cache policy: {', '.join(POLICIES)}, or an import path module:Class "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--mode",
        choices=("eager", "lazy"),
        default=defaults.mode,
        help="eager: offload every computed block at once; lazy: only when the GPU evicts it "
        "(default: %(default)s)",
    )
    for name, about in SIZES.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=positive_int,
            default=getattr(defaults, name),
            metavar="N",
            help=f"{about} (default: {DEFAULTS_SAID.get(name, '%(default)s')})",
        )
    parser.add_argument(
        "--tier",
        metavar="TIER",
        help="a tier below host memory, shared by two engines run one after the other in two "
        "processes: dir:PATH (a local directory, bounded at 1 GiB) or redis://HOST:PORT/DB "
        f"(a Redis or Valkey server; values expire after {TTL_S:g} s; also rediss:// for TLS, "
        "valkey://, and unix:///SOCKET for a server on this host), settings in the URL's query "
        "(?ttl_s=60; docs/TIERS.md) (default: none, one engine)",
    )
    parser.add_argument(
        "--tiering",
        choices=TIERINGS,
        help="with --tier, how blocks reach the tier below: demote (a block evicted from host "
        "memory moves down, and what host memory still holds when an engine finishes is flushed "
        "down) or write-through (every stored block is copied down at once) (default: "
        f"{defaults.tiering})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON document on stdout, the human-readable text on "
        "stderr (default: text on stdout)",
    )
    return parser


def _check(parser: Parser, config: DemoConfig) -> None:
    """Everything about the arguments that can be checked before any memory is touched."""
    if config.policy == BELADY:
        parser.bad("--policy", BELADY, "a cache policy: belady is replay-only (numbakv-replay)")
    try:
        resolve_policy(config.policy)
    except (ValueError, TypeError) as error:
        if ":" in config.policy:
            parser.error(f"argument --policy: {error}")
        parser.bad("--policy", config.policy, f"one of {', '.join(POLICIES)}, or module:Class")
    if config.tier is not None and (why := tier_spec_error(config.tier)):
        parser.error(f"argument --tier: {why}")  # not `bad`: it would show the password
    if config.trace is not None:
        try:
            check_trace(config.trace)
        except TraceError as error:
            parser.error(f"argument --trace: {error}")
    block_bytes = block_bytes_of(config)
    # KV cache, host tier and staging pool; on the simulator "GPU" memory is host memory too.
    needed = block_bytes * (config.host_blocks + 2 * (config.gpu_blocks or DEFAULT_GPU_BLOCKS))
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > available:
        parser.error(
            f"the demo would need {needed / 2**30:,.1f} GiB of memory "
            f"({bytes_label(block_bytes)} a block), more than this machine's "
            f"{available / 2**30:,.1f} GiB: lower --host-blocks, --gpu-blocks or the block's sizes"
        )


def _interrupted(config: DemoConfig, cut_short: Interrupted) -> str:
    """The line that says where Ctrl-C cut the demo short, and what its figures are."""
    if not cut_short.results:
        return "interrupted before any request was served"
    served, requests = cut_short.results[-1].requests, cut_short.requests
    if served == requests and config.tier is not None:
        engines = len(cut_short.results)
        return f"interrupted after {engines} of {ENGINES} engines finished; the figures are theirs"
    engine = "" if config.tier is None else f" in engine {len(cut_short.results)} of {ENGINES}"
    return (
        f"interrupted{engine} after {served:,} of {requests:,} requests; "
        "the figures below are partial"
    )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    if args["tiering"] is None:
        args["tiering"] = DemoConfig.tiering
    elif args["tier"] is None:
        parser.error("argument --tiering: shapes the tier below host memory; give --tier with it")
    config = DemoConfig(**args)
    _check(parser, config)
    if config.tier is not None and (
        why := tier_probe_error(config.tier, namespace_of(config), block_bytes_of(config))
    ):
        parser.error(f"argument --tier: {why}")
    text = sys.stderr if as_json else sys.stdout
    try:
        reports = [run(config, progress=True)] if config.tier is None else run_engines(config, True)
    except TraceError as error:
        parser.error(f"argument --trace: {error}")
    except TierOpenError as error:
        parser.error(f"argument --tier: {error}")
    except DemoConfigError as error:
        parser.error(str(error))
    except Interrupted as cut_short:
        reports, status = cut_short.results, INTERRUPTED
        sys.stderr.write(f"{parser.prog}: {_interrupted(config, cut_short)}\n")
        if not reports:
            return INTERRUPTED
    except KeyboardInterrupt:
        sys.stderr.write(f"{parser.prog}: interrupted before any request was served\n")
        return INTERRUPTED
    else:
        status = 1 if any(report.mismatched for report in reports) else 0
    failures = []
    for number, report in enumerate(reports, 1):
        if config.tier is not None:
            print(f"engine {number} of {ENGINES}, in a process of its own", file=text)
            if why := tier_failure(report):
                failures.append(f"engine {number}: {why}")
        _print(report, config, text)
    if failures and status != INTERRUPTED:
        sys.stderr.write(f"{parser.prog}: error: --tier {redacted(config.tier)}: ")
        sys.stderr.write("; ".join(failures) + "\n")
        status = 1
    if as_json:
        served = {"engines": [asdict(r) for r in reports]} if config.tier else asdict(reports[0])
        said = asdict(config)
        if config.tier is not None:
            said["tier"] = redacted(config.tier)  # a password in the URL stays out of the report
        print_json({"config": said, "interrupted": status == INTERRUPTED, **served})
    return status
