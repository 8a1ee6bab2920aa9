"""benchmarks/gpu_check.py's own parts on the simulator: its round trip, the JUnit summary, and
the targets it checks against the run's DMA ceiling."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sanitizer_round_trip_is_byte_exact(check, capsys):
    assert check.round_trip() == 0
    assert "round trip: bytes exact" in capsys.readouterr().out


def test_the_limits_keep_the_run_under_nine_minutes(check):
    assert sum(check.LIMITS_S.values()) <= 9 * 60 - 30  # the install and the probe take the rest


def test_junit_summary_counts_outcomes_and_gpu_tests(check, tmp_path):
    junit = tmp_path / "pytest.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.datapath.test_gpu" name="a"/>'
        '<testcase classname="tests.datapath.test_gpu" name="b"><skipped/></testcase>'
        '<testcase classname="tests.manager.test_methods" name="c"><failure/></testcase>'
        '<testcase classname="tests.manager.test_methods" name="d"/>'
        "</testsuite></testsuites>"
    )
    summary = check.junit_summary(junit)
    assert summary["counts"] == {"passed": 2, "failure": 1, "error": 0, "skipped": 1}
    assert (summary["gpu_tests_passed"], summary["gpu_tests_skipped"]) == (1, 1)
    assert summary["not_passed"] == ["tests.manager.test_methods::c (failure)"]


def _bandwidth(gather_16: float) -> dict:
    row = {
        "chunk_bytes": 16384,
        "gather_gbps": {"16": gather_16, "all": 53.0},
        "scatter_gbps": {"16": 50.0, "all": 52.0},
        "concurrent_gbps": 100.0,
        "naive_gbps": {"d2h": 4.0, "h2d": 4.0},
        "torch_gbps": None,
    }
    small = {**row, "chunk_bytes": 2048, "gather_gbps": {"16": 1.0, "all": 1.0}}
    return {
        "dma_ceiling_gbps": {"d2h": 55.0, "h2d": 55.0},
        "rows": [small, row],
        "per_step": {"store_poll_gbps": 45.0, "load_poll_gbps": 40.0, "submit_us_median": 20.0},
    }


def test_targets_are_checked_against_the_same_runs_ceiling(check, capsys):
    report = {
        "environment": {"device": "test"},
        "steps": {"tests": {"status": "passed", "seconds": 1.0}},
        "bandwidth": _bandwidth(gather_16=49.0),
        "e2e": {"overlap": {"compute_slowdown": 0.12}},
    }
    targets = {row["target"]: row for row in check.check_targets(report)}
    gather_16 = targets["gather, chunks >= 4 KiB, 16 thread blocks"]
    assert gather_16["value"] == pytest.approx(100 * 49 / 55) and gather_16["ok"] is False
    assert targets["gather, chunks >= 4 KiB, best cap"]["ok"] is True  # 2 KiB chunks not counted
    assert targets["per-step load (16 x 32 x 16 KiB), submit to done"]["ok"] is False
    assert targets["store + load together, chunks >= 4 KiB"]["value"] == pytest.approx(100 / 53)
    assert targets["compute slowed by a store next to it"]["ok"] is False
    assert targets["submit, 16 blocks"]["ok"] is True
    report["targets"] = list(targets.values())
    check.print_table(report)
    assert "NO" in capsys.readouterr().out


def test_missing_figures_are_unchecked_not_passed(check):
    targets = check.check_targets({"bandwidth": None, "e2e": None})
    assert all(row["value"] is None and row["ok"] is None for row in targets)
