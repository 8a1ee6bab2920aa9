"""The capacity-planning replay CLI: several policies and capacities, sizes, table, JSON, plot."""

from __future__ import annotations

import json

import pytest

from numbakv.checks import whole_bytes
from numbakv.tools.replay.command import main
from numbakv.tools.replay.core import replay
from numbakv.tools.replay.planning import Capacity, bytes_label, parse_capacity
from numbakv.tools.traces import read_hash_chains, write_trace
from numbakv.tools.workloads.core import mixed_traffic


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "mixed.jsonl"
    write_trace(path, mixed_traffic(requests=400, seed=1))
    return str(path)


def test_parse_capacity() -> None:
    assert parse_capacity("5000") == Capacity(5000)
    assert parse_capacity("64GiB", block_bytes=2**20) == Capacity(64 * 1024, "64", "GiB")
    assert parse_capacity("1.5gb", block_bytes=10**6) == Capacity(1500, "1.5", "GB")
    assert parse_capacity("64GiB", block_bytes=2**20).label == "64 GiB"
    # exact decimals: in floats, 2.05 GB / 50 MB came to 40.99... blocks, and 4.1 MB was no
    # whole number of bytes
    assert parse_capacity("2.05GB", block_bytes=50 * 10**6).blocks == 41
    with pytest.raises(ValueError, match="--block-bytes"):
        parse_capacity("64GiB")
    for bad in ("12 parsecs", "-3", "1.5", "0", "1KiB"):
        with pytest.raises(ValueError, match="got"):
            parse_capacity(bad, block_bytes=2048)


def test_block_bytes_and_labels() -> None:
    assert whole_bytes("2097152") == whole_bytes("2MiB") == 2**21
    assert whole_bytes("4.1MB") == 4_100_000 and whole_bytes("16.1kB") == 16_100
    for bad in ("0", "0.5", "2 apples", "-1"):
        with pytest.raises(ValueError, match="got"):
            whole_bytes(bad)
    assert (bytes_label(64 * 2**20), bytes_label(3000)) == ("64 MiB", "3,000 bytes")


def test_single_run_json(trace: str, capsys) -> None:
    assert main([trace, "--policy", "lru", "--capacity", "300", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"hit_ratio", "hits", "references", "evictions", "seconds"} <= result.keys()
    assert result["policy"] == "lru" and result["capacity"] == 300


def test_grid_is_one_json_document_and_a_table_on_stderr(trace: str, capsys) -> None:
    argv = [trace, "--policy", "lru,sarc", "--capacity", "100,300", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    runs = document["runs"]
    assert [(run["policy"], run["capacity"]) for run in runs] == [
        ("lru", 100),
        ("lru", 300),
        ("sarc", 100),
        ("sarc", 300),
    ]  # no Belady row unless asked for
    assert document["trace"] == trace and document["interrupted"] is False
    for run in runs:
        assert f"{run['hit_ratio']:.4f}" in err
    assert "belady" not in err


def test_belady_only_when_asked_and_labelled(trace: str, capsys) -> None:
    argv = [trace, "--policy", "lru,belady", "--capacity", "100,300", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    runs = json.loads(out)["runs"]
    bound = {run["capacity"]: run["hits"] for run in runs if run["policy"] == "belady"}
    assert all(run["hits"] <= bound[run["capacity"]] for run in runs)
    assert "belady: Belady's MIN, the clairvoyant bound" in err


def test_sizes_in_and_out(trace: str, capsys) -> None:
    """Capacities asked in MiB come out in MiB, with blocks beside; the JSON has both."""
    argv = [trace, "--policy", "lru,arc", "--capacity", "1MiB,4MiB", "--block-bytes", "4KiB"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "hit ratio by host capacity (blocks of 4 KiB)" in table
    header, blocks = table.splitlines()[2:4]
    assert header.split() == ["policy", "1", "MiB", "4", "MiB", "us/ref"]
    assert blocks.split() == ["256", "blk", "1,024", "blk"]
    assert main([*argv, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(run["capacity"], run["capacity_size"]) for run in runs[:2]] == [
        (256, "1 MiB"),
        (1024, "4 MiB"),
    ]
    assert runs[1]["capacity_bytes"] == 4 * 2**20 and runs[1]["block_bytes"] == 4096


def test_single_run_in_a_size(trace: str, capsys) -> None:
    assert main([trace, "--capacity", "1MiB", "--block-bytes", "4096"]) == 0
    assert "capacity        1 MiB: 256 blocks of 4 KiB" in capsys.readouterr().out


def test_belady_single_run(trace: str) -> None:
    chains = read_hash_chains(trace)
    bound = replay(chains, "belady", 200)
    assert bound.policy == "belady" and bound.references == sum(map(len, chains))
    assert replay(chains, "lru", 200).hits <= bound.hits


def test_plot_in_the_given_unit(trace: str, tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    labels = []
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_xlabel", lambda self, text, **kw: labels.append(text)
    )
    png = tmp_path / "plan.png"
    argv = [trace, "--capacity", "1MiB,4MiB", "--block-bytes", "4KiB", "--plot", str(png)]
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert labels == ["host capacity (MiB)"]
