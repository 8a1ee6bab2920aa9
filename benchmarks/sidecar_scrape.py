"""Benchmark: can the sidecar answer 200 scrapes/s with p99 under 50 ms?

Fills a metrics directory as N running engine processes would (each has its counter, histogram and
live gauge files; they stay alive, so their live gauges count), starts the sidecar under uvicorn on
127.0.0.1, then sends GET /metrics at a fixed rate from 8 kept-alive connections and reports latency
percentiles, measured from each request's scheduled send time (so a stalled server cannot hide
queueing). Run from the repository root:

    python benchmarks/sidecar_scrape.py --rate 200 --duration 30 --instances 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile

import httpx
from scraping import ROOT, cpu_seconds, percentile, running_sidecar, scrape

WRITER = """
import os, sys
from dataclasses import dataclass
sys.path.insert(0, sys.argv[1])
from numbakv.metrics import OffloadMetrics
from numbakv.jobs import FinishedJob

@dataclass(frozen=True)
class Stats:
    lookups: int = 1000; hit_blocks: int = 7000; missed_blocks: int = 3000; evicted_blocks: int = 500
    stored_blocks: int = 4000; failed_store_blocks: int = 3; loaded_blocks: int = 6000; stores_skipped: int = 10
    used: int = 900; free: int = 100; being_stored: int = 4; being_read: int = 2; capacity: int = 1000

class Manager:
    policy_name = "arc"
    def stats(self): return Stats()
    def policy_stats(self): return {"p": 300.0, "t1": 400.0, "t2": 500.0, "b1": 100.0, "b2": 50.0}

metrics = OffloadMetrics(Manager(), instance=sys.argv[2])
for job in range(1000):
    metrics.on_job_done(FinishedJob(job, ("store", "load")[job % 2], True, 1 << 20, 0.0001 * (job % 100)))
metrics.sync()
print("ready", flush=True)
sys.stdin.read()  # alive, like a running engine, until the benchmark closes stdin
"""


def fill(directory: str, instances: int) -> list[subprocess.Popen]:
    """Start ``instances`` writers, one after the other; they run until their stdin closes."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
    writers = []
    for i in range(instances):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, ROOT, f"gpu{i}"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout.readline() == "ready\n", "a writer did not start"
        writers.append(writer)
    return writers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rate", type=float, default=200.0, help="scrapes per second (default %(default)s)"
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="seconds of load (default %(default)s)"
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=8,
        help="engine processes to simulate (default %(default)s)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        writers = fill(directory, args.instances)
        try:
            with running_sidecar(directory) as (sidecar, port):
                size = len(httpx.get(f"http://127.0.0.1:{port}/metrics").content)
                load_before, cpu_before = os.getloadavg()[0], cpu_seconds(sidecar.pid)
                scrapes = asyncio.run(scrape(port, args.rate, args.duration))
                cpu = cpu_seconds(sidecar.pid) - cpu_before
        finally:
            for writer in writers:
                writer.stdin.close()
                writer.wait()
    ms = scrapes.latencies_ms
    print(
        f"{len(ms)} scrapes ({size} bytes each, {args.instances} instances) in "
        f"{scrapes.elapsed_s:.1f} s = {len(ms) / scrapes.elapsed_s:.0f}/s, "
        f"{len(scrapes.errors) + scrapes.unsent} errors; latency ms: p50 {percentile(ms, 0.5):.1f} "
        f"p90 {percentile(ms, 0.9):.1f} p99 {percentile(ms, 0.99):.1f} max {max(ms):.1f}; "
        f"sidecar CPU {cpu / len(ms) * 1000:.2f} ms per scrape; 1-min load average "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
