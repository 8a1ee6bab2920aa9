"""A tier's metrics (numbakv.metrics.definitions.TIER): the same values in-process (scraped) and
through the multiprocess directory the sidecar reads."""

from __future__ import annotations

import pytest
from numbakv.service.metrics_dir import MetricsDirectory
from prometheus_client import CollectorRegistry

from numbakv.metrics import TIER, OffloadMetrics
from tests.metrics_fakes import run_engine_process
from tests.test_tiers_core import DictBackend, finished, tier_over


def workload():
    """A tier over the core tests' dict backend: 2 chunks stored, 1 loaded by its writer, a
    lookup of 3 finding 2, then the store down: a lookup skipped, the breaker open."""
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
        "from tests.test_metrics_tiers import workload\n"
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
    tier.contains([b"a", b"b", b"x", b"y"])
    tier.submit_load(3, [b"b"], [3])
    finished(tier)
    stats = summarize(totals_from(registry.collect(), at=10.0), before)
    assert stats.tiers["redis"].hit_ratio == pytest.approx(2 / 4)
    assert stats.tiers["redis"].loaded_from_others == 0.0
    assert stats.tiers["redis"].breaker_open is False
    assert summarize(before, None).tiers["redis"].breaker_open is True
