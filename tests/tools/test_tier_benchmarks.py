"""The tier benchmarks' harness: the disk benchmark's smoke run from a relative directory, its
round-by-round comparison, and the rounds in which every source takes its turn in a new order
(what ran just before a source slows it on a small machine, so no source may keep one
predecessor)."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_disk_benchmark_smoke_run_works_from_a_relative_directory(tmp_path):
    out = tmp_path / "tiers.json"
    finished = subprocess.run(
        [sys.executable, str(BENCHMARKS / "tier_bandwidth.py"), "--smoke", "--dir", "."]
        + ["--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    rows = {(row["source"], row["direction"]) for row in json.loads(out.read_text())["rows"]}
    assert {("dd", "store"), ("numbakv-disk", "load")} <= rows
    assert [entry.name for entry in tmp_path.iterdir()] == ["tiers.json"]  # its files are gone


def test_every_round_runs_each_source_once_in_a_new_order(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from redis_tier_bandwidth import round_seconds

    calls = []

    def source(name):
        def run():
            calls.append(name)
            return float(len(calls))  # its seconds: the call's place in the whole sequence

        return run

    names = list("abcdef")
    runs = round_seconds({name: source(name) for name in names}, 9)
    rounds = [calls[start : start + len(names)] for start in range(0, len(calls), len(names))]
    assert len(rounds) == 9 and all(sorted(turns) == names for turns in rounds)
    followed = {turns[turns.index("a") - 1] for turns in rounds if turns[0] != "a"}
    assert len(followed) > 2  # "a" comes after different sources from round to round
    for name in names:
        places = sorted(place + 1 for place, called in enumerate(calls) if called == name)
        assert runs[name] == places  # its seconds, round by round


def test_the_disk_benchmark_compares_numbakv_round_by_round(monkeypatch):
    """Each other source's row gets numbakv's rate over its own, round by round: the median of
    the ratios and the rounds numbakv was ahead (dd's too; numbakv's own row gets neither)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from tier_bandwidth import with_numbakv_by_round

    rows = with_numbakv_by_round(
        [
            {"source": "numbakv-disk", "direction": "load", "runs_GB/s": [2.0, 1.0, 3.0]},
            {"source": "vllm-fs", "direction": "load", "runs_GB/s": [1.0, 2.0, 2.0]},
            {"source": "vllm-fs", "direction": "store", "runs_GB/s": [1.0, 1.0, 1.0]},
        ]
    )
    assert "rounds numbakv ahead" not in rows[0]
    assert rows[1]["numbakv / this, median of rounds"] == 1.5  # of 2.0, 0.5 and 1.5
    assert rows[1]["rounds numbakv ahead"] == 2
    assert "rounds numbakv ahead" not in rows[2]  # numbakv has no store row to compare
