"""A stand-in engine process for multi-process tests: writes metrics into PROMETHEUS_MULTIPROC_DIR.

``python tests/support/metrics_writer.py INSTANCE REPEATS [SECONDS [POLICY]]``: runs the known
workload REPEATS times and syncs; with SECONDS, keeps running a varied workload that long, syncing
every 0.1 s, a tier below host memory (``disk``) counting its own and filling up. The manager's
policy is POLICY (default ``arc``).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from numbakv.jobs import FinishedJob
from numbakv.metrics import OffloadMetrics
from numbakv.tiers import Occupancy, TierCounters
from tests.support.metrics_fakes import FakeManager, run_workload


class FakeTier:
    """What the metrics read of a tier: its counters and occupancy, moved by `step` as a busy
    tier's would."""

    def __init__(self) -> None:
        self.counters = TierCounters()

    def occupancy(self) -> Occupancy:
        return Occupancy(min(self.counters.stored, 500), 500)

    def step(self) -> None:
        c = self.counters
        found = random.randint(0, 8)
        c.lookups += found + random.randint(0, 4)
        c.lookup_hits += found
        c.loaded_own += random.randint(0, 2)
        c.loaded_other += random.randint(0, 3)
        c.loaded_bytes = (c.loaded_own + c.loaded_other) << 20
        c.stored += 2
        c.stored_bytes = c.stored << 20
        c.dropped_stores += random.randint(0, 1)
        c.integrity_failures += random.randint(0, 1)
        c.unavailable += random.randint(0, 1)
        c.late_lookups += random.randint(0, 1)
        c.breaker_open = random.randint(0, 1)
        for latency in (c.lookup_latency, c.load_latency, c.store_latency):
            latency.observe(random.uniform(0.0002, 0.02))


def main(instance: str, repeats: int, seconds: float = 0.0, policy: str = "arc") -> None:
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR"), "set PROMETHEUS_MULTIPROC_DIR"
    # Ctrl-C ends it as it ends an engine run from a terminal, even where SIGINT is inherited
    # ignored (pytest started as a background job of a script: the test would wait in vain).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    manager = FakeManager(capacity=1000, policy_name=policy)
    tier = FakeTier()
    metrics = OffloadMetrics(manager, instance=instance, tiers={"disk": tier} if seconds else None)
    for _ in range(repeats):
        run_workload(manager, metrics)
    metrics.sync()
    deadline, job = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        manager.lookup(hits=random.randint(0, 8), misses=random.randint(0, 4))
        manager.store(blocks=2, evicted=random.randint(0, 2))
        manager.load(blocks=random.randint(1, 4))
        tier.step()
        for direction in ("store", "load"):
            job += 1
            metrics.on_job_done(
                FinishedJob(job, direction, True, 1 << 20, random.uniform(0.0002, 0.02))
            )
        metrics.sync()
        time.sleep(0.1)
    metrics.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], int(args[1]), float(args[2]) if len(args) > 2 else 0.0, *args[3:4])
