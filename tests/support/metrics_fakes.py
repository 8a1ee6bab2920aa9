"""Small stand-ins that follow the manager's and the transfer engine's contracts, for metrics tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

from prometheus_client.mmap_dict import MmapedDict

from numbakv.jobs import FinishedJob
from numbakv.manager import ManagerStats

NO_ACTIVITY = ManagerStats(**dict.fromkeys(ManagerStats.__dataclass_fields__, 0))
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics_writer.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ARC_KEYS = ("p", "t1", "t2", "b1", "b2")
POLICY_KEYS = {"arc": ARC_KEYS, "sarc": ARC_KEYS, "s3fifo": ("small", "main", "ghost")}
"""The keys of each policy's ``policy_stats()``, as the real policies give them."""


class FakeManager:
    """Counts as ``CPUOffloadingManager`` does: plain ints bumped once per call, with a batch size."""

    def __init__(self, capacity: int = 100, policy_name: str = "arc") -> None:
        self.policy_name = policy_name
        self._stats = replace(NO_ACTIVITY, free=capacity, capacity=capacity)
        self._policy = dict.fromkeys(POLICY_KEYS.get(policy_name, ()), 0.0)

    def stats(self) -> ManagerStats:
        return self._stats

    def policy_stats(self) -> dict[str, float]:
        return dict(self._policy)

    def lookup(self, hits: int, misses: int) -> None:
        s = self._stats
        self._stats = replace(
            s,
            lookups=s.lookups + 1,
            hit_blocks=s.hit_blocks + hits,
            missed_blocks=s.missed_blocks + misses,
        )

    def store(self, blocks: int, failed: int = 0, evicted: int = 0) -> None:
        s = self._stats
        used = s.used + blocks - evicted
        self._stats = replace(
            s,
            stored_blocks=s.stored_blocks + blocks,
            evicted_blocks=s.evicted_blocks + evicted,
            failed_store_blocks=s.failed_store_blocks + failed,
            used=used,
            free=s.capacity - used,
        )
        half, rest = float(used // 2), float(used - used // 2)
        if "p" in self._policy:  # an ARC: its target and lists
            self._policy.update(p=self._policy["p"] + 1, t1=half, t2=rest, b1=float(evicted))
        elif self._policy:  # S3-FIFO: its queues
            self._policy.update(small=half, main=rest, ghost=float(evicted))

    def load(self, blocks: int) -> None:
        self._stats = replace(self._stats, loaded_blocks=self._stats.loaded_blocks + blocks)

    def skip(self, blocks: int) -> None:
        self._stats = replace(self._stats, stores_skipped=self._stats.stores_skipped + blocks)


def churn(manager) -> None:
    """Stores past the capacity, lookups and reuse, on a real ``CPUOffloadingManager`` of 16
    blocks: every policy fills its lists or queues and evicts."""
    for start in range(0, 40, 4):
        hashes = list(range(start, start + 6))
        manager.lookup(hashes)
        output = manager.prepare_store(hashes)
        if output is not None:
            manager.complete_store(output.block_hashes_to_store)
        manager.lookup(list(range(0, start + 6, 3)))
        manager.touch(list(range(0, start, 5)))


def run_workload(manager: FakeManager, metrics) -> None:
    """A known sequence of manager and transfer operations; tests check every metric against it."""
    manager.lookup(hits=3, misses=2)
    manager.lookup(hits=0, misses=5)
    manager.store(blocks=4, evicted=1)
    manager.store(blocks=2, failed=1)
    manager.load(blocks=3)
    manager.skip(blocks=7)
    metrics.on_job_done(FinishedJob(1, "store", True, 4096, 0.0003))
    metrics.on_job_done(FinishedJob(2, "store", True, 2048, 0.002))
    metrics.on_job_done(FinishedJob(3, "store", False, 1024, 0.002))
    metrics.on_job_done(FinishedJob(4, "load", True, 3072, 3.0))


# The label sets of the workload's series, as the tests key samples: (name, value) pairs sorted by name.
MANAGER = (("instance", "gpu0"), ("policy", "arc"))
STORE = (("direction", "store"), ("instance", "gpu0"))
LOAD = (("direction", "load"), ("instance", "gpu0"))

EXPECTED = {
    ("numbakv_lookups_total", MANAGER): 2,
    ("numbakv_hit_blocks_total", MANAGER): 3,
    ("numbakv_missed_blocks_total", MANAGER): 7,
    ("numbakv_evicted_blocks_total", MANAGER): 1,
    ("numbakv_stored_blocks_total", MANAGER): 6,
    ("numbakv_failed_store_blocks_total", MANAGER): 1,
    ("numbakv_loaded_blocks_total", MANAGER): 3,
    ("numbakv_stores_skipped_total", MANAGER): 7,
    ("numbakv_host_capacity_blocks", MANAGER): 100,
    ("numbakv_host_used_blocks", MANAGER): 5,
    ("numbakv_host_free_blocks", MANAGER): 95,
    ("numbakv_host_being_stored_blocks", MANAGER): 0,
    ("numbakv_host_being_loaded_blocks", MANAGER): 0,
    ("numbakv_arc_p_blocks", MANAGER): 2,
    ("numbakv_arc_list_blocks", (("instance", "gpu0"), ("list", "t1"), ("policy", "arc"))): 2,
    ("numbakv_arc_list_blocks", (("instance", "gpu0"), ("list", "t2"), ("policy", "arc"))): 3,
    ("numbakv_arc_list_blocks", (("instance", "gpu0"), ("list", "b1"), ("policy", "arc"))): 0,
    ("numbakv_arc_list_blocks", (("instance", "gpu0"), ("list", "b2"), ("policy", "arc"))): 0,
    ("numbakv_transfer_jobs_total", STORE): 3,
    ("numbakv_transfer_jobs_total", LOAD): 1,
    ("numbakv_transfer_failed_jobs_total", STORE): 1,
    ("numbakv_transfer_failed_jobs_total", LOAD): 0,
    ("numbakv_transfer_bytes_total", STORE): 6144,
    ("numbakv_transfer_bytes_total", LOAD): 3072,
    ("numbakv_transfer_duration_seconds_count", STORE): 3,
    ("numbakv_transfer_duration_seconds_sum", STORE): 0.0043,
    ("numbakv_transfer_duration_seconds_bucket", (*STORE, ("le", "0.0001"))): 0,
    ("numbakv_transfer_duration_seconds_bucket", (*STORE, ("le", "0.0005"))): 1,
    ("numbakv_transfer_duration_seconds_bucket", (*STORE, ("le", "0.0025"))): 3,
    ("numbakv_transfer_duration_seconds_bucket", (*STORE, ("le", "+Inf"))): 3,
    ("numbakv_transfer_duration_seconds_bucket", (*LOAD, ("le", "2.5"))): 0,
    ("numbakv_transfer_duration_seconds_bucket", (*LOAD, ("le", "+Inf"))): 1,
    ("numbakv_transfer_duration_seconds_sum", LOAD): 3.0,
}
"""Every sample after one ``run_workload`` by a manager of capacity 100 and instance ``gpu0``."""


def run_engine_process(code: str, directory, *args: str) -> str:
    """Run `code` as an engine process writing into `directory` (multiprocess mode); its stdout.

    The code imports `tests.support.metrics_fakes` and `numbakv.metrics` from the checkout.
    """
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    prelude = "import sys; sys.path.insert(0, sys.argv[1])\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + code, ROOT, *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


def start_engine_process(code: str, directory) -> subprocess.Popen:
    """Start `code` (run with the checkout's root as its argv[1]) as an engine process writing
    into `directory`, its stdin and stdout piped: it runs until it closes them itself or ends."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    return subprocess.Popen(
        [sys.executable, "-c", code, ROOT],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def run_writers(directory, *writers: tuple[str, int]) -> None:
    """Run one writer process (tests/support/metrics_writer.py) per (instance, repeats) at once,
    and wait for them."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    procs = [
        subprocess.Popen([sys.executable, WRITER, instance, str(repeats)], env=env)
        for instance, repeats in writers
    ]
    assert [p.wait(timeout=60) for p in procs] == [0] * len(procs)


def start_writer(directory, instance: str, seconds: float = 60.0) -> subprocess.Popen:
    """A writer process that keeps running (varied workload, syncing every 0.1 s) for ``seconds``;
    returns once its files exist (its first sync writes all three, one after another), so that it
    can be killed with its live gauges in place and every kind of file written."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    proc = subprocess.Popen([sys.executable, WRITER, instance, "1", str(seconds)], env=env)
    files = [
        os.path.join(str(directory), f"{kind}_{proc.pid}.db")
        for kind in ("counter", "gauge_livesum", "histogram")
    ]
    deadline = time.monotonic() + 30
    while not all(map(os.path.exists, files)):
        assert proc.poll() is None and time.monotonic() < deadline, "the writer never wrote"
        time.sleep(0.02)
    return proc


def write_metrics_file(path, entries: list[tuple[str, float]]) -> None:
    """A metrics file with the given (key, value) entries, written by prometheus-client's own
    writer: keys are whatever JSON (or not) the test wants."""
    values = MmapedDict(str(path))
    try:
        for key, value in entries:
            values.write_value(key, value, 0.0)
    finally:
        values.close()


def key(metric: str, sample: str, labels: dict, help_text="help") -> str:
    """An entry's key as prometheus-client writes it (any types: tests make malformed ones)."""
    return json.dumps([metric, sample, labels, help_text], sort_keys=True)
