"""The offloader's full cycle on the CUDA simulator, with failures injected."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import cuda

from numbakv import CPUOffloadingManager
from numbakv.datapath import HostPool, TransferEngine
from numbakv.offloader import KVOffloader
from numbakv.tools.demo.command import _print
from numbakv.tools.demo.command import main as demo_main
from numbakv.tools.demo.core import (
    DemoConfig,
    DemoReport,
    StandInEngine,
    block_contents,
    build_kv_cache,
    run,
)
from numbakv.tools.traces import read_hash_chains
from tests.support.datapath_cases import EngineInFront, make_cache, outcomes, small_engine


class FlakyTransfers(EngineInFront):
    """A real engine whose chosen jobs fail, at submit or on completion."""

    def __init__(self, engine, fail_jobs=(), refuse_jobs=()):
        super().__init__(engine)
        self.fail_jobs, self.refuse_jobs = set(fail_jobs), set(refuse_jobs)
        self.waited = []

    def enqueue(self, job_id, *args, **options):
        if job_id in self.refuse_jobs:
            raise RuntimeError(f"job {job_id} refused")
        self.engine.enqueue(job_id, *args, **options)

    def get_finished(self):
        return [
            replace(job, success=job.success and job.job_id not in self.fail_jobs)
            for job in self.engine.get_finished()
        ]

    def wait(self, job_id):
        self.waited.append(job_id)
        return self.engine.wait(job_id) and job_id not in self.fail_jobs


class HeldTransfers(EngineInFront):
    """A real engine whose jobs stay in flight until released, as on a GPU where a job finishes
    well after its submit (the simulator finishes every job within submit)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.held, self.released = {}, set()
        self.wait_events = {}

    def enqueue(self, job_id, direction, gpu_ids, host_ids, wait_event=None, *, layers=None):
        self.engine.enqueue(job_id, direction, gpu_ids, host_ids, wait_event, layers=layers)
        self.wait_events[job_id] = wait_event

    def get_finished(self):
        self.held.update((job.job_id, job) for job in self.engine.get_finished())
        done = [job for job_id, job in self.held.items() if job_id in self.released]
        for job in done:
            del self.held[job.job_id]
        return done

    def wait(self, job_id):
        self.released.add(job_id)
        return self.engine.wait(job_id) if job_id not in self.held else self.held[job_id].success


@pytest.fixture
def setup():
    cache = make_cache("flash_attn", np.random.default_rng(7), num_layers=2, num_blocks=8)
    pool = HostPool.for_layout(cache.layout, 6)
    engine = TransferEngine(cache.layout, pool, threads_per_block=32, max_thread_blocks=2)
    manager = CPUOffloadingManager(block_size=2, num_blocks=6, enable_events=True)
    return cache, pool, engine, manager


def test_store_then_load_moves_the_bytes_and_keeps_the_manager_in_step(setup):
    cache, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    before = cache.host_copies()
    job = offloader.store([b"a", b"b", b"c"], [5, 1, 3])
    assert offloader.lookup([b"a", b"b", b"c"]) == 0  # in flight: not ready yet
    assert offloader.wait(job) is True
    assert offloader.lookup([b"a", b"b", b"c"]) == 3
    assert outcomes(offloader.poll()) == [(job, True)]
    assert offloader.poll() == []
    cache.poison()
    job = offloader.load([b"b", b"c"], [0, 7])
    assert offloader.wait(job)
    offloader.poll()
    after = cache.host_copies()
    assert cache.block_bytes(after, 0) == cache.block_bytes(before, 1)
    assert cache.block_bytes(after, 7) == cache.block_bytes(before, 3)
    assert manager.stats().being_read == 0
    assert [e.removed for e in manager.take_events()] == [False]


def test_only_blocks_not_yet_stored_are_copied_each_from_its_own_gpu_block(setup):
    cache, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    before = cache.host_copies()
    offloader.wait(offloader.store([1, 2], [0, 1]))
    copies = []
    engine.on_job_done = lambda job: copies.append(job.nbytes)
    offloader.wait(offloader.store([4, 1, 3, 2], [7, 0, 6, 1]))  # 4 and 3 are new
    assert copies == [2 * cache.layout.block_bytes]
    assert offloader.store([1, 2], [0, 1]) is None
    cache.poison()
    offloader.wait(offloader.load([3, 4], [2, 3]))
    after = cache.host_copies()
    assert cache.block_bytes(after, 2) == cache.block_bytes(before, 6)
    assert cache.block_bytes(after, 3) == cache.block_bytes(before, 7)


def test_a_failed_store_never_becomes_ready_and_is_reported(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, FlakyTransfers(engine, fail_jobs={0}))
    job = offloader.store([1, 2], [0, 1])
    assert offloader.wait(job) is False
    assert outcomes(offloader.poll()) == [(job, False)]
    assert offloader.lookup([1]) == 0
    stats = manager.stats()
    assert (stats.used, stats.failed_store_blocks, stats.being_stored) == (0, 2, 0)


def test_a_refused_submit_rolls_the_manager_back(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, FlakyTransfers(engine, refuse_jobs={1}))
    offloader.wait(offloader.store([1], [0]))
    with pytest.raises(RuntimeError, match="refused"):
        offloader.load([1], [4])
    assert manager.stats().being_read == 0 and offloader.jobs_in_flight == 0
    offloader.wait(offloader.load([1], [4]))  # job 2 goes through


def test_a_load_of_blocks_evicted_meanwhile_is_refused(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    offloader.wait(offloader.store([1, 2, 3], [0, 1, 2]))
    offloader.wait(offloader.store([4, 5, 6, 7], [3, 4, 5, 6]))  # 6 slots: evicts 1
    with pytest.raises(KeyError, match="not cached"):
        offloader.load([1, 2], [0, 1])
    assert manager.stats().being_read == 0 and offloader.jobs_in_flight == 0


@pytest.mark.parametrize(
    ("gpu_ids", "error", "message"),
    [
        ([0], ValueError, "as long as"),
        ([0, 8], IndexError, r"\[0, 8\)"),  # the data path's one range check
        ([2, 2], ValueError, "repeat"),
        ([0.5, 1.0], TypeError, "integers"),
    ],
)
def test_bad_gpu_ids_are_refused_before_the_manager_changes(setup, gpu_ids, error, message):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    before = manager.stats()
    with pytest.raises(error, match=message):
        offloader.store([1, 2], gpu_ids)
    assert manager.stats() == before


@pytest.mark.parametrize("hashes", [(h for h in [1, 2]), b"ab"])
def test_block_hashes_that_are_no_sequence_are_refused_by_name(setup, hashes):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    with pytest.raises(TypeError, match="block_hashes must be a sequence of block hashes"):
        offloader.store(hashes, [0, 1])
    assert manager.stats().used == 0


@pytest.mark.parametrize("direction", ["store", "load"])
def test_a_bad_wait_event_is_refused_before_the_manager_changes(setup, direction):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    offloader.wait(offloader.store([1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5]))  # its 6 slots full
    offloader.poll()
    before = manager.stats()
    with pytest.raises(TypeError, match="wait_event"):
        if direction == "store":  # would evict 1 and 2
            offloader.store([7, 8], [6, 7], wait_event="after the compute")
        else:
            offloader.load([1], [7], wait_event="after the compute")
    assert manager.stats() == before and offloader.lookup([1, 2]) == 2


def test_mode_must_be_eager_or_lazy(setup):
    with pytest.raises(ValueError, match="eager"):
        KVOffloader(setup[3], setup[2], mode="sometimes")


SMALL = DemoConfig(gpu_blocks=72, host_blocks=96, sessions=8)


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_demo_round_trips_every_loaded_block(mode):
    report = run(DemoConfig(**{**SMALL.__dict__, "mode": mode}))
    assert report.host_hits > 0 and report.verified == report.host_hits
    assert report.mismatched == 0
    assert report.gpu_hits + report.host_hits + report.computed == report.references


def test_lazy_mode_stores_no_more_than_eager():
    eager = run(SMALL)
    lazy = run(DemoConfig(**{**SMALL.__dict__, "mode": "lazy"}))
    assert lazy.blocks_moved["store"] < eager.blocks_moved["store"]


def test_the_byte_check_catches_a_corrupted_host_block():
    report = DemoReport()
    engine = StandInEngine(SMALL, build_kv_cache(SMALL), report)
    engine.serve([1, 2, 3])
    engine.offloader.poll()
    host_ids = engine.offloader.manager.prepare_load([2]).block_ids
    engine.offloader.manager.complete_load([2])
    engine.offloader.transfers.host_pool.blocks[host_ids[0], 0] ^= 0xFF
    engine.gpu_cache.clear()
    engine.free_gpu_blocks = list(range(SMALL.gpu_blocks))
    engine.serve([1, 2, 3])
    assert report.host_hits == 3 and report.mismatched == 1


def test_block_contents_depend_on_the_hash_and_are_never_constant():
    contents = block_contents(np.array([1, 2]), 100)
    assert contents.shape == (2, 100) and not np.array_equal(contents[0], contents[1])
    assert len(np.unique(contents[0])) > 10


def test_drain_finishes_every_job_and_reports_each_once(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, FlakyTransfers(engine, fail_jobs={1}))
    jobs = [offloader.store([1, 2], [0, 1]), offloader.store([3], [2])]
    assert all(offloader.in_flight(job) for job in jobs)
    assert sorted(outcomes(offloader.drain())) == [(jobs[0], True), (jobs[1], False)]
    assert not any(offloader.in_flight(job) for job in jobs)
    assert offloader.poll() == [] and offloader.lookup([1, 2, 3]) == 2


def test_the_demo_prints_a_rate_only_for_timed_transfers(capsys):
    report = DemoReport(bytes_moved={"store": 4 * 10**9, "load": 2**20})
    report.transfer_seconds["store"] = 0.1  # the load was not timed, as on the simulator
    _print(report, SMALL)
    out = capsys.readouterr().out.splitlines()
    store, load = (next(line for line in out if line.startswith(name)) for name in ("GPU", "host"))
    assert store.endswith("3,814.7 MiB, 40 GB/s")
    assert load.endswith("1.0 MiB")


def test_reset_with_jobs_in_flight_settles_them_and_starts_clean(setup):
    """Issue 24, item 8: `manager.reset_cache()` under jobs in flight made `poll` raise KeyError,
    lost the report (and the pins) of later jobs, and let an old store's completion mark a block
    re-stored after the reset ready while its own store was still in flight."""
    _, _, engine, manager = setup
    transfers = HeldTransfers(engine)
    offloader = KVOffloader(manager, transfers)
    offloader.wait(offloader.store([1, 2], [0, 1]))
    offloader.poll()
    old_store = offloader.store([3], [2])
    old_load = offloader.load([1], [5])
    assert manager.stats().being_stored == 1 and manager.stats().being_read == 1

    assert sorted(outcomes(offloader.reset())) == [(old_store, True), (old_load, True)]
    stats = manager.stats()
    assert (stats.used, stats.being_stored, stats.being_read) == (0, 0, 0)
    assert offloader.jobs_in_flight == 0 and offloader.lookup([1]) == 0

    new_store = offloader.store([3], [2])  # the hash of a store begun before the reset
    other = offloader.store([4], [3])
    assert offloader.poll() == [] and offloader.lookup([3]) == 0  # in flight: not ready
    transfers.released.add(other)
    assert outcomes(offloader.poll()) == [(other, True)] and offloader.lookup([3]) == 0
    transfers.released.add(new_store)
    assert outcomes(offloader.poll()) == [(new_store, True)] and offloader.lookup([3, 4]) == 2
    load = offloader.load([3, 4], [6, 7])
    assert offloader.wait(load) and outcomes(offloader.poll()) == [(load, True)]
    assert manager.stats().being_read == 0


def test_reset_with_nothing_in_flight_empties_the_cache(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    offloader.wait(offloader.store([1], [0]))
    assert outcomes(offloader.reset()) == [(0, True)]
    assert offloader.lookup([1]) == 0 and manager.stats().used == 0


def test_a_load_waits_for_the_event_it_is_given(setup):
    """Issue 23, item 3: a load passed no wait event, so it could overwrite GPU blocks that
    kernels queued on the engine's stream still read."""
    _, _, engine, manager = setup
    transfers = HeldTransfers(engine)
    offloader = KVOffloader(manager, transfers)
    transfers.released.update(range(10))
    offloader.wait(offloader.store([1], [0]))
    compute = cuda.stream()
    load = offloader.load([1], [4], wait_event=compute)
    assert transfers.wait_events[load] is compute
    assert offloader.wait(load)


def test_a_load_by_layer_groups_is_one_job_that_lands_group_by_group(setup):
    """A job per group, the first held behind the compute stream, each with its own event;
    while the second is in flight the load is too, and its blocks stay pinned; then one job is
    reported, the whole blocks are back, and the blocks were pinned and counted once. (Which
    bytes each group moves: tests/datapath/test_layers.py.)"""
    cache, _, engine, manager = setup
    transfers = HeldTransfers(engine)
    offloader = KVOffloader(manager, transfers)
    stored = cache.host_copies()
    transfers.released.add(0)
    offloader.wait(offloader.store([1, 2], [5, 1]))
    offloader.poll()
    cache.poison()
    before = manager.stats()
    compute = cuda.stream()
    job = offloader.load([1, 2], [0, 7], compute, layer_groups=[range(1), range(1, 2)])
    assert transfers.wait_events == {0: None, (job, 0): compute, (job, 1): None}
    assert offloader.completion_event(job, layer=0) is engine.completion_event((job, 0))
    assert offloader.completion_event(job) is engine.completion_event((job, 1))
    transfers.released.add((job, 0))
    assert offloader.poll() == [] and offloader.in_flight(job)
    assert manager.stats().being_read == 2
    assert offloader.wait(job)
    [finished] = offloader.poll()
    assert (finished.job_id, finished.success) == (job, True)
    assert finished.nbytes == 2 * cache.layout.block_bytes
    whole = cache.host_copies()
    assert cache.block_bytes(whole, 0) == cache.block_bytes(stored, 5)
    assert cache.block_bytes(whole, 7) == cache.block_bytes(stored, 1)
    after = manager.stats()
    assert after.being_read == 0 and after.loaded_blocks == before.loaded_blocks + 2


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    loads=st.lists(
        st.tuples(st.sets(st.integers(1, 3)), st.sets(st.integers(0, 3)), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    seed=st.integers(0, 2**16),
)
def test_layered_loads_against_whole_ones(loads, seed):
    """Loads of random groups of 4 layers, each with random groups failing, the offloader polled
    or waited: each load is reported once, failed exactly when a group failed, its bytes where a
    whole load puts them when none did; the manager ends as whole loads leave it."""
    rng = np.random.default_rng(seed)
    cache = make_cache("flash_attn", rng, num_layers=4, num_blocks=8)
    engine, _ = small_engine(cache, "staged", num_host_blocks=6)
    transfers = FlakyTransfers(engine)
    manager = CPUOffloadingManager(block_size=2, num_blocks=6)
    offloader = KVOffloader(manager, transfers)
    stored = cache.host_copies()
    offloader.wait(offloader.store([1, 2, 3], [5, 6, 7]))
    reported, expected = [], []
    for cuts, failing_groups, polled in loads:
        bounds = [0, *sorted(cuts), 4]
        groups = [range(start, stop) for start, stop in itertools.pairwise(bounds)]
        job = offloader.load([3, 1], [0, 1], layer_groups=groups)
        transfers.fail_jobs.update((job, group) for group in failing_groups if group < len(groups))
        expected.append((job, not any(group < len(groups) for group in failing_groups)))
        if not polled:
            offloader.wait(job)
        reported += offloader.poll()
        if expected[-1][1]:
            loaded = cache.host_copies()
            assert cache.block_bytes(loaded, 0) == cache.block_bytes(stored, 7)
            assert cache.block_bytes(loaded, 1) == cache.block_bytes(stored, 5)
    reported += offloader.drain()
    assert outcomes(reported) == [(0, True), *expected]
    assert all(job.nbytes == 2 * cache.layout.block_bytes for job in reported[1:])
    stats = manager.stats()
    assert (stats.being_read, stats.loaded_blocks) == (0, 2 * len(loads))


def test_a_failed_group_fails_the_whole_load(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, FlakyTransfers(engine, fail_jobs={(1, 1)}))
    offloader.wait(offloader.store([1], [5]))
    job = offloader.load([1], [0], layer_groups=[range(1), range(1, 2)])
    assert offloader.wait(job) is False
    assert outcomes(offloader.poll()) == [(0, True), (job, False)]
    assert manager.stats().being_read == 0


class TimedTransfers(EngineInFront):
    """A real engine whose jobs report the seconds given (the simulator times nothing)."""

    def __init__(self, engine, seconds):
        super().__init__(engine)
        self.seconds = seconds

    def get_finished(self):
        return [
            replace(job, seconds=self.seconds.get(job.job_id, job.seconds))
            for job in self.engine.get_finished()
        ]


def test_a_layered_loads_time_is_its_groups_together(setup):
    """The groups of a load run one after another on the load's stream: the load took their sum."""
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, TimedTransfers(engine, {(1, 0): 0.25, (1, 1): 0.5}))
    offloader.wait(offloader.store([1], [5]))
    job = offloader.load([1], [0], layer_groups=[range(1), range(1, 2)])
    assert offloader.wait(job)
    assert [(done.job_id, done.seconds) for done in offloader.poll()][-1] == (job, 0.75)


def test_a_group_refused_midway_rolls_the_load_back_and_drops_its_queued_groups(setup):
    """The group queued before the refusal is waited for (its copy still writes the GPU blocks
    and reads the host blocks whose pins the rollback releases), and never reported."""
    _, _, engine, manager = setup
    transfers = FlakyTransfers(engine, refuse_jobs={(1, 1)})
    offloader = KVOffloader(manager, transfers)
    offloader.wait(offloader.store([1], [5]))
    offloader.poll()
    with pytest.raises(RuntimeError, match="refused"):
        offloader.load([1], [0], layer_groups=[range(1), range(1, 2)])
    assert transfers.waited[-1] == (1, 0)
    assert offloader.poll() == [] and offloader.jobs_in_flight == 0
    assert manager.stats().being_read == 0


@pytest.mark.parametrize(
    ("layer_groups", "error", "message"),
    [
        ([range(1)], ValueError, "covering layers 0 to 2"),
        ([range(1, 2), range(1)], ValueError, "in order"),
        ([range(2), range(1, 2)], ValueError, "consecutive"),
        ([], ValueError, "covering"),
        ([range(1), range(1, 3)], ValueError, r"layer_groups\[1\]: layers must be"),
        ([range(0, 2, 2)], ValueError, r"layer_groups\[0\]"),
        ([range(1), [1]], TypeError, r"layer_groups\[1\]"),
        (range(2), TypeError, "list of ranges"),
    ],
)
def test_bad_layer_groups_are_refused_before_the_manager_changes(
    setup, layer_groups, error, message
):
    cache, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    offloader.wait(offloader.store([1], [5]))
    offloader.poll()
    before, gpu = manager.stats(), cache.host_copies()
    with pytest.raises(error, match=message):
        offloader.load([1], [0], layer_groups=layer_groups)
    assert manager.stats() == before and offloader.jobs_in_flight == 0
    assert [now.tobytes() for now in cache.host_copies()] == [then.tobytes() for then in gpu]


@pytest.mark.parametrize("layer", [2, -1, True, 1.0, "1"])
def test_completion_event_refuses_a_layer_the_cache_has_not(setup, layer):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    with pytest.raises(
        ValueError, match=rf"layer must be a layer index in \[0, 2\), got {layer!r}"
    ):
        offloader.completion_event(0, layer=layer)
    assert offloader.completion_event(0, layer=np.int64(1)) is None  # NumPy's ints are layers


def test_completion_event_is_none_once_the_offloader_has_the_result(setup):
    _, _, engine, manager = setup
    offloader = KVOffloader(manager, engine)
    offloader.wait(offloader.store([1], [0]))
    load = offloader.load([1], [4])
    offloader.wait(load)
    offloader.poll()
    assert offloader.completion_event(load) is None


def test_the_demo_sizes_its_gpu_cache_to_the_trace_by_default(capsys):
    """Issue 37: `--trace mooncake_conversation` refused the demo's own default --gpu-blocks."""
    assert demo_main(["--trace", "mooncake_conversation", "--requests", "12"]) == 0
    out = capsys.readouterr().out
    longest = max(map(len, read_hash_chains("mooncake_conversation")[:12]))
    assert f"cache          {max(96, longest)} GPU blocks" in out and longest > 96
