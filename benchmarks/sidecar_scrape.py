"""Benchmark: can the sidecar answer 200 scrapes/s with p99 under 50 ms?

Fills a metrics directory as N running engine processes would (each has its counter, histogram and
live gauge files; they stay alive, so their live gauges count), starts the sidecar under uvicorn on
127.0.0.1, then sends GET /metrics open-loop at a
fixed rate and reports latency percentiles, measured from each request's scheduled send time (so a
stalled server cannot hide queueing). Run from the repository root:

    python benchmarks/sidecar_scrape.py --rate 200 --duration 30 --instances 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = """
import os, sys
from dataclasses import dataclass
sys.path.insert(0, sys.argv[1])
from numbakv.metrics import OffloadMetrics

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
    metrics.on_job_done(job, ("store", "load")[job % 2], 1 << 20, 0.0001 * (job % 100), True)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


async def load(url: str, rate: float, duration_s: float) -> tuple[list[float], int, float]:
    """Open-loop GETs at ``rate``/s; returns latencies (s) from scheduled send, errors, elapsed."""
    latencies: list[float] = []
    errors = 0

    async def one(client: httpx.AsyncClient, scheduled: float) -> None:
        nonlocal errors
        try:
            response = await client.get(url)
            response.raise_for_status()
            latencies.append(time.perf_counter() - scheduled)
        except httpx.HTTPError:
            errors += 1

    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
        start = time.perf_counter()
        tasks = []
        for i in range(int(rate * duration_s)):
            scheduled = start + i / rate
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client, scheduled)))
        await asyncio.gather(*tasks)
        return latencies, errors, time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


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
        port = free_port()
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "service", "--port", str(port), "--metrics-dir", directory],
            cwd=ROOT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(f"{base}/healthz")
            size = len(httpx.get(f"{base}/metrics").content)
            load_before, cpu_before = os.getloadavg()[0], cpu_seconds(sidecar.pid)
            latencies, errors, elapsed = asyncio.run(
                load(f"{base}/metrics", args.rate, args.duration)
            )
            load_after, cpu_per_scrape = (
                os.getloadavg()[0],
                (cpu_seconds(sidecar.pid) - cpu_before) / len(latencies),
            )
        finally:
            sidecar.terminate()
            sidecar.wait()
            for writer in writers:
                writer.stdin.close()
                writer.wait()
    ms = [x * 1000 for x in latencies]
    print(
        f"{len(ms)} scrapes ({size} bytes each, {args.instances} instances) in {elapsed:.1f} s "
        f"= {len(ms) / elapsed:.0f}/s, {errors} errors; latency ms: p50 {percentile(ms, 0.5):.1f} "
        f"p90 {percentile(ms, 0.9):.1f} p99 {percentile(ms, 0.99):.1f} max {max(ms):.1f}; "
        f"sidecar CPU {cpu_per_scrape * 1000:.2f} ms per scrape; "
        f"1-min load average {load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
