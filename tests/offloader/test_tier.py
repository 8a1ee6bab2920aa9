"""KVOffloader with a second tier under the host pool, on the CUDA simulator: demotion and
write-through, promotion of host misses, and every failure path a miss, never wrong bytes.

The tier's store is a dict in this process (tests/support/tiers.py): these tests are about
what the offloader wires; two processes over a real directory are in test_processes.py.
"""

import threading
import time

import numpy as np
import pytest

from numbakv import CPUOffloadingManager
from numbakv.cascade import TierFlush, tier_key
from numbakv.datapath import HostPool, TransferEngine
from numbakv.offloader import KVOffloader
from numbakv.tiers import ChunkTier
from numbakv.tiers.chunk_format import HEADER_BYTES
from tests.support.datapath_cases import make_cache
from tests.support.tiers import DictBackend, SlowLoads, namespace

HOST_BLOCKS = 4


class Rig:
    """A GPU cache of 8 random blocks, a host pool of 4, a dict-backed tier over that pool."""

    def __init__(self, tiering="demote", seed=11, backend=None, lookup_deadline_s=1.0, **tier):
        self.cache = make_cache("flash_attn", np.random.default_rng(seed), num_blocks=8)
        pool = HostPool.for_layout(self.cache.layout, HOST_BLOCKS)
        self.pool = pool.blocks
        engine = TransferEngine(self.cache.layout, pool, threads_per_block=32, max_thread_blocks=2)
        self.manager = CPUOffloadingManager(block_size=2, num_blocks=HOST_BLOCKS)
        self.backend = backend or DictBackend()
        self.tier = ChunkTier(
            self.backend, pool.blocks, namespace(), lookup_deadline_s=lookup_deadline_s, **tier
        )
        self.offloader = KVOffloader(self.manager, engine, tier=self.tier, tiering=tiering)
        self.original = self.cache.host_copies()

    def gpu_bytes(self, block: int, copies=None) -> bytes:
        return self.cache.block_bytes(copies or self.cache.host_copies(), block)

    def settled_lookup(self, hashes) -> int:
        """What an engine sees once the promotions its lookups started have finished."""
        hits = self.offloader.lookup(hashes)
        while hits is None:
            self.offloader.drain()
            hits = self.offloader.lookup(hashes)
        return hits

    def demote_a_and_ask_for_it(self) -> None:
        """Host memory full of b to e, a demoted to the tier, and the tier asked for a: the next
        lookup of a promotes it, evicting b."""
        offloader = self.offloader
        offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
        offloader.wait(offloader.store([b"e"], [4]))  # evicts a: demoted
        offloader.drain()
        assert offloader.lookup([b"a"]) is None  # the tier is asked
        offloader.drain()

    def load_and_check(self, hashes, from_gpu_blocks, into=(6, 7)) -> None:
        """Load `hashes` into GPU blocks `into`; each must hold what GPU block it came from held."""
        into = list(into)[: len(hashes)]
        assert self.offloader.wait(self.offloader.load(hashes, into))
        after = self.cache.host_copies()
        for target, source in zip(into, from_gpu_blocks):
            assert self.gpu_bytes(target, after) == self.gpu_bytes(source, self.original)


@pytest.fixture
def rig():
    return Rig()


def test_an_evicted_block_is_demoted_then_promoted_back_byte_exact(rig):
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    assert rig.backend.values == {}  # demotion stores nothing until something is evicted
    offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # evicts a and b (LRU)
    offloader.drain()
    assert set(rig.backend.values) == {b"a", b"b"}
    assert offloader.lookup([b"a", b"b"]) is None  # the tier is asked
    offloader.drain()
    assert offloader.lookup([b"a", b"b"]) is None  # it holds both: promotion under way
    offloader.drain()
    assert offloader.lookup([b"a", b"b"]) == 2
    rig.load_and_check([b"a", b"b"], [0, 1])
    assert (rig.tier.counters.loaded_own, rig.tier.counters.loaded_other) == (2, 0)


def test_a_store_into_slots_being_demoted_waits_for_the_demotion(rig):
    """Without the wait the new block's copy overwrites the row the tier is still reading: the
    tier would keep the wrong bytes under the evicted block's key, or fail its checksum."""
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    row = rig.manager.prepare_load([b"a"]).block_ids[0]
    rig.manager.complete_load([b"a"])
    demoted_row = rig.pool[row].copy()
    offloader.poll()
    rig.backend.gate.clear()  # the tier's store blocks until released
    try:
        job = offloader.store([b"e"], [4])  # evicts a, and takes its row
        assert offloader.in_flight(job) and offloader.poll() == []
        np.testing.assert_array_equal(rig.pool[row], demoted_row)  # e's copy has not started
    finally:
        rig.backend.gate.set()
    assert offloader.wait(job)
    offloader.drain()
    assert rig.backend.values[b"a"][HEADER_BYTES:] == demoted_row.tobytes()
    assert rig.settled_lookup([b"a", b"e"]) == 2
    rig.load_and_check([b"a", b"e"], [0, 4])


def test_a_store_held_for_a_demotion_copies_the_blocks_it_was_given(rig):
    """The engine may reuse its array of block ids as soon as `store` returns."""
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.poll()
    rig.backend.gate.clear()
    gpu_ids = np.array([4, 5])
    try:
        job = offloader.store([b"e", b"f"], gpu_ids)  # held until a and b are demoted
        gpu_ids[:] = [6, 7]
    finally:
        rig.backend.gate.set()
    assert offloader.wait(job)
    rig.load_and_check([b"e", b"f"], [4, 5])


def test_waiting_for_a_store_waits_for_its_slots_demotion_not_for_every_tier_job():
    rig = Rig(backend=SlowLoads())
    offloader, backend = rig.offloader, rig.backend
    rig.demote_a_and_ask_for_it()
    assert offloader.lookup([b"a"]) is None  # it holds a: its promotion evicts b
    release = threading.Timer(10, backend.load_gate.set)  # a regression waits, then fails
    release.start()
    try:
        while not backend.loading.wait(0.01):  # b's demotion lands, then a's promotion starts
            offloader.poll()
        job = offloader.store([b"x"], [5])  # evicts c: waits for c's demotion
        assert offloader.wait(job)
        assert not backend.load_gate.is_set()  # the promotion is still under way
    finally:
        backend.load_gate.set()
        release.cancel()
    assert b"c" in backend.values
    assert rig.settled_lookup([b"a", b"x"]) == 2
    rig.load_and_check([b"a", b"x"], [0, 5])


def refuse(*job):
    raise RuntimeError("the tier is closed")


def test_a_promotion_the_tier_refuses_after_its_demotion_is_a_miss_asked_again(rig, monkeypatch):
    offloader, backend = rig.offloader, rig.backend
    rig.demote_a_and_ask_for_it()
    backend.gate.clear()
    assert offloader.lookup([b"a"]) is None  # it holds a: its promotion waits for b's demotion
    monkeypatch.setattr(rig.tier, "submit_load", refuse)
    backend.gate.set()
    offloader.drain()  # b lands; a's promotion is refused
    monkeypatch.undo()
    assert rig.manager.stats().being_stored == 0
    assert rig.settled_lookup([b"a"]) == 1
    rig.load_and_check([b"a"], [0])


def test_a_block_on_its_way_down_is_asked_for_again_not_missed(rig):
    """Between its eviction and its demotion's end a block is in neither tier: a lookup then
    says "ask again", and finds the block once it has landed, instead of a miss."""
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    rig.backend.gate.clear()  # the tier's store blocks until released
    try:
        job = offloader.store([b"e"], [4])  # evicts a: its demotion cannot finish
        assert offloader.lookup([b"a"]) is None
        assert offloader.lookup([b"b", b"a"]) is None  # b is in host memory, a on its way
    finally:
        rig.backend.gate.set()
    assert offloader.wait(job)
    assert rig.settled_lookup([b"a"]) == 1
    rig.load_and_check([b"a"], [0])


def test_write_through_copies_every_store_down_before_it_is_ready():
    rig = Rig(tiering="write-through")
    offloader = rig.offloader
    rig.backend.gate.clear()
    try:
        job = offloader.store([b"a", b"b"], [0, 1])
        assert offloader.wait(job)  # the GPU copy is done: the engine may reuse its blocks
        assert offloader.lookup([b"a"]) == 0  # not ready until the tier holds it too
    finally:
        rig.backend.gate.set()
    offloader.drain()
    assert offloader.lookup([b"a", b"b"]) == 2 and set(rig.backend.values) == {b"a", b"b"}
    offloader.wait(offloader.store([b"c", b"d", b"e", b"f"], [2, 3, 4, 5]))  # evicts a and b
    offloader.drain()
    assert len(rig.backend.values) == 6
    assert rig.settled_lookup([b"a", b"b", b"c"]) == 3
    rig.load_and_check([b"a", b"b"], [0, 1])


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_failed_promotion_is_a_miss_and_never_wrong_bytes(rig, damage):
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # a and b go down
    offloader.drain()
    value = bytearray(rig.backend.values[b"b"])
    if damage == "flip":
        value[HEADER_BYTES + 3] ^= 1
    elif damage == "truncate":
        del value[-1:]
    rig.backend.values[b"b"] = bytes(value)
    rig.backend.exists = lambda keys: [True] * len(keys)  # claims b even once deleted (a race)
    if damage == "delete":
        del rig.backend.values[b"b"]
    assert rig.settled_lookup([b"a", b"b"]) == 1  # a promoted, b a miss: not found again
    stats = rig.manager.stats()  # b's slot freed again; c and d made room, demoted
    assert (stats.failed_store_blocks, stats.used, stats.being_stored) == (1, 3, 0)
    rig.load_and_check([b"a"], [0])


def test_the_engine_never_waits_for_the_tier_and_a_late_answer_is_a_miss():
    rig = Rig(lookup_deadline_s=0.05)
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e"], [4]))  # a goes down
    offloader.drain()
    rig.backend.gate.clear()  # the store stops answering
    try:
        assert offloader.lookup([b"a"]) is None and offloader.lookup([b"a"]) is None
        offloader.drain()  # waits for the lookup no longer than its deadline
        assert offloader.lookup([b"a"]) == 0
        assert rig.tier.counters.late_lookups == 1  # counted once, by the tier
    finally:
        rig.backend.gate.set()
    assert rig.settled_lookup([b"a"]) == 1  # asked anew, answered in time
    assert rig.tier.counters.late_lookups == 1


def test_an_answer_taken_past_its_deadline_is_a_miss_counted_late():
    rig = Rig(lookup_deadline_s=0.05)
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e"], [4]))  # a goes down
    offloader.drain()
    rig.backend.gate.clear()
    try:
        assert offloader.lookup([b"a"]) is None
        time.sleep(0.1)
        assert offloader.lookup([b"a"]) == 0 and rig.tier.counters.late_lookups == 1
    finally:
        rig.backend.gate.set()


def test_an_unreachable_tier_makes_misses_and_stores_still_land(rig):
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    rig.backend.unavailable = True
    assert offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # its demotion failed
    offloader.drain()
    assert rig.settled_lookup([b"a"]) == 0
    assert rig.settled_lookup([b"e", b"f"]) == 2
    rig.load_and_check([b"e", b"f"], [4, 5])
    assert rig.tier.counters.dropped_stores == 2


def test_no_promotion_without_room_in_host_memory(rig):
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e"], [4]))
    offloader.drain()
    rig.manager.prepare_load([b"b", b"c", b"d", b"e"])  # every host block being read
    before = rig.manager.stats()
    assert rig.settled_lookup([b"a"]) == 0
    after = rig.manager.stats()
    assert (after.refused_store_blocks, after.evicted_blocks) == (
        before.refused_store_blocks,  # not even asked for: the tier's copy stays where it is
        before.evicted_blocks,
    )


def test_a_promotion_never_evicts_the_blocks_its_request_hits(rig):
    """Room for one block beside three being read: a is promoted into it, and b, which would
    take a's slot, is not; before, each lookup promoted the block the last one had evicted."""
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # a and b demoted
    offloader.drain()
    rig.manager.prepare_load([b"c", b"d", b"e"])
    answers = []
    for _ in range(6):
        answers.append(offloader.lookup([b"a", b"b"]))
        offloader.drain()
    assert answers == [None, None, 1, 1, 1, 1]  # the tier asked for a, a promoted, then no room
    assert rig.manager.stats().evicted_blocks == 3  # a, b, then f for a
    rig.load_and_check([b"a"], [0])


def test_reset_waits_for_the_tier_and_keeps_what_it_holds(rig):
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.store([b"e", b"f"], [4, 5])
    offloader.reset()
    assert rig.manager.stats().used == 0 and offloader.jobs_in_flight == 0
    assert rig.settled_lookup([b"a", b"b"]) == 2
    rig.load_and_check([b"a", b"b"], [0, 1])


def test_random_traffic_loads_only_the_bytes_each_hash_was_stored_with():
    """Stores, evictions, demotions and promotions at random; every load checked byte for byte
    against the GPU block its hash was stored from."""
    rng = np.random.default_rng(5)
    rig = Rig(seed=3)
    offloader = rig.offloader
    for _ in range(40):  # hash h is always computed into GPU block h; loads go to blocks 6 and 7
        hashes = [int(h) for h in rng.choice(6, size=rng.integers(1, 3), replace=False)]
        hits = rig.settled_lookup(hashes)
        if hits:
            rig.load_and_check(hashes[:hits], hashes[:hits])
        job = offloader.store(hashes[hits:], hashes[hits:]) if hashes[hits:] else None
        if job is not None:
            offloader.wait(job)
        offloader.drain()
    assert rig.tier.counters.loaded_own > 0 and rig.tier.counters.integrity_failures == 0


def test_bad_settings_and_hashes_are_refused_before_anything_moves(rig):
    engine = rig.offloader.transfers
    with pytest.raises(ValueError, match="tiering"):
        KVOffloader(CPUOffloadingManager(2, HOST_BLOCKS), engine, tier=rig.tier, tiering="down")
    small = ChunkTier(DictBackend(), np.zeros((2, 8), np.uint8), namespace())
    with pytest.raises(ValueError, match="tier must be built over the transfer engine's host"):
        KVOffloader(CPUOffloadingManager(2, HOST_BLOCKS), engine, tier=small)
    for bad in [("tuple",), b"", 2**64, True]:
        with pytest.raises(ValueError, match="block_hashes"):
            rig.offloader.store([b"fine", bad], [0, 1])
    assert rig.manager.stats().used == 0 and rig.backend.values == {}


def test_a_tier_over_another_pool_of_the_same_shape_is_refused(rig):
    """The tier would read and write rows the engine never copies: a load would put whatever
    those rows hold on the GPU."""
    engine = rig.offloader.transfers
    other = HostPool.for_layout(rig.cache.layout, HOST_BLOCKS)
    elsewhere = ChunkTier(DictBackend(), other, namespace())
    with pytest.raises(ValueError, match="tier must be built over the transfer engine's host"):
        KVOffloader(CPUOffloadingManager(2, HOST_BLOCKS), engine, tier=elsewhere)
    same = ChunkTier(DictBackend(), engine.host_pool, namespace())  # the HostPool itself: fine
    KVOffloader(CPUOffloadingManager(2, HOST_BLOCKS), engine, tier=same)
    same.close()
    with pytest.raises(RuntimeError, match="the tier is closed"):
        KVOffloader(CPUOffloadingManager(2, HOST_BLOCKS), engine, tier=same)


def test_tier_keys_are_bytes_as_they_are_and_ints_as_8_bytes():
    assert tier_key(b"\x01\x02") == b"\x01\x02"
    assert tier_key(1) == b"\x01" + bytes(7) and tier_key(np.int64(-1)) == b"\xff" * 8
    assert tier_key(np.uint64(2**64 - 1)) == b"\xff" * 8  # unsigned hashes, xxh64's, as well
    assert tier_key(2**63) == bytes(7) + b"\x80"
    for outside in (2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match="64-bit ints"):
            tier_key(outside)
    assert len({tier_key(h) for h in range(-1000, 1000)}) == 2000


def test_a_promoted_block_evicted_again_is_not_copied_down_twice(rig):
    offloader, writes = rig.offloader, []
    write = rig.backend.write
    rig.backend.write = lambda keys, *rest: writes.extend(keys) or write(keys, *rest)
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # a and b go down
    offloader.drain()
    assert rig.settled_lookup([b"a", b"b"]) == 2  # promoted: c and d go down
    assert writes == [b"a", b"b", b"c", b"d"]
    offloader.wait(offloader.store([b"g", b"h"], [6, 7]))  # e and f go down
    assert rig.settled_lookup([b"c"]) == 1  # evicts a, which the tier still holds
    offloader.drain()
    assert writes == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert rig.settled_lookup([b"e", b"f"]) == 2  # evicts b and g: only g goes down
    offloader.drain()
    assert writes[6:] == [b"g"]
    rig.load_and_check([b"e", b"f"], [4, 5])


def recording_writes(backend) -> list:
    """The keys `backend` is asked to write, in order, from now on."""
    writes, write = [], backend.write
    backend.write = lambda keys, *rest: writes.extend(keys) or write(keys, *rest)
    return writes


def host_row(rig, block_hash) -> np.ndarray:
    row = rig.manager.prepare_load([block_hash]).block_ids[0]
    rig.manager.complete_load([block_hash])
    return rig.pool[row]


def test_a_flush_hands_host_memory_down_once_and_a_second_copies_nothing(rig):
    offloader, writes = rig.offloader, recording_writes(rig.backend)
    offloader.wait(offloader.store([b"a", b"b", b"c", b"d"], [0, 1, 2, 3]))
    offloader.wait(offloader.store([b"e", b"f"], [4, 5]))  # a and b are demoted
    assert offloader.flush_to_tier() == TierFlush(stored=4)
    assert sorted(writes) == [b"a", b"b", b"c", b"d", b"e", b"f"]
    for block_hash in [b"c", b"d", b"e", b"f"]:  # what host memory holds, byte for byte
        stored = rig.backend.values[block_hash][HEADER_BYTES:]
        assert stored == host_row(rig, block_hash).tobytes()
    assert offloader.flush_to_tier() == TierFlush(stored=0)
    offloader.wait(offloader.store([b"g", b"h"], [6, 7]))  # evicts c and d: the tier has them
    offloader.drain()
    assert len(writes) == 6 and offloader.flush_to_tier() == TierFlush(stored=2)
    assert sorted(writes[6:]) == [b"g", b"h"]
    assert rig.settled_lookup([b"c", b"d"]) == 2  # promoted back: evicts e and f, not copied
    assert offloader.flush_to_tier().stored == 0 and len(writes) == 8
    rig.load_and_check([b"c", b"d"], [2, 3])


def test_a_flush_with_nothing_to_do_moves_nothing():
    rig = Rig(tiering="write-through")
    writes = recording_writes(rig.backend)
    assert rig.offloader.flush_to_tier() == TierFlush(stored=0)  # host memory is empty
    rig.offloader.wait(rig.offloader.store([b"a", b"b"], [0, 1]))
    rig.offloader.drain()
    assert writes == [b"a", b"b"]
    assert rig.offloader.flush_to_tier() == TierFlush(stored=0)  # written through already
    assert writes == [b"a", b"b"]
    engine = rig.offloader.transfers
    alone = KVOffloader(CPUOffloadingManager(block_size=2, num_blocks=HOST_BLOCKS), engine)
    alone.wait(alone.store([b"c"], [2]))
    assert alone.flush_to_tier() == TierFlush(stored=0)  # no tier below


def test_a_flush_finishes_the_jobs_in_flight_first(rig):
    offloader = rig.offloader
    offloader.wait(offloader.store([b"a", b"b"], [0, 1]))
    offloader.poll()
    load = offloader.load([b"a"], [6])  # a is being read
    store = offloader.store([b"c", b"d"], [2, 3])  # c and d are being written
    assert offloader.flush_to_tier() == TierFlush(stored=4)
    assert {job.job_id for job in offloader.poll()} == {load, store}  # still reported
    assert rig.manager.stats().being_read == rig.manager.stats().being_stored == 0
    for gpu_block, block_hash in enumerate([b"a", b"b", b"c", b"d"]):
        assert rig.backend.values[block_hash][HEADER_BYTES:] == host_row(rig, block_hash).tobytes()
        assert rig.gpu_bytes(gpu_block) == rig.gpu_bytes(gpu_block, rig.original)
    assert rig.gpu_bytes(6) == rig.gpu_bytes(0, rig.original)


@pytest.mark.parametrize("fault", ["refused", "unreachable", "closed"])
def test_a_failed_flush_is_reported_and_the_next_flush_retries(fault):
    rig = Rig(breaker_cooldown_s=0.01)
    offloader, backend = rig.offloader, rig.backend
    offloader.wait(offloader.store([b"a", b"b", b"c"], [0, 1, 2]))
    write = backend.write
    if fault == "refused":  # a full store refuses one value
        backend.write = lambda keys, *rest: [key != b"b" for key in keys]
    elif fault == "unreachable":
        backend.unavailable = True
    else:
        rig.tier.close()
    flushed = offloader.flush_to_tier()
    lost = (b"b",) if fault == "refused" else (b"a", b"b", b"c")
    assert flushed == TierFlush(stored=3 - len(lost), failed=lost) and not flushed.success
    assert offloader.lookup([b"a", b"b", b"c"]) == 3  # host memory keeps every block
    rig.load_and_check([b"a", b"b"], [0, 1])
    if fault == "closed":
        return
    backend.write, backend.unavailable = write, False
    time.sleep(0.02)  # the breaker's cooldown
    writes = recording_writes(backend)
    assert offloader.flush_to_tier() == TierFlush(stored=len(lost))
    assert sorted(writes) == list(lost) and offloader.flush_to_tier() == TierFlush(stored=0)


def test_a_block_whose_write_through_failed_is_flushed():
    rig = Rig(tiering="write-through", breaker_cooldown_s=0.01)
    offloader = rig.offloader
    rig.backend.unavailable = True
    offloader.wait(offloader.store([b"a", b"b"], [0, 1]))
    offloader.drain()
    assert offloader.lookup([b"a", b"b"]) == 2 and rig.backend.values == {}
    rig.backend.unavailable = False
    time.sleep(0.02)
    assert offloader.flush_to_tier() == TierFlush(stored=2)
    assert set(rig.backend.values) == {b"a", b"b"}
