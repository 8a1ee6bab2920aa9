"""Every metric against a known sequence of manager and transfer operations, in-process export."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from numbakv.jobs import FinishedJob
from numbakv.metrics import (
    DURATION_BUCKETS_SECONDS,
    MultiprocessWriter,
    OffloadMetrics,
    ScrapeCollector,
    TransferRecorder,
)
from numbakv.metrics import offload as offload_module
from tests.support.metrics_fakes import EXPECTED, FakeManager, run_workload


def samples(registry) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def check_expected(got: dict) -> None:
    for key, value in EXPECTED.items():
        assert got.get(key) == pytest.approx(value), key


def test_in_process_export_matches_the_workload():
    registry = CollectorRegistry()
    manager = FakeManager()
    metrics = OffloadMetrics(manager, instance="gpu0", registry=registry, enabled=True)
    run_workload(manager, metrics)
    check_expected(samples(registry))
    assert len([b for b in DURATION_BUCKETS_SECONDS]) + 1 == len(
        [k for k in samples(registry) if k[0].endswith("_bucket") and ("direction", "load") in k[1]]
    )


def test_a_directory_named_after_prometheus_client_was_imported_is_said_and_left(
    tmp_path, monkeypatch, caplog
):
    """prometheus-client chose in-memory values when it was imported: numbakv exports in-process
    and says why, once (before, it joined the directory and wrote lock files, and no metric)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    offload_module._warn_directory_set_late.cache_clear()
    registry = CollectorRegistry()
    manager = FakeManager()
    with caplog.at_level("WARNING", logger="numbakv.metrics"):
        metrics = OffloadMetrics(manager, instance="gpu0", registry=registry, enabled=True)
        OffloadMetrics(FakeManager(), instance="gpu1", registry=CollectorRegistry(), enabled=True)
    assert [r.getMessage().count("set after prometheus_client") for r in caplog.records] == [1]
    assert list(tmp_path.iterdir()) == []
    run_workload(manager, metrics)
    check_expected(samples(registry))


def test_lru_exports_no_arc_series():
    registry = CollectorRegistry()
    OffloadMetrics(FakeManager(policy_name="lru"), instance="gpu0", registry=registry, enabled=True)
    names = {name for name, _ in samples(registry)}
    assert "numbakv_lookups_total" in names and not any(n.startswith("numbakv_arc") for n in names)


def test_disabled_metrics_register_nothing_and_ignore_jobs(monkeypatch):
    monkeypatch.setenv("NUMBAKV_METRICS", "0")
    registry = CollectorRegistry()
    metrics = OffloadMetrics(FakeManager(), registry=registry)
    metrics.on_job_done(FinishedJob(1, "store", True, 10, 0.1))
    metrics.sync()
    assert not metrics.enabled and samples(registry) == {}
    assert metrics._transfers.totals["store"].jobs == 0  # the job was not even counted


def test_close_unregisters_the_collector():
    registry = CollectorRegistry()
    metrics = OffloadMetrics(FakeManager(), registry=registry, enabled=True)
    metrics.close()
    assert samples(registry) == {}


class QuietTier:
    """A tier that reports nothing: the tests below never scrape it."""

    counters = None

    def occupancy(self):
        return None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"instance": 0}, "OffloadMetrics instance must be a string such as 'gpu0', got 0"),
        ({"instance": None}, "OffloadMetrics instance must be a string such as 'gpu0', got None"),
        ({"instance": 0, "enabled": False}, "OffloadMetrics instance must be a string"),
        (
            {"tiers": {0: QuietTier()}},
            "OffloadMetrics tiers must be named by strings such as 'redis', got the name 0",
        ),
        ({"tiers": {None: QuietTier()}}, "OffloadMetrics tiers must be named by strings"),
        ({"tiers": ["redis"]}, "OffloadMetrics tiers must be a mapping of names to tiers"),
        (
            {"enabled": "false"},
            "OffloadMetrics enabled must be True, False or None (NUMBAKV_METRICS decides), got 'false'",
        ),
        ({"enabled": 1}, "OffloadMetrics enabled must be True, False or None"),
    ],
)
def test_bad_options_are_refused_by_name_and_leave_the_registry_scrapable(options, message):
    registry = CollectorRegistry()
    with pytest.raises(TypeError) as refused:
        OffloadMetrics(FakeManager(), registry=registry, **{"enabled": True, **options})
    assert message in str(refused.value)
    assert samples(registry) == {} and generate_latest(registry) == b""


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: ScrapeCollector(FakeManager(), TransferRecorder(), 7),
            "ScrapeCollector instance must be a string such as 'gpu0', got 7",
        ),
        (
            lambda: ScrapeCollector(None, TransferRecorder(), "e0", {b"redis": QuietTier()}),
            "ScrapeCollector tiers must be named by strings such as 'redis', got the name b'redis'",
        ),
        (
            lambda: MultiprocessWriter(None, TransferRecorder(), None, "unused"),
            "MultiprocessWriter instance must be a string such as 'gpu0', got None",
        ),
        (
            lambda: MultiprocessWriter(None, TransferRecorder(), "e0", "unused", {1: QuietTier()}),
            "MultiprocessWriter tiers must be named by strings such as 'redis', got the name 1",
        ),
    ],
)
def test_the_exporters_refuse_label_values_that_are_not_strings(build, message):
    with pytest.raises(TypeError) as refused:
        build()
    assert message in str(refused.value)


def test_unknown_direction_is_rejected():
    metrics = OffloadMetrics(registry=None, enabled=True)
    with pytest.raises(KeyError):
        metrics.on_job_done(FinishedJob(1, "sideways", True, 10, 0.1))


@pytest.mark.parametrize("auto_describe", [True, False], ids=["checking", "plain"])
def test_two_in_one_registry_export_one_family_each_with_both_instances(auto_describe):
    """A registry that checks for duplicates (the default one does) refused the second; one that
    does not wrote every family twice, which Prometheus refuses."""
    registry = CollectorRegistry(auto_describe=auto_describe)
    first, second = FakeManager(), FakeManager()
    run_workload(first, OffloadMetrics(first, instance="gpu0", registry=registry, enabled=True))
    other = OffloadMetrics(second, instance="gpu1", registry=registry, enabled=True)
    run_workload(second, other)
    text = generate_latest(registry).decode()
    assert text.count("# HELP numbakv_lookups_total ") == 1
    got = samples(registry)
    for instance in ("gpu0", "gpu1"):
        check_expected(
            {
                (name, tuple((k, "gpu0" if k == "instance" else v) for k, v in labels)): value
                for (name, labels), value in got.items()
                if ("instance", instance) in labels
            }
        )
    with pytest.raises(ValueError, match="instance 'gpu1' is exported in this registry already"):
        OffloadMetrics(FakeManager(), instance="gpu1", registry=registry, enabled=True)
    other.close()
    assert not any(("instance", "gpu1") in labels for _, labels in samples(registry))
    OffloadMetrics(FakeManager(), instance="gpu1", registry=registry, enabled=True)


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_finds_nothing_to_report():
    registry = CollectorRegistry()
    manager = FakeManager()
    run_workload(manager, OffloadMetrics(manager, instance="gpu0", registry=registry, enabled=True))
    run_workload(manager, OffloadMetrics(manager, instance="gpu1", registry=registry, enabled=True))
    result = subprocess.run(
        ["promtool", "check", "metrics"],
        input=generate_latest(registry),
        check=False,
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 0 and result.stdout == b"" and result.stderr == b"", result
