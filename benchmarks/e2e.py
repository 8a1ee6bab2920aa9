"""End to end on a GPU: loading a prefix from the host tier versus recomputing it, and overlap.

    python benchmarks/e2e.py [--out results/e2e.json]      # on a GPU (torch used if present)
    python benchmarks/e2e.py --smoke                        # tiny, on the CUDA simulator

1. Time to make a prefix of n blocks available: a load through the offloader (submit to `wait`)
   versus prefill of the same tokens (torch's scaled_dot_product_attention per layer, causal; or
   an assumed cost without torch, stated in the output).
2. A store next to a busy compute stream (torch matmuls on the default stream, as an engine
   computes), for several launch shapes of the store (the default first): the compute's own time
   alone and with the store running (CUDA events on its stream: the slowdown the store causes),
   and the share of the store hidden behind the compute, (store + compute - both) / store, from
   wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

ASSUMED_PREFILL_TOKENS_PER_SECOND = 10_000.0  # an 8B model on one H100, when torch is absent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes for the simulator")
    parser.add_argument("--out", default="results/e2e.json")
    args = parser.parse_args()
    if args.smoke:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    from numba import cuda
    from transfer_bandwidth import optional_torch

    from numbakv import CPUOffloadingManager
    from numbakv.datapath import HostPool, KVLayout, TransferEngine
    from numbakv.offloader import KVOffloader

    layers, block_size, heads, head = (2, 4, 1, 8) if args.smoke else (32, 16, 8, 128)
    gpu_blocks, host_blocks = (32, 64) if args.smoke else (2048, 2048)
    prefixes = [2, 8] if args.smoke else [16, 64, 256, 1024]
    torch = optional_torch()  # None on the simulator
    shape = (2, gpu_blocks, block_size, heads, head)
    if torch is not None:
        kv = [torch.randn(shape, dtype=torch.float16, device="cuda") for _ in range(layers)]
        compute_stream = torch.cuda.current_stream()  # stores and loads are ordered after it
    else:
        rng = np.random.default_rng(0)
        kv = [cuda.to_device(rng.standard_normal(shape).astype(np.float16)) for _ in range(layers)]
        compute_stream = None
    layout = KVLayout.from_arrays("flash_attn", kv)
    engine = TransferEngine(layout, HostPool.for_layout(layout, host_blocks))
    offloader = KVOffloader(CPUOffloadingManager(block_size, host_blocks), engine)
    report: dict = {"block_bytes": layout.block_bytes, "load_vs_recompute": [], "overlap": None}

    hashes = list(range(max(prefixes)))
    offloader.wait(offloader.store(hashes, np.arange(len(hashes)), compute_stream))
    print(
        f"{'prefix blocks':>13} {'tokens':>7} {'load ms':>9} {'recompute ms':>13} {'speed-up':>9}"
    )
    for n in prefixes:
        offloader.wait(offloader.load(hashes[:n], np.arange(n), compute_stream))  # warm
        started = time.perf_counter()
        offloader.wait(offloader.load(hashes[:n], np.arange(n), compute_stream))
        load_s = time.perf_counter() - started
        tokens = n * block_size
        recompute_s, how = _prefill_seconds(torch, layers, heads, head, tokens)
        row = {
            "blocks": n,
            "tokens": tokens,
            "load_s": load_s,
            "recompute_s": recompute_s,
            "recompute": how,
        }
        report["load_vs_recompute"].append(row)
        print(
            f"{n:>13} {tokens:>7} {load_s * 1e3:>9.2f} {recompute_s * 1e3:>13.2f} "
            f"{recompute_s / load_s:>8.1f}x  ({how})"
        )
    offloader.poll()

    if torch is not None:
        shapes = _overlap(torch, layout, engine.host_pool, min(gpu_blocks, host_blocks) // 2)
        report["overlap"] = next(o for o in shapes if o["default"])
        report["overlap_by_shape"] = shapes
        print(
            f"a store of {shapes[0]['blocks']} blocks beside 20 fp16 8192^3 matmuls, by launch shape:"
        )
        for o in shapes:
            print(
                f"  {o['threads_per_block']:>4} threads x {o['thread_blocks']:>2} blocks: store "
                f"alone {o['store_s'] * 1e3:.1f} ms, compute alone {o['compute_alone_ms']:.1f} ms, "
                f"beside the store {o['compute_with_store_ms']:.1f} ms "
                f"({o['compute_slowdown']:+.1%}), both {o['both_s'] * 1e3:.1f} ms: "
                f"{o['hidden_share']:.0%} of the store hidden"
                + (" (default)" if o["default"] else "")
            )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


def _prefill_seconds(torch, layers: int, heads: int, head: int, tokens: int) -> tuple[float, str]:
    """Causal attention over `tokens` in every layer (a lower bound on real prefill)."""
    if torch is None:
        return (
            tokens / ASSUMED_PREFILL_TOKENS_PER_SECOND,
            f"assumed {ASSUMED_PREFILL_TOKENS_PER_SECOND:,.0f} tok/s",
        )
    q = torch.randn((1, heads, tokens, head), dtype=torch.float16, device="cuda")
    attention = torch.nn.functional.scaled_dot_product_attention
    attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(layers):
        attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()
    return time.perf_counter() - started, "torch SDPA, attention only"


OVERLAP_SHAPES = [(1024, 16), (512, 16), (256, 16), (256, 8), (256, 32), (128, 16), (128, 32)]
"""(threads per block, thread blocks) of the stores run beside the compute; the default first."""


def _overlap(torch, layout, pool, n: int) -> list[dict]:
    """A store of `n` blocks (blocks not being computed) against matmuls on the default stream, for
    each launch shape: the compute's own time (CUDA events) alone and beside the store,
    interleaved and repeated, and the share of the store hidden behind it (wall times)."""
    from numbakv.datapath import (
        DEFAULT_MAX_THREAD_BLOCKS,
        DEFAULT_THREADS_PER_BLOCK,
        TransferEngine,
    )
    from numbakv.jobs import Direction

    a = torch.randn((8192, 8192), dtype=torch.float16, device="cuda")
    gpu_ids, host_ids = np.arange(n), np.arange(n)
    jobs = iter(range(10**9))

    def compute() -> tuple:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            a @ a
        end.record()
        return start, end

    def timed(action) -> tuple[float, object]:
        torch.cuda.synchronize()
        started = time.perf_counter()
        result = action()
        torch.cuda.synchronize()
        return time.perf_counter() - started, result

    default = (DEFAULT_THREADS_PER_BLOCK[Direction.STORE], DEFAULT_MAX_THREAD_BLOCKS)
    shapes = [default] + [shape for shape in OVERLAP_SHAPES if shape != default]
    results = []
    for threads, blocks in shapes:
        engine = TransferEngine(layout, pool, max_thread_blocks=blocks, threads_per_block=threads)

        def store(engine: TransferEngine = engine) -> None:
            job = next(jobs)
            engine.submit(job, "store", gpu_ids, host_ids)
            engine.wait(job)
            engine.get_finished()

        timed(compute), timed(store)  # warm up both
        alone_ms, beside_ms, store_s, compute_s, both_s = [], [], [], [], []
        for _ in range(3):
            seconds, (start, end) = timed(compute)
            compute_s.append(seconds)
            alone_ms.append(start.elapsed_time(end))
            store_s.append(timed(store)[0])
            seconds, (start, end) = timed(lambda: (compute(), store())[0])
            both_s.append(seconds)
            beside_ms.append(start.elapsed_time(end))
        alone, beside = statistics.median(alone_ms), statistics.median(beside_ms)
        store_wall, both_wall = statistics.median(store_s), statistics.median(both_s)
        results.append(
            {
                "threads_per_block": threads,
                "thread_blocks": blocks,
                "default": (threads, blocks) == default,
                "blocks": n,
                "store_s": store_wall,
                "compute_s": statistics.median(compute_s),
                "both_s": both_wall,
                "hidden_share": max(
                    0.0, (store_wall + statistics.median(compute_s) - both_wall) / store_wall
                ),
                "compute_alone_ms": alone,
                "compute_with_store_ms": beside,
                "compute_slowdown": beside / alone - 1,
            }
        )
    return results


if __name__ == "__main__":
    main()
