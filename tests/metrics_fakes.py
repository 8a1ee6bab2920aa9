"""Small stand-ins that follow the manager's and the transfer engine's contracts, for metrics tests."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class FakeManagerStats:
    """Same fields as ``numbakv.manager.ManagerStats``."""

    lookups: int = 0
    hit_blocks: int = 0
    missed_blocks: int = 0
    evicted_blocks: int = 0
    stored_blocks: int = 0
    failed_store_blocks: int = 0
    loaded_blocks: int = 0
    stores_skipped: int = 0
    used: int = 0
    free: int = 0
    being_stored: int = 0
    being_read: int = 0
    capacity: int = 0


class FakeManager:
    """Counts as ``CPUOffloadingManager`` does: plain ints bumped once per call, with a batch size."""

    def __init__(self, capacity: int = 100, policy_name: str = "arc") -> None:
        self.policy_name = policy_name
        self._stats = FakeManagerStats(free=capacity, capacity=capacity)
        self._arc = {"p": 0.0, "t1": 0.0, "t2": 0.0, "b1": 0.0, "b2": 0.0}

    def stats(self) -> FakeManagerStats:
        return self._stats

    def policy_stats(self) -> dict[str, float]:
        return dict(self._arc) if self.policy_name == "arc" else {}

    def lookup(self, hits: int, misses: int) -> None:
        s = self._stats
        self._stats = replace(s, lookups=s.lookups + 1, hit_blocks=s.hit_blocks + hits,
                              missed_blocks=s.missed_blocks + misses)

    def store(self, blocks: int, failed: int = 0, evicted: int = 0) -> None:
        s = self._stats
        used = s.used + blocks - evicted
        self._stats = replace(s, stored_blocks=s.stored_blocks + blocks, evicted_blocks=s.evicted_blocks + evicted,
                              failed_store_blocks=s.failed_store_blocks + failed, used=used, free=s.capacity - used)
        self._arc.update(p=self._arc["p"] + 1, t1=float(used // 2), t2=float(used - used // 2), b1=float(evicted))

    def load(self, blocks: int) -> None:
        self._stats = replace(self._stats, loaded_blocks=self._stats.loaded_blocks + blocks)

    def skip(self, blocks: int) -> None:
        self._stats = replace(self._stats, stores_skipped=self._stats.stores_skipped + blocks)


def run_workload(manager: FakeManager, metrics) -> None:
    """A known sequence of manager and transfer operations; tests check every metric against it."""
    manager.lookup(hits=3, misses=2)
    manager.lookup(hits=0, misses=5)
    manager.store(blocks=4, evicted=1)
    manager.store(blocks=2, failed=1)
    manager.load(blocks=3)
    manager.skip(blocks=7)
    metrics.on_job_done(1, "store", 4096, 0.0003, True)
    metrics.on_job_done(2, "store", 2048, 0.002, True)
    metrics.on_job_done(3, "store", 1024, 0.002, False)
    metrics.on_job_done(4, "load", 3072, 3.0, True)
