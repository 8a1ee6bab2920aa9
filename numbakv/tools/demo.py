"""The whole path, end to end: a paged GPU KV cache too small for its workload, offloaded and back.

    python -m numbakv.demo [--trace FILE] [--policy lru] [--mode eager|lazy] [sizes...] [--json]
        [--tier dir:PATH | redis://HOST:PORT/DB [--tiering demote|write-through]]

A stand-in engine replays a multi-turn chat workload (or a Mooncake trace) over a GPU block pool
that cannot hold it: it reuses blocks still on the GPU, loads what the host tier has, "computes"
the rest, and offloads through numbakv. Each block's content is derived from its hash, so every
block loaded back is checked byte for byte against what its hash says it must hold. With --tier,
two engines in two processes, one after the other, replay the workload over one tier below host
memory: the second finds what the first stored there (each hands its host memory down to the tier
when it finishes, `KVOffloader.flush_to_tier`).
"""

from __future__ import annotations

import os
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import get_context
from typing import Any, TextIO

import numpy as np

from numbakv.jobs import FinishedJob
from numbakv.manager import CPUOffloadingManager
from numbakv.offloader import DEMOTE, TIERINGS, KVOffloader
from numbakv.policies import POLICIES, resolve_policy
from numbakv.simulator import simulate_without_gpu
from numbakv.tiers.backend import TierOpenError
from numbakv.tiers.settings import redacted
from numbakv.tools.belady import BELADY
from numbakv.tools.cli import INTERRUPTED, Parser, positive_int, print_json
from numbakv.tools.demo_tier import (
    TTL_S,
    demo_namespace,
    describe_tier,
    open_tier,
    tier_failure,
    tier_spec_error,
)
from numbakv.tools.planning import bytes_label
from numbakv.tools.progress import track
from numbakv.tools.traces import SAMPLE_TRACES, TraceError, check_trace, read_hash_chains
from numbakv.tools.workloads import multi_turn_chat

KV_ITEM_BYTES = 2  # float16


DEFAULT_GPU_BLOCKS = 96
"""GPU blocks of the stand-in engine unless a request needs more (a trace's longest, say)."""
FIRST_REQUESTS = 10
"""The second engine's first requests, whose hits in the tier below show what is shared."""
ENGINES = 2
"""Engines, each in a process of its own, that the demo runs over one tier below host memory."""


@dataclass(frozen=True)
class DemoConfig:
    num_layers: int = 2
    block_size: int = 4
    num_kv_heads: int = 1
    head_size: int = 8
    gpu_blocks: int | None = None  # None: DEFAULT_GPU_BLOCKS, or the longest request if longer
    host_blocks: int = 512
    sessions: int = 60
    policy: str = "lru"
    mode: str = "eager"
    trace: str | None = None
    requests: int | None = None  # the first this many requests of the workload; None: all
    launch: Mapping[str, Any] | None = None  # TransferEngine's launch options; None: by device
    tier: str | None = None  # a tier below host memory: "dir:PATH" or a redis:// URL
    tiering: str = DEMOTE  # how blocks reach the tier (numbakv.offloader.TIERINGS)


@dataclass
class DemoReport:
    requests: int = 0
    references: int = 0
    gpu_hits: int = 0
    host_hits: int = 0
    tier_hits: int = 0  # promoted from the tier below into host memory, then loaded
    first_requests_tier_hits: int = 0  # of those, in the first FIRST_REQUESTS requests
    tier_hits_from_others: int = 0  # promoted blocks another engine (process) stored
    tier_stored: int = 0  # blocks this engine copied down to the tier
    tier_flushed: int = 0  # of those, from host memory when the engine finished
    tier_flush_failed: int = 0  # blocks the tier failed to store then
    tier_unavailable: int = 0  # calls that found the tier unreachable (or skipped while it was)
    computed: int = 0
    verified: int = 0
    mismatched: int = 0
    bytes_moved: dict = field(default_factory=lambda: {"store": 0, "load": 0})
    blocks_moved: dict = field(default_factory=lambda: {"store": 0, "load": 0})
    transfer_seconds: dict = field(default_factory=lambda: {"store": 0.0, "load": 0.0})
    seconds: float = 0.0
    block_bytes: int = 0
    gpu_blocks: int = 0


class DemoInterrupted(KeyboardInterrupt):
    """Ctrl-C during the demo; still a KeyboardInterrupt, with the report of what was served."""

    def __init__(self, report: DemoReport, requests: int) -> None:
        super().__init__()
        self.report = report
        self.requests = requests  # of the workload, served or not


class DemoConfigError(ValueError):
    """A configuration the demo cannot run; the message names the option to change."""


def block_contents(block_hashes: np.ndarray, block_bytes: int) -> np.ndarray:
    """What each block must hold, [n, block_bytes] uint8, from its hash alone (splitmix64)."""
    words = -(-block_bytes // 8)
    with np.errstate(over="ignore"):
        x = block_hashes.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
        x = x + np.arange(1, words + 1, dtype=np.uint64)[None, :] * np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x.view(np.uint8)[:, :block_bytes]


def build_kv_cache(config: DemoConfig) -> list:
    """The engine's paged KV cache: vLLM flash-attention layout, one Numba device array a layer."""
    simulate_without_gpu()  # before Numba CUDA is imported: the simulator where there is no GPU
    from numba import cuda

    shape = (2, config.gpu_blocks, config.block_size, config.num_kv_heads, config.head_size)
    return [cuda.device_array(shape, dtype=np.float16) for _ in range(config.num_layers)]


class StandInEngine:
    """Just enough of an inference engine: a GPU prefix cache with LRU reuse of its blocks.

    "Computing" a block writes its hash-derived content; a small staging pool and the same
    scatter/gather kernels write those blocks and read loaded ones back for the check.
    """

    def __init__(self, config: DemoConfig, kv_arrays: list, report: DemoReport) -> None:
        from numbakv.datapath import SIMULATOR_LAUNCH, HostPool, KVLayout, TransferEngine

        self.report = report
        layout = KVLayout.from_arrays("flash_attn", kv_arrays)
        self.block_bytes = report.block_bytes = layout.block_bytes
        launch = config.launch
        if launch is None:  # the engine's defaults on a GPU; few threads for the interpreter
            launch = SIMULATOR_LAUNCH if simulate_without_gpu() else {}
        host_pool = HostPool.for_layout(layout, config.host_blocks)
        self.tier = None
        if config.tier is not None:
            namespace = demo_namespace(
                config.num_layers,
                config.block_size,
                config.num_kv_heads,
                config.head_size,
                KV_ITEM_BYTES,
            )
            self.tier = open_tier(config.tier, host_pool.blocks, namespace)
        self.offloader = KVOffloader(
            CPUOffloadingManager(config.block_size, config.host_blocks, cache_policy=config.policy),
            TransferEngine(layout, host_pool, on_job_done=self._count, **launch),
            mode=config.mode,
            tier=self.tier,
            tiering=config.tiering,
        )
        self.staging = HostPool.for_layout(layout, config.gpu_blocks)
        self.compute = TransferEngine(layout, self.staging, **launch)
        self.gpu_cache: OrderedDict[int, int] = OrderedDict()  # hash -> GPU block, LRU first
        self.free_gpu_blocks = list(range(config.gpu_blocks))
        self.pending_store: dict[int, int] = {}  # GPU block -> store job still reading it
        self._job_ids = 0

    def _count(self, job: FinishedJob) -> None:
        direction = job.direction.value
        self.report.bytes_moved[direction] += job.nbytes
        self.report.blocks_moved[direction] += job.nbytes // self.block_bytes
        self.report.transfer_seconds[direction] += job.seconds

    def serve(self, chain: list[int]) -> None:
        report = self.report
        report.requests += 1
        report.references += len(chain)
        gpu_hits = 0
        while gpu_hits < len(chain) and chain[gpu_hits] in self.gpu_cache:
            self.gpu_cache.move_to_end(chain[gpu_hits])
            gpu_hits += 1
        rest = chain[gpu_hits:]
        self.offloader.touch(chain)
        host_hits, tier_hits = self._lookup(rest)
        gpu_ids = self._allocate(len(rest), keep=set(chain[:gpu_hits]))
        if host_hits:
            job = self.offloader.load(rest[:host_hits], gpu_ids[:host_hits])
            self.offloader.wait(job)
            self._verify(rest[:host_hits], gpu_ids[:host_hits])
        computed = rest[host_hits:]
        if computed:
            self._compute(computed, gpu_ids[host_hits:])
            job = self.offloader.blocks_filled(computed, gpu_ids[host_hits:])
            if job is not None:
                self.pending_store.update(dict.fromkeys(gpu_ids[host_hits:].tolist(), job))
        self.gpu_cache.update(zip(rest, gpu_ids.tolist()))
        self.offloader.poll()
        report.gpu_hits += gpu_hits
        report.host_hits += host_hits - tier_hits
        report.tier_hits += tier_hits
        if report.requests <= FIRST_REQUESTS:
            report.first_requests_tier_hits += tier_hits
        report.computed += len(computed)

    def _lookup(self, block_hashes: list[int]) -> tuple[int, int]:
        """The host tier's hits, and how many of them were promoted from the tier below first.

        This engine waits for a promotion; a real one serves other requests meanwhile.
        """
        hits = self.offloader.lookup(block_hashes)
        if hits is not None:
            return hits, 0
        counters = self.tier.counters
        before = counters.loaded_own + counters.loaded_other
        while hits is None:
            self.offloader.drain()
            hits = self.offloader.lookup(block_hashes)
        return hits, min(hits, counters.loaded_own + counters.loaded_other - before)

    def close(self) -> None:
        """Finish every job; hand host memory down to the tier below (so the next engine finds
        it), count what the tier stored and served, and close it."""
        self.offloader.drain()
        if self.tier is not None:
            flushed = self.offloader.flush_to_tier()
            self.report.tier_flushed = flushed.stored
            self.report.tier_flush_failed = len(flushed.failed)
            self.report.tier_stored = self.tier.counters.stored
            self.report.tier_hits_from_others = self.tier.counters.loaded_other
            self.report.tier_unavailable = self.tier.counters.unavailable
            self.tier.close()

    def _allocate(self, n: int, keep: set) -> np.ndarray:
        """n GPU blocks: free ones first, then the least recently used not in this request."""
        victims: list[tuple[int, int]] = []
        for block_hash, gpu_block in self.gpu_cache.items():
            if len(self.free_gpu_blocks) + len(victims) >= n:
                break
            if block_hash not in keep:
                victims.append((block_hash, gpu_block))
        if len(self.free_gpu_blocks) + len(victims) < n:
            raise RuntimeError(f"a request needs {n} GPU blocks; raise --gpu-blocks")
        if victims:
            hashes, blocks = map(list, zip(*victims))
            job = self.offloader.blocks_freeing(hashes, blocks)
            if job is not None:
                self.offloader.wait(job)  # lazy mode: the copy must finish before reuse
            for block_hash, gpu_block in victims:
                del self.gpu_cache[block_hash]
                store_job = self.pending_store.pop(gpu_block, None)
                if store_job is not None and self.offloader.in_flight(store_job):
                    self.offloader.wait(store_job)  # eager mode: ditto, if still in flight
                self.free_gpu_blocks.append(gpu_block)
        taken = self.free_gpu_blocks[-n:] if n else []
        del self.free_gpu_blocks[len(self.free_gpu_blocks) - n :]
        return np.array(taken, dtype=np.int64)

    def _compute(self, block_hashes: list[int], gpu_ids: np.ndarray) -> None:
        n = len(block_hashes)
        self.staging.blocks[:n] = block_contents(np.array(block_hashes), self.block_bytes)
        self._staged_job("load", gpu_ids, n)

    def _verify(self, block_hashes: list[int], gpu_ids: np.ndarray) -> None:
        n = len(block_hashes)
        self._staged_job("store", gpu_ids, n)
        expected = block_contents(np.array(block_hashes), self.block_bytes)
        wrong = np.any(self.staging.blocks[:n] != expected, axis=1)
        self.report.verified += n
        self.report.mismatched += int(wrong.sum())

    def _staged_job(self, direction: str, gpu_ids: np.ndarray, n: int) -> None:
        self._job_ids += 1
        self.compute.submit(self._job_ids, direction, gpu_ids, np.arange(n, dtype=np.int64))
        self.compute.wait(self._job_ids)
        self.compute.get_finished()


def block_bytes_of(config: DemoConfig) -> int:
    """Bytes of one KV block, every layer, K and V (float16, flash-attention layout)."""
    per_layer = 2 * config.block_size * config.num_kv_heads * config.head_size * KV_ITEM_BYTES
    return config.num_layers * per_layer


def workload(config: DemoConfig, progress: bool = False) -> list[list[int]]:
    """The requests' block chains: the trace's, or the built-in chat workload's; the first
    `config.requests` of them if set."""
    if config.trace:
        chains = read_hash_chains(config.trace, progress)
    else:
        chains = [request.hash_ids for request in multi_turn_chat(sessions=config.sessions)]
    return chains[: config.requests]


def run(config: DemoConfig, kv_arrays: list | None = None, progress: bool = False) -> DemoReport:
    """Replay the workload through a stand-in engine; kv_arrays may be torch/CuPy/Numba arrays.

    Ctrl-C while serving raises DemoInterrupted with the report so far.
    """
    chains = workload(config, progress)
    longest = max(map(len, chains))
    if config.gpu_blocks is None:
        config = replace(config, gpu_blocks=max(DEFAULT_GPU_BLOCKS, longest))
    elif longest > config.gpu_blocks:
        raise DemoConfigError(
            f"argument --gpu-blocks: got '{config.gpu_blocks}', expected at least {longest}, "
            "the longest request's blocks"
        )
    report = DemoReport(gpu_blocks=config.gpu_blocks)
    engine = StandInEngine(config, kv_arrays or build_kv_cache(config), report)
    started = time.perf_counter()
    try:
        for chain in track(chains, "serving", len(chains), "req", progress):
            engine.serve(chain)
        engine.close()
    except KeyboardInterrupt:
        report.seconds = time.perf_counter() - started
        raise DemoInterrupted(report, len(chains)) from None
    report.seconds = time.perf_counter() - started
    return report


def run_engines(config: DemoConfig, progress: bool = False) -> list[DemoReport]:
    """Run the demo in ENGINES processes, one after the other, over `config.tier`: each later
    engine finds in the tier what the earlier ones stored. Ctrl-C raises KeyboardInterrupt."""
    reports = []
    for _ in range(ENGINES):
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as process:
            reports.append(process.submit(run, config, None, progress).result())
    return reports


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
        f"(a Redis or Valkey server; values expire after {TTL_S:g} s), settings in the URL's query "
        "(?ttl_s=60; docs/TIERS.md) (default: none, one engine)",
    )
    parser.add_argument(
        "--tiering",
        choices=TIERINGS,
        default=defaults.tiering,
        help="how blocks reach the tier below: demote (a block evicted from host memory moves "
        "down, and what host memory still holds when an engine finishes is flushed down) or "
        "write-through (every stored block is copied down at once) (default: %(default)s)",
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


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = vars(parser.parse_args(argv))
    as_json = args.pop("json")
    config = DemoConfig(**args)
    _check(parser, config)
    text = sys.stderr if as_json else sys.stdout
    try:
        reports = [run(config, progress=True)] if config.tier is None else run_engines(config, True)
    except TraceError as error:
        parser.error(f"argument --trace: {error}")
    except TierOpenError as error:
        parser.error(f"argument --tier: {error}")
    except DemoConfigError as error:
        parser.error(str(error))
    except DemoInterrupted as cut_short:
        reports, status = [cut_short.report], INTERRUPTED
        sys.stderr.write(
            f"{parser.prog}: interrupted after {cut_short.report.requests:,} of "
            f"{cut_short.requests:,} requests; the figures below are partial\n"
        )
    except KeyboardInterrupt:
        before = "any request was served" if config.tier is None else "both engines finished"
        sys.stderr.write(f"{parser.prog}: interrupted before {before}\n")
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
        print_json({"config": asdict(config), "interrupted": status == INTERRUPTED, **served})
    return status
