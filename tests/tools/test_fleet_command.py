"""`numbakv.replay --engines N`: the fleet's report, its table and plot, and bad input."""

from __future__ import annotations

import json

import pytest

from numbakv.tools.fleet.core import FleetConfig, fleet_replay
from numbakv.tools.replay.command import main
from numbakv.tools.traces import read_hash_chains, write_trace
from numbakv.tools.workloads.core import mixed_traffic


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "mixed.jsonl"
    write_trace(path, mixed_traffic(requests=300, seed=3))
    return str(path)


def test_one_fleet_is_one_json_document_with_hits_per_tier(trace, capsys):
    argv = [trace, "--engines", "3", "--capacity", "100", "--disk-capacity", "200"]
    assert main([*argv, "--shared-capacity", "500", "--route", "round-robin", "--json"]) == 0
    out, err = capsys.readouterr()
    run = json.loads(out)
    expected = fleet_replay(
        read_hash_chains(trace), FleetConfig(3, 100, 200, 500, route="round-robin")
    )
    assert run["hits"] == expected.hits and run["shared_other_hits"] == expected.shared_other_hits
    tiers = ("host_hits", "disk_hits", "shared_own_hits", "shared_other_hits", "misses")
    assert sum(run[tier] for tier in tiers) == sum(map(len, read_hash_chains(trace)))
    assert (run["engines"], run["tiering"], run["interrupted"]) == (3, "demote", False)
    assert "another engine's write" in err and "3 engines routed by round-robin" in err


def test_a_grid_in_sizes_is_a_table_in_those_units(trace, capsys):
    argv = [trace, "--engines", "2", "--capacity", "400KiB,1MiB", "--block-bytes", "4KiB"]
    argv += ["--disk-capacity", "0,2MiB", "--shared-capacity", "none,4MiB"]
    assert main([*argv, "--tiering", "demote,write-through", "--json"]) == 0
    out, err = capsys.readouterr()
    runs = json.loads(out)["runs"]
    # 2 hosts x (no lower tier once, and 3 lower-tier combinations x 2 tierings)
    assert len(runs) == 2 * (1 + 3 * 2)
    assert {run["host_capacity"] for run in runs} == {100, 256}
    assert runs[-1]["shared_capacity_size"] == "4 MiB" and runs[-1]["block_bytes"] == 4096
    assert "400 KiB (100 blk)" in err and "write-through" in err and "none" in err


def test_a_lower_tier_alone_makes_a_fleet_of_one(trace, capsys):
    assert main([trace, "--capacity", "50", "--disk-capacity", "300"]) == 0
    out = capsys.readouterr().out
    assert "1 engine routed by session" in out and "own disk" in out


def test_the_plot_has_a_line_per_lower_tier_setting(trace, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn, save = [], Figure.savefig

    def savefig(figure, *args, **kwargs):
        drawn.extend((line.get_label(), len(line.get_xdata())) for line in figure.axes[0].lines)
        return save(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    png = tmp_path / "fleet.png"
    argv = [trace, "--engines", "2", "--capacity", "50,100", "--shared-capacity", "0,400"]
    assert main([*argv, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn == [  # one line per shared setting, a point per host capacity
        ("lru, disk none, shared none", 2),
        ("lru, disk none, shared 400, demote", 2),
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--engines", "2", "--policy", "belady"], "argument --policy: got 'belady'"),
        (["--engines", "0"], "argument --engines: got '0'"),
        (["--engines", "2", "--tiering", "copy"], "argument --tiering: got 'copy'"),
        (["--engines", "2", "--route", "random"], "argument --route"),
        (["--engines", "2", "--lower-policy", "fifo"], "argument --lower-policy: got 'fifo'"),
        (["--disk-capacity", "2TB"], "argument --disk-capacity: got '2TB', a size"),
        (["--shared-capacity", "-4"], "argument --shared-capacity: got '-4'"),
        (
            ["--disk-capacity", "1GiB", "--block-bytes", "4KiB"],
            "--capacity 10,000 (blocks); --disk-capacity 1 GiB (sizes); give them all in blocks",
        ),
    ],
)
def test_bad_fleet_input_is_one_line_before_any_replay(trace, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([trace, *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
