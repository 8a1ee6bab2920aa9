"""An engine's use of KVOffloader over a tier, at random, against what the engine relies on.

A stand-in engine stores, looks up, loads its hits (some loads kept in flight across later calls,
their host blocks pinned, as on a GPU where a job lands steps after its submit), touches, resets
and flushes, under both tierings, while the tier's store refuses writes, leaves reads unanswered,
goes down, or has values corrupted or lost. After every step:

1. Liveness: a request settles (a lookup returns an int) within SETTLE_ROUNDS rounds of lookup and
   engine step once the engine changes nothing else, whether its loads stay in flight (their pins
   held: a step then lets the tier's jobs and lookups land, nothing else) or it drains.
2. Bytes: every load brings back exactly the GPU block its hash was computed into (hash h always
   into GPU block h; loads land in GPU blocks of their own).
3. Accounting: the blocks being read are those the loads in flight pin; after a drain, reset or
   flush nothing is being read or stored, and no engine or tier job is in flight.
4. A lookup answers no more than the host blocks cached and ready from the first, and those hits
   can be loaded at once.

With 7544342's livelock put back (a promotion evicting its own request's host hits, so each
lookup promotes the block the last one evicted), the machine fails invariant 1 and shrinks to four
steps; test_random_traffic_loads_only_the_bytes_each_hash_was_stored_with in test_tier.py, which
keeps no pin across lookups and no request longer than host memory, passes there.
"""

from __future__ import annotations

import time

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import numbakv.cascade
from numbakv import CPUOffloadingManager
from numbakv.cascade import TIERINGS, tier_key
from numbakv.datapath import HostPool, TransferEngine
from numbakv.offloader import KVOffloader
from numbakv.tiers import BackendUnavailable, ChunkTier
from tests.offloader.test_tier import Rig
from tests.support.datapath_cases import EngineInFront, make_cache
from tests.support.tiers import DictBackend, namespace

HOST_BLOCKS = 4
HASHES = range(6)  # hash h is always computed into GPU block h, and only stored from there
TARGETS = range(6, 12)  # loads land here, each load in flight in GPU blocks of its own
SETTLE_ROUNDS = 8
REQUESTS = st.lists(st.sampled_from(HASHES), min_size=1, max_size=4, unique=True)


class FaultyBackend(DictBackend):
    """A dict store that refuses writes of the keys in `refused` (as a full store does) and leaves
    the next read of each key in `unanswered` unanswered (a timeout, an error reply; after writing
    the row, as a failed read may); `unavailable` (DictBackend's) makes it unreachable.

    A read left unanswered for good (`for_good`): test_a_promotion_the_store_never_answers_is_a_miss
    below; the machine fails a read once."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[bytes] = set()
        self.unanswered: set[bytes] = set()
        self.for_good = False

    def write(self, keys, headers, payloads):
        self._reach()
        written = []
        for key, header, payload in zip(keys, headers, payloads):
            written.append(key not in self.refused)
            if written[-1]:
                self.values[key] = header + bytes(payload)
        return written

    def read_into(self, keys, payloads, header_bytes):
        found = super().read_into(keys, payloads, header_bytes)
        for position, key in enumerate(keys):
            if key in self.unanswered:
                if not self.for_good:
                    self.unanswered.discard(key)
                found[position] = BackendUnavailable("no answer")
        return found


class HeldTransfers(EngineInFront):
    """A real transfer engine whose jobs stay in flight until `wait`ed for (the offloader's `wait`,
    `drain`, `reset` and `flush_to_tier` do), as on a GPU where a job lands well after its submit:
    a load's pins are held across the engine's later calls and polls."""

    def __init__(self, engine: TransferEngine) -> None:
        super().__init__(engine)
        self.held: dict = {}
        self.released: set = set()

    def get_finished(self):
        self.held.update((job.job_id, job) for job in self.engine.get_finished())
        done = [job for job_id, job in self.held.items() if job_id in self.released]
        for job in done:
            del self.held[job.job_id]
            self.released.discard(job.job_id)
        return done

    def wait(self, job_id):
        self.released.add(job_id)
        return self.engine.wait(job_id) if job_id not in self.held else self.held[job_id].success


class EngineOverATier(RuleBasedStateMachine):
    """A stand-in engine over a KVOffloader with a tier: GPU blocks 0-5 hold what hashes 0-5
    compute, loads land in blocks 6-11, the host pool has 4 blocks."""

    @initialize(tiering=st.sampled_from(TIERINGS), seed=st.integers(0, 3))
    def build(self, tiering, seed):
        self.cache = make_cache(
            "flash_attn", np.random.default_rng(seed), num_layers=2, num_blocks=12
        )
        pool = HostPool.for_layout(self.cache.layout, HOST_BLOCKS)
        engine = TransferEngine(self.cache.layout, pool, threads_per_block=32, max_thread_blocks=1)
        self.transfers = HeldTransfers(engine)
        self.manager = CPUOffloadingManager(block_size=2, num_blocks=HOST_BLOCKS)
        self.backend = FaultyBackend()
        self.tier = ChunkTier(
            self.backend, pool, namespace(), lookup_deadline_s=1.0, breaker_cooldown_s=0.01
        )
        self.offloader = KVOffloader(self.manager, self.transfers, tier=self.tier, tiering=tiering)
        self.original = self.cache.host_copies()
        self.loads: dict[int, tuple[list, list]] = {}  # in flight: hashes, GPU blocks
        self.stores: set[int] = set()
        self.faulted = False  # whether the tier's store misbehaved at some point

    def teardown(self):
        if not hasattr(self, "offloader"):
            return
        try:
            self.drain()
            if not self.faulted:
                self.every_block_kept_is_found()
            self.drain()
        finally:
            self.tier.close()

    def every_block_kept_is_found(self):
        """Every block host memory or the tier holds is a hit once settled, the tier's promoted.

        A tier lookup a request left is taken by the next request with the same first miss for
        ANSWER_KEPT_S past its deadline, and may predate the block reaching the tier (a false
        miss; test_an_answer_its_request_left_is_asked_again_once_past_its_time): such a block
        is asked once more."""
        stale = set(self.offloader._cascade._lookups)
        for block_hash in HASHES:
            kept = int(
                self.manager.lookup([block_hash]) == 1
                or tier_key(block_hash) in self.backend.values
            )
            found = self.settle([block_hash], drain=True)
            if found != kept and block_hash in stale:
                found = self.settle([block_hash], drain=True)
            assert found == kept, (block_hash, found, kept)

    # --- the engine's own steps ---

    def step(self):
        """Time passes for the tier (its jobs and lookups land, as `drain` waits for them), and
        the engine polls; its own jobs stay in flight."""
        cascade = self.offloader._cascade
        cascade.finish()
        cascade.answer_lookups()
        self.offloader.poll()

    def settle(self, hashes, drain=False) -> int:
        """A request's lookup, asked again after each engine step (or drain) until it answers:
        it must within SETTLE_ROUNDS rounds, the answer checked (invariant 4)."""
        answers = []
        for _ in range(SETTLE_ROUNDS):
            hits = self.offloader.lookup(hashes)
            answers.append(hits)
            if hits is not None:
                self.check_answer(hashes, hits)
                return hits
            self.drain() if drain else self.step()
        raise AssertionError(
            f"lookup({hashes}) did not settle in {SETTLE_ROUNDS} rounds: {answers}, with "
            f"{self.manager.stats()}"
        )

    def check_answer(self, hashes, hits):
        assert 0 <= hits <= len(hashes)
        assert hits <= self.manager.lookup(hashes)
        if hits:  # loadable at once: prepare_load raises for a block not cached and ready
            self.manager.prepare_load(hashes[:hits])
            self.manager.complete_load(hashes[:hits])

    def check_bytes(self, hashes, targets):
        after = self.cache.host_copies()
        for block_hash, target in zip(hashes, targets):
            loaded = self.cache.block_bytes(after, target)
            assert loaded == self.cache.block_bytes(self.original, block_hash), (block_hash, target)

    def finish_load(self, job):
        hashes, targets = self.loads.pop(job)
        assert self.offloader.wait(job)
        self.check_bytes(hashes, targets)

    def load(self, hashes, hold, layered):
        busy = {target for _, targets in self.loads.values() for target in targets}
        free = [target for target in TARGETS if target not in busy]
        while len(free) < len(hashes):  # the engine waits for its oldest load to land
            oldest = next(iter(self.loads))
            free += self.loads[oldest][1]
            self.finish_load(oldest)
        targets = free[: len(hashes)]
        groups = [range(1), range(1, 2)] if layered else None
        job = self.offloader.load(hashes, targets, layer_groups=groups)
        self.loads[job] = (list(hashes), targets)
        if not hold:
            self.finish_load(job)

    def drain(self):
        """`drain`, then everything settled: the held loads' bytes checked, nothing in flight."""
        self.offloader.drain()
        self.settled_everything()

    def settled_everything(self):
        for job in list(self.loads):
            hashes, targets = self.loads.pop(job)
            self.check_bytes(hashes, targets)
        self.stores.clear()
        stats = self.manager.stats()
        assert (stats.being_read, stats.being_stored) == (0, 0), stats
        assert self.offloader.jobs_in_flight == 0 and not self.offloader._cascade.busy
        assert not self.transfers.held

    # --- rules ---

    @rule(hashes=REQUESTS)
    def store(self, hashes):
        job = self.offloader.store(hashes, hashes)
        if job is not None:
            self.stores.add(job)

    @rule(hashes=REQUESTS)
    def lookup_once(self, hashes):
        """A lookup the engine does not follow up on (now): it may leave work under way."""
        hits = self.offloader.lookup(hashes)
        if hits is not None:
            self.check_answer(hashes, hits)

    @rule(hashes=REQUESTS, hold=st.booleans(), layered=st.booleans(), compute=st.booleans())
    def request(self, hashes, hold, layered, compute):
        """Look up until settled, load the hits (kept in flight or waited for), and maybe compute
        and store the rest."""
        hits = self.settle(hashes)
        if hits:
            self.load(hashes[:hits], hold, layered)
        if compute and hits < len(hashes):
            self.store(hashes[hits:])

    @rule(hashes=REQUESTS, layered=st.booleans())
    def request_whose_load_stays_in_flight(self, hashes, layered):
        """The engine's commonest step, drawn twice as often: its hits pinned past this step."""
        self.request(hashes, hold=True, layered=layered, compute=True)

    @rule(tier_only=st.booleans())
    def engine_step(self, tier_only):
        """A scheduler step: a poll, after the tier's jobs and lookups have landed or not."""
        self.step() if tier_only else self.offloader.poll()

    @rule(which=st.integers(0, 7))
    def land_a_job(self, which):
        jobs = sorted([*self.loads, *self.stores])
        if not jobs:
            return
        job = jobs[which % len(jobs)]
        if job in self.loads:
            self.finish_load(job)
        else:
            self.stores.discard(job)
            assert self.offloader.wait(job)

    @rule(hashes=REQUESTS)
    def touch(self, hashes):
        self.offloader.touch(hashes)

    @rule(
        kind=st.sampled_from(["refuse", "unanswered", "corrupt", "lose", "down", "heal"]),
        block_hash=st.sampled_from(HASHES),
        position=st.integers(0, 10_000),
        on=st.booleans(),
    )
    def fault(self, kind, block_hash, position, on):
        """The tier's store refuses a key's writes (or takes them again), fails its next read,
        has its value's bit flipped or the value lost, goes down (or comes back), or heals."""
        key = tier_key(block_hash)
        if kind in ("refuse", "unanswered"):
            keys = self.backend.refused if kind == "refuse" else self.backend.unanswered
            keys.add(key) if on else keys.discard(key)
        elif kind == "down":
            self.backend.unavailable = on
        elif kind == "heal":
            self.backend.refused.clear()
            self.backend.unanswered.clear()
            self.backend.unavailable = False
            return
        elif key in self.backend.values and kind == "lose":
            del self.backend.values[key]
        elif key in self.backend.values:  # a flipped bit, in the header or the payload
            value = bytearray(self.backend.values[key])
            value[position % len(value)] ^= 1 << position % 8
            self.backend.values[key] = bytes(value)
        self.faulted = True

    @rule(hashes=REQUESTS)
    def drain_then_settle(self, hashes):
        self.drain()
        self.settle(hashes, drain=True)
        self.drain()

    @rule()
    def reset(self):
        self.offloader.reset()
        self.settled_everything()
        assert self.manager.stats().used == 0

    @rule()
    def flush(self):
        flushed = self.offloader.flush_to_tier()
        self.settled_everything()
        assert set(flushed.failed) <= set(HASHES)
        if not self.faulted:
            assert flushed.success
            for block_hash in HASHES:  # what host memory holds, the tier holds now
                if self.manager.lookup([block_hash]):
                    assert tier_key(block_hash) in self.backend.values, block_hash

    @invariant()
    def pins_are_the_loads_in_flight(self):
        if not hasattr(self, "offloader"):
            return
        pinned = {block_hash for hashes, _ in self.loads.values() for block_hash in hashes}
        stats = self.manager.stats()
        assert stats.being_read == len(pinned), (stats, self.loads)
        assert stats.used + stats.free == HOST_BLOCKS
        assert stats.being_stored + stats.being_read <= stats.used


TestEngineOverATier = EngineOverATier.TestCase
TestEngineOverATier.settings = settings(
    max_examples=300,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,  # the same sequences every run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# --- what the machine found, each as the shortest sequence that shows it ---


def test_a_promotion_the_store_never_answers_is_a_miss():
    """The tier holds a, but no read of it is ever answered (an error reply, a cluster node down
    for its slot): the promotion fails, and the next lookup is a miss. Before, the tier still
    said it held a, a was promoted again, and the request never settled."""
    backend = FaultyBackend()
    rig = Rig(backend=backend)
    offloader = rig.offloader
    try:
        offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
        offloader.wait(offloader.store([b"e"], [4]))  # a is demoted
        offloader.drain()
        backend.unanswered.add(b"a")
        backend.for_good = True
        answers = []
        for _ in range(SETTLE_ROUNDS):
            answers.append(offloader.lookup([b"a"]))
            offloader.drain()
        assert answers[:3] == [None, None, 0], answers  # asked, promoted and failed, a miss
    finally:
        rig.tier.close()


def test_an_answer_its_request_left_is_asked_again_once_past_its_time(monkeypatch):
    """A request asks the tier for a, which it has not got, and does not come back (aborted, or
    its blocks computed meanwhile). a is then computed, stored and demoted: the tier holds it. A
    request starting at a past the answer's time asks again and finds it; before, it took the
    first request's answer, however old, and a was a miss."""
    monkeypatch.setattr(numbakv.cascade, "ANSWER_KEPT_S", 0.0)
    rig = Rig(lookup_deadline_s=0.05)
    offloader = rig.offloader
    try:
        assert offloader.lookup([b"a"]) is None  # the tier is asked: it has no a
        offloader.drain()  # answered; kept for a request starting at a
        offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
        offloader.wait(offloader.store([b"e"], [4]))  # a is demoted
        offloader.drain()
        assert b"a" in rig.backend.values and offloader.lookup([b"b"]) == 1
        time.sleep(0.06)  # past the answer's deadline, and ANSWER_KEPT_S more
        assert rig.settled_lookup([b"a"]) == 1
    finally:
        rig.tier.close()


def test_a_failed_promotions_miss_is_forgotten_once_the_block_is_stored_anew():
    """Both reads of a two-block promotion go unanswered: the next lookup misses a, and the
    engine computes and stores a and b. b, later demoted, is then found in the tier; before, its
    failed promotion still made that lookup a miss without asking."""
    backend = FaultyBackend()
    rig = Rig(backend=backend)
    offloader = rig.offloader
    try:
        offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
        offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # a and b are demoted
        offloader.drain()
        backend.unanswered.update(backend.values)
        assert rig.settled_lookup([b"a", b"b"]) == 0
        offloader.wait(offloader.store([b"a", b"b"], [0, 1]))  # computed, stored anew
        offloader.drain()
        offloader.wait(offloader.store([b"g", b"h", b"c", b"d"], [2, 3, 4, 5]))  # b demoted
        offloader.drain()
        assert offloader.lookup([b"b"]) is None  # the tier is asked
        assert rig.settled_lookup([b"b"]) == 1
    finally:
        rig.tier.close()
