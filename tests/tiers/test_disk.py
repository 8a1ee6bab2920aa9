"""The disk tier (numbakv.tiers.disk) on real files: bound and policy, faults, restarts, sharing.

Every test writes real files in a temporary directory (O_DIRECT where the file system takes it);
the full file system is a real, small tmpfs mount.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from numbakv import POLICIES
from numbakv.manager import CPUOffloadingManager
from numbakv.tiers import TierOpenError, open_tier
from numbakv.tiers import disk as disk_module
from numbakv.tiers.chunk_format import HEADER_BYTES, encode_header
from numbakv.tiers.disk import HEADER_ATTRIBUTE, DiskBackend, DiskSettings
from numbakv.tools.workloads.core import multi_turn_chat
from tests.support.disk_tier import (
    CHUNK_BYTES,
    FILE_BYTES,
    aligned_pool,
    bytes_for,
    disk_tier,
    random_pool,
)
from tests.support.servers import ROOT
from tests.support.tiers import finished, namespace


def chunk_files(backend: DiskBackend) -> list[str]:
    return sorted(
        os.path.join(fan.path, entry.name)
        for fan in os.scandir(backend.directory)
        if fan.is_dir()
        for entry in os.scandir(fan.path)
    )


KEYS = [b"key-%d" % i for i in range(4)]


def stored_header(backend: DiskBackend, path: str) -> bytes:
    """A chunk file's header, wherever the backend keeps it."""
    if backend.header_in_attribute:
        return os.getxattr(path, HEADER_ATTRIBUTE)
    with open(path, "rb") as file:
        return file.read(HEADER_BYTES)


def store_header(backend: DiskBackend, path: str, header: bytes) -> None:
    if backend.header_in_attribute:
        os.setxattr(path, HEADER_ATTRIBUTE, header)
    else:
        with open(path, "r+b") as file:
            file.write(header)


@pytest.fixture(params=["direct", "buffered"])
def io_mode(request, monkeypatch):
    """Both ways a file system may answer O_DIRECT: taken, or refused (buffered I/O)."""
    if request.param == "buffered":
        monkeypatch.setattr(disk_module, "_direct_io_works", lambda directory: False)
    return request.param


@pytest.fixture(params=["attribute", "block"])
def header_place(request, monkeypatch):
    """Both places a file's header may be: its extended attribute, or (a file system without
    them) a block before the payload."""
    if request.param == "block":
        monkeypatch.setattr(disk_module, "_attributes_work", lambda directory: False)
    return request.param


@pytest.mark.parametrize("chunk_bytes", [CHUNK_BYTES, 5000])
@pytest.mark.parametrize("make_pool", [aligned_pool, random_pool], ids=["aligned", "unaligned"])
def test_store_then_load_is_byte_exact(tmp_path, io_mode, header_place, chunk_bytes, make_pool):
    pool = make_pool(8, 1, chunk_bytes)
    tier = disk_tier(tmp_path, pool)
    assert tier.backend.direct_io == (io_mode == "direct")
    assert tier.backend.header_in_attribute == (header_place == "attribute")
    tier.submit_store("s", KEYS, [0, 1, 2, 3])
    assert finished(tier)["s"].success
    assert tier.contains(KEYS + [b"absent"]) == [True] * 4 + [False]
    tier.submit_load("l", KEYS[::-1], [4, 5, 6, 7])
    assert finished(tier)["l"].success
    np.testing.assert_array_equal(pool[4:8], pool[3::-1])
    assert tier.counters.loaded_own == 4 and tier.counters.integrity_failures == 0
    assert len(chunk_files(tier.backend)) == 4
    tier.close()


@pytest.mark.parametrize("stripes", [1, 3])
def test_a_batch_moves_on_its_stripes_byte_exact_with_repeated_keys(tmp_path, monkeypatch, stripes):
    """Each file of a batch on one of `stripes` threads (1: the caller's), answers in the keys'
    order; a key named twice in a store is written once."""
    threads = []
    for name in ("_write_file", "_read_file"):
        real = getattr(DiskBackend, name)

        def on_thread(self, *args, real=real):
            threads.append(threading.current_thread().name)
            time.sleep(0.01)  # long enough for the other stripes to start theirs
            return real(self, *args)

        monkeypatch.setattr(DiskBackend, name, on_thread)
    pool = aligned_pool(12, 5)
    tier = disk_tier(tmp_path, pool, stripes=stripes)
    keys = [b"stripe-%d" % i for i in range(6)]
    tier.submit_store("s", keys + keys[:1], list(range(6)) + [0])
    assert finished(tier)["s"].success and len(threads) == 6
    tier.submit_load("l", keys[::-1], list(range(6, 12)))
    assert finished(tier)["l"].success
    np.testing.assert_array_equal(pool[6:12], pool[5::-1])
    assert tier.counters.integrity_failures == 0
    on_stripes = {name for name in threads if name.startswith("numbakv-disk")}
    assert len(on_stripes) == (0 if stripes == 1 else stripes)
    tier.close()


def test_a_loads_checksums_are_taken_off_the_stripes_while_they_read_on(tmp_path, monkeypatch):
    """A load's checksums run on the job's thread as files arrive, so a stripe goes straight on
    to its next read: the batch's last read waits here until an earlier file has been hashed."""
    hashed_on, hashed = [], threading.Event()
    real_checksum, real_read = disk_module.checksum, DiskBackend._read_file

    def checksum(payload, key=b""):
        hashed_on.append(threading.current_thread().name)
        hashed.set()
        return real_checksum(payload, key)

    def read_file(self, key, payload):
        if key == KEYS[-1]:
            assert hashed.wait(10), "no file was hashed while the stripes were still reading"
        return real_read(self, key, payload)

    pool = aligned_pool(8, 21)
    tier = disk_tier(tmp_path, pool, stripes=2)
    tier.submit_store("s", KEYS, [0, 1, 2, 3])
    assert finished(tier)["s"].success
    monkeypatch.setattr(disk_module, "checksum", checksum)
    monkeypatch.setattr(DiskBackend, "_read_file", read_file)
    tier.submit_load("l", KEYS, [4, 5, 6, 7])
    assert finished(tier)["l"].success
    np.testing.assert_array_equal(pool[4:], pool[:4])
    assert len(hashed_on) == 4 and not any(name.startswith("numbakv-disk") for name in hashed_on)
    tier.close()


def lower_tier_hits(chains, policy: str, capacity: int) -> int:
    """The hits of numbakv's manager driven as a lower tier: look up, touch, store the rest."""
    manager = CPUOffloadingManager(block_size=1, num_blocks=capacity, cache_policy=policy)
    hits = 0
    for chain in chains:
        hit = manager.lookup(chain)
        hits += hit
        manager.touch(chain)
        plan = manager.prepare_store(chain[hit:])
        if plan is not None:
            manager.complete_store(plan.block_hashes_to_store)
    return hits


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_bound_and_eviction_give_the_managers_hits(tmp_path, policy):
    """Driven as a tier below host memory is (look up, touch, store the missing tail: no request
    boundaries, as in the fleet replay's lower tiers), the disk tier hits exactly where numbakv's
    manager with that policy and capacity does, and never holds more files."""
    chains = [request.hash_ids for request in multi_turn_chat(sessions=40, seed=1)]
    capacity = 120
    backend = DiskBackend(DiskSettings(tmp_path, bytes_for(capacity, 64), policy), namespace(), 64)
    header = encode_header(namespace().digest, b"w" * 8, memoryview(bytes(64)))
    hits = 0
    for chain in chains:
        keys = [b"%d" % block for block in chain]
        found = backend.exists(keys)
        hit = found.index(False) if False in found else len(found)
        hits += hit
        backend.touch(keys)
        payloads = [memoryview(key.rjust(64, b".")) for key in keys[hit:]]
        backend.write(keys[hit:], [header] * len(payloads), payloads)
        assert backend.used_files() <= capacity
    assert hits == lower_tier_hits(chains, policy, capacity)
    files = chunk_files(backend)
    assert len(files) == backend.used_files() == capacity
    key = bytes.fromhex(os.path.basename(files[0]))
    payload = memoryview(bytearray(64))
    assert backend.read_into([key], [payload], HEADER_BYTES)[0].payload_bytes == 64
    assert bytes(payload) == key.rjust(64, b".")


def test_a_file_being_read_is_never_evicted(tmp_path, monkeypatch):
    """A store needing room while a read is under way evicts another file, even the more recent
    one: read_into pins what it reads until it has read it."""
    backend = DiskBackend(DiskSettings(tmp_path, bytes_for(2, 64), stripes=1), namespace(), 64)
    rows = np.random.default_rng(0).integers(0, 256, (3, 64), dtype=np.uint8)
    headers = [
        encode_header(namespace().digest, b"w" * 8, memoryview(row), key)
        for key, row in zip(KEYS, rows)
    ]
    assert backend.write(KEYS[:2], headers[:2], [memoryview(r) for r in rows[:2]]) == [True] * 2
    reading, release = threading.Event(), threading.Event()
    read_file = DiskBackend._read_file

    def held_read(self, key, payload):
        reading.set()
        release.wait(10)
        return read_file(self, key, payload)

    monkeypatch.setattr(DiskBackend, "_read_file", held_read)
    out, answers = memoryview(bytearray(64)), []
    reader = threading.Thread(
        target=lambda: answers.append(backend.read_into(KEYS[:1], [out], HEADER_BYTES))
    )
    reader.start()
    try:
        assert reading.wait(10)
        backend.touch(KEYS[1:2])  # KEYS[0] is now the least recent, what a store would evict
        assert backend.write(KEYS[2:3], headers[2:], [memoryview(rows[2])]) == [True]
        assert backend.exists(KEYS[:3]) == [True, False, True]
    finally:
        release.set()
        reader.join(10)
    assert answers[0][0] is not None and bytes(out) == rows[0].tobytes()


@pytest.mark.parametrize(
    "damage, check",
    [
        ("flip a payload byte", "checksum"),
        ("truncate the payload", "length"),
        ("flip a namespace byte", "namespace"),
        ("overwrite the magic", "format"),
    ],
)
def test_a_damaged_file_is_never_loaded_and_is_removed(
    tmp_path, caplog, header_place, damage, check
):
    pool = aligned_pool(4, 2)
    tier = disk_tier(tmp_path, pool)
    tier.submit_store("s", KEYS[:2], [0, 1])
    finished(tier)
    path = tier.backend._path(KEYS[0])
    payload_at = tier.backend.payload_offset
    header = bytearray(stored_header(tier.backend, path))
    with open(path, "r+b") as file:
        if damage == "flip a payload byte":
            file.seek(payload_at + 1234)
            byte = file.read(1)
            file.seek(payload_at + 1234)
            file.write(bytes([byte[0] ^ 1]))
        elif damage == "truncate the payload":
            file.truncate(payload_at + CHUNK_BYTES // 2)
        elif damage == "flip a namespace byte":
            header[8] ^= 0xFF
        else:
            header[:4] = b"XXXX"
    if header != stored_header(tier.backend, path):
        store_header(tier.backend, path, bytes(header))
    pool[2:4] = 7
    tier.submit_load("l", KEYS[:2], [2, 3])
    job = finished(tier)["l"]
    assert not job.success and job.failed_keys == (KEYS[0],)
    assert f"failed its {check} check" in caplog.text
    np.testing.assert_array_equal(pool[3], pool[1])  # row 2 went back unused, whatever it holds
    assert not os.path.exists(path) and tier.counters.integrity_failures == 1
    assert tier.contains(KEYS[:2]) == [False, True]
    assert tier.backend.used_files() == 1
    tier.submit_store("again", KEYS[:1], [0])
    finished(tier)
    tier.submit_load("l2", KEYS[:1], [2])
    assert finished(tier)["l2"].success
    np.testing.assert_array_equal(pool[2], pool[0])


WRITER_KILLED_BEFORE_RENAME = """
import os, sys, time
import numpy as np
from numbakv.tiers import ChunkTier
from numbakv.tiers.disk import DiskBackend, DiskSettings
from tests.support.disk_tier import CHUNK_BYTES, FILE_BYTES, random_pool
from tests.support.tiers import namespace

def stuck(source, target):  # the writer dies here: the chunk is written, not renamed
    print(source, flush=True)
    time.sleep(60)

os.replace = stuck
pool = random_pool(1, 3)
tier = ChunkTier(DiskBackend(DiskSettings(sys.argv[1], 8 * FILE_BYTES), namespace(), CHUNK_BYTES), pool, namespace())
tier.submit_store("s", [b"half"], [0])
tier.drain()
"""


def test_a_writer_killed_before_its_rename_leaves_nothing_visible(tmp_path):
    root = str(tmp_path)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER_KILLED_BEFORE_RENAME, root],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    temp = writer.stdout.readline().strip()
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    whole = CHUNK_BYTES if disk_module._attributes_work(root) else FILE_BYTES
    assert os.path.getsize(temp) == whole  # the whole chunk, under its temporary name
    tier = disk_tier(root, random_pool(1, 4), files=8)
    assert tier.contains([b"half"]) == [False]
    assert not os.path.exists(temp) and chunk_files(tier.backend) == []


@pytest.mark.parametrize("writer", ["another process", "another backend of this process"])
def test_a_live_writers_temporary_file_is_left_alone(tmp_path, writer):
    backend = DiskBackend(DiskSettings(tmp_path, 8 * FILE_BYTES), namespace(), CHUNK_BYTES)
    pid = os.getppid() if writer == "another process" else os.getpid()
    temp = f"{backend.directory}/ab/.ab.{pid}.0.tmp"
    open(temp, "wb").close()
    DiskBackend(DiskSettings(tmp_path, 8 * FILE_BYTES), namespace(), CHUNK_BYTES)
    assert os.path.exists(temp)
    old = time.time() - disk_module.STALE_TEMP_S - 1
    os.utime(temp, (old, old))
    DiskBackend(DiskSettings(tmp_path, 8 * FILE_BYTES), namespace(), CHUNK_BYTES)
    assert not os.path.exists(temp)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 48 KiB tmpfs mount: room for six chunk files of 8 KiB (four of 12 KiB, with a header
    block)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount_point)],
        check=False,
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {mounted.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_a_full_file_system_refuses_stores_and_keeps_what_it_holds(small_tmpfs):
    pool = aligned_pool(16, 5)
    tier = disk_tier(small_tmpfs, pool, files=64)  # the index allows far more than the mount
    keys = [b"full-%d" % i for i in range(8)]
    tier.submit_store("s", keys, range(8))
    job = finished(tier)["s"]
    stored = [key for key in keys if key not in job.failed_keys]
    assert 0 < len(stored) < 8 and tier.counters.dropped_stores == 8 - len(stored)
    assert tier.backend.used_files() == len(stored)
    assert len(chunk_files(tier.backend)) == len(stored)  # no temporary file left behind
    assert tier.contains(keys) == [key in stored for key in keys]
    tier.submit_load("l", stored, range(8, 8 + len(stored)))
    assert finished(tier)["l"].success
    # which stores found room depends on the order the stripes wrote in
    np.testing.assert_array_equal(pool[8 : 8 + len(stored)], pool[[keys.index(k) for k in stored]])
    tier.backend.delete(stored[:2])  # room again
    tier.submit_store("s2", job.failed_keys[:2], [keys.index(k) for k in job.failed_keys[:2]])
    assert finished(tier)["s2"].success


def test_a_restart_serves_what_is_there_newest_first_within_its_bound(tmp_path, header_place):
    pool = aligned_pool(12, 6)
    keys = [b"restart-%d" % i for i in range(6)]
    tier = disk_tier(tmp_path, pool, files=8)
    tier.submit_store("s", keys, range(6))
    finished(tier)
    tier.close()
    for age, key in enumerate(reversed(keys)):  # keys[0] oldest
        written = time.time() - 100 - age
        os.utime(tier.backend._path(key), (written, written))
    directory = tier.backend.directory
    open(f"{directory}/00/not-a-chunk", "wb").close()
    with open(f"{directory}/00/00ff", "wb") as short:  # no whole chunk is this size
        short.write(b"x" * 100)

    restarted = disk_tier(tmp_path, pool, files=4)  # a smaller bound: the oldest two go
    assert restarted.contains(keys) == [False, False, True, True, True, True]
    assert not os.path.exists(f"{directory}/00/00ff")
    assert os.path.exists(f"{directory}/00/not-a-chunk")
    assert len(chunk_files(restarted.backend)) == 5  # four chunks and the stranger
    restarted.submit_load("l", keys[2:], range(6, 10))
    assert finished(restarted)["l"].success
    np.testing.assert_array_equal(pool[6:10], pool[2:6])
    assert restarted.counters.loaded_other == 4  # another writer: the tier before the restart


def test_a_restart_drops_the_files_of_a_header_block_where_headers_are_attributes(
    tmp_path, monkeypatch
):
    """Files written with the header in front (a file system without attributes, or a numbakv
    before headers moved there) are of no chunk's size where headers are attributes: deleted."""
    pool = aligned_pool(4, 8)
    monkeypatch.setattr(disk_module, "_attributes_work", lambda directory: False)
    before = disk_tier(tmp_path, pool)
    before.submit_store("s", KEYS[:2], [0, 1])
    finished(before)
    before.close()
    monkeypatch.undo()
    after = disk_tier(tmp_path, pool)
    if not after.backend.header_in_attribute:
        pytest.skip("this file system keeps no extended attributes")
    assert after.contains(KEYS[:2]) == [False, False] and chunk_files(after.backend) == []
    after.submit_store("again", KEYS[:1], [0])
    assert finished(after)["again"].success
    after.submit_load("l", KEYS[:1], [2])
    assert finished(after)["l"].success
    np.testing.assert_array_equal(pool[2], pool[0])


def test_a_directory_another_namespace_wrote_is_never_loaded(tmp_path):
    pool = aligned_pool(4, 7)
    other = disk_tier(tmp_path / "other", pool, ns=namespace(model="another"))
    other.submit_store("s", KEYS[:2], [0, 1])
    finished(other)
    ours = disk_tier(tmp_path, pool)
    assert ours.contains(KEYS[:2]) == [False, False]  # the namespaces' directories differ
    os.rmdir(ours.backend.directory + "/00")  # and if the other's files are put under ours:
    shutil.copytree(other.backend.directory, ours.backend.directory, dirs_exist_ok=True)
    assert ours.contains(KEYS[:2]) == [True, True]
    ours.submit_load("l", KEYS[:2], [2, 3])
    assert finished(ours)["l"].failed_keys == tuple(KEYS[:2])
    assert ours.counters.integrity_failures == 2 and ours.counters.loaded_other == 0
    assert ours.contains(KEYS[:2]) == [False, False] and chunk_files(ours.backend) == []


def test_two_backends_sharing_a_directory_serve_each_other(tmp_path):
    pool_a, pool_b = aligned_pool(4, 8), aligned_pool(4, 9)
    a = disk_tier(tmp_path, pool_a, files=2, track_removals=True)
    b = disk_tier(tmp_path, pool_b, files=2)
    a.submit_store("s", KEYS[:2], [0, 1])
    finished(a)
    assert b.contains(KEYS[:2]) == [True, True]
    b.submit_load("l", KEYS[:2], [2, 3])
    assert finished(b)["l"].success
    np.testing.assert_array_equal(pool_b[2:4], pool_a[:2])
    assert b.counters.loaded_other == 2
    a.touch(KEYS[1:2])
    a.submit_store("evict", KEYS[2:3], [2])  # a's bound evicts its least recent file
    finished(a)
    assert a.backend.take_removed() == [KEYS[0]] and a.backend.take_removed() == []
    assert b.contains(KEYS[:3]) == [False, True, True]
    assert b.backend.used_files() == 2


def test_a_store_of_a_file_another_engine_removed_writes_it_anew(tmp_path):
    """a's index still lists KEYS[0] once b's bound has evicted its file: a's next store of it
    writes the file (before, it answered success and wrote nothing, and the chunk was lost)."""
    pool_a, pool_b = aligned_pool(4, 16), aligned_pool(4, 17)
    a = disk_tier(tmp_path, pool_a, files=2, track_removals=True)
    b = disk_tier(tmp_path, pool_b, files=2)
    a.submit_store("s", KEYS[:1], [0])
    finished(a)
    assert b.contains(KEYS[:1]) == [True]  # b's index takes a's file in
    b.submit_store("s", KEYS[1:3], [1, 2])  # b's bound evicts a's file
    finished(b)
    assert a.backend.indexed(KEYS[:1]) == [True] and len(chunk_files(a.backend)) == 2
    a.submit_store("again", KEYS[:1], [0])
    assert finished(a)["again"].success
    assert len(chunk_files(a.backend)) == 3 and a.backend.take_removed() == []  # kept, rewritten
    b.submit_load("l", KEYS[:1], [3])
    assert finished(b)["l"].success
    np.testing.assert_array_equal(pool_b[3], pool_a[0])


def disk_backend(tmp_path, files: int = 4) -> DiskBackend:
    return DiskBackend(
        DiskSettings(tmp_path, bytes_for(files, CHUNK_BYTES), stripes=1), namespace(), CHUNK_BYTES
    )


def write_one(backend: DiskBackend, key: bytes, seed: int = 0) -> list[bool]:
    payload = memoryview(aligned_pool(1, seed)[0])
    header = encode_header(backend._namespace, b"w" * 8, payload, key)
    return backend.write([key], [header], [payload])


def test_a_lookup_that_raced_a_store_of_its_key_leaves_the_new_file_indexed(tmp_path):
    """The lookup saw no file, then the store of its key ended before it took the lock: before,
    it dropped the key from the index, and the file stayed in no index, never evicted (the
    directory grew past its bound for good)."""
    backend = disk_backend(tmp_path)
    on_disk = backend._on_disk

    def store_meanwhile(keys):
        seen = on_disk(keys)
        backend._on_disk = on_disk
        assert write_one(backend, KEYS[0]) == [True]
        return seen

    backend._on_disk = store_meanwhile
    assert backend.exists(KEYS[:1]) == [False]  # a miss this once
    assert backend.indexed(KEYS[:1]) == [True] and backend.exists(KEYS[:1]) == [True]
    for key in KEYS[1:]:
        write_one(backend, key)
    write_one(backend, b"one-more")  # past the bound of 4: the oldest file is evicted
    assert len(chunk_files(backend)) == backend.used_files() == 4


def test_a_rewrite_of_a_file_gone_while_a_read_holds_its_key_writes_it(tmp_path):
    backend = disk_backend(tmp_path)
    assert write_one(backend, KEYS[0]) == [True]
    backend._index.prepare_load(KEYS[:1])  # a read of it under way
    os.remove(backend._path(KEYS[0]))  # another engine's bound evicted the file
    assert write_one(backend, KEYS[0], seed=1) == [True]
    assert os.path.exists(backend._path(KEYS[0]))  # before: True answered, no file written
    backend._index.complete_load(KEYS[:1])


def test_a_store_of_a_key_another_job_is_storing_vouches_for_nothing(tmp_path):
    backend = disk_backend(tmp_path)
    backend._index.prepare_store(KEYS[:1])  # another job's write of it under way
    assert write_one(backend, KEYS[0]) == [False]  # before: True, with no file written
    backend._index.complete_store(KEYS[:1], False)  # that write failed: the key never existed
    assert backend.exists(KEYS[:1]) == [False]


def test_a_delete_leaves_the_file_a_store_of_this_process_is_landing(tmp_path):
    """clear() or a corrupt chunk's delete, between a store's rename and its completion."""
    backend = disk_backend(tmp_path)
    plan = backend._index.prepare_store(KEYS[:1])
    assert plan.block_hashes_to_store == KEYS[:1]
    payload = memoryview(aligned_pool(1, 2)[0])
    header = encode_header(backend._namespace, b"w" * 8, payload, KEYS[0])
    assert backend._write_file(KEYS[0], header, payload)  # renamed into place
    assert backend.clear() == 1
    backend._index.complete_store(KEYS[:1])
    assert os.path.exists(backend._path(KEYS[0])) and backend.exists(KEYS[:1]) == [True]


def test_a_file_that_cannot_be_opened_is_a_miss_for_its_key_alone(tmp_path, caplog):
    pool = aligned_pool(6, 18)
    tier = disk_tier(tmp_path, pool)
    tier.submit_store("s", KEYS[:3], [0, 1, 2])
    finished(tier)
    path = tier.backend._path(KEYS[1])
    os.remove(path)
    os.mkdir(path)  # EISDIR, or EINVAL under O_DIRECT: not "not found"
    tier.submit_load("l", KEYS[:3], [3, 4, 5])
    assert finished(tier)["l"].failed_keys == (KEYS[1],)  # before: the whole batch failed
    np.testing.assert_array_equal(pool[[3, 5]], pool[[0, 2]])
    assert tier.contains(KEYS[:3]) == [True, False, True]  # a miss from now on
    assert "opening" in caplog.text and "Traceback" not in caplog.text


def test_a_directory_where_no_file_can_be_made_is_refused_when_opened(tmp_path, monkeypatch):
    open_file = os.open

    def read_only(path, flags, *mode):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return open_file(path, flags, *mode)

    disk_backend(tmp_path).close()  # the directory exists, as a tier's would
    monkeypatch.setattr(disk_module.os, "open", read_only)
    with pytest.raises(TierOpenError, match="Read-only file system"):
        open_tier(
            f"dir:{tmp_path}?bytes_to_use={bytes_for(4, CHUNK_BYTES)}",
            aligned_pool(1, 0),
            namespace(),
        )


def test_clear_removes_the_namespaces_files_another_engine_wrote_too(tmp_path):
    pool_a, pool_b = aligned_pool(4, 13), aligned_pool(4, 14)
    a = disk_tier(tmp_path, pool_a, files=8)
    b = disk_tier(tmp_path, pool_b, files=8)
    other = disk_tier(tmp_path, aligned_pool(4, 15), files=8, ns=namespace(dtype="bfloat16"))
    a.submit_store("s", KEYS[:2], [0, 1])
    b.submit_store("s", KEYS[2:3], [0])
    other.submit_store("s", KEYS[:1], [0])
    finished(a), finished(b), finished(other)
    assert a.clear() == 3
    assert chunk_files(a.backend) == [] and len(chunk_files(other.backend)) == 1
    assert a.contains(KEYS[:3]) == b.contains(KEYS[:3]) == [False] * 3
    a.submit_store("again", KEYS[:1], [0])
    assert finished(a)["again"].success and a.contains(KEYS[:1]) == [True]


def test_files_joining_a_full_index_never_evict_their_own_batchs_files(tmp_path):
    pool_a, pool_b = aligned_pool(6, 10), aligned_pool(4, 11)
    a = disk_tier(tmp_path, pool_a, files=2)
    b = disk_tier(tmp_path, pool_b, files=4)
    a.submit_store("s", KEYS[:2], [0, 1])  # a's index is full, KEYS[0] its least recent file
    b.submit_store("s", KEYS[2:4], [2, 3])  # files a's index does not know yet
    finished(a), finished(b)
    # KEYS[0] is ready; KEYS[2] joins a's index in its place, evicting KEYS[1]; KEYS[3] finds
    # both of a's places taken by this batch and is a miss.
    a.submit_load("l", [KEYS[0], KEYS[2], KEYS[3]], [3, 4, 5])
    assert finished(a)["l"].failed_keys == (KEYS[3],)
    np.testing.assert_array_equal(pool_a[3], pool_a[0])
    np.testing.assert_array_equal(pool_a[4], pool_b[2])
    assert a.backend.used_files() == 2 and not a.backend._leaving
    assert a.contains(KEYS[:3]) == [True, False, True]
    a.submit_store("again", KEYS[:1], [0])
    assert finished(a)["again"].success


class FailingHeaders(list):
    """A store's headers, the last of which fails to be made."""

    def __getitem__(self, position):
        if position == len(self) - 1:
            raise RuntimeError("no header")
        return super().__getitem__(position)


@pytest.mark.parametrize("stripes", [1, 4])
def test_a_store_that_fails_midway_leaves_no_key_half_stored(tmp_path, stripes):
    backend = DiskBackend(
        DiskSettings(tmp_path, 4 * FILE_BYTES, stripes=stripes), namespace(), CHUNK_BYTES
    )
    pool = aligned_pool(2, 12)
    keys, payloads = KEYS[:2], [memoryview(row) for row in pool]
    headers = [encode_header(namespace().digest, b"w" * 8, p, k) for k, p in zip(keys, payloads)]
    with pytest.raises(RuntimeError, match="no header"):
        backend.write(keys, FailingHeaders(headers), payloads)
    assert backend.used_files() == 0  # none left being stored (a whole file may be found)
    assert backend.write(keys, headers, payloads) == [True, True]
    assert backend.exists(keys) == [True, True] and len(chunk_files(backend)) == 2
    assert backend.used_files() == 2


def test_a_failed_file_is_raised_only_once_every_other_stripe_has_ended(tmp_path, monkeypatch):
    """The rows of a failed batch go back to the caller: no stripe may still be writing from one."""
    ended = []
    real = DiskBackend._write_file

    def slow(self, key, header, payload):
        time.sleep(0.05)
        written = real(self, key, header, payload)
        ended.append(key)
        return written

    monkeypatch.setattr(DiskBackend, "_write_file", slow)
    backend = DiskBackend(
        DiskSettings(tmp_path, 8 * FILE_BYTES, stripes=4), namespace(), CHUNK_BYTES
    )
    pool = aligned_pool(4, 13)
    keys, payloads = KEYS[:4], [memoryview(row) for row in pool]
    headers = [encode_header(namespace().digest, b"w" * 8, p, k) for k, p in zip(keys, payloads)]
    with pytest.raises(RuntimeError, match="no header"):
        backend.write(keys, FailingHeaders(headers), payloads)
    assert sorted(ended) == sorted(keys[:3])


@pytest.mark.parametrize(
    "arguments, error, named",
    [
        ({"namespace": "ns"}, TypeError, "namespace"),
        ({"chunk_bytes": 0}, ValueError, "chunk_bytes"),
        ({"bytes_to_use": True}, ValueError, "bytes_to_use"),
        ({"bytes_to_use": FILE_BYTES - 1}, ValueError, "bytes_to_use"),
        ({"cache_policy": "fifo"}, ValueError, "cache policy"),
        ({"stripes": 0}, ValueError, "stripes"),
        ({"bytes_to_use": 2**70}, ValueError, r"bytes_to_use must be at most [\d,]+ \(2,147,48"),
    ],
)
def test_bad_settings_are_refused_before_the_directory_is_made(tmp_path, arguments, error, named):
    backend = {"namespace": namespace(), "chunk_bytes": CHUNK_BYTES}
    settings = {"root_dir": tmp_path / "kv", "bytes_to_use": FILE_BYTES}
    for key, value in arguments.items():
        (backend if key in backend else settings)[key] = value
    with pytest.raises(error, match=named):
        DiskBackend(DiskSettings(**settings), **backend)
    assert not (tmp_path / "kv").exists()


def test_a_root_dir_under_the_home_directory_is_there(tmp_path, monkeypatch):
    """`~/kvcache` in a configuration, not a folder named `~` in the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert DiskSettings("~/kvcache", FILE_BYTES).root_dir == str(tmp_path / "home" / "kvcache")
    assert not (tmp_path / "~").exists()


def test_a_key_too_long_for_a_file_name_is_refused_when_the_job_is_submitted(tmp_path):
    """It used to fail on the tier's thread, logged, on every store of it."""
    tier = disk_tier(tmp_path, random_pool(2, 5))
    with pytest.raises(ValueError, match="keys must be at most 100 bytes in this store"):
        tier.submit_store(1, [b"x" * 101], [0])
    with pytest.raises(ValueError, match="keys must be at most 100 bytes in this store"):
        tier.lookup([b"x" * 101])
    tier.close()


def test_a_backend_takes_its_settings_as_one_object(tmp_path):
    with pytest.raises(TypeError, match="settings must be DiskSettings, got dict"):
        DiskBackend({"root_dir": tmp_path, "bytes_to_use": FILE_BYTES}, namespace(), CHUNK_BYTES)


def test_bad_writes_are_refused_before_a_file_is_written(tmp_path):
    backend = DiskBackend(DiskSettings(tmp_path, 4 * FILE_BYTES), namespace(), 64)
    header = encode_header(namespace().digest, b"w" * 8, memoryview(bytes(64)))
    with pytest.raises(ValueError, match="keys must be at most 100 bytes"):
        backend.write([b"k", b"x" * 101], [header] * 2, [memoryview(bytes(64))] * 2)
    with pytest.raises(ValueError, match="payloads must be chunk_bytes"):
        backend.write([b"k"], [header], [memoryview(bytes(65))])
    assert backend.exists([b"k"]) == [False] and chunk_files(backend) == []


def test_a_store_racing_the_removal_of_its_keys_old_file_is_dropped_not_lost(tmp_path, monkeypatch):
    """Room for two files: storing a third evicts the first, whose file is removed outside the
    lock. A store of that key in between would be a file the removal takes with it (the index
    holding a chunk that is gone): it is refused instead, and the key can be stored once its old
    file has gone."""
    backend = DiskBackend(
        DiskSettings(tmp_path, bytes_for(2, CHUNK_BYTES)), namespace(), CHUNK_BYTES
    )
    pool = aligned_pool(3, 11)

    def write(key: bytes, row: int) -> bool:
        payload = memoryview(pool[row])
        header = encode_header(namespace().digest, b"w" * 8, payload, key)
        (stored,) = backend.write([key], [header], [payload])
        return stored

    assert write(b"first", 0) and write(b"second", 1)
    raced = []
    remove = disk_module._remove_quietly

    def remove_after_a_racing_store(path: str) -> None:
        if path == backend._path(b"first") and not raced:
            raced.append(write(b"first", 2))  # another thread's store, in the window
        remove(path)

    monkeypatch.setattr(disk_module, "_remove_quietly", remove_after_a_racing_store)
    assert write(b"third", 2)
    assert raced == [False]  # refused, not reported stored and then lost
    assert backend.exists([b"first", b"second", b"third"]) == [False, True, True]
    assert write(b"first", 0) and backend.exists([b"first"]) == [True]


def occupy_with_a_directory(path: str) -> None:
    """Put a non-empty directory where a chunk file was: unlinking it fails (EISDIR, even as root)."""
    os.unlink(path)
    os.makedirs(f"{path}/inside")


def test_an_evicted_file_that_cannot_be_removed_leaves_the_index_whole(tmp_path, caplog):
    pool = random_pool(4, 12)
    tier = disk_tier(tmp_path, pool, files=2)
    tier.submit_store("a", KEYS[:2], [0, 1])
    finished(tier)
    occupy_with_a_directory(tier.backend._path(KEYS[0]))  # KEYS[0] is evicted next
    tier.submit_store("b", KEYS[2:3], [2])
    assert finished(tier)["b"].success
    assert "removing" in caplog.text
    assert tier.contains(KEYS[1:3]) == [True, True]
    tier.submit_load("l", KEYS[2:3], [3])
    assert finished(tier)["l"].success
    np.testing.assert_array_equal(pool[3], pool[2])
    assert tier.backend.used_files() == 2  # no slot left stuck as being written


def test_a_restart_starts_past_an_entry_it_cannot_remove(tmp_path):
    pool = random_pool(2, 13)
    tier = disk_tier(tmp_path, pool)
    tier.submit_store("a", KEYS[:1], [0])
    finished(tier)
    tier.close()
    stranger = f"{tier.backend.directory}/00/00aa"  # a chunk's name, no chunk's size
    os.makedirs(f"{stranger}/inside")
    restarted = disk_tier(tmp_path, pool)
    assert restarted.contains(KEYS[:1]) == [True]
