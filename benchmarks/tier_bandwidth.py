"""Bandwidth of the tiers below host memory, against what their store delivers without them.

Each row source (`ROW_SOURCES`) moves the same chunks, the rows of one page-aligned host pool of
random bytes (as pinned host memory is), to its store and back, in jobs of `--job-chunks` chunks,
and reports GB/s per direction (median of `--repeats`, each into a fresh directory):
- `dd`: one file of the same bytes, `oflag=direct` / `iflag=direct`, bs = one chunk: what the
  file system delivers to one sequential stream with the page cache bypassed;
- `numbakv-disk`: `ChunkTier` over `DiskBackend` (header, XXH3-64 and rename per chunk);
- `vllm-fs`: vLLM 0.32's `FileSystemTierManager` on the same pool and chunks, its C I/O where
  built (run with vLLM installed; left out otherwise), as many threads as numbakv's.
Every load is checked byte for byte against what was stored. Prints a table and writes JSON.

    python benchmarks/tier_bandwidth.py --dir /mnt/nvme/bench          # the full configuration
    python benchmarks/tier_bandwidth.py --smoke                         # a tiny check anywhere
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import mmap
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numbakv.tiers import ChunkTier, Namespace
from numbakv.tiers.disk import DiskBackend

FULL = {"chunk_bytes": 2 << 20, "chunks": 512, "job_chunks": 16, "threads": 8, "repeats": 3}
SMOKE = {"chunk_bytes": 64 << 10, "chunks": 32, "job_chunks": 4, "threads": 2, "repeats": 1}


@dataclass
class Setup:
    """What every row source moves: `pool` (one chunk a row), into fresh directories under `root`."""

    pool: np.ndarray
    root: Path
    job_chunks: int
    threads: int
    repeats: int

    @property
    def chunk_bytes(self) -> int:
        return self.pool.shape[1]

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def fresh_directory(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))

    def jobs(self) -> list[np.ndarray]:
        rows = np.arange(len(self.pool))
        return [
            rows[start : start + self.job_chunks] for start in range(0, len(rows), self.job_chunks)
        ]


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def row(source: str, direction: str, setup: Setup, seconds: list[float]) -> dict:
    return {
        "source": source,
        "direction": direction,
        "chunk_bytes": setup.chunk_bytes,
        "chunks": len(setup.pool),
        "GB/s": gbps(setup.nbytes, statistics.median(seconds)),
        "runs_s": seconds,
    }


def dd_rows(setup: Setup) -> list[dict]:
    """dd with O_DIRECT both ways on one file of the same size, bs = one chunk."""
    seconds = {"store": [], "load": []}
    count = f"count={len(setup.pool)}"
    block = f"bs={setup.chunk_bytes}"
    for _ in range(setup.repeats):
        directory = setup.fresh_directory("dd")
        target = directory / "dd.bin"
        seconds["store"].append(_dd("if=/dev/zero", f"of={target}", block, count, "oflag=direct"))
        seconds["load"].append(_dd(f"if={target}", "of=/dev/null", block, count, "iflag=direct"))
        shutil.rmtree(directory)
    return [row("dd", direction, setup, runs) for direction, runs in seconds.items()]


def _dd(*operands: str) -> float:
    finished = subprocess.run(["dd", *operands], capture_output=True, text=True, check=True)
    return float(re.search(r"copied, ([0-9.e+-]+) s", finished.stderr).group(1))


def numbakv_disk_rows(setup: Setup) -> list[dict]:
    """ChunkTier over DiskBackend: every job submitted at once, timed until the last finishes."""
    namespace = Namespace("bench", "", "uint8", 16, 1, 1, 1, 1, setup.chunk_bytes, "bench")
    keys = [uuid.uuid4().bytes for _ in range(len(setup.pool))]
    target = np.empty_like(setup.pool)
    seconds = {"store": [], "load": []}
    for _ in range(setup.repeats):
        directory = setup.fresh_directory("numbakv")
        backend = DiskBackend(directory, namespace, setup.chunk_bytes, 2 * setup.nbytes)
        tier = ChunkTier(backend, setup.pool, namespace, io_threads=setup.threads)
        for direction, submit in (("store", tier.submit_store), ("load", tier.submit_load)):
            if direction == "load":
                target[:] = setup.pool
                setup.pool[:] = 0
            started = time.perf_counter()
            for number, rows in enumerate(setup.jobs()):
                submit(number, [keys[row] for row in rows], rows)
            tier.drain()
            seconds[direction].append(time.perf_counter() - started)
            failed = [job for job in tier.take_finished() if not job.success]
            if failed:
                raise RuntimeError(f"numbakv-disk: {len(failed)} {direction} jobs failed")
        _check_loaded(setup.pool, target, "numbakv-disk")
        tier.close()
        shutil.rmtree(directory)
    return [row("numbakv-disk", direction, setup, runs) for direction, runs in seconds.items()]


def vllm_fs_rows(setup: Setup) -> list[dict]:
    """vLLM 0.32's FileSystemTierManager over the same pool, driven as its tiering manager does."""
    try:
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.tiering.base import TransferJob
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        from tests.vllm_support import offloading_config
    except ImportError as error:
        print(f"vllm-fs left out: vLLM does not import ({error})", file=sys.stderr)
        return []
    config = offloading_config(
        {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": setup.nbytes},
        worker_kv_bytes_per_block=setup.chunk_bytes,
    )
    spec = TieringOffloadingSpec(dataclasses.replace(config, engine_id=uuid.uuid4().hex))
    keys = [make_offload_key(uuid.uuid4().bytes, 0) for _ in range(len(setup.pool))]
    context = ReqContext("bench")
    target = np.empty_like(setup.pool)
    seconds = {"store": [], "load": []}
    for _ in range(setup.repeats):
        directory = setup.fresh_directory("vllm")
        tier = FileSystemTierManager(
            spec,
            memoryview(setup.pool),
            "fs",
            root_dir=str(directory),
            n_read_threads=setup.threads,
            n_write_threads=setup.threads,
        )
        for direction in ("store", "load"):
            if direction == "load":
                target[:] = setup.pool
                setup.pool[:] = 0
            submit = tier.submit_store if direction == "store" else tier.submit_load
            jobs = setup.jobs()
            started = time.perf_counter()
            for number, rows in enumerate(jobs):
                keys_of_job = [keys[row] for row in rows]
                submit(TransferJob(number, keys_of_job, rows, direction == "load", context))
            results = []
            while len(results) < len(jobs):
                results += tier.get_finished_jobs()
                time.sleep(0.0002)
            seconds[direction].append(time.perf_counter() - started)
            if not all(result.success for result in results):
                raise RuntimeError(f"vllm-fs: a {direction} job failed")
        _check_loaded(setup.pool, target, "vllm-fs")
        tier.shutdown()
        shutil.rmtree(directory)
    return [row("vllm-fs", direction, setup, runs) for direction, runs in seconds.items()]


def _check_loaded(loaded: np.ndarray, stored: np.ndarray, source: str) -> None:
    if not np.array_equal(loaded, stored):
        raise RuntimeError(f"{source}: loaded bytes differ from the stored ones")


ROW_SOURCES: dict[str, Callable[[Setup], list[dict]]] = {
    "dd": dd_rows,
    "numbakv-disk": numbakv_disk_rows,
    "vllm-fs": vllm_fs_rows,
}


def aligned_random_pool(chunks: int, chunk_bytes: int) -> np.ndarray:
    memory = mmap.mmap(-1, chunks * chunk_bytes)
    pool = np.frombuffer(memory, np.uint8).reshape(chunks, chunk_bytes)
    pool[:] = np.random.default_rng(0).integers(0, 256, pool.shape, dtype=np.uint8)
    return pool


def with_dd_share(rows: list[dict]) -> list[dict]:
    """Each row's GB/s as a percentage of dd's in the same direction."""
    dd = {r["direction"]: r["GB/s"] for r in rows if r["source"] == "dd"}
    for r in rows:
        if r["direction"] in dd:
            r["vs dd %"] = 100 * r["GB/s"] / dd[r["direction"]]
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'source':<14} {'direction':<9} {'chunk':>9} {'chunks':>7} {'GB/s':>7} {'vs dd':>7}")
    for r in rows:
        share = f"{r['vs dd %']:.0f} %" if "vs dd %" in r else ""
        print(
            f"{r['source']:<14} {r['direction']:<9} {r['chunk_bytes']:>9,} {r['chunks']:>7}"
            f" {r['GB/s']:>7.2f} {share:>7}"
        )


def file_system(path: Path) -> str:
    found = subprocess.run(
        ["df", "--output=fstype,source", str(path)], capture_output=True, text=True, check=True
    )
    return " ".join(found.stdout.split()[2:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("."),
        help="where the files go (a fresh directory is made in it)",
    )
    parser.add_argument(
        "--sources", nargs="+", default=list(ROW_SOURCES), choices=list(ROW_SOURCES)
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny configuration")
    parser.add_argument("--chunk-bytes", type=int)
    parser.add_argument("--chunks", type=int)
    parser.add_argument("--job-chunks", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--json", type=Path, default=Path("tier_bandwidth.json"))
    args = parser.parse_args(argv)
    settings = dict(SMOKE if args.smoke else FULL)
    for name in settings:
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    root = Path(tempfile.mkdtemp(prefix="tier-bandwidth-", dir=args.dir))
    try:
        setup = Setup(
            pool=aligned_random_pool(settings["chunks"], settings["chunk_bytes"]),
            root=root,
            job_chunks=settings["job_chunks"],
            threads=settings["threads"],
            repeats=settings["repeats"],
        )
        machine = (
            f"{platform.node()}, {platform.processor() or platform.machine()}, {file_system(root)}"
        )
        rows = with_dd_share([r for name in args.sources for r in ROW_SOURCES[name](setup)])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{machine}; {settings}")
    print_table(rows)
    args.json.write_text(
        json.dumps({"machine": machine, "settings": settings, "rows": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
