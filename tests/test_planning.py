"""The capacity-planning replay CLI: several policies and capacities, bytes, table, JSON, plot."""

from __future__ import annotations

import json

import pytest

from numbakv.replay import main, parse_capacity, replay
from numbakv.traces import read_hash_chains, write_trace
from numbakv.workloads import mixed_traffic


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "mixed.jsonl"
    write_trace(path, mixed_traffic(requests=400, seed=1))
    return str(path)


def test_parse_capacity() -> None:
    assert parse_capacity("5000") == 5000
    assert parse_capacity("64GiB", block_bytes=2**20) == 64 * 1024
    assert parse_capacity("1.5GB", block_bytes=10**6) == 1500
    with pytest.raises(ValueError, match="--block-bytes"):
        parse_capacity("64GiB")
    for bad in ("12 parsecs", "-3", "1.5", "0"):
        with pytest.raises(ValueError):
            parse_capacity(bad, block_bytes=1)


def test_single_run_json_is_unchanged(trace: str, capsys) -> None:
    assert main([trace, "--policy", "lru", "--capacity", "300", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"hit_ratio", "hits", "references", "evictions", "seconds"} <= result.keys()
    assert result["policy"] == "lru" and result["capacity"] == 300


def test_grid_prints_a_table_and_ends_with_all_runs(trace: str, capsys) -> None:
    argv = [trace, "--policy", "lru,sarc", "--capacity", "100,300", "--json"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    runs = json.loads(lines[-1])["runs"]
    assert [(run["policy"], run["capacity"]) for run in runs] == [
        ("belady", 100),
        ("belady", 300),
        ("lru", 100),
        ("lru", 300),
        ("sarc", 100),
        ("sarc", 300),
    ]
    table = "\n".join(lines[:-1])
    for run in runs:
        assert f"{run['hit_ratio']:.4f}" in table
    assert all(run["hits"] <= runs[0 if run["capacity"] == 100 else 1]["hits"] for run in runs)


def test_capacities_in_bytes(trace: str, capsys) -> None:
    argv = [trace, "--policy", "lru,arc", "--capacity", "1MiB,4MiB", "--block-bytes", "4096"]
    assert main([*argv, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"]
    assert sorted({run["capacity"] for run in runs}) == [256, 1024]


def test_belady_single_run(trace: str) -> None:
    chains = read_hash_chains(trace)
    bound = replay(chains, "belady", 200)
    assert bound.policy == "belady" and bound.references == sum(map(len, chains))
    assert replay(chains, "lru", 200).hits <= bound.hits


def test_plot(trace: str, tmp_path, capsys) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert main([trace, "--policy", "lru", "--capacity", "100,300", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_are_one_line(trace: str, capsys) -> None:
    for argv in (
        [trace, "--policy", "nope", "--capacity", "100"],
        [trace, "--capacity", "64GiB"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "error" in error
