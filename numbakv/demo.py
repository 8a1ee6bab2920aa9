"""The whole path, end to end: a paged GPU KV cache too small for its workload, offloaded and back.

    python -m numbakv.demo [--trace FILE] [--policy lru] [--mode eager|lazy] [sizes...]

A stand-in engine replays a multi-turn chat workload (or a Mooncake trace) over a GPU block pool
that cannot hold it: it reuses blocks still on the GPU, loads what the host tier has, "computes"
the rest, and offloads through numbakv. Each block's content is derived from its hash, so every
block loaded back is checked byte for byte against what its hash says it must hold.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from numbakv.manager import CPUOffloadingManager
from numbakv.offloader import KVOffloader
from numbakv.simulator import simulate_without_gpu
from numbakv.traces import TraceError, read_hash_chains
from numbakv.workloads import multi_turn_chat


@dataclass(frozen=True)
class DemoConfig:
    num_layers: int = 2
    block_size: int = 4
    num_kv_heads: int = 1
    head_size: int = 8
    gpu_blocks: int = 96
    host_blocks: int = 512
    sessions: int = 60
    policy: str = "lru"
    mode: str = "eager"
    trace: str | None = None
    threads_per_block: int = 32
    max_thread_blocks: int | None = 2


@dataclass
class DemoReport:
    requests: int = 0
    references: int = 0
    gpu_hits: int = 0
    host_hits: int = 0
    computed: int = 0
    verified: int = 0
    mismatched: int = 0
    bytes_moved: dict = field(default_factory=lambda: {"store": 0, "load": 0})
    blocks_moved: dict = field(default_factory=lambda: {"store": 0, "load": 0})
    transfer_seconds: dict = field(default_factory=lambda: {"store": 0.0, "load": 0.0})
    seconds: float = 0.0
    block_bytes: int = 0


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
    from numba import cuda

    shape = (2, config.gpu_blocks, config.block_size, config.num_kv_heads, config.head_size)
    return [cuda.device_array(shape, dtype=np.float16) for _ in range(config.num_layers)]


class StandInEngine:
    """Just enough of an inference engine: a GPU prefix cache with LRU reuse of its blocks.

    "Computing" a block writes its hash-derived content; a small staging pool and the same
    scatter/gather kernels write those blocks and read loaded ones back for the check.
    """

    def __init__(self, config: DemoConfig, kv_arrays: list, report: DemoReport) -> None:
        from numbakv.datapath import HostPool, KVLayout, TransferEngine

        self.report = report
        layout = KVLayout.from_arrays("flash_attn", kv_arrays)
        self.block_bytes = report.block_bytes = layout.block_bytes
        launch = {
            "threads_per_block": config.threads_per_block,
            "max_thread_blocks": config.max_thread_blocks,
        }
        self.offloader = KVOffloader(
            CPUOffloadingManager(config.block_size, config.host_blocks, cache_policy=config.policy),
            TransferEngine(
                layout,
                HostPool.for_layout(layout, config.host_blocks),
                on_job_done=self._count,
                **launch,
            ),
            mode=config.mode,
        )
        self.staging = HostPool.for_layout(layout, config.gpu_blocks)
        self.compute = TransferEngine(layout, self.staging, **launch)
        self.gpu_cache: OrderedDict[int, int] = OrderedDict()  # hash -> GPU block, LRU first
        self.free_gpu_blocks = list(range(config.gpu_blocks))
        self.pending_store: dict[int, int] = {}  # GPU block -> store job still reading it
        self._job_ids = 0

    def _count(self, job_id, direction, nbytes, seconds, success) -> None:
        direction = str(getattr(direction, "value", direction))
        self.report.bytes_moved[direction] += nbytes
        self.report.blocks_moved[direction] += nbytes // self.block_bytes
        self.report.transfer_seconds[direction] += seconds

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
        host_hits = self.offloader.lookup(rest)
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
        report.host_hits += host_hits
        report.computed += len(computed)

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


def run(config: DemoConfig, kv_arrays: list | None = None, progress: bool = False) -> DemoReport:
    """Replay the workload through a stand-in engine; kv_arrays may be torch/CuPy/Numba arrays."""
    if config.trace:
        chains = read_hash_chains(config.trace)
    else:
        chains = [request.hash_ids for request in multi_turn_chat(sessions=config.sessions)]
    longest = max(map(len, chains))
    if longest > config.gpu_blocks:
        raise ValueError(
            f"the longest request has {longest} blocks: --gpu-blocks must be at least that"
        )
    report = DemoReport()
    engine = StandInEngine(config, kv_arrays or build_kv_cache(config), report)
    started = time.perf_counter()
    for chain in tqdm(chains, disable=not progress, unit="req"):
        engine.serve(chain)
    engine.offloader.drain()
    report.seconds = time.perf_counter() - started
    return report


def _print(report: DemoReport, config: DemoConfig) -> None:
    hits = report.gpu_hits + report.host_hits
    print(
        f"workload       {config.trace or f'built-in multi-turn chat, {config.sessions} sessions'}"
    )
    print(
        f"cache          {config.gpu_blocks} GPU blocks, {config.host_blocks} host blocks "
        f"({config.policy}, {config.mode} offload), {report.block_bytes:,} bytes a block"
    )
    print(f"requests       {report.requests:,}, {report.references:,} block references")
    print(
        f"hit ratio      {hits / max(1, report.references):.3f}  "
        f"(GPU {report.gpu_hits:,} + host tier {report.host_hits:,}; computed {report.computed:,})"
    )
    for direction, name in (("store", "GPU -> host"), ("load", "host -> GPU")):
        seconds, moved = report.transfer_seconds[direction], report.bytes_moved[direction]
        # The simulator's events have no clock: no time, no rate (rather than "0 GB/s").
        rate = f", {moved / seconds / 1e9:.3g} GB/s" if seconds else ""
        print(
            f"{name:<14} {report.blocks_moved[direction]:,} blocks, {moved / 2**20:,.1f} MiB{rate}"
        )
    print(f"byte check     {report.verified:,} loaded blocks verified, {report.mismatched} wrong")
    print(f"time           {report.seconds:.1f} s")


def main(argv: list[str] | None = None) -> int:
    defaults = DemoConfig()
    parser = argparse.ArgumentParser(prog="numbakv-demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace", help="Mooncake-format jsonl trace (default: built-in chat workload)"
    )
    parser.add_argument("--policy", default=defaults.policy)
    parser.add_argument("--mode", choices=("eager", "lazy"), default=defaults.mode)
    for name in (
        "num_layers",
        "block_size",
        "num_kv_heads",
        "head_size",
        "gpu_blocks",
        "host_blocks",
        "sessions",
    ):
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name)
        )
    args = parser.parse_args(argv)
    config = DemoConfig(**vars(args))
    if simulate_without_gpu():
        print(
            "no CUDA GPU here: running on Numba's CUDA simulator "
            "(small sizes suit it; transfers are not timed)"
        )
    try:
        report = run(config, progress=sys.stderr.isatty())
    except (TraceError, ValueError, TypeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    _print(report, config)
    return 1 if report.mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
