"""Benchmark: the cost of recording a transfer job and of one multiprocess ``sync()``.

    python benchmarks/metrics_record.py

Runs itself with PROMETHEUS_MULTIPROC_DIR set to a temporary directory for the sync figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import timeit
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from numbakv.jobs import FinishedJob
from numbakv.manager import ManagerStats
from numbakv.metrics import OffloadMetrics

NO_ACTIVITY = ManagerStats(**dict.fromkeys(ManagerStats.__dataclass_fields__, 0))


class Manager:
    """With ``moving``, every counter moves between two syncs: the worst case for ``sync()``."""

    policy_name = "arc"

    def __init__(self, moving: bool) -> None:
        self._stats = replace(NO_ACTIVITY, free=1000, capacity=1000)
        self._moving = moving

    def stats(self) -> ManagerStats:
        s = self._stats
        if not self._moving:
            return s
        self._stats = replace(
            s,
            lookups=s.lookups + 1,
            hit_blocks=s.hit_blocks + 3,
            missed_blocks=s.missed_blocks + 1,
            evicted_blocks=s.evicted_blocks + 1,
            stored_blocks=s.stored_blocks + 2,
            loaded_blocks=s.loaded_blocks + 2,
            used=s.used + 1,
        )
        return s

    def policy_stats(self) -> dict[str, float]:
        return {"p": 10.0, "t1": 1.0, "t2": 2.0, "b1": 3.0, "b2": 4.0}


def best_ns(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def main() -> None:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        job = FinishedJob(1, "store", True, 1 << 20, 0.002)  # the engine makes it either way
        metrics = OffloadMetrics(registry=None, enabled=True)
        print(f"on_job_done: {best_ns(lambda: metrics.on_job_done(job), 100000):.0f} ns")
        off = OffloadMetrics(registry=None, enabled=False)
        print(f"on_job_done, metrics off: {best_ns(lambda: off.on_job_done(job), 100000):.0f} ns")
        with tempfile.TemporaryDirectory() as directory:
            subprocess.run(
                [sys.executable, __file__],
                env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory},
                check=True,
            )
        return
    busy = OffloadMetrics(Manager(moving=True), instance="busy")

    def step() -> None:
        busy.on_job_done(FinishedJob(1, "store", True, 1 << 20, 0.002))
        busy.on_job_done(FinishedJob(2, "load", True, 1 << 20, 0.003))
        busy.sync()

    idle = OffloadMetrics(Manager(moving=False), instance="idle")
    print(
        f"sync() after a step (every counter, a gauge, both directions changed): {best_ns(step, 2000) / 1000:.1f} us"
    )
    print(f"sync() with nothing changed: {best_ns(idle.sync, 2000) / 1000:.1f} us")


if __name__ == "__main__":
    main()
