"""Soak: the sidecar through a long bad day. Does it keep answering and keep telling the truth?

Four writer processes (real CPUOffloadingManagers of 1,000, 2,000, 4,000 and 8,000 blocks, so that
every set of live writers has its own capacity sum) record metrics into one directory; every few
seconds one of them is SIGKILLed and restarted; meanwhile stray files come and go (counter files of
other processes, FIFOs, unknown and truncated files). The sidecar (``python -m numbakv.service``, default
settings) is scraped at 200/s from 8 kept-alive connections, each sending its share one request
after the other. Checked, for the whole run:

- every scrape answers 200;
- no counter, histogram count, sum or bucket goes backwards (scrape to scrape within a connection,
  whose requests are served in order);
- ``numbakv_host_capacity_blocks`` equals the capacities of the writers alive at some moment within
  one refresh period (plus the reads' own time, up to 0.25 s) before the scrape;
- the directory stays bounded (a writer folds what dead ones left when it starts);
- the sidecar's memory stays flat.

    python benchmarks/sidecar_soak.py [--duration 120] [--rate 200] [--kill-every 3]

Prints a table, writes JSON (``--out``), and exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from scraping import ROOT, TIMEOUT_S, Scrapes, cpu_seconds, percentile, running_sidecar, scrape

CAPACITIES = (1000, 2000, 4000, 8000)
LANES = 8
REFRESH_S = 0.25  # the sidecar's default --cache-seconds
# The data a scrape gets was read up to a refresh period and two reads before: the one served and
# the one under way. On this loaded 2-core machine a read took up to 0.12 s when a starting writer's
# compaction held the directory lock.
READ_SLACK_S = 0.25
STRAY_FILES = 20
STRAY_PIDS = 3_000_000

WRITER = """
import random, sys, time
sys.path.insert(0, sys.argv[1])
from numbakv.manager import CPUOffloadingManager
from numbakv.metrics import OffloadMetrics
from numbakv.jobs import FinishedJob

capacity = int(sys.argv[3])
manager = CPUOffloadingManager(block_size=16, num_blocks=capacity)
metrics = OffloadMetrics(manager, instance=sys.argv[2])
metrics.sync()
print("ready", flush=True)
job = 0
while True:
    hashes = [random.randrange(3 * capacity) for _ in range(16)]
    hits = manager.lookup(hashes)
    if hits:
        manager.prepare_load(hashes[:hits])
        manager.complete_load(hashes[:hits])
        job += 1
        metrics.on_job_done(FinishedJob(job, "load", True, hits << 16, random.uniform(1e-4, 1e-2)))
    stored = manager.prepare_store(hashes[hits:])
    if stored is not None and stored.block_hashes_to_store:
        manager.complete_store(stored.block_hashes_to_store)
        job += 1
        metrics.on_job_done(FinishedJob(job, "store", True, len(stored.block_hashes_to_store) << 16, 1e-3))
    metrics.sync()
    time.sleep(0.02)
"""


@dataclass
class Life:
    """One writer process's life: launched, first sync seen (ready), SIGKILL sent."""

    launched: float
    ready: float = math.inf
    killed: float = math.inf


@dataclass
class Slot:
    capacity: int
    lives: list[Life] = field(default_factory=list)
    proc: subprocess.Popen | None = None

    def states(self, t0: float, t1: float) -> set[int]:
        """Whether the slot's writer was (1) or was not (0) alive at some moment in [t0, t1]."""
        alive = any(life.launched <= t1 and life.killed >= t0 for life in self.lives)
        always = any(life.ready <= t0 and life.killed >= t1 for life in self.lives)
        return {1} if always else ({0, 1} if alive else {0})


class Writers:
    """The writer processes, and the thread that kills and restarts one every ``kill_every``."""

    def __init__(self, directory: str, kill_every: float) -> None:
        self.directory = directory
        self.kill_every = kill_every
        self.slots = [Slot(c) for c in CAPACITIES]
        self.lock = threading.Lock()
        self.starts = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._kill_and_restart, daemon=True)

    def start(self, slot: Slot) -> None:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self.directory}
        args = [sys.executable, "-c", WRITER, ROOT, f"writer{slot.capacity}", str(slot.capacity)]
        with self.lock:
            slot.lives.append(Life(launched=time.monotonic()))
        # stderr: compaction warns, at every start, about the stray files it cannot fold
        slot.proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert slot.proc.stdout.readline() == "ready\n", "a writer did not start"
        with self.lock:
            slot.lives[-1].ready = time.monotonic()
            self.starts += 1

    def kill(self, slot: Slot) -> None:
        with self.lock:
            slot.lives[-1].killed = time.monotonic()
        slot.proc.send_signal(signal.SIGKILL)
        slot.proc.wait()

    def _kill_and_restart(self) -> None:
        while not self.stop.wait(self.kill_every):
            slot = random.choice(self.slots)
            self.kill(slot)
            self.start(slot)

    def possible_capacities(self, t0: float, t1: float) -> set[int]:
        with self.lock:
            states = [slot.states(t0, t1) for slot in self.slots]
        return {
            sum(c * s for c, s in zip(CAPACITIES, choice)) for choice in itertools.product(*states)
        }


def stray_files(directory: str, stop: threading.Event) -> int:
    """Add a stray file every 0.2 s and remove the oldest past ``STRAY_FILES``; returns how many
    were added. Kinds in turn: a counter file of a process that is not running, a FIFO, a name
    prometheus-client does not write, a truncated file."""
    made: list[str] = []
    n = 0
    while not stop.wait(0.2):
        pid = STRAY_PIDS + n
        kind = n % 4
        path = os.path.join(
            directory,
            (f"counter_{pid}.db", f"histogram_{pid}.db", f"stray_{n}.db", f"summary_{pid}.db")[
                kind
            ],
        )
        if kind == 0:
            values = MmapedDict(path)
            values.write_value(mmap_key("soak_stray", "soak_stray_total", [], [], "stray"), 1, 0)
            values.close()
        elif kind == 1:
            os.mkfifo(path)
        else:
            Path(path).write_bytes(b"\xff" * 12)
        made.append(path)
        if len(made) > STRAY_FILES:
            with contextlib.suppress(FileNotFoundError):  # folded by a writer's compaction
                os.unlink(made.pop(0))
        n += 1
    return n


_COUNTERS = re.compile(
    rb"^(numbakv_\w*(?:_total|_count|_sum|_bucket)(?:{[^}\n]*})?) (\S+)$", re.MULTILINE
)
_CAPACITY = re.compile(rb"^numbakv_host_capacity_blocks(?:{[^}\n]*})? (\S+)$", re.MULTILINE)


class Checker:
    """Checks every answer: counters against the same lane's previous answer, the capacity gauge
    against the writers alive around the scrape."""

    def __init__(self, writers: Writers) -> None:
        self.writers = writers
        self.last: dict[int, dict[bytes, float]] = {}
        self.series_checked = self.capacity_checked = 0
        self.backwards: list[str] = []
        self.capacity_wrong: list[str] = []

    def __call__(self, lane: int, body: bytes, sent: float, received: float) -> None:
        series = {name: float(value) for name, value in _COUNTERS.findall(body)}
        self.series_checked += len(series)
        for name, before in self.last.get(lane, {}).items():
            if series.get(name, 0.0) < before:
                self.backwards.append(f"{name.decode()}: {before} then {series.get(name)}")
        self.last[lane] = series
        capacity = sum(float(value) for value in _CAPACITY.findall(body))
        possible = self.writers.possible_capacities(sent - REFRESH_S - READ_SLACK_S, received)
        self.capacity_checked += 1
        if capacity not in possible:
            self.capacity_wrong.append(f"{capacity} not in {sorted(possible)} at {sent:.2f}")


def is_stray(name: str) -> bool:
    """Whether ``name`` is one of :func:`stray_files`' files, not one of the writers'."""
    owner = name.split(".")[0].rsplit("_", 1)[-1]
    return name.startswith("stray_") or (owner.isdigit() and int(owner) >= STRAY_PIDS)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration", type=float, default=120.0, help="seconds of soak (default %(default)s)"
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="scrapes per second (default %(default)s)"
    )
    parser.add_argument(
        "--kill-every",
        type=float,
        default=3.0,
        help="seconds between SIGKILLs of a writer, restarted at once (default %(default)s)",
    )
    parser.add_argument(
        "--out", default="results/sidecar_soak.json", help="JSON report (default %(default)s)"
    )
    args = parser.parse_args()
    if not (args.duration > 0 and args.rate > 0 and args.kill_every > 0):
        parser.error("--duration, --rate and --kill-every must be positive")

    with tempfile.TemporaryDirectory() as directory:
        writers = Writers(directory, args.kill_every)
        checker = Checker(writers)
        stop = threading.Event()
        samples: list[tuple[float, float, int]] = []  # (time, sidecar RSS MB, writers' entries)
        strays: list[int] = []
        # stderr: the sidecar warns about every stray file it skips
        with running_sidecar(directory, stderr=subprocess.DEVNULL) as (sidecar, port):

            def sample() -> None:
                while not stop.wait(1.0):
                    entries = [name for name in os.listdir(directory) if not is_stray(name)]
                    samples.append((time.monotonic(), rss_mb(sidecar.pid), len(entries)))

            threads = [
                writers.thread,
                threading.Thread(target=lambda: strays.append(stray_files(directory, stop))),
                threading.Thread(target=sample),
            ]
            try:
                for slot in writers.slots:
                    writers.start(slot)
                for thread in threads:
                    thread.start()
                cpu_before = cpu_seconds(sidecar.pid), time.process_time()
                scrapes = asyncio.run(scrape(port, args.rate, args.duration, LANES, checker))
                cpu = (
                    cpu_seconds(sidecar.pid) - cpu_before[0],
                    time.process_time() - cpu_before[1],
                )
            finally:
                stop.set()
                writers.stop.set()
                for thread in threads:
                    if thread.is_alive():
                        thread.join()
                for slot in writers.slots:
                    if slot.proc is not None:
                        slot.proc.kill()
                        slot.proc.wait()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT_S).json()
            except httpx.HTTPError as exc:
                health = {"status": f"no answer ({type(exc).__name__})"}
    checks = judge(args, scrapes, checker, samples, writers.starts, strays[0])
    width = max(len(name) for name in checks)
    print(f"{'check':<{width}}  result  figures")
    for name, (ok, figures) in checks.items():
        print(f"{name:<{width}}  {'PASS' if ok else 'FAIL':<6}  {figures}")
    per_scrape = 1000 * cpu[0] / max(1, len(scrapes.latencies_ms))
    print(
        f"CPU over the run: sidecar {cpu[0]:.1f} s ({per_scrape:.2f} ms per scrape), this client "
        f"{cpu[1]:.1f} s; 1-min load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    )
    print(
        f"/healthz at the end: {health['status']}, {health.get('files')} files merged, "
        f"{len(health.get('skipped_files', ()))} stray files skipped, "
        f"{health.get('dead_writers')} dead writers"
    )
    write_report(Path(args.out), args, checks, scrapes, checker, samples, health, cpu)
    if not all(ok for ok, _ in checks.values()):
        sys.exit(1)


def judge(args, scrapes: Scrapes, checker: Checker, samples, starts: int, strays: int) -> dict:
    """Each check's verdict and figures."""
    lat = scrapes.latencies_ms
    scheduled = int(args.rate * args.duration)
    warm = [rss for t, rss, _ in samples if t - samples[0][0] >= 10] or [0.0]
    third = max(1, len(warm) // 3)
    early, late = max(warm[:third]), max(warm[-third:])
    entries = max(e for _, _, e in samples)
    # 3 files and a lock per live writer, those of one just killed, 2 compacted kinds and the
    # directory lock
    bound = 4 * (len(CAPACITIES) + 1) + 3
    answered = (
        f"{len(lat):,} of {scheduled:,} scrapes answered in {scrapes.elapsed_s:.0f} s, "
        f"{len(scrapes.errors)} errors, {scrapes.unsent} never sent (too late)"
    )
    if len(lat) > 1:
        answered += (
            f"; latency from the scheduled send: p50 {percentile(lat, 0.5):.1f} ms, "
            f"p99 {percentile(lat, 0.99):.1f} ms, max {max(lat):.0f} ms"
        )
    return {
        "every scrape answered": (not scrapes.errors and not scrapes.unsent, answered),
        "no counter went backwards": (
            not checker.backwards,
            f"{checker.series_checked:,} series values compared, "
            + f"{len(checker.backwards)} went backwards",
        ),
        "capacity = the live writers' sum": (
            not checker.capacity_wrong,
            f"{checker.capacity_checked:,} scrapes checked against the writers alive within "
            + f"{REFRESH_S + READ_SLACK_S:.2f} s before, {len(checker.capacity_wrong)} wrong; "
            + f"{starts} writer starts, {starts - len(CAPACITIES)} SIGKILLs",
        ),
        "directory bounded": (
            entries <= bound,
            f"at most {entries} writers' files and locks at once (bound {bound}); "
            + f"without compaction, {3 * starts} files; {strays} stray files came and went",
        ),
        "memory flat": (
            late <= early * 1.1,
            f"sidecar RSS peak {early:.1f} MB in the first third after 10 s, "
            + f"{late:.1f} MB in the last third",
        ),
    }


def write_report(
    out: Path, args, checks: dict, scrapes: Scrapes, checker: Checker, samples, health, cpu
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    lat = scrapes.latencies_ms
    report = {
        "arguments": vars(args),
        "checks": {name: {"pass": ok, "figures": f} for name, (ok, f) in checks.items()},
        "latency_ms": {"p50": percentile(lat, 0.5), "p99": percentile(lat, 0.99), "max": max(lat)}
        if len(lat) > 1
        else None,
        "first_problems": {
            "errors": scrapes.errors[:10],
            "backwards": checker.backwards[:10],
            "capacity": checker.capacity_wrong[:10],
        },
        "healthz_at_the_end": health,
        "cpu_seconds": {"sidecar": cpu[0], "client": cpu[1]},
        "samples": [{"t": t, "rss_mb": r, "writer_entries": e} for t, r, e in samples],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
