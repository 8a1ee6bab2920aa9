"""Two writer processes into one multiprocess directory, aggregated as the sidecar does."""

from __future__ import annotations

import json
import os
import signal

import pytest
from numbakv.service.metrics_dir import MetricsDirectory

from numbakv.metrics.liveness import writer_alive
from tests.support.metrics_fakes import (
    EXPECTED,
    run_engine_process,
    run_writers,
    start_engine_process,
)

GAUGES = ("numbakv_host_", "numbakv_arc_")


def merged_samples(directory) -> dict:
    reading = MetricsDirectory(str(directory)).read()
    assert not reading.state.problems, reading.state
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in reading.metrics
        for s in m.samples
    }


def test_two_writers_with_distinct_instances_are_kept_apart(tmp_path):
    run_writers(tmp_path, ("gpu0", 1), ("gpu1", 2))
    got = merged_samples(tmp_path)
    for (name, labels), value in EXPECTED.items():
        other = tuple((k, "gpu1" if k == "instance" else v) for k, v in labels)
        if name.startswith(GAUGES):
            # Live gauges leave with their process: a cleanly exited writer has none left.
            assert (name, labels) not in got and (name, other) not in got
        else:
            assert got[(name, labels)] == pytest.approx(value), name
            assert got[(name, other)] == pytest.approx(2 * value), name


def test_writers_sharing_an_instance_are_summed(tmp_path):
    run_writers(tmp_path, ("node", 1), ("node", 1))
    got = merged_samples(tmp_path)
    for (name, labels), value in EXPECTED.items():
        if not name.startswith(GAUGES):
            labels = tuple((k, "node" if k == "instance" else v) for k, v in labels)
            assert got[(name, labels)] == pytest.approx(2 * value), name


def test_live_gauges_are_served_while_the_writer_runs(tmp_path):
    # The writer reads the directory itself before it exits (and drops its live gauges).
    out = run_engine_process(
        "import json\n"
        "from tests.support.metrics_fakes import FakeManager, run_workload\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "from numbakv.service.metrics_dir import MetricsDirectory\n"
        "m = FakeManager(); om = OffloadMetrics(m, instance='gpu0'); run_workload(m, om); om.sync()\n"
        "metrics = MetricsDirectory(sys.argv[2]).read().metrics\n"
        "print(json.dumps({s.name + str(sorted(s.labels.items())): s.value"
        " for x in metrics for s in x.samples}))\n",
        tmp_path,
        str(tmp_path),
    )
    got = json.loads(out)
    for (name, labels), value in EXPECTED.items():
        if name.startswith(GAUGES):
            assert got[name + str(sorted(labels))] == pytest.approx(value), name


def test_sync_writes_only_deltas(tmp_path):
    run_engine_process(
        "from tests.support.metrics_fakes import FakeManager, run_workload\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "m = FakeManager(); om = OffloadMetrics(m, instance='gpu0')\n"
        "run_workload(m, om); om.sync(); om.sync(); run_workload(m, om); om.sync(); om.close()\n",
        tmp_path,
    )
    got = merged_samples(tmp_path)
    for (name, labels), value in EXPECTED.items():
        if not name.startswith(GAUGES):
            assert got[(name, labels)] == pytest.approx(2 * value), name


def test_sync_thread_lives_on_past_a_failed_sync(tmp_path):
    out = run_engine_process(
        "import time\n"
        "from tests.support.metrics_fakes import FakeManager\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "m, reads = FakeManager(), []\n"
        "stats = m.stats\n"
        "def flaky():\n"
        "    reads.append(1)\n"
        "    if len(reads) == 2:\n"
        "        raise OSError('No space left on device')\n"
        "    return stats()\n"
        "m.stats = flaky\n"
        "om = OffloadMetrics(m, instance='gpu0'); om.start_sync_thread(0.01)\n"
        "time.sleep(0.3); om.close(); print(len(reads))\n",
        tmp_path,
    )
    assert int(out) > 3


def test_sync_thread_publishes_without_explicit_syncs(tmp_path):
    run_engine_process(
        "import os, time\n"
        "from tests.support.metrics_fakes import FakeManager, run_workload\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "m = FakeManager(); om = OffloadMetrics(m, instance='gpu0'); om.start_sync_thread(0.01)\n"
        "run_workload(m, om); time.sleep(0.2)\n"
        "os._exit(0)  # no close(), no atexit: only the thread can have written\n",
        tmp_path,
    )
    got = merged_samples(tmp_path)
    for (name, labels), value in EXPECTED.items():
        if name.startswith(GAUGES):  # left behind by a process that died: no longer counted
            assert (name, labels) not in got, name
        else:
            assert got[(name, labels)] == pytest.approx(value), name


FORKING_ENGINE = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from numbakv.metrics import OffloadMetrics
from tests.support.metrics_fakes import FakeManager
metrics = OffloadMetrics(FakeManager(), instance="parent")
child = os.fork()
if child == 0:
    metrics.sync()  # the child writes files of its own PID: it joins under it
    os.write(1, b"%d\\n" % os.getpid())  # one write: the lines of the two processes stay whole
    time.sleep(60)
    os._exit(0)
os.write(1, b"%d\\n" % os.getpid())
sys.stdin.read()
os._exit(0)
"""


def test_a_forked_child_does_not_keep_its_parent_alive(tmp_path):
    parent = start_engine_process(FORKING_ENGINE, tmp_path)
    pids = sorted(int(parent.stdout.readline()) for _ in range(2))
    child = pids[1] if pids[0] == parent.pid else pids[0]
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert writer_alive(dir_fd, f"numbakv-writer-{parent.pid}.lock")
        assert writer_alive(dir_fd, f"numbakv-writer-{child}.lock")
        parent.stdin.close()
        parent.wait(timeout=30)
        assert not writer_alive(dir_fd, f"numbakv-writer-{parent.pid}.lock")
        assert writer_alive(dir_fd, f"numbakv-writer-{child}.lock")
    finally:
        os.close(dir_fd)
        os.kill(child, signal.SIGKILL)


def test_a_forked_child_reports_only_what_it_does_itself(tmp_path):
    """The child's copies of the totals hold what the parent has not synced yet: the parent
    reports that, so the child must not."""
    run_engine_process(
        "import os\n"
        "from tests.support.metrics_fakes import FakeManager\n"
        "from numbakv.jobs import Direction, FinishedJob\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "metrics = OffloadMetrics(FakeManager(), instance='e')\n"
        "job = lambda name: FinishedJob(name, Direction.STORE, True, 1000, 0.001)\n"
        "metrics.on_job_done(job('synced')); metrics.sync()\n"
        "metrics.on_job_done(job('parent, not yet synced'))\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    metrics.on_job_done(job('the child')); metrics.sync(); os._exit(0)\n"
        "os.waitpid(child, 0)\n"
        "metrics.sync()\n",
        tmp_path,
    )
    totals = {
        name: value
        for (name, labels), value in merged_samples(tmp_path).items()
        if name.startswith("numbakv_transfer_") and ("direction", "store") in labels
    }
    assert totals["numbakv_transfer_jobs_total"] == 3
    assert totals["numbakv_transfer_bytes_total"] == 3000


PREDECESSOR_OF_THE_SAME_PID = """
import os, sys
sys.path.insert(0, sys.argv[1])
from prometheus_client.mmap_dict import MmapedDict, mmap_key
# what a killed predecessor that had this PID left: a live gauge of its instance "old"
left = MmapedDict(os.path.join(os.environ["PROMETHEUS_MULTIPROC_DIR"], f"gauge_livesum_{os.getpid()}.db"))
left.write_value(mmap_key("numbakv_host_used_blocks", "numbakv_host_used_blocks", ["policy", "instance"], ["arc", "old"], "h"), 900.0, 0.0)
left.close()
from tests.support.metrics_fakes import FakeManager
from numbakv.metrics import OffloadMetrics
OffloadMetrics(FakeManager(), instance="new").sync()
print(flush=True)
sys.stdin.read()
"""


def test_a_dead_predecessors_files_under_this_processs_pid_are_compacted(tmp_path):
    engine = start_engine_process(PREDECESSOR_OF_THE_SAME_PID, tmp_path)
    try:
        engine.stdout.readline()
        used = {
            dict(labels)["instance"]: value
            for (name, labels), value in merged_samples(tmp_path).items()
            if name == "numbakv_host_used_blocks"
        }
    finally:
        engine.stdin.close()
        engine.wait(timeout=30)
    assert list(used) == ["new"]


def test_threads_of_one_process_join_the_directory_once(tmp_path):
    run_engine_process(
        "import threading\n"
        "from tests.support.metrics_fakes import FakeManager\n"
        "from numbakv.metrics import OffloadMetrics\n"
        "start, failed = threading.Barrier(8), []\n"
        "def make(i):\n"
        "    start.wait()\n"
        "    try:\n"
        "        OffloadMetrics(FakeManager(), instance=f'i{i}')\n"
        "    except Exception as exc:\n"
        "        failed.append(exc)\n"
        "threads = [threading.Thread(target=make, args=(i,)) for i in range(8)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "assert not failed, failed\n",
        tmp_path,
    )
    assert len([n for n in os.listdir(tmp_path) if n.startswith("numbakv-writer-")]) == 1
