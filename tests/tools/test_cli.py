"""Every command's bad input: one line naming the flag and what it got, exit status 2, before any
work; help with defaults; Ctrl-C with one line and the partial summary; progress off a terminal."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import weakref
from multiprocessing.process import BaseProcess

import pytest
from numbakv.dashboards import generate

import numbakv.tools.demo.core
import numbakv.tools.replay.core
from numbakv.tools.cli import Interrupted, interrupts_between_requests
from numbakv.tools.demo import command as demo
from numbakv.tools.demo.core import DemoConfig, StandInEngine, run, run_engines
from numbakv.tools.progress import Progress
from numbakv.tools.replay import command as replay_command
from numbakv.tools.traces import read_hash_chains
from numbakv.tools.workloads import command as workloads
from tests.support.replaying import interrupted_at

BIG = "999999999999999999999"
# (command, arguments, text the error must show: the flag and what it got). "{dir}" is a directory
# that exists, "{file}" a trace file.
BAD_INPUT = [
    (replay_command.main, ["--capacity", BIG], ["--capacity", BIG]),
    (replay_command.main, ["--capacity", "0"], ["--capacity", "'0'"]),
    (replay_command.main, ["--capacity", "-3"], ["--capacity", "'-3'"]),
    (replay_command.main, ["--capacity", "lots"], ["--capacity", "'lots'"]),
    (replay_command.main, ["--capacity", "1.5"], ["--capacity", "'1.5'", "whole"]),
    (replay_command.main, ["--capacity", "64GiB"], ["--capacity", "'64GiB'", "--block-bytes"]),
    (
        replay_command.main,
        ["--capacity", "64parsecs", "--block-bytes", "1"],
        ["--capacity", "'parsecs'"],
    ),
    (
        replay_command.main,
        ["--capacity", "1KiB", "--block-bytes", "2KiB"],
        ["--capacity", "'1KiB'"],
    ),
    (
        replay_command.main,
        ["--capacity", "100,1GiB", "--block-bytes", "1MiB"],
        ["--capacity", "a mix"],
    ),
    (replay_command.main, ["--capacity", ","], ["--capacity", "','"]),
    (replay_command.main, ["--capacity", "10,,20"], ["--capacity", "'10,,20'", "empty"]),
    (replay_command.main, ["--capacity", "10,"], ["--capacity", "'10,'", "empty"]),
    (replay_command.main, ["--block-bytes", "0"], ["--block-bytes", "'0'"]),
    (replay_command.main, ["--block-bytes", "0.5"], ["--block-bytes", "'0.5'"]),
    (replay_command.main, ["--block-bytes", "x"], ["--block-bytes", "'x'"]),
    (replay_command.main, ["--policy", "nope"], ["--policy", "'nope'", "lru", "belady"]),
    (replay_command.main, ["--policy", ","], ["--policy", "','"]),
    (replay_command.main, ["--policy", "lru,,arc"], ["--policy", "'lru,,arc'", "empty"]),
    (
        replay_command.main,
        ["--policy", "no_such_module:Policy"],
        ["--policy", "no_such_module:Policy"],
    ),
    (replay_command.main, ["--store-threshold", "0"], ["--store-threshold", "'0'"]),
    (replay_command.main, ["--route", "session"], ["--route", "--engines"]),
    (
        replay_command.main,
        ["--engines", "5", "--requests", "3"],
        ["--engines", "'5'", "the 3 requests"],
    ),
    (replay_command.main, ["--tiering", "write-through"], ["--tiering", "--engines"]),
    (
        replay_command.main,
        ["--engines", "2", "--tiering", "demote,,write-through", "--shared-capacity", "9"],
        ["--tiering", "'demote,,write-through'", "empty"],
    ),
    (
        replay_command.main,
        ["--engines", "2", "--disk-capacity", "10,,20"],
        ["--disk-capacity", "'10,,20'", "empty"],
    ),
    (replay_command.main, ["--lower-policy", "lru"], ["--lower-policy", "--engines"]),
    (replay_command.main, ["--plot", "/missing/dir/x.png"], ["--plot", "'/missing/dir/x.png'"]),
    # a directory where no file can be made, even by root (issue 37: a traceback after the replay)
    (replay_command.main, ["--plot", "/proc/x.png"], ["--plot", "'/proc/x.png'", "can write"]),
    (workloads.main, ["--out", "/proc/w.jsonl"], ["--out", "'/proc/w.jsonl'", "can write"]),
    (replay_command.main, ["--plot", "{dir}"], ["--plot", "not a directory"]),
    (replay_command.main, ["--plot", "{dir}/x.txt"], ["--plot", "x.txt", ".png"]),
    (replay_command.main, ["missing.jsonl"], ["TRACE", "'missing.jsonl'", "mooncake_conversation"]),
    (replay_command.main, ["{dir}"], ["TRACE", "not a file"]),
    (replay_command.main, ["--frobnicate"], ["unrecognized arguments: --frobnicate"]),
    (workloads.main, ["--seed", "-1", "--out", "{dir}/w.jsonl"], ["--seed", "'-1'", ">= 0"]),
    (workloads.main, ["--seed", "x", "--out", "{dir}/w.jsonl"], ["--seed", "'x'"]),
    (workloads.main, ["--out", "/missing/dir/w.jsonl"], ["--out", "'/missing/dir/w.jsonl'"]),
    (workloads.main, ["--out", "{dir}"], ["--out", "not a directory"]),
    (workloads.main, ["--out", "/dev/null"], ["--out", "'/dev/null'", "not a device"]),
    (workloads.main, ["--kind", "nope", "--out", "{dir}/w.jsonl"], ["--kind", "'nope'", "chat"]),
    (workloads.main, [], ["required: --out"]),
    (demo.main, ["--sessions", "0"], ["--sessions", "'0'", ">= 1"]),
    (demo.main, ["--block-size", "-1"], ["--block-size", "'-1'"]),
    (demo.main, ["--host-blocks", "-5"], ["--host-blocks", "'-5'"]),
    (demo.main, ["--gpu-blocks", "0"], ["--gpu-blocks", "'0'"]),
    (demo.main, ["--num-layers", "x"], ["--num-layers", "'x'"]),
    (demo.main, ["--head-size", "1.5"], ["--head-size", "'1.5'"]),
    (demo.main, ["--requests", "0"], ["--requests", "'0'"]),
    (demo.main, ["--mode", "sideways"], ["--mode", "'sideways'", "eager"]),
    (demo.main, ["--tiering", "write-through"], ["--tiering", "give --tier with it"]),
    (demo.main, ["--policy", "nope"], ["--policy", "'nope'", "sarc"]),
    (demo.main, ["--policy", "belady"], ["--policy", "'belady'", "replay-only"]),
    (demo.main, ["--trace", "missing.jsonl"], ["--trace", "'missing.jsonl'"]),
    (demo.main, ["--host-blocks", BIG], ["--host-blocks", "GiB of memory"]),
    (demo.main, ["--trace", "{file}", "--gpu-blocks", "2"], ["--gpu-blocks", "'2'", "at least 3"]),
    (generate.main, ["--out", "/missing/dir/board.json"], ["--out", "'/missing/dir/board.json'"]),
    (generate.main, ["--out", "{dir}"], ["--out", "not a directory"]),
    (generate.main, ["--bogus"], ["unrecognized arguments: --bogus"]),
]
INTERNAL_NAMES = ("num_blocks", "host_blocks", "gpu_blocks", "Error", "Exception", "Traceback")


def _fill(argv: list[str], tmp_path) -> list[str]:
    trace = tmp_path / "three.jsonl"
    trace.write_text('{"hash_ids": [1, 2, 3]}\n')
    return [arg.format(dir=tmp_path, file=trace) for arg in argv]


@pytest.mark.parametrize(
    ("main", "argv", "shows"),
    BAD_INPUT,
    ids=[f"{main.__module__.split('.')[-1]} {' '.join(argv)}" for main, argv, _ in BAD_INPUT],
)
def test_bad_input_is_one_line_and_status_2(main, argv, shows, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written anywhere else
    with pytest.raises(SystemExit) as exit_info:
        main(_fill(argv, tmp_path))
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    error = err.splitlines()[-1]
    assert out == "" and err.endswith("\n") and ": error: " in error
    assert err.count(": error: ") == 1 and len(err.splitlines()) <= 2  # a demo's simulator note
    for text in shows:
        assert text in error, error
    assert not any(name in err for name in INTERNAL_NAMES), err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["three.jsonl"]


@pytest.mark.parametrize(
    "command",
    [
        ["numbakv.replay", "--capacity", BIG],
        ["numbakv.workloads", "--seed", "-1", "--out", "w.jsonl"],
        ["numbakv.demo", "--sessions", "0"],
        ["numbakv.dashboards.generate", "--out", "/missing/dir/board.json"],
    ],
)
def test_commands_answer_bad_input_without_a_traceback(command, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", *command], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("command", [replay_command, demo, workloads, generate])
def test_every_option_has_help_with_its_default(command):
    for action in command._parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, action.dest
        if not isinstance(action, argparse._StoreTrueAction) or action.dest == "json":
            assert "default" in action.help or action.required, action.dest


def test_replay_ctrl_c_ends_with_one_line_and_the_partial_table(monkeypatch, capsys):
    monkeypatch.setattr(numbakv.tools.replay.core, "replay_request", interrupted_at(9000))  # run 2
    status = replay_command.main(["--policy", "lru,arc", "--capacity", "1000", "--json"])
    assert status == 130
    out, err = capsys.readouterr()
    first = err.splitlines()[0]
    assert first.startswith("numbakv-replay: interrupted after 1 of 2 runs; arc at 1,000 blocks")
    assert "its figures are partial" in first and "Traceback" not in err
    document = json.loads(out)
    assert document["interrupted"] is True
    assert [run["policy"] for run in document["runs"]] == ["lru", "arc"]
    assert document["runs"][1]["requests"] < document["runs"][0]["requests"]


def test_an_interrupted_replays_table_marks_its_partial_cells(monkeypatch, capsys):
    """Issue 37: the table on stdout looked complete."""
    monkeypatch.setattr(numbakv.tools.replay.core, "replay_request", interrupted_at(9000))  # run 2
    assert replay_command.main(["--policy", "lru,arc,sieve", "--capacity", "1000"]) == 130
    table = capsys.readouterr().out.splitlines()
    lru, arc, sieve = (
        next(line for line in table if line.startswith(p)) for p in ("lru", "arc", "sieve")
    )
    assert "*" not in lru and "*" in arc and sieve.split()[1] == "-"
    assert "* partial: arc at 1,000 blocks stopped after " in "\n".join(table)
    assert table[-1] == "- not replayed"


def test_demo_ctrl_c_ends_with_one_line_and_the_partial_report(monkeypatch, capsys):
    served = 0
    real = numbakv.tools.demo.core.StandInEngine.serve

    def interrupted_at_the_fourth_request(self, chain):
        nonlocal served
        served += 1
        if served == 4:
            raise KeyboardInterrupt
        real(self, chain)

    monkeypatch.setattr(
        numbakv.tools.demo.core.StandInEngine, "serve", interrupted_at_the_fourth_request
    )
    assert demo.main(["--sessions", "3", "--json"]) == 130
    out, err = capsys.readouterr()
    assert "numbakv-demo: interrupted after 3 of " in err and "Traceback" not in err
    report = json.loads(out)
    assert report["interrupted"] is True and report["requests"] == 3


DEMO_WITH_CTRL_C = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('numbakv.demo', run_name='__main__')"
)
"""`python3 -m numbakv.demo`, with Ctrl-C raising KeyboardInterrupt even where the test runs in
the background (whose processes start with SIGINT ignored)."""


@pytest.mark.slow
@pytest.mark.parametrize("to", ["the demo alone", "its process group"])
def test_a_demo_over_a_tier_interrupted_in_its_second_engine_reports_both(tmp_path, to):
    """Ctrl-C while the second engine serves: the first engine's whole figures, the second's so
    far. A terminal interrupts the demo and its engine's process; `kill -INT` the demo alone, and
    the demo passes it on."""
    demo_process = subprocess.Popen(
        [sys.executable, "-c", DEMO_WITH_CTRL_C, "--tier", f"dir:{tmp_path}"],
        env={**os.environ, "NUMBA_ENABLE_CUDASIM": "1"},  # slow enough for progress lines
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job is
    )
    said = []
    for line in demo_process.stderr:  # a progress line every few seconds while an engine serves
        said.append(line)
        if sum(" 00:05 elapsed" in line for line in said) == 2:  # the second engine's first
            break
    interrupt = os.kill if to == "the demo alone" else os.killpg
    interrupt(demo_process.pid, signal.SIGINT)
    out, err = demo_process.communicate(timeout=60)
    assert demo_process.returncode == 130, "".join(said) + err
    assert "numbakv-demo: interrupted in engine 2 of 2 after " in err and "Traceback" not in err
    first, second = out.split("engine 2 of 2, in a process of its own")
    assert "engine 1 of 2" in first and "0 wrong" in first and "0 wrong" in second
    requests = [
        int(line.split()[1].replace(",", ""))
        for line in out.splitlines()
        if line.startswith("requests")
    ]
    assert requests[1] < requests[0]  # the second engine's figures so far
    assert "loaded that another engine stored; " in second and " 0 loaded that" not in second


def test_ctrl_c_while_an_engine_process_ends_keeps_every_report(tmp_path, monkeypatch):
    """The engine has sent its whole report and its process is ending: a Ctrl-C then used to
    leave as a plain KeyboardInterrupt, and the demo printed no figures at all."""
    ending = BaseProcess.join
    joins = []

    def join_interrupted_once(process, timeout=None):
        joins.append(timeout)
        if len(joins) == 2:  # the second engine's, once it answered
            raise KeyboardInterrupt
        return ending(process, timeout)

    monkeypatch.setattr(BaseProcess, "join", join_interrupted_once)
    config = DemoConfig(tier=f"dir:{tmp_path}", requests=8, sessions=2)
    with pytest.raises(Interrupted) as cut_short:
        run_engines(config)
    assert [report.requests for report in cut_short.value.results] == [8, 8]
    assert cut_short.value.requests == 8


def test_ctrl_c_landing_in_a_weakref_callback_still_stops_the_demo(monkeypatch, capsys):
    """Ctrl-C raised where it lands can land in a weakref callback (the simulator and the tiers
    leave plenty), where Python prints a traceback and drops it: the demo served on. It is noted
    instead, and the demo stops before its next request."""
    serve, served = StandInEngine.serve, []

    def serve_then_ctrl_c_in_a_callback(engine, chain):
        serve(engine, chain)
        served.append(chain)
        if len(served) == 3:

            class Dropped:
                pass

            dropped = Dropped()
            ref = weakref.ref(  # noqa: F841 (kept, so that its callback runs)
                dropped, lambda _: (os.kill(os.getpid(), signal.SIGINT), sum(range(99)))
            )
            del dropped  # the callback runs now, and the signal's handler inside it

    monkeypatch.setattr(StandInEngine, "serve", serve_then_ctrl_c_in_a_callback)
    with pytest.raises(Interrupted) as cut_short:
        run(DemoConfig(requests=8, sessions=2))
    assert [report.requests for report in cut_short.value.results] == [3]
    assert "Traceback" not in capsys.readouterr().err


def test_a_second_ctrl_c_is_raised_where_it_lands():
    """The first Ctrl-C waits for the request under way; a second one, for a request that takes
    too long, interrupts it as Ctrl-C always did. Leaving raises the first; the handler before is
    put back."""
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), interrupts_between_requests() as stop_if_interrupted:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # noted: nothing raised here
        with pytest.raises(KeyboardInterrupt):
            stop_if_interrupted()  # raised before the next request
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # the handler runs here at the latest
    assert signal.getsignal(signal.SIGINT) is before


def test_progress_off_a_terminal_is_a_plain_line_every_interval(tmp_path):
    log = (tmp_path / "log").open("w+")
    meter = Progress("replaying", 4, "req", stream=log, interval=0.0)
    meter.update()
    meter.update(2)
    meter.close()
    log.seek(0)
    lines = log.read().splitlines()
    assert lines[0].startswith("replaying: 1 of 4 req (25%), 00:00 elapsed, about 00:00 left")
    assert lines[1].startswith("replaying: 3 of 4 req (75%)")
    quiet = (tmp_path / "quiet").open("w+")
    Progress("replaying", 4, "req", stream=quiet).update()  # before the first interval: nothing
    assert quiet.tell() == 0


def test_loading_reports_progress_off_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr("numbakv.tools.progress.INTERVAL", 0.0)

    read_hash_chains("mooncake_conversation", progress=True)
    err = capsys.readouterr().err
    assert "reading mooncake_conversation.jsonl: " in err and "of 3.03MB" in err
