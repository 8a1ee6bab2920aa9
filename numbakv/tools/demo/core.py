"""The demo's engine and its runs: a paged GPU KV cache too small for its workload, offloaded and
back (`python3 -m numbakv.demo` is the command line over it: numbakv.tools.demo.command).

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
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from numbakv.cascade import DEMOTE, Tiering
from numbakv.jobs import FinishedJob
from numbakv.manager import CPUOffloadingManager
from numbakv.offloader import KVOffloader
from numbakv.simulator import simulate_without_gpu
from numbakv.tiers import Namespace, TierOpenError
from numbakv.tools.cli import Interrupted, interrupts_between_requests
from numbakv.tools.demo.tier import open_tier
from numbakv.tools.progress import track
from numbakv.tools.traces import TraceError, read_hash_chains
from numbakv.tools.workloads.core import multi_turn_chat

KV_ITEM_BYTES = 2  # float16


DEFAULT_GPU_BLOCKS = 96
"""GPU blocks of the stand-in engine unless a request needs more (a trace's longest, say)."""
FIRST_REQUESTS = 10
"""The second engine's first requests, whose hits in the tier below show what is shared."""
ENGINES = 2
"""Engines, each in a process of its own, that the demo runs over one tier below host memory."""
ANSWER_GRACE_S = 0.5
"""How long an engine's process has, after Ctrl-C, to send its figures so far before it is sent
the interrupt itself (a terminal sends it to both; `kill -INT` to the demo's own pid does not)."""
ANSWER_WAIT_S = 30.0
"""How long an interrupted engine may take to send its figures so far, and then to end, before it
is stopped."""


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
    tiering: Tiering = DEMOTE  # how blocks reach the tier (numbakv.cascade.TIERINGS)


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
            self.tier = open_tier(config.tier, host_pool.blocks, namespace_of(config))
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
            self.count_tier()
            self.tier.close()

    def count_tier(self) -> None:
        """Copy what the tier below stored and served so far into the report."""
        if self.tier is not None:
            self.report.tier_stored = self.tier.counters.stored
            self.report.tier_hits_from_others = self.tier.counters.loaded_other
            self.report.tier_unavailable = self.tier.counters.unavailable

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


def namespace_of(config: DemoConfig) -> Namespace:
    """What the demo's host blocks mean in a tier: engines of the same sizes read each other's."""
    return Namespace(
        model="numbakv-demo",
        revision="",
        dtype="float16",
        tokens_per_block=config.block_size,
        blocks_per_chunk=1,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_size=config.head_size,
        page_bytes=config.block_size * config.num_kv_heads * config.head_size * KV_ITEM_BYTES,
        layout="numbakv:flash_attn-host-block",
    )


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

    Ctrl-C while serving raises `Interrupted` with the report so far.
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
        with interrupts_between_requests() as stop_if_interrupted:
            for chain in track(chains, "serving", len(chains), "req", progress):
                stop_if_interrupted()
                engine.serve(chain)
            engine.close()
    except KeyboardInterrupt:
        report.seconds = time.perf_counter() - started
        engine.count_tier()
        raise Interrupted([report], len(chains)) from None
    report.seconds = time.perf_counter() - started
    return report


def run_engines(config: DemoConfig, progress: bool = False) -> list[DemoReport]:
    """Run the demo in ENGINES processes, one after the other, over `config.tier`: each later
    engine finds in the tier what the earlier ones stored.

    Ctrl-C raises `Interrupted` with the reports of the engines that finished and, last, the
    figures so far of the one cut short (when it sent them in time).
    """
    reports: list[DemoReport] = []
    for _ in range(ENGINES):
        engine, answers = _start_engine(config, progress)
        interrupted = False
        try:
            try:
                report, requests = _answer_of(engine, answers)
            except KeyboardInterrupt:
                interrupted = True
                report, requests = _answer_after_interrupt(engine, answers)
        finally:
            interrupted |= _ended(engine, answers)
        if report is not None:
            reports.append(report)
        if interrupted or requests is not None:  # cut short, here or in the engine alone
            whole = reports[-1].requests if reports else 0  # what a finished engine served
            raise Interrupted(reports, requests or whole)
    return reports


def _start_engine(config: DemoConfig, progress: bool) -> tuple[BaseProcess, Connection]:
    """An engine's process, started deaf to Ctrl-C (it turns it on once its imports are done:
    an import cut short would end it with a traceback), and the end of the pipe it answers on."""
    spawn = get_context("spawn")
    answers, sender = spawn.Pipe(duplex=False)
    engine = spawn.Process(target=_serve_engine, args=(config, progress, sender))
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        engine.start()  # a process started with SIGINT ignored keeps it ignored
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, before)
    sender.close()  # the engine holds the other end: end of file here once it exits
    return engine, answers


def _serve_engine(config: DemoConfig, progress: bool, answers: Connection) -> None:
    """One engine's run, in a process of its own. It sends back its report and None; or, when
    Ctrl-C cut it short, its figures so far (None, cut before serving) and the requests a whole
    run serves; or the error that stopped it, where the command names it (a bad trace, a tier
    that will not open). Any other error ends the process with its traceback."""
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        answer: Any = (run(config, progress=progress), None)
    except Interrupted as cut_short:
        answer = (cut_short.results[0], cut_short.requests)
    except KeyboardInterrupt:
        answer = (None, 0)
    except (DemoConfigError, TierOpenError, TraceError) as error:
        answer = error
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the answer goes back whatever else comes
    answers.send(answer)


def _answer_of(engine: BaseProcess, answers: Connection) -> tuple[DemoReport | None, int | None]:
    try:
        answer = answers.recv()
    except EOFError:
        engine.join()  # for its exit code
        raise RuntimeError(
            f"the demo's engine process ended (exit code {engine.exitcode}) without a report; "
            "its traceback is above"
        ) from None
    if isinstance(answer, Exception):
        raise answer
    return answer


def _answer_after_interrupt(
    engine: BaseProcess, answers: Connection
) -> tuple[DemoReport | None, int | None]:
    """What an engine answers once Ctrl-C reached this process. A terminal interrupts the engine
    too; where it has not answered within ANSWER_GRACE_S (`kill -INT` to this process alone, or
    the engine still starting), it is sent the interrupt, again each ANSWER_GRACE_S, for up to
    ANSWER_WAIT_S. A second Ctrl-C here stops the waiting: no figures."""
    deadline = time.monotonic() + ANSWER_WAIT_S
    try:
        while not answers.poll(ANSWER_GRACE_S):
            if not engine.is_alive() or time.monotonic() > deadline:
                return None, 0
            os.kill(engine.pid, signal.SIGINT)
        answer = answers.recv()
    except (KeyboardInterrupt, EOFError):  # interrupted again, or it ended without a word
        return None, 0
    return (None, 0) if isinstance(answer, Exception) else answer


def _ended(engine: BaseProcess, answers: Connection) -> bool:
    """Let the engine's process end (at once, or after closing its tier where it was cut short),
    stopped past ANSWER_WAIT_S; whether Ctrl-C came meanwhile."""
    interrupted = False
    try:
        engine.join(ANSWER_WAIT_S)
    except KeyboardInterrupt:
        interrupted = True
    if engine.is_alive():
        engine.terminate()
        engine.join()
    answers.close()
    return interrupted
