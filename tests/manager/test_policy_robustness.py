"""The policy robustness benchmark runs end to end on tiny workloads and reports every cell."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_robustness.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("policy_robustness", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_draws_are_reproducible_and_valid():
    bench = load_benchmark()
    draws = [bench.draw(seed=3, index=index) for index in range(30)]
    assert draws == [bench.draw(seed=3, index=index) for index in range(30)]
    assert {kind for kind, _ in draws} == {"chat", "mixed"}
    for kind, params in draws:
        if kind == "mixed":
            assert params["session_share"] + params["document_share"] <= 0.9


def test_smoke_run_writes_a_margin_per_workload_and_capacity(tmp_path):
    bench = load_benchmark()
    out = tmp_path / "robustness.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=SCRIPT.parents[1],
    )

    report = json.loads(out.read_text())
    assert len(report["rows"]) == bench.SMOKE["workloads"]
    for row in report["rows"]:
        assert set(row["margins"]) == {str(c) for c in bench.SMOKE["capacities"]}
        assert row["references"] > 0
    summary = report["summary"]
    assert summary["cells"] == bench.SMOKE["workloads"] * len(bench.SMOKE["capacities"])
    assert "workloads lose somewhere" in run.stdout
