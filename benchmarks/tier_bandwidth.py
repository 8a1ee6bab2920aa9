"""Bandwidth of the tiers below host memory, against what their store delivers without them.

Each row source (`ROW_SOURCES`) moves the same chunks of random bytes, the rows of a page-aligned
host pool, to its store and back, in jobs of `--job-chunks` chunks, and reports GB/s per direction
(median of `--repeats` rounds, each into a fresh directory; the sources' runs alternate within a
round, in a new order each round). Two pools hold the same bytes: numbakv's `HostPool` (the
memory its offloader gives its tiers: its own, with transparent huge pages where the kernel gives
them) and a plain one, a shared mapping of small pages as vLLM 0.32 maps its CPU tier in /dev/shm.
- `dd`: one file of the same bytes, `oflag=direct` / `iflag=direct`, bs = one chunk: what the
  file system delivers to one sequential stream with the page cache bypassed;
- `numbakv-disk`: `ChunkTier` over `DiskBackend` (header, XXH3-64 and rename per chunk) on
  numbakv's `HostPool`; `numbakv-disk-plain` the same on the plain pool;
- `vllm-fs`: vLLM 0.32's `FileSystemTierManager` on the plain pool, its C I/O where built (run
  with vLLM installed; left out otherwise), as many threads as numbakv's: half of them load-first
  and half store-first (each group takes the other's work when it has none); `vllm-fs-huge` the
  same on numbakv's `HostPool`, which shows what the tiers' code makes of the same memory;
- `lmcache-disk`: LMCache 0.5.6's `LocalDiskBackend` with O_DIRECT, as many I/O threads, on
  chunks of the same size in its own memory (run with `--lmcache-python`, the Python of an
  environment with LMCache: benchmarks/lmcache_baseline.py; left out otherwise).
Every load is checked byte for byte against what was stored. Prints a table and writes JSON
(`--out`, results/tier_bandwidth.json by default).

    python benchmarks/tier_bandwidth.py --dir /mnt/nvme/bench          # the full configuration
    python benchmarks/tier_bandwidth.py --smoke                         # a tiny check anywhere
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import mmap
import platform
import random
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

from lmcache_baseline import LMCacheBaseline
from rounds import by_round

from numbakv.datapath import HostPool
from numbakv.tiers import Namespace, open_tier

FULL = {"chunk_bytes": 2 << 20, "chunks": 512, "job_chunks": 16, "threads": 8, "repeats": 3}
SMOKE = {"chunk_bytes": 64 << 10, "chunks": 32, "job_chunks": 4, "threads": 2, "repeats": 1}


@dataclass
class Setup:
    """What every row source moves: the rows of `pool` (plain memory) or of `host_pool` (numbakv's
    `HostPool`), the same bytes, one chunk a row, into fresh directories under `root`."""

    pool: np.ndarray
    host_pool: np.ndarray
    root: Path
    job_chunks: int
    threads: int
    repeats: int
    lmcache: LMCacheBaseline | None = None

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


class SourceUnavailable(Exception):
    """A row source that cannot run here (its library is not installed)."""


def dd_run(setup: Setup) -> dict[str, float]:
    """dd with O_DIRECT both ways on one file of the same size, bs = one chunk."""
    directory = setup.fresh_directory("dd")
    target = directory / "dd.bin"
    count, block = f"count={len(setup.pool)}", f"bs={setup.chunk_bytes}"
    seconds = {
        "store": _dd("if=/dev/zero", f"of={target}", block, count, "oflag=direct"),
        "load": _dd(f"if={target}", "of=/dev/null", block, count, "iflag=direct"),
    }
    shutil.rmtree(directory)
    return seconds


def _dd(*operands: str) -> float:
    finished = subprocess.run(["dd", *operands], capture_output=True, text=True, check=True)
    return float(re.search(r"copied, ([0-9.e+-]+) s", finished.stderr).group(1))


def numbakv_disk_run(setup: Setup, pool: np.ndarray) -> dict[str, float]:
    """ChunkTier over DiskBackend on `pool`: every job submitted at once, timed until the last
    finishes."""
    namespace = Namespace("bench", "", "uint8", 16, 1, 1, 1, 1, setup.chunk_bytes, "bench")
    keys = [uuid.uuid4().bytes for _ in range(len(setup.pool))]
    directory = setup.fresh_directory("numbakv")
    url = f"{directory.as_uri()}?bytes_to_use={2 * setup.nbytes}&io_threads={setup.threads}"
    tier = open_tier(url, pool, namespace)
    stored = pool.copy()
    seconds = {}
    for direction, submit in (("store", tier.submit_store), ("load", tier.submit_load)):
        if direction == "load":
            pool[:] = 0
        started = time.perf_counter()
        for number, rows in enumerate(setup.jobs()):
            submit(number, [keys[row] for row in rows], rows)
        tier.drain()
        seconds[direction] = time.perf_counter() - started
        if not all(job.success for job in tier.take_finished()):
            raise RuntimeError(f"numbakv-disk: a {direction} job failed")
    _check_loaded(pool, stored, "numbakv-disk")
    tier.close()
    shutil.rmtree(directory)
    return seconds


def vllm_fs_run(setup: Setup, pool: np.ndarray) -> dict[str, float]:
    """vLLM 0.32's FileSystemTierManager over `pool`, driven as its tiering manager does."""
    try:
        from vllm.v1.kv_offload.base import ReqContext, make_offload_key
        from vllm.v1.kv_offload.tiering.base import TransferJob
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        from tests.support.vllm_support import offloading_config
    except ImportError as error:
        raise SourceUnavailable(f"vLLM does not import ({error})") from error
    config = offloading_config(
        {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": setup.nbytes},
        worker_kv_bytes_per_block=setup.chunk_bytes,
    )
    spec = TieringOffloadingSpec(dataclasses.replace(config, engine_id=uuid.uuid4().hex))
    keys = [make_offload_key(uuid.uuid4().bytes, 0) for _ in range(len(setup.pool))]
    context = ReqContext("bench")
    directory = setup.fresh_directory("vllm")
    tier = FileSystemTierManager(
        spec,
        memoryview(pool),
        "fs",
        root_dir=str(directory),
        n_read_threads=max(1, setup.threads // 2),
        n_write_threads=max(1, setup.threads // 2),
    )
    stored = pool.copy()
    seconds = {}
    for direction, submit in (("store", tier.submit_store), ("load", tier.submit_load)):
        if direction == "load":
            pool[:] = 0
        jobs = setup.jobs()
        started = time.perf_counter()
        for number, rows in enumerate(jobs):
            keys_of_job = [keys[row] for row in rows]
            submit(TransferJob(number, keys_of_job, rows, direction == "load", context))
        results = []
        while len(results) < len(jobs):
            results += tier.get_finished_jobs()
            time.sleep(0.0002)
        seconds[direction] = time.perf_counter() - started
        if not all(result.success for result in results):
            raise RuntimeError(f"vllm-fs: a {direction} job failed")
    _check_loaded(pool, stored, "vllm-fs")
    tier.shutdown()
    shutil.rmtree(directory)
    return seconds


def lmcache_disk_run(setup: Setup) -> dict[str, float]:
    """LMCache's LocalDiskBackend (O_DIRECT) in its own process, one directory for every round
    (it forgets its files before each store)."""
    if setup.lmcache is None:
        raise SourceUnavailable("no --lmcache-python given")
    where = str(setup.root / "lmcache")
    batch = (where, setup.chunk_bytes, len(setup.pool))
    return {
        direction: setup.lmcache.seconds("disk", *batch, op, threads=setup.threads)
        for direction, op in (("store", "write"), ("load", "read"))
    }


def _check_loaded(loaded: np.ndarray, stored: np.ndarray, source: str) -> None:
    if not np.array_equal(loaded, stored):
        raise RuntimeError(f"{source}: loaded bytes differ from the stored ones")


ROW_SOURCES: dict[str, Callable[[Setup], dict[str, float]]] = {
    "dd": dd_run,
    "numbakv-disk": lambda setup: numbakv_disk_run(setup, setup.host_pool),
    "numbakv-disk-plain": lambda setup: numbakv_disk_run(setup, setup.pool),
    "vllm-fs": lambda setup: vllm_fs_run(setup, setup.pool),
    "vllm-fs-huge": lambda setup: vllm_fs_run(setup, setup.host_pool),
    "lmcache-disk": lmcache_disk_run,
}
"""One run of each source: seconds per direction. The runs of all sources alternate, so a busy
moment of the machine falls on each alike."""


def measure(setup: Setup, sources: list[str]) -> list[dict]:
    """`setup.repeats` rounds of one run per source; a row per source and direction (medians)."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
    shuffler = random.Random(0)  # a new order each round: no source always follows another
    for _ in range(setup.repeats):
        for name in shuffler.sample(list(runs), len(runs)):
            try:
                runs[name].append(ROW_SOURCES[name](setup))
            except SourceUnavailable as why:
                print(f"{name} left out: {why}", file=sys.stderr)
                del runs[name]
    rows = []
    for name, results in runs.items():
        for direction in results[0]:
            seconds = [result[direction] for result in results]
            rows.append(
                {
                    "source": name,
                    "direction": direction,
                    "chunk_bytes": setup.chunk_bytes,
                    "chunks": len(setup.pool),
                    "GB/s": gbps(setup.nbytes, statistics.median(seconds)),
                    "runs_GB/s": [gbps(setup.nbytes, s) for s in seconds],
                }
            )
    return rows


def random_pools(chunks: int, chunk_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """The plain pool (a shared mapping of small pages, as vLLM maps its CPU tier) and the rows of
    numbakv's `HostPool`, holding the same random bytes."""
    plain = np.frombuffer(mmap.mmap(-1, chunks * chunk_bytes), np.uint8)
    plain = plain.reshape(chunks, chunk_bytes)
    plain[:] = np.random.default_rng(0).integers(0, 256, plain.shape, dtype=np.uint8)
    host_pool = HostPool(chunks, chunk_bytes).blocks
    host_pool[:] = plain
    return plain, host_pool


def with_dd_share(rows: list[dict]) -> list[dict]:
    """Each row's GB/s as a percentage of dd's in the same direction."""
    dd = {r["direction"]: r["GB/s"] for r in rows if r["source"] == "dd"}
    for r in rows:
        if r["direction"] in dd:
            r["vs dd %"] = 100 * r["GB/s"] / dd[r["direction"]]
    return rows


def with_numbakv_by_round(rows: list[dict]) -> list[dict]:
    """Each other source's row: numbakv's rate over its own, round by round (`rounds.by_round`),
    as the median and the rounds numbakv was ahead."""
    ours = {r["direction"]: r["runs_GB/s"] for r in rows if r["source"] == "numbakv-disk"}
    for r in rows:
        if r["source"] != "numbakv-disk" and r["direction"] in ours:
            median, ahead = by_round(ours[r["direction"]], r["runs_GB/s"])
            r["numbakv / this, median of rounds"] = median
            r["rounds numbakv ahead"] = ahead
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        f"{'source':<18} {'direction':<9} {'chunk':>9} {'chunks':>7} {'GB/s':>7} {'vs dd':>7}"
        f"   numbakv / this, by round (rounds ahead)"
    )
    for r in rows:
        share = f"{r['vs dd %']:.0f} %" if "vs dd %" in r else ""
        paired = ""
        if "rounds numbakv ahead" in r:
            paired = (
                f"{r['numbakv / this, median of rounds']:.2f} "
                f"({r['rounds numbakv ahead']} of {len(r['runs_GB/s'])})"
            )
        print(
            f"{r['source']:<18} {r['direction']:<9} {r['chunk_bytes']:>9,} {r['chunks']:>7}"
            f" {r['GB/s']:>7.2f} {share:>7}   {paired}"
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
    parser.add_argument("--out", type=Path, default=Path("results/tier_bandwidth.json"))
    parser.add_argument(
        "--lmcache-python",
        help="the Python of an environment with LMCache 0.5.6, to time its LocalDiskBackend",
    )
    args = parser.parse_args(argv)
    settings = dict(SMOKE if args.smoke else FULL)
    for name in settings:
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    root = Path(tempfile.mkdtemp(prefix="tier-bandwidth-", dir=args.dir.resolve()))
    lmcache = LMCacheBaseline(args.lmcache_python) if args.lmcache_python else None
    try:
        pool, host_pool = random_pools(settings["chunks"], settings["chunk_bytes"])
        setup = Setup(
            pool=pool,
            host_pool=host_pool,
            root=root,
            job_chunks=settings["job_chunks"],
            threads=settings["threads"],
            repeats=settings["repeats"],
            lmcache=lmcache,
        )
        machine = (
            f"{platform.node()}, {platform.processor() or platform.machine()}, {file_system(root)}"
        )
        rows = with_numbakv_by_round(with_dd_share(measure(setup, args.sources)))
    finally:
        if lmcache is not None:
            lmcache.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{machine}; {settings}")
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine, "settings": settings, "rows": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
