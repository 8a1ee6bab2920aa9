"""Synthetic workloads: deterministic, in the trace format, with the structure they promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from numbakv.tools.traces import TraceRequest, read_hash_chains, write_trace
from numbakv.tools.workloads.command import main
from numbakv.tools.workloads.core import WORKLOADS, mixed_traffic, multi_turn_chat


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_seeded_and_deterministic(kind: str) -> None:
    first, again, other = WORKLOADS[kind](seed=5), WORKLOADS[kind](seed=5), WORKLOADS[kind](seed=6)
    assert first == again
    assert first != other


def test_ids_imply_their_prefix() -> None:
    requests = mixed_traffic(requests=3000, seed=2)
    parent: dict[int, int | None] = {}
    for request in requests:
        for position, block in enumerate(request.hash_ids):
            before = request.hash_ids[position - 1] if position else None
            assert parent.setdefault(block, before) == before
    timestamps = [request.timestamp for request in requests]
    assert timestamps == sorted(timestamps)


def test_mixed_traffic_has_one_offs_and_popular_prefixes() -> None:
    requests = mixed_traffic(requests=3000, seed=0)
    uses = Counter(block for request in requests for block in request.hash_ids)
    assert sum(1 for count in uses.values() if count == 1) > len(uses) / 2  # mostly one-offs
    assert max(uses.values()) > 100  # and a few hot system prompts


def test_default_chat_workload_still_works() -> None:
    requests = multi_turn_chat(sessions=50)
    assert requests and all(request.hash_ids for request in requests)


def test_cli_writes_a_readable_trace(tmp_path, capsys) -> None:
    out = tmp_path / "docs.jsonl"
    assert main(["--kind", "documents", "--seed", "1", "--out", str(out)]) == 0
    assert len(read_hash_chains(out)) == 12_000
    assert "block references" in capsys.readouterr().out


def test_cli_json_is_the_whole_stdout(tmp_path, capsys) -> None:
    out = tmp_path / "loop.jsonl"
    assert main(["--kind", "loop", "--seed", "2", "--out", str(out), "--json"]) == 0
    stdout, stderr = capsys.readouterr()
    summary = json.loads(stdout)
    assert summary["requests"] == len(read_hash_chains(out)) == 12_000
    assert (summary["kind"], summary["seed"], summary["out"]) == ("loop", 2, str(out))
    assert "block references" in stderr


def test_an_interrupted_write_leaves_no_file(tmp_path) -> None:
    def requests():
        yield TraceRequest(0, 512, 1, [0])
        raise KeyboardInterrupt

    out = tmp_path / "w.jsonl"
    with pytest.raises(KeyboardInterrupt):
        write_trace(out, requests())
    assert list(tmp_path.iterdir()) == []


def test_a_trace_written_to_a_link_replaces_the_file_it_names(tmp_path) -> None:
    target, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    target.write_text("old\n")
    link.symlink_to(target)
    write_trace(link, [TraceRequest(0, 512, 1, [7])])
    assert link.is_symlink() and read_hash_chains(target) == [[7]]


def test_a_pipe_is_refused_as_out_without_waiting_on_it(tmp_path, capsys) -> None:
    pipe = tmp_path / "pipe.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(pipe)])
    assert exit_.value.code == 2 and "not a device or a pipe" in capsys.readouterr().err


def test_module_runs_as_a_script(tmp_path) -> None:
    out = tmp_path / "chat.jsonl"
    command = [sys.executable, "-m", "numbakv.workloads", "--kind", "chat", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True)
    assert read_hash_chains(out)
