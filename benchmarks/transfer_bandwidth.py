"""Bandwidth of the data path's two paths against the DMA ceiling and the ways a user would do it.

For each per-layer chunk size (the bytes one block occupies in one layer) it builds a KV cache of
`layers` layers, a host pool, and jobs of about `job_mib` MiB of scattered blocks, then measures in
one process, side by side:
- zero-copy gather (GPU -> host) and scatter (host -> GPU) GB/s for several caps on the thread
  blocks a job may hold (16 is the engine's default; "all" is one warp per 4 KiB work item);
- the staged path (kernel into a device staging buffer, one batched copy) each way, default cap;
- a store and a load in flight together, total GB/s, on each pair of paths (store's, load's);
- launch shapes (threads per block x thread blocks) of the zero-copy kernels at one chunk size;
- peers: one cudaMemcpyAsync per block and layer issued from Python, and what a torch user writes
  instead (an index gather per layer into a GPU staging buffer, then one pinned copy; loads the
  other way round), when torch is installed;
- the host time of one `submit` of the whole job and of 16 blocks (default engine).
Then a per-step job (16 blocks, 32 layers, 16 KiB chunks) on each path: submit to completion as an
engine that polls `get_finished` sees it, and through `wait`; and the host time of `submit`: hot
(the previous job polled to its end, as an engine steps), right after the thread slept, and with
the launch left out (on the simulator, submit's Python alone); then the median host time of each
driver call a submit makes (event record, id upload, launch, batched copy). The DMA ceiling is one
large contiguous pinned copy in each direction, and one each way at once, in the same run. Prints
a table and writes JSON.

    python benchmarks/transfer_bandwidth.py                 # on a GPU: the full configuration
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/transfer_bandwidth.py --smoke   # a tiny check anywhere
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/transfer_bandwidth.py --submit-cost   # submit's Python
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numbakv.datapath import (
    COMPILE_SECONDS,
    DEFAULT_MAX_THREAD_BLOCKS,
    HostPool,
    KVLayout,
    LayoutKind,
    TransferEngine,
)
from numbakv.datapath._device import ON_SIMULATOR, event_done, record, upload
from numbakv.datapath.kernels import get_kernel
from numbakv.datapath.transfer import PATHS, STAGED, ZERO_COPY
from numbakv.jobs import Direction

FULL = {
    "chunks": [2048, 4096, 16384, 65536, 262144],
    "layers": 32,
    "job_mib": 1024,
    "thread_blocks": [8, 16, 32, 132, None],
    "threads_per_block": None,  # the engine's default, per direction
    "launch_shapes": {"chunk": 16384, "shapes": [(128, 16), (256, 8), (256, 16), (1024, 16)]},
    "repeats": 5,
    "naive_copies": 4096,
    "submits": 50,
    "per_step": {"blocks": 16, "layers": 32, "chunk": 16384, "repeats": 100},
    "driver_calls": 200,
}
SMOKE = {
    "chunks": [256, 1024],
    "layers": 2,
    "job_mib": 1 / 64,
    "thread_blocks": [1, 2, None],
    "threads_per_block": 32,
    "launch_shapes": {"chunk": 256, "shapes": [(32, 1), (64, 2)]},
    "repeats": 1,
    "naive_copies": 8,
    "submits": 3,
    "per_step": {"blocks": 2, "layers": 2, "chunk": 512, "repeats": 2},
    "driver_calls": 3,
}


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def optional_torch():
    """torch with a GPU, or None (the torch peer is then left out)."""
    if ON_SIMULATOR:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def timed_on(stream, action, repeats: int) -> float:
    """Median seconds of `action` between two events on `stream`, after one warm-up run."""
    times = []
    for _ in range(repeats + 1):
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        action()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times[1:])


def dma_ceiling(nbytes: int, repeats: int) -> dict:
    """One contiguous pinned copy each way, and one each way at once (total): what the link's
    copy engines deliver."""
    devices = [cuda.device_array(nbytes, dtype=np.uint8) for _ in range(2)]
    hosts = [cuda.pinned_array(nbytes, dtype=np.uint8) for _ in range(2)]
    streams = [cuda.stream() for _ in range(2)]

    def d2h(stream=streams[0]):
        devices[0].copy_to_host(hosts[0], stream)

    def h2d(stream=streams[0]):
        devices[1].copy_to_device(hosts[1], stream)

    def both() -> None:
        d2h(streams[0])
        h2d(streams[1])

    walls = []
    for _ in range(repeats + 1):
        cuda.synchronize()
        started = time.perf_counter()
        both()
        cuda.synchronize()
        walls.append(time.perf_counter() - started)
    return {
        "d2h": gbps(nbytes, timed_on(streams[0], d2h, repeats)),
        "h2d": gbps(nbytes, timed_on(streams[0], h2d, repeats)),
        "both": gbps(2 * nbytes, statistics.median(walls[1:])),
    }


class ChunkBench:
    """`layers` layers of `2 * blocks` blocks of `chunk` bytes (torch tensors when torch is
    there, so its peer reads the same memory), a pool as large, random scattered ids."""

    def __init__(self, chunk: int, layers: int, blocks: int, threads_per_block: int | None, torch):
        self.chunk, self.torch = chunk, torch
        self.threads_per_block = threads_per_block
        self.blocks = blocks
        shape = (2 * blocks, 1, chunk)
        if torch is not None:
            self.arrays = [
                torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")
                for _ in range(layers)
            ]
            torch.cuda.synchronize()
        else:
            self.arrays = [cuda.device_array(shape, dtype=np.uint8) for _ in range(layers)]
        self.layout = KVLayout.from_arrays(LayoutKind.MLA, self.arrays)
        self.pool = HostPool.for_layout(self.layout, 2 * blocks)
        self.job_bytes = blocks * self.layout.block_bytes
        rng = np.random.default_rng(chunk)
        self.gpu_ids = rng.permutation(2 * blocks)
        self.host_ids = rng.permutation(2 * blocks)
        self._next_job = 0

    def engine(
        self,
        thread_blocks: int | None,
        seconds: list | None = None,
        threads: int | None = None,
        path: str | dict | None = ZERO_COPY,
    ) -> TransferEngine:
        """An engine on `path` (None: the engine's default paths)."""
        return TransferEngine(
            self.layout,
            self.pool,
            max_thread_blocks=thread_blocks,
            threads_per_block=threads or self.threads_per_block,
            path=path,
            on_job_done=None if seconds is None else lambda job: seconds.append(job.seconds),
        )

    def job_id(self) -> int:
        self._next_job += 1
        return self._next_job

    def one_direction(
        self,
        thread_blocks: int | None,
        direction: str,
        repeats: int,
        threads: int | None = None,
        path: str = ZERO_COPY,
    ) -> float:
        """GB/s of one job, from the engine's own events around it (median after a warm-up)."""
        seconds: list[float] = []
        engine = self.engine(thread_blocks, seconds, threads, path)
        for _ in range(repeats + 1):
            job = self.job_id()
            engine.submit(job, direction, self.gpu_ids[: self.blocks], self.host_ids[: self.blocks])
            engine.wait(job)
        return gbps(self.job_bytes, statistics.median(seconds[1:]))

    def concurrent(
        self,
        repeats: int,
        thread_blocks: int = DEFAULT_MAX_THREAD_BLOCKS,
        threads: int | None = None,
        path: str | dict = ZERO_COPY,
    ) -> float:
        """A store of one half and a load of the other half in flight together, on `path` (one
        for both, or one per direction): total GB/s."""
        engine = self.engine(thread_blocks, threads=threads, path=path)
        half = slice(self.blocks, 2 * self.blocks)
        walls = []
        for _ in range(repeats + 1):
            cuda.synchronize()
            started = time.perf_counter()
            store, load = self.job_id(), self.job_id()
            engine.submit(store, "store", self.gpu_ids[: self.blocks], self.host_ids[: self.blocks])
            engine.submit(load, "load", self.gpu_ids[half], self.host_ids[half])
            engine.wait(store)
            engine.wait(load)
            walls.append(time.perf_counter() - started)
        return gbps(2 * self.job_bytes, statistics.median(walls[1:]))

    def _submit_times(
        self, engine: TransferEngine, submits: int, blocks: int, before: str = "wait"
    ) -> list[float]:
        """Host seconds of each of `submits` submits of `blocks` blocks, one job at a time; the
        job before each was seen to its end by `wait`, by polling, or by polling and a sleep of
        the thread (`before`)."""
        times = []
        for _ in range(submits):
            job = self.job_id()
            started = time.perf_counter()
            engine.submit(job, "store", self.gpu_ids[:blocks], self.host_ids[:blocks])
            times.append(time.perf_counter() - started)
            if before == "wait":
                engine.wait(job)
            while not engine.get_finished():
                pass
            if before == "sleep":
                time.sleep(0.001)
        return times

    def submit_seconds(
        self, submits: int, blocks: int, path: str | None = None, before: str = "wait"
    ) -> float:
        """Median host time of one submit of `blocks` blocks (validation, ids, records, launch,
        and a staged job's copies)."""
        engine = self.engine(DEFAULT_MAX_THREAD_BLOCKS, path=path)
        return statistics.median(self._submit_times(engine, submits + 1, blocks, before)[1:])

    def submit_seconds_without_launch(
        self, submits: int, blocks: int, path: str | None = ZERO_COPY
    ) -> float:
        """The same, polled, with the kernel launch (and a staged job's copies) replaced by
        nothing, best of 5 rounds: submit's cost before the launch (on the simulator, where
        records and uploads do nothing either, its Python alone)."""
        engine = self.engine(DEFAULT_MAX_THREAD_BLOCKS, path=path)
        for lane in engine._lanes.values():  # a measurement's seam, not an API
            lane.launch = lambda grid, *values: None
            if lane.staging is not None:
                lane.staging._copy = lambda pairs: None
        return min(
            statistics.median(self._submit_times(engine, submits, blocks, "poll")) for _ in range(5)
        )

    def submit_to_completion(self, repeats: int, path: str) -> dict:
        """Per-step jobs on `path`, from before `submit` to completion: seen by polling
        `get_finished` (as an engine stepping does) and by `wait`."""
        engine = self.engine(DEFAULT_MAX_THREAD_BLOCKS, path=path)
        result = {}
        for direction in ("store", "load"):
            for how in ("poll", "wait"):
                walls = []
                for _ in range(repeats + 1):
                    job = self.job_id()
                    started = time.perf_counter()
                    engine.submit(
                        job, direction, self.gpu_ids[: self.blocks], self.host_ids[: self.blocks]
                    )
                    if how == "wait":
                        engine.wait(job)
                    while not engine.get_finished():
                        pass
                    walls.append(time.perf_counter() - started)
                result[f"{direction}_{how}_gbps"] = gbps(
                    self.job_bytes, statistics.median(walls[1:])
                )
        return result

    def driver_calls(self, calls: int) -> dict:
        """Median host microseconds of each driver call a submit of this bench's job makes, on
        an idle stream (each waited out before the next): where a submit's time goes."""
        engine = self.engine(DEFAULT_MAX_THREAD_BLOCKS, path=STAGED)
        lane = engine._lanes[Direction.STORE]  # a measurement's seam, not an API
        slot, count = lane.free_slots[0], self.blocks
        slot.pinned_ids[:count] = self.gpu_ids[:count]
        lane.staging.positions(out=slot.pinned_ids[count : 2 * count])
        segments = engine.layout.num_segments
        every = (0, segments, segments, 0)  # the kernels' segment arguments: every segment
        lane.staging.queue(lambda *_: None, 1, self.host_ids[:count], count, every)  # addresses
        plain = engine._lanes[Direction.LOAD]
        calls_of = {
            "event_record": lambda: record(slot.end_at, lane.stream_at),
            "id_upload": lambda: upload(
                lane.device_ids,
                lane.device_ids_at,
                slot.pinned_ids,
                slot.pinned_ids_at,
                2 * count,
                lane.stream_at,
            ),
            "launch": lambda: lane.launch(DEFAULT_MAX_THREAD_BLOCKS, count, 0, count, *every),
            "batch_copy": lambda: lane.staging._copy(count),
            # one entry: whether the batched copy's cost is per call or per block copied
            "batch_copy_one": lambda: lane.staging._copy(1),
            "event_query": lambda: event_done(plain.free_slots[0].end),
        }
        result = {}
        for name, call in calls_of.items():
            times = []
            for _ in range(calls + 1):
                lane.stream.synchronize()
                started = time.perf_counter()
                call()
                times.append(time.perf_counter() - started)
            result[name] = statistics.median(times[1:]) * 1e6
        lane.stream.synchronize()
        return result

    def naive(self, copies: int) -> dict:
        """One cudaMemcpyAsync per block and layer from Python, over the first `copies` of them."""
        stream = cuda.stream()
        host = self.pool.blocks
        layers = len(self.arrays)
        views = self.arrays if self.torch is None else list(map(cuda.as_cuda_array, self.arrays))
        pairs = [
            (self.gpu_ids[i // layers], self.host_ids[i // layers], i % layers)
            for i in range(min(copies, self.blocks * layers))
        ]
        result = {}
        for name in ("d2h", "h2d"):
            cuda.synchronize()
            started = time.perf_counter()
            for gpu_id, host_id, layer in pairs:
                device = views[layer][gpu_id, 0]
                target = host[host_id, layer * self.chunk : (layer + 1) * self.chunk]
                if name == "d2h":
                    device.copy_to_host(target, stream=stream)
                else:
                    device.copy_to_device(target, stream=stream)
            stream.synchronize()
            result[name] = gbps(len(pairs) * self.chunk, time.perf_counter() - started)
        return result

    def torch_way(self, repeats: int) -> dict | None:
        """What a torch user writes: an index gather per layer into a GPU staging buffer, then one
        pinned copy (a load: one pinned copy, then an index copy per layer). Layer-major staging,
        the layout that needs the fewest kernels."""
        torch = self.torch
        if torch is None:
            return None
        layers = len(self.arrays)
        index = torch.as_tensor(self.gpu_ids[: self.blocks], device="cuda")
        staging = torch.empty((layers, self.blocks, self.chunk), dtype=torch.uint8, device="cuda")
        pinned = torch.empty(staging.shape, dtype=torch.uint8, pin_memory=True)
        flat = [array.view(2 * self.blocks, self.chunk) for array in self.arrays]

        def gather() -> None:
            for layer, array in enumerate(flat):
                torch.index_select(array, 0, index, out=staging[layer])
            pinned.copy_(staging, non_blocking=True)

        def scatter() -> None:
            staging.copy_(pinned, non_blocking=True)
            for layer, array in enumerate(flat):
                array.index_copy_(0, index, staging[layer])

        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        return {
            "d2h": gbps(self.job_bytes, timed_on(stream, gather, repeats)),
            "h2d": gbps(self.job_bytes, timed_on(stream, scatter, repeats)),
        }


def compile_probe() -> dict:
    """Kernel compile (or disk-cache load) seconds in this process."""
    for name in ("gather", "scatter"):
        get_kernel(name, np.dtype(np.uint64))
    return dict(COMPILE_SECONDS)


def fresh_process_compile() -> dict | None:
    """The same probe in a new process: with the on-disk cache warm, this is the restart cost."""
    if ON_SIMULATOR:
        return None
    output = subprocess.run(
        [sys.executable, __file__, "--compile-probe"], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def run(config: dict, out: Path) -> dict:
    device = cuda.get_current_device()
    name = getattr(device, "name", "simulator")
    torch = optional_torch()
    report = {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "sm_count": getattr(device, "MULTIPROCESSOR_COUNT", None),
        "simulator": ON_SIMULATOR,
        "python": platform.python_version(),
        "default_max_thread_blocks": DEFAULT_MAX_THREAD_BLOCKS,
        "config": config,
        "compile_seconds_first_call": compile_probe(),
        "compile_seconds_fresh_process": fresh_process_compile(),
    }
    job_bytes = int(config["job_mib"] * 2**20)
    report["dma_ceiling_gbps"] = dma_ceiling(job_bytes, config["repeats"])
    rows = []
    for chunk in config["chunks"]:
        blocks = max(1, job_bytes // (config["layers"] * chunk))
        bench = ChunkBench(chunk, config["layers"], blocks, config["threads_per_block"], torch)
        row = {
            "chunk_bytes": chunk,
            "blocks_per_job": bench.blocks,
            "job_bytes": bench.job_bytes,
            "gather_gbps": {},
            "scatter_gbps": {},
        }
        for cap in config["thread_blocks"]:
            key = "all" if cap is None else str(cap)
            row["gather_gbps"][key] = bench.one_direction(cap, "store", config["repeats"])
            row["scatter_gbps"][key] = bench.one_direction(cap, "load", config["repeats"])
        row["staged_gbps"] = {
            direction: bench.one_direction(
                DEFAULT_MAX_THREAD_BLOCKS, direction, config["repeats"], path=STAGED
            )
            for direction in ("store", "load")
        }
        row["together_gbps"] = {
            f"{store}/{load}": bench.concurrent(
                config["repeats"], path={"store": store, "load": load}
            )
            for store in PATHS
            for load in PATHS
        }
        row["naive_gbps"] = bench.naive(config["naive_copies"])
        row["torch_gbps"] = bench.torch_way(config["repeats"])
        row["submit_us_median"] = bench.submit_seconds(config["submits"], bench.blocks) * 1e6
        row["submit_us_median_16_blocks"] = (
            bench.submit_seconds(config["submits"], min(16, bench.blocks)) * 1e6
        )
        rows.append(row)
        del bench
    report["rows"] = rows
    report["launch_shapes"] = launch_shapes(config, job_bytes, torch)
    step = config["per_step"]
    bench = ChunkBench(
        step["chunk"], step["layers"], step["blocks"], config["threads_per_block"], torch
    )
    probe = TransferEngine(bench.layout, bench.pool)
    report["default_paths"] = {direction.value: path for direction, path in probe.path.items()}
    del probe
    repeats = step["repeats"]
    report["per_step"] = {
        "blocks": step["blocks"],
        "layers": step["layers"],
        "chunk_bytes": step["chunk"],
        "job_bytes": bench.job_bytes,
        "paths": {
            path: {
                **bench.submit_to_completion(repeats, path),
                "submit_us_polled": bench.submit_seconds(repeats, step["blocks"], path, "poll")
                * 1e6,
                "submit_us_after_wait": bench.submit_seconds(repeats, step["blocks"], path) * 1e6,
                "submit_us_after_sleep": bench.submit_seconds(
                    repeats, step["blocks"], path, "sleep"
                )
                * 1e6,
                "submit_us_without_launch": bench.submit_seconds_without_launch(
                    config["submits"], step["blocks"], path
                )
                * 1e6,
            }
            for path in PATHS
        },
    }
    report["driver_calls_us"] = bench.driver_calls(config["driver_calls"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"\nwrote {out}")
    return report


def launch_shapes(config: dict, job_bytes: int, torch) -> list[dict]:
    """Each (threads per block, thread blocks) of the zero-copy kernels: GB/s each way and both at
    once, one chunk size."""
    sweep = config["launch_shapes"]
    chunk = sweep["chunk"]
    blocks = max(1, job_bytes // (config["layers"] * chunk))
    bench = ChunkBench(chunk, config["layers"], blocks, config["threads_per_block"], torch)
    repeats = config["repeats"]
    return [
        {
            "chunk_bytes": chunk,
            "threads_per_block": threads,
            "thread_blocks": thread_blocks,
            "gather_gbps": bench.one_direction(thread_blocks, "store", repeats, threads),
            "scatter_gbps": bench.one_direction(thread_blocks, "load", repeats, threads),
            "concurrent_gbps": bench.concurrent(repeats, thread_blocks, threads),
        }
        for threads, thread_blocks in sweep["shapes"]
    ]


def _ratio(value: float | None, ceiling: float) -> str:
    return "-" if value is None else f"{100 * value / ceiling:.0f}%"


def print_table(report: dict) -> None:
    ceiling = report["dma_ceiling_gbps"]
    print(
        f"device: {report['device']} (SMs: {report['sm_count']}, simulator: {report['simulator']})"
    )
    print(
        f"DMA ceiling: d2h {ceiling['d2h']:.1f} GB/s, h2d {ceiling['h2d']:.1f} GB/s, "
        f"both at once {ceiling['both']:.1f} GB/s"
    )
    print(f"kernel compile, first call: {report['compile_seconds_first_call']}")
    print(f"kernel compile, fresh process: {report['compile_seconds_fresh_process']}")
    keys = list(report["rows"][0]["gather_gbps"])
    header = (
        ["chunk KiB", "dir"]
        + [f"tb={k}" for k in keys]
        + ["% ceil", "% ceil@16", "staged", "% ceil", "memcpy", "torch"]
        + [f"{store[0]}+{load[0]} both" for store in PATHS for load in PATHS]
        + ["submit us", "submit16 us"]
    )
    print(
        "zero-copy kernels by thread-block cap, the staged path (16 blocks), and a store and a "
        "load together on each pair of paths (s+l: z zero-copy, s staged), GB/s:"
    )
    print(" | ".join(f"{h:>10}" for h in header))
    for row in report["rows"]:
        staged = row["staged_gbps"]
        for direction, name, link in (
            ("store", "gather", "d2h"),
            ("load", "scatter", "h2d"),
        ):
            speeds = row[f"{name}_gbps"]
            torch_way = row["torch_gbps"]
            cells = [f"{row['chunk_bytes'] / 1024:g}", name] + [f"{speeds[k]:.1f}" for k in keys]
            cells += [
                _ratio(max(speeds.values()), ceiling[link]),
                _ratio(speeds.get("16"), ceiling[link]),
                f"{staged[direction]:.1f}",
                _ratio(staged[direction], ceiling[link]),
                f"{row['naive_gbps'][link]:.2f}",
                "-" if torch_way is None else f"{torch_way[link]:.1f}",
                *(f"{gbps:.1f}" for gbps in row["together_gbps"].values()),
                f"{row['submit_us_median']:.1f}",
                f"{row['submit_us_median_16_blocks']:.1f}",
            ]
            print(" | ".join(f"{c:>10}" for c in cells))
    print(f"launch shapes, {report['launch_shapes'][0]['chunk_bytes'] / 1024:g} KiB chunks:")
    print(" | ".join(f"{h:>10}" for h in ("threads", "blocks", "gather", "scatter", "both")))
    for shape in report["launch_shapes"]:
        cells = [shape["threads_per_block"], shape["thread_blocks"]]
        cells += [f"{shape[key]:.1f}" for key in ("gather_gbps", "scatter_gbps", "concurrent_gbps")]
        print(" | ".join(f"{c:>10}" for c in cells))
    step = report["per_step"]
    print(
        f"per-step job ({step['blocks']} blocks x {step['layers']} layers x "
        f"{step['chunk_bytes'] / 1024:g} KiB), submit to completion; default paths "
        f"{report['default_paths']}:"
    )
    for path, figures in step["paths"].items():
        print(
            f"  {path:>9}: store {figures['store_poll_gbps']:.1f} GB/s "
            f"({_ratio(figures['store_poll_gbps'], ceiling['d2h'])}), load "
            f"{figures['load_poll_gbps']:.1f} GB/s "
            f"({_ratio(figures['load_poll_gbps'], ceiling['h2d'])}) polling; with wait: store "
            f"{figures['store_wait_gbps']:.1f}, load {figures['load_wait_gbps']:.1f}; submit "
            f"{figures['submit_us_polled']:.1f} us median hot, "
            f"{figures['submit_us_after_wait']:.1f} after wait, "
            f"{figures['submit_us_after_sleep']:.1f} after a sleep, "
            f"{figures['submit_us_without_launch']:.1f} without the launch"
        )
    calls = ", ".join(f"{name} {us:.1f}" for name, us in report["driver_calls_us"].items())
    print(f"driver calls of a submit, median us: {calls}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny configuration (for the simulator)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/transfer_bandwidth.json"))
    parser.add_argument(
        "--threads-per-block", type=int, help="override the configuration's threads per block"
    )
    parser.add_argument(
        "--submit-cost",
        action="store_true",
        help="only submit's cost for the per-step job on each path, the launch left out (best "
        "of 5 rounds)",
    )
    parser.add_argument("--compile-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_probe:
        print(json.dumps(compile_probe()))
        return
    if args.submit_cost:
        step = FULL["per_step"]
        bench = ChunkBench(step["chunk"], step["layers"], step["blocks"], None, None)
        for path in PATHS:
            seconds = bench.submit_seconds_without_launch(200, step["blocks"], path)
            print(
                f"submit of {step['blocks']} blocks x {step['layers']} layers x "
                f"{step['chunk'] // 1024} KiB, {path}, launch left out: {seconds * 1e6:.1f} us "
                f"median (best of 5 rounds of 200; simulator: {ON_SIMULATOR})"
            )
        return
    config = dict(SMOKE if args.smoke else FULL)
    if args.threads_per_block:
        config["threads_per_block"] = args.threads_per_block
    run(config, args.out)


if __name__ == "__main__":
    main()
