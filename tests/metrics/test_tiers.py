"""A tier's metrics (numbakv.metrics.definitions.TIER, TIER_OCCUPANCY): the same values in-process
(scraped) and through the multiprocess directory the sidecar reads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from numbakv.service.metrics_dir import MetricsDirectory
from prometheus_client import CollectorRegistry

from numbakv.metrics import TIER, TIER_OCCUPANCY, OffloadMetrics
from tests.support.disk_tier import aligned_pool, disk_tier
from tests.support.metrics_fakes import ROOT, run_engine_process
from tests.support.sidecar_app import client, reread
from tests.support.tiers import DictBackend, finished, tier_over


def workload():
    """A tier over the dict backend of tests/support/tiers.py: 2 chunks stored, 1 loaded by its
    writer, a lookup of 3 finding 2, then the store down: a lookup skipped, the breaker open."""
    backend = DictBackend()
    tier = tier_over(backend)
    tier.submit_store(1, [b"a", b"b"], [0, 1])
    finished(tier)
    tier.contains([b"a", b"b", b"c"])
    tier.submit_load(2, [b"a"], [2])
    finished(tier)
    backend.unavailable = True
    tier.contains([b"a"])
    return tier


EXPECTED = {
    ("numbakv_tier_lookups_total", ()): 4,
    ("numbakv_tier_lookup_hits_total", ()): 2,
    ("numbakv_tier_stored_chunks_total", ()): 2,
    ("numbakv_tier_loaded_chunks_total", (("writer", "own"),)): 1,
    ("numbakv_tier_loaded_chunks_total", (("writer", "other"),)): 0,
    ("numbakv_tier_unavailable_calls_total", ()): 1,
    ("numbakv_tier_breaker_opens_total", ()): 1,
    ("numbakv_tier_breaker_open", ()): 1,
    ("numbakv_tier_lookup_duration_seconds_count", ()): 2,
    ("numbakv_tier_store_duration_seconds_count", ()): 1,
    ("numbakv_tier_load_duration_seconds_count", ()): 1,
}


def samples(metrics) -> dict:
    found = {}
    for metric in metrics:
        for sample in metric.samples:
            if sample.name.startswith("numbakv_tier_"):
                extra = tuple(
                    (k, v)
                    for k, v in sorted(sample.labels.items())
                    if k not in ("tier", "instance", "le")
                )
                assert sample.labels["tier"] == "redis" and sample.labels["instance"] == "e0"
                if "le" not in sample.labels:
                    found[(sample.name, extra)] = sample.value
    return found


def test_every_tier_definition_is_exported_in_process():
    tier = workload()
    registry = CollectorRegistry()
    OffloadMetrics(instance="e0", registry=registry, enabled=True, tiers={"redis": tier})
    got = samples(registry.collect())
    for key, value in EXPECTED.items():
        assert got[key] == pytest.approx(value), key
    names = {metric.name for metric in registry.collect()}
    assert {definition.name for definition in TIER} <= names


def test_the_multiprocess_directory_holds_the_same_values(tmp_path):
    run_engine_process(
        "from tests.metrics.test_tiers import workload\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "tier = workload()\n"
        "metrics = OffloadMetrics(instance='e0', enabled=True, tiers={'redis': tier})\n"
        "metrics.sync(); metrics.sync()\n"
        "print('done')\n",
        tmp_path,
    )
    reading = MetricsDirectory(str(tmp_path)).read()
    got = samples(reading.metrics)
    for key, value in EXPECTED.items():
        if key[0] == "numbakv_tier_breaker_open":
            continue  # a live gauge: it left with its process
        assert got[key] == pytest.approx(value), key


def test_the_sidecar_summary_gives_each_tier_its_ratios_and_breaker():
    from numbakv.service.stats import summarize, totals_from

    tier = workload()
    registry = CollectorRegistry()
    OffloadMetrics(instance="e0", registry=registry, enabled=True, tiers={"redis": tier})
    before = totals_from(registry.collect(), at=0.0)
    tier.backend.unavailable = False
    tier._breaker._open_until = 0.0  # cooled down: the next call probes the store
    other = tier_over(tier.backend, writer_id=b"another!")  # another engine, the same store
    other.submit_store(1, [b"o"], [4])
    finished(other)
    tier.contains([b"a", b"b", b"x", b"y"])
    tier.submit_load(3, [b"b", b"o", b"a"], [3, 4, 5])
    finished(tier)
    stats = summarize(totals_from(registry.collect(), at=10.0), before)
    assert stats.tiers["redis"].hit_ratio == pytest.approx(2 / 4)
    assert stats.tiers["redis"].loaded_from_others == pytest.approx(1 / 3)
    assert stats.tiers["redis"].breaker_open is False
    assert summarize(before, None).tiers["redis"].breaker_open is True


DISK_FILES = 4


def filling(root):
    """A real disk tier of 4 files beside a tier that does not know its occupancy (a dict backend,
    as Redis: its server bounds it); yields them, then again after each step, with the files the
    disk holds: 3 stored, 2 more (one evicted), 2 more (two evicted), one found damaged (deleted)."""
    disk = disk_tier(root, aligned_pool(8, 0), files=DISK_FILES)
    tiers = {"disk": disk, "redis": tier_over(DictBackend())}
    yield tiers, 0
    keys = [b"chunk-%d" % i for i in range(7)]
    for step, (start, stop) in enumerate(((0, 3), (3, 5), (5, 7))):
        disk.submit_store(step, keys[start:stop], list(range(stop - start)))
        finished(disk)
        yield tiers, min(stop, DISK_FILES)
    with open(disk.backend._path(keys[6]), "r+b") as file:
        file.truncate(100)
    disk.submit_load("damaged", keys[6:], [7])
    assert not finished(disk)["damaged"].success
    yield tiers, DISK_FILES - 1


def occupancy(metrics) -> dict[str, tuple[float, float]]:
    """Each tier's (used, capacity) chunks, as exported."""
    found: dict[str, dict[str, float]] = {}
    for metric in metrics:
        for sample in metric.samples:
            if sample.name in ("numbakv_tier_used_chunks", "numbakv_tier_capacity_chunks"):
                found.setdefault(sample.labels["tier"], {})[sample.name] = sample.value
    return {
        tier: (values["numbakv_tier_used_chunks"], values["numbakv_tier_capacity_chunks"])
        for tier, values in found.items()
    }


def test_occupancy_gauges_follow_a_disk_tier_filling_and_evicting(tmp_path):
    """Exported only for the tier that knows it: Redis gets no series (not NaN)."""
    registry = CollectorRegistry()
    metrics = None
    for tiers, used in filling(tmp_path):
        if metrics is None:
            metrics = OffloadMetrics(instance="e0", registry=registry, enabled=True, tiers=tiers)
        assert tiers["disk"].backend.used_files() == used
        assert occupancy(registry.collect()) == {"disk": (used, DISK_FILES)}
    names = {metric.name for metric in registry.collect()}
    assert {definition.name for definition in TIER_OCCUPANCY} <= names


ENGINE = """
import sys
sys.path.insert(0, sys.argv[1])
from numbakv.metrics import OffloadMetrics
from tests.metrics.test_tiers import filling
metrics = None
for tiers, used in filling(sys.argv[2]):
    metrics = metrics or OffloadMetrics(instance="e0", enabled=True, tiers=tiers)
    metrics.sync()
    print(used, flush=True)
    sys.stdin.readline()
metrics.close()
"""


def test_the_sidecar_shows_each_tiers_occupancy_while_its_engine_lives(tmp_path):
    """Through the multiprocess directory: /stats gives the disk's chunks at every step, null
    for Redis, and null for both once the engine has exited (live gauges)."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, ROOT, str(tmp_path / "disk")],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    steps = []
    with client(metrics_dir) as c:
        for line in engine.stdout:
            reread(c)
            tiers = c.get("/stats").json()["tiers"]
            steps.append((tiers["disk"]["used_chunks"], tiers["disk"]["capacity_chunks"]))
            assert tiers["redis"]["used_chunks"] is tiers["redis"]["capacity_chunks"] is None
            assert steps[-1] == (int(line), DISK_FILES)
            engine.stdin.write("\n")
            engine.stdin.flush()
        assert engine.wait(timeout=30) == 0
        reread(c)
        disk = c.get("/stats").json()["tiers"]["disk"]
    assert [used for used, _ in steps] == [0, 3, 4, 4, 3]
    assert disk["used_chunks"] is disk["capacity_chunks"] is None
