"""The metrics directory's files: safe reads, per-family merges, liveness and compaction.

Compaction is checked the hard way: interrupted after each of its file operations, the directory
must read the same as before, and the next compaction must finish the job.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from numbakv.service import metrics_dir
from numbakv.service.app import Sidecar
from numbakv.service.metrics_dir import MetricsDirectory
from numbakv.service.settings import Settings
from prometheus_client.mmap_dict import MmapedDict

from numbakv.metrics import compaction
from numbakv.metrics import directory as directory_module
from numbakv.metrics.directory import (
    DbFile,
    FileData,
    Unreadable,
    directory_lock,
    list_directory,
    merge,
    parse_name,
    read_file,
)
from numbakv.metrics.liveness import claim, forget_dead_writers, writer_alive
from tests.support.metrics_fakes import key, run_writers, start_writer, write_metrics_file

COUNTER = key("jobs", "jobs_total", {"direction": "load"})


def read_one(directory, name: str) -> FileData:
    db = parse_name(name) or DbFile(name, "counter", "1")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return read_file(fd, db)
    finally:
        os.close(fd)


def samples(directory) -> dict:
    """Every sample the sidecar would serve, checked to come from a whole read."""
    reading = MetricsDirectory(str(directory)).read()
    assert not reading.state.skipped, reading.state.skipped
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in reading.metrics
        for s in m.samples
    }


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda path: None, "does not exist"),
        (lambda path: path.write_text("metrics"), "names a file, not a directory"),
    ],
    ids=["missing", "a file"],
)
def test_a_directory_that_is_not_there_says_which_way(tmp_path, make, said):
    path = tmp_path / "metrics"
    make(path)
    (problem,) = MetricsDirectory(str(path)).read().state.problems
    assert said in problem


def test_a_file_reads_as_prometheus_client_wrote_it(tmp_path):
    write_metrics_file(tmp_path / "counter_1.db", [(COUNTER, 3.0)])
    data = read_one(tmp_path, "counter_1.db")
    assert data.families == {"jobs": ("help", [("jobs_total", (("direction", "load"),), 3.0, 0.0)])}


def int32(value: int) -> bytes:
    return value.to_bytes(4, "little", signed=True)


@pytest.mark.parametrize(
    "content, reason",
    [
        (int32(4096) + b"\0" * 60, "the header says 4096 bytes are in use, the file has 64"),
        (int32(1 << 30) + b"\0" * 4, "1073741824 bytes in use, over the limit"),
        (int32(-5) + b"\0" * 4, "the header says -5 bytes"),
        (int32(64) + b"\0" * 4 + int32(-28) + b"\0" * 52, "the entry at byte 8 overruns"),
        (int32(40) + b"\0" * 4 + int32(4) + b"\xff" * 28, "the key at byte 8 is not UTF-8"),
    ],
    ids=["cut short", "oversized", "negative size", "negative key length", "not UTF-8"],
)
def test_a_malformed_file_is_unreadable_with_a_reason(tmp_path, content, reason):
    (tmp_path / "counter_1.db").write_bytes(content)
    with pytest.raises(Unreadable, match=reason):
        read_one(tmp_path, "counter_1.db")


@pytest.mark.parametrize(
    "entry, reason",
    [
        ("not json", "not JSON"),
        ('["a", "a_total", {}]', "not \\[metric"),
        (key("jobs", "jobs_total", {}, help_text=7), "help text"),
        (key("jobs", "jobs_total", {"direction": 1}), "label value"),
        (key("", "jobs_total", {}), "non-empty string"),
        (key("jobs", "jobs_total", {"": "load"}), "empty or reserved: ''"),
        (key("jobs", "jobs_total", {"__name__": "x"}), "empty or reserved: '__name__'"),
        (key("jobs", "jobs_total", {"direction": "\ud800"}), "not valid Unicode"),
        (key("jobs", "jobs_total", {"\ud800": "load"}), "not valid Unicode"),
        (key("jobs", "jobs_total", {}, help_text="\udfff"), "not valid Unicode"),
    ],
)
def test_a_malformed_key_makes_its_file_unreadable(tmp_path, entry, reason):
    write_metrics_file(tmp_path / "counter_1.db", [(COUNTER, 1.0), (entry, 2.0)])
    with pytest.raises(Unreadable, match=reason):
        read_one(tmp_path, "counter_1.db")


def test_the_keys_kept_parsed_are_bounded_in_characters(tmp_path, monkeypatch):
    """Long keys that change from read to read (a writer's label values) never pile up."""
    monkeypatch.setattr(directory_module, "_MAX_PARSED_KEY_CHARS", 20_000)
    monkeypatch.setattr(directory_module, "_parsed_keys", {})
    monkeypatch.setattr(directory_module, "_parsed_key_chars", 0)
    for read in range(50):
        entry = key("jobs", "jobs_total", {"model": f"{read}-" + "m" * 1000})
        write_metrics_file(tmp_path / "counter_1.db", [(entry, 1.0)])
        assert read_one(tmp_path, "counter_1.db").families
        kept = sum(len(parsed_key) for parsed_key, _ in directory_module._parsed_keys)
        assert kept <= 20_000


def test_a_key_nested_past_what_python_parses_is_skipped_and_compaction_goes_on(tmp_path):
    write_metrics_file(tmp_path / "counter_999991.db", [("[" * 5000 + "]" * 5000, 1.0)])
    write_metrics_file(
        tmp_path / "counter_999992.db", [(key("numbakv_x", "numbakv_x_total", {}), 2.0)]
    )
    compaction.compact(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["counter_999991.db", "counter_compacted-1.db"]
    skipped = MetricsDirectory(str(tmp_path)).read().state.skipped
    assert list(skipped) == ["counter_999991.db"] and "not JSON" in skipped["counter_999991.db"]


def test_a_bucket_bound_must_be_a_number_in_a_histogram(tmp_path):
    bucket = key("t", "t_bucket", {"le": "abc"})
    write_metrics_file(tmp_path / "histogram_1.db", [(bucket, 1.0)])
    write_metrics_file(tmp_path / "summary_2.db", [(bucket, 1.0)])
    with pytest.raises(Unreadable, match="not a number"):
        read_one(tmp_path, "histogram_1.db")
    assert read_one(tmp_path, "summary_2.db").families  # a summary's le is only a label


def test_only_regular_files_with_one_name_inside_the_directory_are_read(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_metrics_file(outside / "counter_9.db", [(COUNTER, 1.0)])
    directory = tmp_path / "metrics"
    directory.mkdir()
    os.mkfifo(directory / "counter_1.db")
    (directory / "counter_2.db").symlink_to("/dev/urandom")
    (directory / "counter_3.db").symlink_to(outside / "counter_9.db")
    os.link(outside / "counter_9.db", directory / "counter_4.db")
    (directory / "counter_5.db").mkdir()
    reasons = {}
    for name in ("counter_1.db", "counter_2.db", "counter_3.db", "counter_4.db", "counter_5.db"):
        with pytest.raises(Unreadable) as error:
            read_one(directory, name)
        reasons[name] = str(error.value)
    assert reasons == {
        "counter_1.db": "not a regular file (a FIFO, socket, device or directory)",
        "counter_2.db": "a symbolic link",
        "counter_3.db": "a symbolic link",
        "counter_4.db": "a hard link (2 names)",
        "counter_5.db": "not a regular file (a FIFO, socket, device or directory)",
    }


def file_data(name: str, family: str, samples_: list) -> FileData:
    db = parse_name(name)
    return FileData(db, {family: ("help", samples_)})


def test_a_file_that_clashes_with_the_others_is_skipped_alone():
    bucket = ("t_bucket", (("le", "1.0"),), 2.0, 0.0)
    files = [
        file_data("histogram_1.db", "t", [bucket]),
        file_data("histogram_2.db", "t", [bucket]),
        file_data("summary_3.db", "t", [("t_bucket", (("le", "abc"),), 1.0, 0.0)]),
        file_data("counter_3.db", "jobs", [("jobs_total", (), 5.0, 0.0)]),
    ]
    merged, skipped = merge(files, accumulate=True, render=lambda m: None)
    assert skipped == {"summary_3.db": "t is a summary here but a histogram in 2 file(s)"}
    values = {(s.name, s.labels.get("le")): s.value for m, _ in merged for s in m.samples}
    assert values[("t_bucket", "1.0")] == 4.0 and values[("jobs_total", None)] == 5.0


def test_a_file_whose_data_fails_to_render_is_found_among_the_others():
    files = [file_data(f"counter_{i}.db", "jobs", [("jobs_total", (), i, 0.0)]) for i in (1, 2, 3)]

    def render(metric):
        if any(s.value == 7 for s in metric.samples) or sum(s.value for s in metric.samples) > 4:
            raise ValueError("too much")
        return "ok"

    merged, skipped = merge(files, accumulate=True, render=render)
    assert list(skipped) == ["counter_3.db"] and "ValueError: too much" in skipped["counter_3.db"]
    assert merged[0][0].samples[0].value == 3.0


def test_a_file_that_fails_alone_is_found_in_one_pass_over_the_files():
    """Among 300 files, the one that fails to render alone is skipped after a linear number of
    renders (before, each file was merged again with every file accepted before it)."""
    files = [
        file_data(f"counter_{i}.db", "jobs", [("jobs_total", (("file", str(i)),), i, 0.0)])
        for i in range(1, 301)
    ]
    renders = []

    def render(metric):
        renders.append(len(metric.samples))
        if any(s.value == 150 for s in metric.samples):
            raise ValueError("bad value")
        return "ok"

    merged, skipped = merge(files, accumulate=True, render=render)
    assert list(skipped) == ["counter_150.db"]
    assert sum(s.value for s in merged[0][0].samples) == sum(range(1, 301)) - 150
    assert len(renders) <= 2 * len(files) + 2 and sum(renders) <= 3 * len(files)


names = st.sampled_from(
    [
        "counter_1.db",
        "counter_2.db",
        "gauge_livesum_1.db",
        "gauge_bogus_1.db",
        "counter_compacted-1.db",
        "counter_compacted-2.db",
        "counter_3.db.in-compacted-2",
        "counter_4.db.in-compacted-3",
        "counter_compacted-3.db.tmp",
        "numbakv-writer-1.lock",
        "numbakv-directory.lock",
        "other.db",
        "notes.txt",
    ]
)


@given(st.sets(names))
def test_listing_counts_each_kind_s_newest_compaction_and_what_it_does_not_hold(present):
    listing = list_directory(present)
    counted = {db.name for db in listing.files}
    newest = max((g for g in (1, 2) if f"counter_compacted-{g}.db" in present), default=0)
    for g in (1, 2):
        name = f"counter_compacted-{g}.db"
        assert (name in counted) == (name in present and g == newest)
    for name, generation in (
        ("counter_3.db.in-compacted-2", 2),
        ("counter_4.db.in-compacted-3", 3),
    ):
        if name in present:
            assert (name in counted) == (newest < generation)
            assert (name in listing.orphans) == (newest < generation)
    assert set(listing.unknown) == present & {"other.db", "gauge_bogus_1.db"}
    assert listing.writers == (
        {1: "numbakv-writer-1.lock"} if "numbakv-writer-1.lock" in present else {}
    )
    for name in present:  # every name has one place
        places = [name in counted, name in listing.unknown, name in listing.leftovers]
        assert sum(places) <= 1


def kill(proc: subprocess.Popen, sig: int) -> None:
    proc.send_signal(sig)
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def restarts(tmp_path_factory):
    """A directory after two engine 'runs': writers that exited, were SIGKILLed and SIGTERMed,
    and one compaction in between, as a joining writer does it."""
    directory = tmp_path_factory.mktemp("restarts")
    run_writers(directory, ("gpu0", 1), ("gpu1", 2))
    kill(start_writer(directory, "gpu2"), signal.SIGKILL)
    compaction.compact(str(directory))
    run_writers(directory, ("gpu0", 1))
    kill(start_writer(directory, "gpu3"), signal.SIGKILL)
    kill(start_writer(directory, "gpu3"), signal.SIGTERM)
    return directory


def compaction_steps(directory) -> int:
    """How many renames and unlinks a compaction of ``directory`` makes."""
    calls = []
    real = os.rename, os.unlink
    try:
        os.rename = lambda *a, **k: (calls.append(1), real[0](*a, **k))[1]
        os.unlink = lambda *a, **k: (calls.append(1), real[1](*a, **k))[1]
        compaction.compact(str(directory))
    finally:
        os.rename, os.unlink = real
    return len(calls)


class Crash(BaseException):
    """The process dies here (BaseException: nothing in compaction may catch it)."""


def test_compaction_interrupted_at_any_step_leaves_a_directory_that_reads_the_same(
    restarts, tmp_path, monkeypatch
):
    expected = samples(restarts)
    steps = compaction_steps(shutil.copytree(restarts, tmp_path / "count"))
    assert steps >= 6
    for crash_at in range(steps):
        directory = shutil.copytree(restarts, tmp_path / f"crash{crash_at}")

        def step(real, done=[], crash_at=crash_at):  # noqa: B006 (one count for both calls)
            def wrapped(*args, **kwargs):
                if len(done) == crash_at:
                    raise Crash
                done.append(1)
                return real(*args, **kwargs)

            return wrapped

        with monkeypatch.context() as patch:
            patch.setattr(os, "rename", step(os.rename))
            patch.setattr(os, "unlink", step(os.unlink))
            with pytest.raises(Crash):
                compaction.compact(str(directory))
        assert samples(directory) == expected, f"interrupted after {crash_at} steps"
        compaction.compact(str(directory))  # recovery, then the job
        assert samples(directory) == expected, f"recovered after {crash_at} steps"
        assert_compacted(directory)


def assert_compacted(directory) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        forget_dead_writers(dir_fd)
    finally:
        os.close(dir_fd)
    left = sorted(os.listdir(directory))
    kinds = [name.split("_compacted-")[0] for name in left if "_compacted-" in name]
    assert kinds == ["counter", "histogram"] and len(left) == 3, left  # and the directory lock


def test_compaction_folds_dead_writers_and_drops_their_live_gauges(restarts, tmp_path):
    directory = shutil.copytree(restarts, tmp_path / "d")
    before = samples(directory)
    assert any(name.startswith("gauge_livesum_") for name in os.listdir(directory))
    compaction.compact(str(directory))
    assert samples(directory) == before
    assert_compacted(directory)
    lookups = {k: v for k, v in before.items() if k[0] == "numbakv_lookups_total"}
    assert lookups[("numbakv_lookups_total", (("instance", "gpu0"), ("policy", "arc")))] == 4


def test_compaction_keeps_each_mostrecent_gauge_at_its_newest_value(tmp_path):
    """The merge picks a mostrecent gauge's newest value but drops its time; without it the
    compacted value lost to every other (or vanished), however old they were."""
    series = ("numbakv_temp", (("instance", "gpu0"),))

    def dead_writer(pid: int, value: float, stamp: float) -> None:
        values = MmapedDict(str(tmp_path / f"gauge_mostrecent_{pid}.db"))
        try:
            values.write_value(
                key("numbakv_temp", "numbakv_temp", {"instance": "gpu0"}), value, stamp
            )
        finally:
            values.close()

    for pid, value, stamp in ((999991, 1.0, 100.0), (999992, 2.0, 200.0), (999993, 3.0, 150.0)):
        dead_writer(pid, value, stamp)
    assert samples(tmp_path)[series] == 2.0
    compaction.compact(str(tmp_path))
    assert os.listdir(tmp_path) == ["gauge_mostrecent_compacted-1.db"]
    assert samples(tmp_path)[series] == 2.0
    dead_writer(999994, 4.0, 120.0)  # set before the compacted value was
    compaction.compact(str(tmp_path))
    assert samples(tmp_path)[series] == 2.0


def test_no_read_is_made_while_a_writer_compacts_past_the_wait(tmp_path, monkeypatch):
    """Read in the middle of a compaction's renames, the files count some series twice or not
    at all (a counter seen to fall): the sidecar serves its last reading instead."""
    run_writers(tmp_path, ("gpu0", 1))
    sidecar = Sidecar(Settings(metrics_dir=str(tmp_path)))
    last = sidecar.refresh()
    monkeypatch.setattr(metrics_dir, "LOCK_WAIT_S", 0.05)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with directory_lock(dir_fd, exclusive=True, timeout_s=1.0) as locked:  # the compactor
            assert locked
            assert MetricsDirectory(str(tmp_path)).read() is None
            assert sidecar.refresh() is last
    finally:
        os.close(dir_fd)
    assert sidecar.refresh() is not last and sidecar.snapshot.reading.text == last.reading.text


REUSER = """
import sys, time
from prometheus_client.mmap_dict import MmapedDict
values = MmapedDict(sys.argv[1])
print(flush=True)
time.sleep(60)
"""


def test_compaction_leaves_files_a_live_process_has_open(tmp_path):
    live = start_writer(tmp_path, "gpu1")
    for pid in (4000001, 4000002):  # PIDs of writers long gone
        write_metrics_file(tmp_path / f"counter_{pid}.db", [(COUNTER, 1.0)])
    # A process that reused a dead writer's PID has taken over its file (prometheus-client opens
    # an existing file of its PID and continues it): whatever its lock says, the file is in use.
    reuser = subprocess.Popen(
        [sys.executable, "-c", REUSER, str(tmp_path / "counter_4000001.db")],
        stdout=subprocess.PIPE,
    )
    try:
        reuser.stdout.readline()
        compaction.compact(str(tmp_path))
        left = set(os.listdir(tmp_path))
        assert {"counter_4000001.db", f"counter_{live.pid}.db", f"histogram_{live.pid}.db"} <= left
        assert "counter_4000002.db" not in left and "counter_compacted-1.db" in left
    finally:
        reuser.kill()
        kill(live, signal.SIGKILL)


def test_a_writer_is_alive_while_it_runs_and_dead_however_it_ends(tmp_path):
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            writer = start_writer(tmp_path, "gpu0")
            lock = f"numbakv-writer-{writer.pid}.lock"
            assert writer_alive(dir_fd, lock)
            kill(writer, sig)
            assert not writer_alive(dir_fd, lock), sig
        assert not writer_alive(dir_fd, "numbakv-writer-1.lock")  # no such file: nothing alive
    finally:
        os.close(dir_fd)


def test_a_second_process_with_the_same_pid_is_refused(tmp_path):
    """Writers in two PID namespaces sharing one directory would share prometheus-client's files."""
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        held = claim(dir_fd, str(tmp_path), 7)  # PID 7 of one container
        with pytest.raises(RuntimeError, match="another live process holds numbakv-writer-7"):
            claim(dir_fd, str(tmp_path), 7)  # PID 7 of another
        os.close(held)
        os.close(claim(dir_fd, str(tmp_path), 7))  # once the first is gone
    finally:
        os.close(dir_fd)


def test_a_dead_writer_s_lock_goes_once_its_pid_is_reused_by_a_process_writing_its_file(tmp_path):
    """Else readers would take the reusing process for the dead writer and drop its gauges."""
    for pid in (4000001, 4000002):
        (tmp_path / f"numbakv-writer-{pid}.lock").touch()  # free: the writers died
        write_metrics_file(tmp_path / f"gauge_livesum_{pid}.db", [(COUNTER, 1.0)])
    reuser = subprocess.Popen(
        [sys.executable, "-c", REUSER, str(tmp_path / "gauge_livesum_4000001.db")],
        stdout=subprocess.PIPE,
    )
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        reuser.stdout.readline()
        forget_dead_writers(dir_fd)
        locks = sorted(n for n in os.listdir(tmp_path) if n.endswith(".lock"))
        assert locks == ["numbakv-writer-4000002.lock"]
    finally:
        os.close(dir_fd)
        reuser.kill()
        reuser.wait()
