"""Bandwidth of the Redis/Valkey tier against redis-py alone and LMCache, and the wait of a lookup.

    python benchmarks/redis_tier_bandwidth.py [--url redis://127.0.0.1:6379/0]
        [--chunk-sizes 256KiB,2MiB,4MiB] [--repeats 7] [--lmcache-python PATH]
        [--out results/redis_tier_bandwidth.json]

Rows: for each chunk size, the bytes per second numbakv's tier (`open_tier`: header, checksum,
checks, its own threads) writes and reads in jobs of 64 MiB, beside the same payloads moved by
redis-py's pipelined SET/GET alone over the same connections on the same kind of thread (target:
numbakv >= 90 % of redis-py's rate both ways) and, with `--lmcache-python` (the Python of an
environment with LMCache 0.5.6, benchmarks/lmcache_baseline.py), by LMCache's `resp://` (its native
client) and `redis://` connectors on the same server. Every source takes its turn in each round, in
a new order each round; a figure is the median of `--repeats` rounds. Beside each rate, the CPU
seconds a GB its client spent (this process's threads, or LMCache's process) and the server (its own
counters, from INFO): on a machine of few cores the two share them, so what one spends the other
waits for. Then the wall time of `ChunkTier.contains` for a 64-chunk prefix (what its caller waits
at most), with the server up, paused and down (target: p99 <= 1 ms up, <= the lookup deadline paused
or down). With vLLM installed, also what vLLM's scheduler thread spends in `NumbaKVRedisTier` per
step for that prefix: 64 `lookup` calls and `on_schedule_end`, the step that sends the batched
lookup and the step that finds its answers. Without `--url` it starts its own redis-server on a free
loopback port (Debian package redis-server). `redis_rows` is a row source: one backend's rows, as a
list of dicts, for a script that compares tiers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's numbakv

from lmcache_baseline import LMCacheBaseline
from rounds import by_round

from numbakv.tiers import ChunkTier, Namespace, open_tier

PREFIX_CHUNKS = 64
LOOKUPS = 2000
BATCH_BYTES = 64 << 20  # bytes per transfer job: the batch of one request's prefix, about
SIZES = {"KiB": 1 << 10, "MiB": 1 << 20}


def parse_size(text: str) -> int:
    for unit, factor in SIZES.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def namespace(chunk_bytes: int) -> Namespace:
    return Namespace(
        model="benchmark",
        revision="",
        dtype="float16",
        tokens_per_block=16,
        blocks_per_chunk=1,
        num_layers=32,
        num_kv_heads=8,
        head_size=128,
        page_bytes=max(chunk_bytes // 64, 1),
        layout="layer_major",
    )


def round_seconds(actions: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """`repeats` runs of each action (each returns its own seconds), round by round, the actions
    taking turns in a new order each round (seeded): on a small machine what ran just before an
    action slows it or not (a large read before a write, up to a third on 2 cores), so no action
    keeps one place or one predecessor, and a machine busy now and idle later favours none."""
    runs: dict[str, list[float]] = {name: [] for name in actions}
    order, shuffler = list(actions), random.Random(0)
    for _ in range(repeats):
        shuffler.shuffle(order)
        for name in order:
            runs[name].append(actions[name]())
    return runs


def timed(action: Callable[[], None]) -> Callable[[], tuple[float, float]]:
    """`action` timed: its wall seconds, and the CPU seconds this process (every thread) spent."""

    def run() -> tuple[float, float]:
        started, cpu_started = time.perf_counter(), time.process_time()
        action()
        return time.perf_counter() - started, time.process_time() - cpu_started

    return run


def tier_jobs(tier: ChunkTier, keys: list[bytes]) -> dict[str, Callable[[], None]]:
    """A whole store job of `keys` from rows 0.., and a whole load job of them into the rows after."""
    rows = list(range(len(keys)))
    back = [row + len(keys) for row in rows]

    def job(submit, target_rows) -> Callable[[], None]:
        def run() -> None:
            submit(0, keys, target_rows)
            tier.drain()
            (finished,) = tier.take_finished()
            assert finished.success, finished

        return run

    return {"write": job(tier.submit_store, rows), "read": job(tier.submit_load, back)}


def waits_ms(lookup: Callable[[], object]) -> dict[str, float]:
    """p50, p99 and the longest wall time of `LOOKUPS` calls of `lookup`, in milliseconds."""
    waits = []
    for _ in range(LOOKUPS):
        started = time.perf_counter()
        lookup()
        waits.append(time.perf_counter() - started)
    return percentiles_ms(waits)


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * ordered[max(0, int(0.99 * len(ordered)) - 1)],
        "max_ms": 1e3 * ordered[-1],
    }


@contextlib.contextmanager
def local_redis() -> Iterator[str]:
    """A redis-server of its own on a free loopback port, in a temporary directory."""
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis-server is not installed: pass --url or install redis-server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        args = [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory]
        args += ["--save", "", "--appendonly", "no", "--maxmemory", "2gb"]
        args += ["--maxmemory-policy", "allkeys-lru"]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.kill()
            process.wait()


def redis_rows(args: argparse.Namespace) -> list[dict]:
    """numbakv's Redis tier against redis-py pipelined SET/GET of the same payloads (and LMCache's
    connectors, given its Python), and the lookup wait with the server up, paused and down."""
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(local_redis())
        lmcache = None
        if args.lmcache_python:
            lmcache = LMCacheBaseline(args.lmcache_python)
            stack.callback(lmcache.close)
        rows = [bandwidth_row(url, size, args.repeats, lmcache) for size in args.chunk_sizes]
        rows += lookup_rows(url)
        if importlib.util.find_spec("vllm") is not None:
            rows += scheduler_rows(url)
        return rows


def bandwidth_row(
    url: str, chunk_bytes: int, repeats: int, lmcache: LMCacheBaseline | None
) -> dict:
    """One chunk size: numbakv's write and read rates, redis-py's over the same connections, and
    LMCache's connectors' on the same server."""
    chunks = max(4, BATCH_BYTES // chunk_bytes)
    rng = np.random.default_rng(chunk_bytes)
    pool = rng.integers(0, 256, (2 * chunks, chunk_bytes), dtype=np.uint8)
    tier = open_tier(url, pool, namespace(chunk_bytes))
    keys = [b"bench-%d" % i for i in range(chunks)]
    client = tier.backend._client  # the same pool of connections
    raw_keys = [b"raw:" + key for key in keys]

    def raw_set() -> None:
        pipe = client.pipeline(transaction=False)
        for key, row in zip(raw_keys, pool):
            pipe.set(key, memoryview(row))
        assert all(pipe.execute())

    def raw_get() -> None:
        pipe = client.pipeline(transaction=False)
        for key in raw_keys:
            pipe.get(key)
        assert all(value is not None for value in pipe.execute())

    def on_io_thread(action: Callable[[], None]) -> Callable[[], tuple[float, float]]:
        # Where the tier's jobs run: threads differ in more than their name (glibc gives each
        # its own malloc arena, which decides whether a freed 1 MiB value's pages are reused).
        return timed(lambda: tier._io_threads.submit(action).result())

    cpu: dict[str, list[tuple[float, float]]] = {}

    def server_cpu_seconds() -> float:
        used = client.info("cpu")
        return used["used_cpu_user"] + used["used_cpu_sys"]

    def costed(name: str, action: Callable[[], tuple[float, float]]) -> Callable[[], float]:
        """`action` (its seconds and its client's CPU seconds), the server's CPU seconds taken
        around it; both CPU times kept in `cpu[name]`, the wall seconds returned."""

        def run() -> float:
            before = server_cpu_seconds()
            seconds, client_cpu = action()
            cpu.setdefault(name, []).append((client_cpu, server_cpu_seconds() - before))
            return seconds

        return run

    sources = {name: timed(job) for name, job in tier_jobs(tier, keys).items()}
    sources |= {"raw_write": on_io_thread(raw_set), "raw_read": on_io_thread(raw_get)}
    if lmcache is not None:
        address = urlsplit(url).netloc
        for store, where in (("resp", f"resp://{address}"), ("redis", url)):
            for op in ("write", "read"):
                sources[f"lmcache_{store}_{op}"] = partial(
                    lmcache.timing, store, where, chunk_bytes, chunks, op
                )
    actions = {name: costed(name, source) for name, source in sources.items()}
    for name in ("write", "raw_write", "lmcache_resp_write", "lmcache_redis_write"):
        if name in actions:  # the keys exist before anything is timed, for every source
            actions[name]()
    cpu.clear()
    runs = round_seconds(actions, repeats)
    seconds = {name: statistics.median(each) for name, each in runs.items()}
    client.delete(*raw_keys)
    tier.close()
    rate = {name: chunks * chunk_bytes / s / 1e9 for name, s in seconds.items()}
    row = {"source": "redis", "chunk_bytes": chunk_bytes, "chunks_per_job": chunks}
    gigabytes = chunks * chunk_bytes / 1e9
    for name, costs in cpu.items():
        row[f"{name}_client_cpu_s_per_gb"] = statistics.median(c for c, _ in costs) / gigabytes
        row[f"{name}_server_cpu_s_per_gb"] = statistics.median(s for _, s in costs) / gigabytes
    for direction in ("write", "read"):
        row[f"{direction}_gbps"] = rate[direction]
        row[f"raw_{direction}_gbps"] = rate[f"raw_{direction}"]
        row[f"{direction}_share"] = rate[direction] / rate[f"raw_{direction}"]
        for store in ("resp", "redis"):
            if f"lmcache_{store}_{direction}" in rate:
                row[f"lmcache_{store}_{direction}_gbps"] = rate[f"lmcache_{store}_{direction}"]
        if f"lmcache_resp_{direction}" in runs:  # numbakv's rate over resp://'s, round by round
            median, ahead = by_round(
                [1 / s for s in runs[direction]], [1 / s for s in runs[f"lmcache_resp_{direction}"]]
            )
            row[f"{direction}_over_resp_by_round"] = median
            row[f"{direction}_rounds_ahead_of_resp"] = ahead
            row["rounds"] = repeats
    return row


def lookup_rows(url: str) -> list[dict]:
    """The wait of a 64-chunk prefix's lookup: server up, paused (CLIENT PAUSE), unreachable."""
    import redis

    pool = np.zeros((PREFIX_CHUNKS, 4096), dtype=np.uint8)
    ns = namespace(4096)
    keys = [b"prefix-%d" % i for i in range(PREFIX_CHUNKS)]
    tier = open_tier(url, pool, ns)
    tier.submit_store(0, keys, range(PREFIX_CHUNKS))
    tier.drain()
    deadline_ms = 1e3 * tier.lookup_deadline_s
    full_keys = [tier.backend._prefix + key for key in keys]

    def exists_alone() -> None:  # redis-py alone, on this thread: the floor under the tier's wait
        pipe = tier.backend._client.pipeline(transaction=False)
        for key in full_keys:
            pipe.exists(key)
        pipe.execute()

    rows = [
        {"source": "redis-py alone", "lookup": "up", **waits_ms(exists_alone)},
        {"source": "redis", "lookup": "up", **waits_ms(lambda: tier.contains(keys))},
    ]
    pause_ms = 4000  # past the socket timeout (2 s): the breaker opens during the pause
    paused_until = time.monotonic() + pause_ms / 1e3
    redis.Redis.from_url(url).execute_command("CLIENT", "PAUSE", str(pause_ms), "ALL")
    rows.append({"source": "redis", "lookup": "paused", **waits_ms(lambda: tier.contains(keys))})
    time.sleep(max(0.0, paused_until - time.monotonic()))
    tier.close()
    tier = open_tier("redis://127.0.0.1:1/0", pool, ns)  # nothing listens on port 1
    rows.append({"source": "redis", "lookup": "down", **waits_ms(lambda: tier.contains(keys))})
    tier.close()
    for row in rows:
        row["deadline_ms"] = deadline_ms
    return rows


def scheduler_rows(url: str) -> list[dict]:
    """vLLM's scheduler thread in `NumbaKVRedisTier` for a 64-chunk prefix, per step, ms."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    from tests.support.tier_engine import engine, keys_of, store

    config = {"type": "NumbaKVRedisTier", "module_path": "numbakv.integrations.vllm", "url": url}
    spec = engine("benchmark-scheduler", config)
    keys = keys_of("prefix", PREFIX_CHUNKS)
    store(spec, "writer", keys)
    (tier,) = spec.get_manager().secondary_tiers
    step = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
    first, answered, late = [], [], 0
    for trial in range(LOOKUPS // 10):
        context = ReqContext(req_id=f"r{trial}")
        started = time.perf_counter()
        results = [tier.lookup(key, context) for key in keys]
        tier.on_schedule_end(step)
        first.append(time.perf_counter() - started)
        assert set(results) == {LookupResult.RETRY}, set(results)
        while results[-1] is LookupResult.RETRY:
            time.sleep(0.001)  # the model runs meanwhile
            started = time.perf_counter()
            results = [tier.lookup(key, context) for key in keys]
            tier.on_schedule_end(step)
            answered.append(time.perf_counter() - started)
        late += results[-1] is LookupResult.MISS  # the batch missed the deadline
        tier.on_request_finished(context)
    spec.get_manager().shutdown()
    rows = [
        {"source": "vllm scheduler", "lookup": name, **percentiles_ms(times), "deadline_ms": 5.0}
        for name, times in (("asking", first), ("answered", answered))
    ]
    rows[-1]["late_share"] = late / (LOOKUPS // 10)
    return rows


def print_tables(rows: list[dict]) -> None:
    print(
        f"{'chunk':>8} {'write GB/s':>10} {'raw':>6} {'share':>6} {'resp':>6} {'redis':>6} "
        f"{'read GB/s':>10} {'raw':>6} {'share':>6} {'resp':>6} {'redis':>6}   "
        "(raw: redis-py; resp, redis: LMCache's connectors)"
    )
    for row in rows:
        if "chunk_bytes" in row:
            cells = [f"{row['chunk_bytes'] >> 10:>5}KiB"]
            for direction in ("write", "read"):
                cells += [
                    f"{row[f'{direction}_gbps']:>10.2f}",
                    f"{row[f'raw_{direction}_gbps']:>6.2f}",
                    f"{row[f'{direction}_share']:>6.0%}",
                ]
                for store in ("resp", "redis"):
                    rate = row.get(f"lmcache_{store}_{direction}_gbps")
                    cells.append(f"{rate:>6.2f}" if rate is not None else f"{'-':>6}")
            print(" ".join(cells))
    if any("write_over_resp_by_round" in row for row in rows):
        print("\nnumbakv over LMCache's resp://, round by round: median (rounds numbakv was ahead)")
        for row in rows:
            if "write_over_resp_by_round" in row:
                cells = [f"{row['chunk_bytes'] >> 10:>5}KiB"]
                for direction in ("write", "read"):
                    cells.append(
                        f"{direction} {row[f'{direction}_over_resp_by_round']:.2f} "
                        f"({row[f'{direction}_rounds_ahead_of_resp']} of {row['rounds']})"
                    )
                print("   ".join(cells))
    sources = [
        ("numbakv", ""),
        ("redis-py", "raw_"),
        ("resp", "lmcache_resp_"),
        ("redis", "lmcache_redis_"),
    ]
    print("\nCPU seconds a GB, client / server (medians of the rounds):")
    print(
        f"{'chunk':>8} "
        + " ".join(f"{f'{name} {op}':>15}" for name, _ in sources for op in ("write", "read"))
    )
    for row in rows:
        if "chunk_bytes" in row:
            cells = [f"{row['chunk_bytes'] >> 10:>5}KiB"]
            for _, prefix in sources:
                for op in ("write", "read"):
                    client = row.get(f"{prefix}{op}_client_cpu_s_per_gb")
                    server = row.get(f"{prefix}{op}_server_cpu_s_per_gb")
                    cell = "-" if client is None else f"{client:.2f} / {server:.2f}"
                    cells.append(f"{cell:>15}")
            print(" ".join(cells))
    print(f"\n{'source':15} {'store':8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'deadline':>9}")
    for row in rows:
        if "lookup" in row:
            print(
                f"{row['source']:15} {row['lookup']:8} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
                f"{row['max_ms']:>8.3f} {row['deadline_ms']:>9.1f}"
            )
    for row in rows:
        if "late_share" in row:
            print(f"vLLM lookups answered as misses at the deadline: {row['late_share']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a Redis/Valkey to use (default: start one)")
    parser.add_argument("--chunk-sizes", default="256KiB,2MiB,4MiB")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--lmcache-python",
        help="the Python of an environment with LMCache 0.5.6, to time its connectors beside",
    )
    parser.add_argument("--out", default="results/redis_tier_bandwidth.json")
    args = parser.parse_args()
    args.chunk_sizes = [parse_size(size) for size in args.chunk_sizes.split(",")]
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    rows = redis_rows(args)
    print_tables(rows)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
