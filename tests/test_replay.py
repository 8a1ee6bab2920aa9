"""The replay CLI: figures, output formats and one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from numbakv.replay import main, replay
from numbakv.traces import TraceRequest, read_hash_chains, write_trace

SHARED_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake_conversation.jsonl"
)


@pytest.fixture
def small_trace(tmp_path):
    path = tmp_path / "small.jsonl"
    chains = [[0, 1, 2], [0, 1, 3], [0, 1, 2, 4], [5], [0, 1, 2, 4, 6]]
    write_trace(path, [TraceRequest(i, 512 * len(c), 10, c) for i, c in enumerate(chains)])
    return path


def test_replay_follows_the_trace_semantics(small_trace):
    result = replay(read_hash_chains(small_trace), policy="lru", capacity=100)
    # hits: 0, then [0,1], then [0,1,2], then none, then [0,1,2,4]
    assert (result.hits, result.references, result.evictions) == (9, 16, 0)
    tight = replay(read_hash_chains(small_trace), policy="lru", capacity=3)
    assert tight.evictions > 0 and tight.hits < 9


def test_cli_json_is_the_last_line(small_trace, capsys):
    assert main([str(small_trace), "--capacity", "100", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert {"hit_ratio", "hits", "references", "evictions", "seconds"} <= result.keys()
    assert result["hits"] == 9 and result["hit_ratio"] == pytest.approx(9 / 16)


def test_cli_lists_policies(capsys):
    assert main(["--list-policies"]) == 0
    assert {"lru", "arc"} <= set(capsys.readouterr().out.split())


def test_cli_without_a_trace_replays_the_built_in_workload(capsys):
    assert main(["--json", "--capacity", "2000"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["references"] > 10_000 and 0 < result["hit_ratio"] < 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.jsonl"], "missing.jsonl: cannot read trace"),
        (["--capacity", "0"], "capacity '0' is less than one block"),
        (["--capacity", "lots"], "bad capacity 'lots'"),
        (["--policy", "nope"], "unknown cache policy 'nope'"),
    ],
)
def test_cli_errors_are_one_line_with_status_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"hash_ids": [1, 2', "not valid JSON"),
        ('{"input_length": 5}', "expected a JSON object with a 'hash_ids' list"),
        ('{"hash_ids": [1, "x"]}', "'hash_ids' must be a list of integers"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_lines_are_named_by_file_and_number(tmp_path, line, message, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"hash_ids": [1]}\n\n' + line + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(path)])
    assert exit_info.value.code == 2
    assert f"{path}:3: {message}" in capsys.readouterr().err


def test_module_entry_point_runs(small_trace):
    done = subprocess.run(
        [sys.executable, "-m", "numbakv.replay", str(small_trace), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout.splitlines()[-1])["hits"] == 9


@pytest.mark.skipif(not SHARED_TRACE.exists(), reason="the shared Mooncake trace is not present")
@pytest.mark.parametrize(("capacity", "expected"), [(2_000, 0.054), (10_000, 0.211)])
def test_lru_matches_the_traces_readme_cross_check(capacity, expected):
    result = replay(read_hash_chains(SHARED_TRACE), policy="lru", capacity=capacity)
    assert round(result.hit_ratio, 3) == expected
    assert result.references == 288_500
