"""What a transfer costs the compute beside it, on a GPU: a store (or a load) of 2 GiB next to 20
fp16 8192^3 matmuls on torch's default stream (as an engine computes), for each path and launch
shape.

    python benchmarks/overlap.py [--out results/overlap.json]     # on a GPU, with torch

For each path at the engine's launch shape, stores then loads, then zero-copy stores at other
shapes: the compute's own time (CUDA events on its stream) alone and beside the transfer,
interleaved, median of 3 (the slowdown the transfer causes), and the share of the transfer hidden
behind the compute, (transfer + compute - both) / transfer, from wall times. The blocks moved are
none the matmuls read or write, so no transfer waits for them. The time to first token a load
buys is benchmarks/ttft.py's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

LAYERS, BLOCK_SIZE, HEADS, HEAD = 32, 16, 8, 128  # 2 MiB blocks, Llama-3.1-8B's KV per block
BLOCKS = 1024
SHAPES = [
    (direction, path, None, None)
    for direction in ("store", "load")
    for path in ("staged", "zero_copy")
] + [("store", "zero_copy", threads, blocks) for threads, blocks in ((256, 8), (1024, 16))]
"""(direction, path, threads per block, thread blocks) of the transfers run beside the compute;
None: the engine's own launch shape for the path."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/overlap.json")
    args = parser.parse_args()
    import torch

    from numbakv.datapath import HostPool, KVLayout

    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: needs a CUDA GPU and torch with CUDA\n")
    shape = (2, BLOCKS, BLOCK_SIZE, HEADS, HEAD)
    kv = [torch.randn(shape, dtype=torch.float16, device="cuda") for _ in range(LAYERS)]
    layout = KVLayout.from_arrays("flash_attn", kv)
    shapes = overlap(torch, layout, HostPool.for_layout(layout, BLOCKS), BLOCKS)
    default = {o["direction"]: o for o in shapes if o["default"]}
    report = {
        "block_bytes": layout.block_bytes,
        "overlap": default["store"],
        "load_overlap": default["load"],
        "overlap_by_shape": shapes,
    }
    print(f"a transfer of {BLOCKS} blocks (2 GiB) beside 20 fp16 8192^3 matmuls:")
    for o in shapes:
        what = o["direction"]
        print(
            f"  {what:>5} {o['path']:>9} {o['threads_per_block']:>4} threads x "
            f"{o['thread_blocks'] or 'all'} blocks: {what} alone {o['transfer_s'] * 1e3:.1f} ms, "
            f"compute alone {o['compute_alone_ms']:.1f} ms, beside the {what} "
            f"{o['compute_with_transfer_ms']:.1f} ms ({o['compute_slowdown']:+.1%}), both "
            f"{o['both_s'] * 1e3:.1f} ms: {o['hidden_share']:.0%} of the {what} hidden"
            + (" (default)" if o["default"] else "")
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


def overlap(torch, layout, pool, n: int) -> list[dict]:
    """A transfer of `n` blocks against matmuls on the default stream, for each of SHAPES: the
    compute's own time (CUDA events) alone and beside the transfer, interleaved and repeated, and
    the share of the transfer hidden behind it (wall times)."""
    from numbakv.datapath import TransferEngine
    from numbakv.datapath.transfer import DEFAULT_PATHS
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

    results = []
    for direction, path, threads, blocks in SHAPES:
        engine_launch = threads is None and blocks is None
        options = {"path": path, "threads_per_block": threads}
        if blocks is not None:
            options["max_thread_blocks"] = blocks
        engine = TransferEngine(layout, pool, **options)
        lane = Direction(direction)

        def transfer(engine: TransferEngine = engine, direction: str = direction) -> None:
            job = next(jobs)
            engine.submit(job, direction, gpu_ids, host_ids)  # blocks no matmul touches
            engine.wait(job)
            engine.get_finished()

        timed(compute), timed(transfer)  # warm up both
        alone_ms, beside_ms, transfer_s, compute_s, both_s = [], [], [], [], []
        for _ in range(3):
            seconds, (start, end) = timed(compute)
            compute_s.append(seconds)
            alone_ms.append(start.elapsed_time(end))
            transfer_s.append(timed(transfer)[0])
            seconds, (start, end) = timed(lambda: (compute(), transfer())[0])
            both_s.append(seconds)
            beside_ms.append(start.elapsed_time(end))
        alone, beside = statistics.median(alone_ms), statistics.median(beside_ms)
        transfer_wall, both_wall = statistics.median(transfer_s), statistics.median(both_s)
        results.append(
            {
                "direction": direction,
                "path": engine.path[lane],
                "threads_per_block": engine.threads_per_block[lane],
                "thread_blocks": engine.thread_blocks[lane],
                "engine_launch": engine_launch,
                "default": engine_launch and path == DEFAULT_PATHS[lane],
                "blocks": n,
                "transfer_s": transfer_wall,
                "compute_s": statistics.median(compute_s),
                "both_s": both_wall,
                "hidden_share": max(
                    0.0,
                    (transfer_wall + statistics.median(compute_s) - both_wall) / transfer_wall,
                ),
                "compute_alone_ms": alone,
                "compute_with_transfer_ms": beside,
                "compute_slowdown": beside / alone - 1,
            }
        )
    return results


if __name__ == "__main__":
    main()
