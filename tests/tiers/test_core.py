"""The tier mechanics every backend shares (numbakv.tiers): namespace, header, checks, jobs.

The backend here is a dict in this process: these tests are about what `ChunkTier` does around any
store; each real backend has its own tests against the real store.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from queue import SimpleQueue

import numpy as np
import pytest

from numbakv.jobs import Direction
from numbakv.tiers import BackendUnavailable, Namespace
from numbakv.tiers.chunk_format import (
    HEADER_BYTES,
    CorruptChunk,
    encode_header,
    parse_header,
    verify,
)
from tests.support.tiers import (
    CHUNK_BYTES,
    KEYS,
    DictBackend,
    SlowLoads,
    finished,
    namespace,
    random_pool,
    tier_over,
)


def test_namespace_digest_changes_with_every_field():
    base = namespace()
    for field in dataclasses.fields(Namespace):
        value = getattr(base, field.name)
        changed = value + "x" if isinstance(value, str) else value + 1
        if field.name == "tensor_parallel_rank":
            changed = namespace(tensor_parallel_size=2, tensor_parallel_rank=1)
        else:
            changed = dataclasses.replace(base, **{field.name: changed})
        assert changed.digest != base.digest, field.name
    assert namespace().digest == base.digest and len(base.digest) == 16
    assert base.digest.hex() in base.describe()


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"num_layers": 0}, "num_layers"),
        ({"page_bytes": "1"}, "page_bytes"),
        ({"tensor_parallel_rank": 1}, "tensor_parallel_rank"),
    ],
)
def test_namespace_refuses_bad_fields(changes, named):
    with pytest.raises(ValueError, match=named):
        namespace(**changes)


def test_header_checks_name_what_failed():
    payload = memoryview(random_pool(1, 1)[0])
    ns = namespace().digest
    header = parse_header(encode_header(ns, b"w" * 8, payload))
    assert len(encode_header(ns, b"w" * 8, payload)) == HEADER_BYTES
    verify(header, ns, payload, payload.nbytes)
    with pytest.raises(CorruptChunk, match="namespace"):
        verify(header, namespace(model="other").digest, payload, payload.nbytes)
    with pytest.raises(CorruptChunk, match="length"):
        verify(header, ns, payload, payload.nbytes - 1)
    flipped = np.array(payload)
    flipped[100] ^= 1
    with pytest.raises(CorruptChunk, match="checksum"):
        verify(header, ns, memoryview(flipped), payload.nbytes)
    with pytest.raises(CorruptChunk, match="format"):
        parse_header(b"XXXX" + encode_header(ns, b"w" * 8, payload)[4:])
    with pytest.raises(CorruptChunk, match="format"):
        parse_header(b"short")


def test_store_then_load_is_byte_exact_and_counts_own_writes():
    backend = DictBackend()
    pool = random_pool(8, 2)
    tier = tier_over(backend, pool)
    assert (tier.num_rows, tier.chunk_bytes) == pool.shape
    tier.submit_store("s", KEYS, [0, 1, 2, 3])
    assert finished(tier)["s"].success
    assert tier.contains(KEYS + [b"absent"]) == [True] * 4 + [False]
    tier.submit_load("l", KEYS, [7, 6, 5, 4])
    job = finished(tier)["l"]
    assert (job.direction, job.success, job.nbytes) == (Direction.LOAD, True, 4 * CHUNK_BYTES)
    np.testing.assert_array_equal(pool[[7, 6, 5, 4]], pool[[0, 1, 2, 3]])
    assert (tier.counters.loaded_own, tier.counters.loaded_other) == (4, 0)
    tier.close()


def test_another_writers_chunks_load_and_count_as_theirs():
    backend = DictBackend()
    writer, reader = tier_over(backend, random_pool(4, 3)), tier_over(backend, random_pool(4, 4))
    writer.submit_store(1, KEYS[:2], [0, 1])
    finished(writer)
    reader.submit_load(2, KEYS[:2], [2, 3])
    assert finished(reader)[2].success
    np.testing.assert_array_equal(reader._pool[2:4], writer._pool[0:2])
    assert (reader.counters.loaded_own, reader.counters.loaded_other) == (0, 2)


@pytest.mark.parametrize("damage", ["flip", "truncate", "namespace", "another_key"])
def test_a_damaged_value_is_a_failed_load_deleted_and_not_found_until_stored_anew(damage):
    backend = DictBackend()
    tier = tier_over(backend)
    tier.submit_store(1, KEYS[:2], [0, 1])
    finished(tier)
    value = bytearray(backend.values[KEYS[1]])
    if damage == "flip":
        value[HEADER_BYTES + 7] ^= 0x10
    elif damage == "truncate":
        del value[-100:]
    elif damage == "another_key":
        value = bytearray(backend.values[KEYS[0]])  # a whole, valid value, under the wrong key
    else:
        value[:HEADER_BYTES] = encode_header(
            namespace(model="other").digest, b"x" * 8, memoryview(tier._pool[1])
        )
    backend.values[KEYS[1]] = bytes(value)
    tier.submit_load(2, KEYS[:2], [4, 5])
    job = finished(tier)[2]
    assert not job.success and job.failed_keys == (KEYS[1],)
    assert job.nbytes == CHUNK_BYTES  # the good chunk moved
    assert KEYS[1] not in backend.values and tier.counters.integrity_failures == 1
    assert tier.contains(KEYS[:2]) == [True, False]
    tier.submit_store(3, KEYS[1:2], [1])
    finished(tier)
    assert tier.contains(KEYS[1:2]) == [True]


def test_a_missing_chunk_fails_its_load_and_stays_a_miss_while_the_store_still_claims_it():
    backend = DictBackend()
    tier = tier_over(backend)
    tier.submit_load(1, KEYS[:1], [0])
    assert finished(tier)[1].failed_keys == (KEYS[0],)
    backend.values[KEYS[0]] = b"junk"  # appears later, written by no tier
    assert tier.contains(KEYS[:1]) == [False]


def test_a_slow_store_answers_misses_at_the_deadline():
    backend = DictBackend()
    tier = tier_over(backend, lookup_deadline_s=0.01)
    tier.submit_store(1, KEYS, [0, 1, 2, 3])
    finished(tier)
    backend.gate.clear()
    try:
        assert tier.contains(KEYS) == [False] * 4
        assert tier.counters.late_lookups == 1
    finally:
        backend.gate.set()
    assert tier.contains(KEYS) == [True] * 4


def test_waiting_for_a_job_waits_for_it_alone():
    backend = SlowLoads()
    tier = tier_over(backend)
    tier.submit_store(1, KEYS[:2], [0, 1])
    finished(tier)
    try:
        tier.submit_load(2, KEYS[:1], [2])
        tier.submit_store(3, KEYS[2:], [2, 3])
        tier.wait(3)
        tier.wait(4)  # never submitted: nothing to wait for
        assert [job.job_id for job in tier.take_finished()] == [3]
        assert not backend.load_gate.is_set()
    finally:
        backend.load_gate.set()
    tier.wait(2)
    assert [job.job_id for job in tier.take_finished()] == [2]


def test_an_unreachable_store_gives_misses_and_failed_jobs_never_exceptions():
    backend = DictBackend()
    tier = tier_over(backend)
    backend.unavailable = True
    assert tier.contains(KEYS) == [False] * 4
    tier.submit_store(1, KEYS[:2], [0, 1])
    tier.submit_load(2, KEYS[2:], [2, 3])
    jobs = finished(tier)
    assert not jobs[1].success and not jobs[2].success
    assert tier.counters.dropped_stores == 2 and tier.counters.unavailable == 3


def test_a_load_the_store_did_not_answer_leaves_its_chunks_loadable_once_it_is_back():
    backend = DictBackend()
    tier = tier_over(backend, breaker_cooldown_s=0.05)
    tier.submit_store(1, KEYS[:2], [0, 1])
    assert finished(tier)[1].success
    backend.unavailable = True
    tier.submit_load(2, KEYS[:2], [2, 3])
    assert not finished(tier)[2].success
    backend.unavailable = False
    time.sleep(0.1)  # past the breaker's cooldown
    assert tier.contains(KEYS[:2]) == [True, True]
    tier.submit_load(3, KEYS[:2], [2, 3])
    assert finished(tier)[3].success


def test_jobs_reach_the_callback_once():
    seen = []
    tier = tier_over(DictBackend(), on_job_done=seen.append)
    tier.submit_store("a", KEYS[:1], [0])
    tier.drain()
    assert [job.job_id for job in seen] == ["a"]
    assert [job.job_id for job in tier.take_finished()] == ["a"] and tier.take_finished() == []


class TakenBetween(SimpleQueue):
    """A queue whose items another consumer takes right after `empty` answers."""

    def empty(self) -> bool:
        answer = super().empty()
        while not super().empty():
            self.get_nowait()
        return answer


def test_take_finished_never_blocks_on_a_job_another_thread_took():
    """SGLang takes a tier's finished jobs from its prefetch and its backup threads at once: one
    must never wait for a job the other took (it waited for the tier's next job, or for good)."""
    tier = tier_over(DictBackend())
    tier.submit_store("a", KEYS[:1], [0])
    tier.drain()
    tier._finished, taken = TakenBetween(), tier.take_finished()
    tier._finished.put(taken[0])
    taker = threading.Thread(target=tier.take_finished, daemon=True)
    taker.start()
    taker.join(timeout=5)
    assert not taker.is_alive()


@pytest.mark.parametrize(
    "keys, rows, named",
    [
        (KEYS[:2], [0], "rows"),
        (KEYS[:1], [8], "rows"),
        (KEYS[:1], [-1], "rows"),
        ([b""], [0], "keys"),
        (["k"], [0], "keys"),
        (KEYS[:1], [0.5], "rows"),
    ],
)
def test_bad_jobs_are_refused_before_anything_moves(keys, rows, named):
    backend = DictBackend()
    tier = tier_over(backend)
    with pytest.raises(ValueError, match=named):
        tier.submit_store(1, keys, rows)
    with pytest.raises(ValueError, match=named):
        tier.submit_load(1, keys, rows)
    assert backend.values == {} and finished(tier) == {}


def test_a_lone_key_a_closed_tier_and_a_job_id_in_flight_are_refused_by_name():
    """A lone bytes key read as a list of ints, a closed tier failed in its thread pool, and a
    second job under an id in flight was reported twice under that id."""
    backend = SlowLoads()
    tier = tier_over(backend)
    for call in (tier.lookup, tier.contains, tier.touch):
        with pytest.raises(TypeError, match="keys must be a sequence of keys, not a single bytes"):
            call(KEYS[0])
    with pytest.raises(TypeError, match="keys must be a sequence of keys"):
        tier.submit_store(1, KEYS[0], [0])
    tier.submit_store(1, KEYS[:1], [0])
    tier.submit_store(2, [], [])  # an empty job is a job
    tier.drain()
    tier.submit_load(3, KEYS[:1], [1])  # held in the store until its gate opens
    with pytest.raises(ValueError, match="job_id 3 is in flight already"):
        tier.submit_store(3, KEYS[1:2], [2])
    backend.load_gate.set()
    tier.close()
    assert sorted((job.job_id, job.success) for job in tier.take_finished()) == [
        (1, True),
        (2, True),
        (3, True),
    ]
    for call in (tier.lookup, tier.touch):
        with pytest.raises(RuntimeError, match="the tier is closed"):
            call(KEYS[:1])
    with pytest.raises(RuntimeError, match="the tier is closed"):
        tier.submit_store(4, KEYS[:1], [0])


def test_a_job_id_is_free_again_once_reported_even_from_on_job_done():
    """A retry submitted from the callback of the job it retries (the id was still taken)."""
    retried = []

    def retry_once(job):
        if not retried:
            retried.append(job.job_id)
            tier.submit_store(job.job_id, KEYS[:1], [0])

    tier = tier_over(DictBackend(), on_job_done=retry_once)
    tier.submit_store(7, KEYS[:1], [0])
    tier.drain()
    assert [(job.job_id, job.success) for job in tier.take_finished()] == [(7, True), (7, True)]


def test_a_load_into_one_row_twice_is_refused():
    with pytest.raises(ValueError, match="distinct"):
        tier_over(DictBackend()).submit_load(1, KEYS[:2], [3, 3])


READ_ONLY_POOL = np.zeros((4, 8), np.uint8)
READ_ONLY_POOL.flags.writeable = False


@pytest.mark.parametrize(
    "pool, options, named",
    [
        (np.zeros((2, 8), np.float32), {}, "host_pool"),
        (np.zeros(8, np.uint8), {}, "host_pool"),
        (np.zeros((4, 0), np.uint8), {}, "host_pool"),
        (READ_ONLY_POOL, {}, "host_pool must be writable"),
        (None, {"writer_id": b"short"}, "writer_id"),
        (None, {"io_threads": 0}, "io_threads"),
        (None, {"lookup_deadline_s": 0}, "lookup_deadline_s"),
        (None, {"breaker_cooldown_s": 0}, "breaker_cooldown_s"),
    ],
)
def test_bad_tier_settings_are_refused(pool, options, named):
    with pytest.raises(ValueError, match=named):
        tier_over(DictBackend(), pool, **options)


class Cancelled(BaseException):
    """As gevent's Timeout or asyncio's CancelledError: not an Exception."""


@pytest.mark.parametrize("error", [OSError("disk on fire"), Cancelled("read cancelled")])
def test_a_backend_error_fails_the_job_instead_of_losing_it(error):
    class Broken(DictBackend):
        def read_into(self, keys, payloads, header_bytes):
            raise error

    tier = tier_over(Broken())
    tier.submit_store(1, KEYS[:1], [0])
    tier.submit_load(2, KEYS[:1], [1])
    jobs = finished(tier)
    assert jobs[1].success and not jobs[2].success and jobs[2].failed_keys == (KEYS[0],)
    tier.submit_load(2, KEYS[:1], [1])  # its id is free again


def test_touch_reaches_the_backend_checked_and_a_backend_may_ignore_it():
    touched = []

    class RecencyBackend(DictBackend):
        def touch(self, keys):
            touched.append(list(keys))

    tier_over(DictBackend()).touch(KEYS)  # the default: nothing to do
    tier = tier_over(RecencyBackend())
    tier.touch(KEYS[:2])
    assert touched == [KEYS[:2]]
    with pytest.raises(ValueError, match="keys"):
        tier.touch(["k"])
    assert touched == [KEYS[:2]]


class CountingBackend(DictBackend):
    """A DictBackend that counts the calls that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _reach(self) -> None:
        self.calls += 1
        super()._reach()


def test_the_breaker_stops_calling_a_down_store_then_probes_and_closes(caplog):
    backend = CountingBackend()
    tier = tier_over(backend, breaker_cooldown_s=0.2)
    backend.unavailable = True
    with caplog.at_level("WARNING", "numbakv.tiers"):
        assert tier.contains(KEYS) == [False] * 4
        assert tier.breaker_open and backend.calls == 1
        for _ in range(5):
            assert tier.contains(KEYS) == [False] * 4
        tier.submit_store(1, KEYS[:1], [0])
        assert not finished(tier)[1].success
        assert backend.calls == 1  # nothing reached the store while open
        time.sleep(0.25)
        assert tier.contains(KEYS) == [False] * 4  # the probe, still down: open again
        assert backend.calls == 2 and tier.breaker_open
        backend.unavailable = False
        time.sleep(0.25)
        tier.submit_store(2, KEYS[:1], [0])
        assert finished(tier)[2].success and not tier.breaker_open
    assert tier.contains(KEYS[:1]) == [True]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("breaker open" in line for line in lines) == 1
    assert sum("breaker closed" in line for line in lines) == 1
    assert tier.counters.breaker_opens == 1 and tier.counters.unavailable == 8


class BrokenProbe(CountingBackend):
    """Unreachable, then one call that fails with something other than unreachability."""

    broken = False

    def _reach(self) -> None:
        super()._reach()
        if self.broken:
            self.broken = False
            raise ValueError("a reply the client could not parse")


def test_a_probe_that_fails_otherwise_leaves_the_next_call_free_to_probe():
    backend = BrokenProbe()
    tier = tier_over(backend, breaker_cooldown_s=0.05)
    backend.unavailable = True
    assert tier.contains(KEYS) == [False] * 4 and tier.breaker_open
    backend.unavailable, backend.broken = False, True
    time.sleep(0.1)
    assert tier.contains(KEYS) == [False] * 4  # the probe: it raised ValueError
    assert backend.calls == 2 and tier.breaker_open
    tier.submit_store(1, KEYS[:1], [0])  # the next call probes again, and closes the breaker
    assert finished(tier)[1].success and not tier.breaker_open
    assert tier.contains(KEYS[:1]) == [True]


class UnansweredKey(DictBackend):
    """Answers every key of a load but `unanswered`, for which it says it could not ask."""

    unanswered = None

    def read_into(self, keys, payloads, header_bytes):
        found = super().read_into(keys, payloads, header_bytes)
        return [
            BackendUnavailable("node down") if key == self.unanswered else value
            for key, value in zip(keys, found)
        ]


def test_a_key_not_answered_fails_its_load_and_stays_found_one_absent_does_not():
    backend = UnansweredKey()
    tier = tier_over(backend)
    tier.submit_store("s", KEYS[:2], [0, 1])
    backend.values.pop(KEYS[1])  # evicted by the store
    backend.unanswered = KEYS[0]
    tier.submit_load("l", KEYS[:2], [2, 3])
    assert finished(tier)["l"].failed_keys == tuple(KEYS[:2])
    backend.values[KEYS[1]] = b"stale"  # found again only after a store of its own
    assert tier.contains(KEYS[:2]) == [True, False]
    backend.unanswered = None
    tier.submit_load("again", KEYS[:1], [2])
    assert finished(tier)["again"].success


class CountedWrites(DictBackend):
    """Says each write it begins (before the gate)."""

    def __init__(self) -> None:
        super().__init__()
        self.begun = threading.Semaphore(0)

    def write(self, keys, headers, payloads):
        self.begun.release()
        return super().write(keys, headers, payloads)


def test_close_can_drop_the_jobs_not_yet_started():
    backend = CountedWrites()
    tier = tier_over(backend, io_threads=2)
    backend.gate.clear()  # the first two jobs start and wait; the other eight queue
    for job in range(10):
        tier.submit_store(job, [b"key-%d" % job], [job % 8])
    assert backend.begun.acquire(timeout=5) and backend.begun.acquire(timeout=5)
    closing = threading.Thread(target=tier.close, kwargs={"discard_pending": True})
    closing.start()
    time.sleep(0.1)
    backend.gate.set()
    closing.join(timeout=5)
    assert not closing.is_alive() and len(backend.values) == 2


class ReadsBeforeTheGate(DictBackend):
    """A load reads the store at once, then waits for `gate` before it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.read, self.answer = threading.Event(), threading.Event()

    def read_into(self, keys, payloads, header_bytes):
        found = super().read_into(keys, payloads, header_bytes)
        self.read.set()
        self.answer.wait()
        return found


def test_a_key_stored_while_a_load_found_it_absent_stays_loadable():
    backend = ReadsBeforeTheGate()
    tier = tier_over(backend)
    tier.submit_load("load", KEYS[:1], [1])  # finds nothing, then waits to answer
    assert backend.read.wait(5)
    tier.submit_store("store", KEYS[:1], [0])
    while KEYS[0] not in backend.values:
        time.sleep(0.01)
    time.sleep(0.05)  # the store's report first, then the load's: the order that lost the key
    backend.answer.set()
    jobs = finished(tier)
    assert not jobs["load"].success and jobs["store"].success
    assert tier.contains(KEYS[:1]) == [True]


def test_clear_empties_the_store_and_forgets_what_was_unloadable():
    backend = DictBackend()
    tier = tier_over(backend)
    tier.submit_store("s", KEYS[:2], [0, 1])
    finished(tier)
    assert tier.clear() == 2 and tier.contains(KEYS[:2]) == [False, False]
    backend.unavailable = True
    assert tier.clear() is None


def test_latency_histograms_count_lookups_and_jobs():
    tier = tier_over(DictBackend())
    tier.submit_store(1, KEYS[:2], [0, 1])
    finished(tier)
    tier.contains(KEYS)
    tier.submit_load(2, KEYS[:2], [2, 3])
    finished(tier)
    counters = tier.counters
    assert sum(counters.lookup_latency.buckets) == 1
    assert sum(counters.store_latency.buckets) == sum(counters.load_latency.buckets) == 1
    assert counters.lookup_latency.seconds > 0


def test_close_lets_the_host_memory_owner_release_its_buffer():
    memory = memoryview(bytearray(8 * CHUNK_BYTES))
    pool = np.frombuffer(memory, dtype=np.uint8).reshape(8, CHUNK_BYTES)
    tier = tier_over(DictBackend(), pool)
    del pool
    tier.submit_store(1, KEYS[:1], [0])
    tier.close()
    memory.release()  # BufferError while the tier still held a view of it


def test_a_lookup_taken_past_its_deadline_is_misses_counted_once():
    backend = DictBackend()
    tier = tier_over(backend, lookup_deadline_s=0.01)
    tier.submit_store(1, KEYS[:2], [0, 1])
    finished(tier)
    backend.gate.clear()
    try:
        lookup = tier.lookup(KEYS[:2])
        assert lookup.answer() is None  # under way, before its deadline
        time.sleep(0.02)
        assert lookup.answer() == [False, False]
        assert lookup.answer() == [False, False]  # asked again: the same misses, not counted again
        assert tier.counters.late_lookups == 1
    finally:
        backend.gate.set()
    answered = tier.lookup(KEYS[:3])
    assert answered.answer(wait=True) == [True, True, False]
    assert tier.counters.late_lookups == 1


def test_a_job_is_reported_even_when_the_callback_fails(caplog):
    def broken_callback(job):
        raise RuntimeError("metrics on fire")

    tier = tier_over(DictBackend(), on_job_done=broken_callback)
    tier.submit_store(1, KEYS[:1], [0])
    assert [job.job_id for job in finished(tier).values()] == [1]
    assert "metrics on fire" in caplog.text


def test_a_backend_answer_of_the_wrong_length_fails_the_job():
    class Short(DictBackend):
        def read_into(self, keys, payloads, header_bytes):
            return super().read_into(keys, payloads, header_bytes)[:1]

    tier = tier_over(Short())
    tier.submit_store(1, KEYS[:2], [0, 1])
    tier.submit_load(2, KEYS[:2], [2, 3])
    job = finished(tier)[2]
    assert not job.success and job.failed_keys == tuple(KEYS[:2])


def test_the_breaker_gauge_follows_the_breaker_when_calls_interleave():
    backend = DictBackend()
    tier = tier_over(backend)
    breaker = tier._breaker
    close = breaker.succeeded

    def succeeded_then_another_call_fails():  # another thread's failure lands between the two
        close()
        backend.unavailable = True
        with pytest.raises(BackendUnavailable):
            tier._call(backend.exists, KEYS[:1])

    breaker.succeeded = succeeded_then_another_call_fails
    tier.contains(KEYS[:1])
    assert tier.breaker_open and tier.counters.breaker_open == 1


@pytest.mark.parametrize("deadline", ["0.005", None, True])
def test_a_lookup_deadline_that_is_no_number_is_refused(deadline):
    with pytest.raises(ValueError, match="lookup_deadline_s"):
        tier_over(DictBackend(), lookup_deadline_s=deadline)


def test_failed_loads_are_remembered_up_to_a_bound_oldest_forgotten_first(monkeypatch):
    monkeypatch.setattr("numbakv.tiers.tier.UNLOADABLE_LIMIT", 2)
    backend = DictBackend()
    tier = tier_over(backend)
    tier.submit_store(1, KEYS[:3], [0, 1, 2])
    finished(tier)
    for job, key in enumerate(KEYS[:3], start=2):
        backend.values[key] = b"junk"
        tier.submit_load(job, [key], [4])
        finished(tier)
        backend.values[key] = b"back"  # the store claims it again
    assert tier.contains(KEYS[:3]) == [True, False, False]
