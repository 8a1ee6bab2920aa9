"""`DiskBackend`: chunks as files in a local directory, bounded and evicted by numbakv's own manager.

The embedded tier that needs no server. One file per chunk, named by its key, under a directory
named by the namespace's digest; a `CPUOffloadingManager` is the index (key -> file) and its
policy picks what to evict when `bytes_to_use` is reached. A file holds the payload alone, on the
alignment O_DIRECT asks for, and the chunk header in an extended attribute (`user.numbakv`): a 2
MiB chunk is a 2 MiB file, which the disk moves in one piece (stores ran 8-38 % faster than with a
header block in front, loads as fast or up to 10 % faster). Where the file system keeps no
extended attributes, a file starts with a 4096-byte block holding the header instead, read with
the payload in one request.

Writes go to a temporary name, then are renamed: a reader sees a whole chunk or none. No fsync:
the tier is a cache and every load is checked against its header's length and XXH3-64, so what a
power loss leaves half-written is a miss, never wrong bytes, and a store costs no flush.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import mmap
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass
from typing import Any

import numpy as np

from numbakv.checks import byte_size, positive
from numbakv.manager import MAX_SIZE, CPUOffloadingManager
from numbakv.policies import resolve_policy
from numbakv.tiers.backend import BackendUnavailable, ChunkBackend, Occupancy, StoredValue
from numbakv.tiers.chunk_format import HEADER_BYTES, MAGIC, CorruptChunk, checksum, parse_header
from numbakv.tiers.namespace import Namespace
from numbakv.tiers.settings import settings_from

logger = logging.getLogger("numbakv.tiers")

ALIGNMENT = 4096
"""O_DIRECT's alignment of file offsets, lengths and buffer addresses (a page: enough for every
device's logical block); a header block is this long."""
HEADER_ATTRIBUTE = "user.numbakv"
"""The extended attribute that holds a chunk file's header."""
MAX_KEY_BYTES = 100
"""A file name is the key in hex, with room for a temporary name's suffix within 255 bytes."""
STALE_TEMP_S = 60.0
"""A temporary file this old is a crashed writer's (a write takes milliseconds)."""
_REBUILD_BATCH = 4096
_TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class DiskSettings:
    """Where the chunk files go and how many may stay; checked when built.

    `root_dir`: the directory (chunks go under `root_dir`/<namespace digest>/). `bytes_to_use`: the
    most bytes of chunk files kept, an int or a size with a unit (`500GiB`, `2TB`; an int once
    built). `cache_policy`: any numbakv policy name or import path, which
    picks what to evict past the bound. `track_removals`: remember the keys of files removed, for
    `DiskBackend.take_removed` (vLLM's KV events). `stripes`: the threads one batch's files are
    read or written on at once, so that one request's chunks reach the disk together (the queue
    depth a batch gets; 1 reads and writes them one after another on the caller's thread).
    """

    root_dir: str | os.PathLike
    bytes_to_use: int | str
    cache_policy: str = "lru"
    track_removals: bool = False
    stripes: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.root_dir, (str, os.PathLike)) or not os.fspath(self.root_dir):
            raise ValueError(f"root_dir must be a directory's path, got {self.root_dir!r}")
        # `~/kvcache` in a configuration means the home directory, not a folder named `~` here
        object.__setattr__(self, "root_dir", os.path.expanduser(self.root_dir))
        object.__setattr__(self, "bytes_to_use", byte_size("bytes_to_use", self.bytes_to_use))
        resolve_policy(self.cache_policy)
        if not isinstance(self.track_removals, bool):
            raise TypeError(f"track_removals must be true or false, got {self.track_removals!r}")
        object.__setattr__(self, "stripes", positive("stripes", self.stripes, integer=True))

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> DiskSettings:
        """Settings from a configuration's keys; an unknown or missing key is named in the error."""
        return settings_from(cls, settings, "disk tier")


class DiskBackend(ChunkBackend):
    """Chunk files under `settings.root_dir`/<namespace digest>/, at most `settings.bytes_to_use`
    of them; `chunk_bytes` is one chunk's payload (a host-pool row). Files already there are
    served after a restart. Several processes may share a directory: each one bounds the files it
    wrote or found, and serves the others'.
    """

    max_key_bytes = MAX_KEY_BYTES

    def __init__(self, settings: DiskSettings, namespace: Namespace, chunk_bytes: int) -> None:
        if not isinstance(settings, DiskSettings):
            raise TypeError(f"settings must be DiskSettings, got {type(settings).__name__}")
        if not isinstance(namespace, Namespace):
            raise TypeError(f"namespace must be a Namespace, got {type(namespace).__name__}")
        self.settings = settings
        self.chunk_bytes = chunk_bytes = positive("chunk_bytes", chunk_bytes, integer=True)
        self.file_bytes = ALIGNMENT + _aligned(chunk_bytes)
        """What one chunk file counts against `bytes_to_use`: its payload, page-aligned, and a page
        for its header (a block of the file, or an attribute and the inode it lives in)."""
        if self.settings.bytes_to_use < self.file_bytes:
            raise ValueError(
                f"bytes_to_use must hold at least one chunk file ({self.file_bytes:,} bytes for "
                f"chunks of {chunk_bytes:,}), got {self.settings.bytes_to_use:,}"
            )
        if self.settings.bytes_to_use // self.file_bytes > MAX_SIZE:
            raise ValueError(
                f"bytes_to_use must be at most {MAX_SIZE * self.file_bytes:,} ({MAX_SIZE:,} chunk "
                f"files of {self.file_bytes:,} bytes), got {self.settings.bytes_to_use:,}"
            )
        self._index = CPUOffloadingManager(
            block_size=1,
            num_blocks=self.settings.bytes_to_use // self.file_bytes,
            cache_policy=settings.cache_policy,
            enable_events=settings.track_removals,
        )
        self.directory = os.path.join(os.fspath(settings.root_dir), namespace.digest.hex())
        for fan in range(256):
            os.makedirs(os.path.join(self.directory, f"{fan:02x}"), exist_ok=True)
        self._namespace = namespace.digest
        self._lock = threading.Lock()
        self._leaving: Counter[bytes] = Counter()
        """Keys whose files are being removed, outside the lock: none is stored or adopted until
        its file is gone, or the removal would take the new file with it."""
        self._changes = 0
        """Stores and removals this process has ended (under the lock): what a look at the
        directory outside the lock is checked against (`_reconcile`)."""
        self._buffers = threading.local()
        self._temp_numbers = itertools.count()
        self.direct_io = _direct_io_works(self.directory)
        if not self.direct_io:
            logger.warning("numbakv disk tier: %s refuses O_DIRECT; buffered I/O", self.directory)
        self.header_in_attribute = _attributes_work(self.directory)
        self.payload_offset = 0 if self.header_in_attribute else ALIGNMENT
        """Where a file's payload starts: after the header block where the header is not in an
        extended attribute."""
        if not self.header_in_attribute:
            logger.info("numbakv disk tier: %s keeps no extended attributes", self.directory)
        self._rebuild()
        self._stripes = (
            ThreadPoolExecutor(settings.stripes, thread_name_prefix="numbakv-disk")
            if settings.stripes > 1
            else None
        )

    @property
    def capacity_files(self) -> int:
        return self._index.num_blocks

    def used_files(self) -> int:
        """How many chunk files the index holds (written, or being written)."""
        return self._index.stats().used

    def occupancy(self) -> Occupancy:
        return Occupancy(self.used_files(), self.capacity_files)

    # --- the ChunkBackend contract ---

    def exists(self, keys: Sequence[bytes]) -> list[bool]:
        seen, on_disk, evicted = self._changes, self._on_disk(keys), []
        with self._lock:
            ready = self._reconcile(keys, on_disk, seen, evicted)
        self._unlink(evicted)
        return ready

    def write(
        self, keys: Sequence[bytes], headers: Sequence[bytes], payloads: Sequence[memoryview]
    ) -> list[bool]:
        for key in keys:
            if len(key) > MAX_KEY_BYTES:
                raise ValueError(
                    f"keys must be at most {MAX_KEY_BYTES} bytes for a file name, got {len(key)}"
                )
        for payload in payloads:
            if payload.nbytes != self.chunk_bytes:
                raise ValueError(
                    f"payloads must be chunk_bytes ({self.chunk_bytes}) long, got {payload.nbytes}"
                )
        on_disk = self._on_disk(keys)
        index = self._index
        with self._lock:
            leaving = {key for key in keys if self._leaving[key]}
            ready = {key for key in keys if key not in leaving and index.lookup((key,))}
            # listed, but another process removed the file: written again, held meanwhile so
            # that no store evicts it
            rewrite = [key for key, there in zip(keys, on_disk) if not there and key in ready]
            index.prepare_load(rewrite)
            plan = index.prepare_store([key for key in keys if key not in leaving])
            if plan is None:
                index.complete_load(rewrite)
            else:
                self._leaving.update(plan.block_hashes_evicted)
        if plan is None:  # every file is being read or written: nothing may be evicted
            return [False] * len(keys)
        self._unlink(plan.block_hashes_evicted)
        to_write, first = {*plan.block_hashes_to_store, *rewrite}, {}
        for position, key in enumerate(keys):
            if key in to_write:
                first.setdefault(key, position)
        outcome = dict.fromkeys(first, False)  # what an error midway leaves: none stored
        try:
            # a header is taken (its payload's checksum) on the thread that writes its file
            written = self._spread(
                lambda position: self._write_file(
                    keys[position], headers[position], payloads[position]
                ),
                list(first.values()),
            )
            outcome = dict(zip(first, written))
        finally:
            with self._lock:
                planned = plan.block_hashes_to_store
                index.complete_store([key for key in planned if outcome[key]])
                index.complete_store([key for key in planned if not outcome[key]], False)
                index.complete_load(rewrite)
                index.remove([key for key in rewrite if not outcome[key]])  # its file is gone
                self._changes += 1
        # Absent from outcome: ready already (stored), or leaving, or being stored by another
        # job of this process, whose outcome this call cannot vouch for (not stored).
        return [key not in leaving and outcome.get(key, key in ready) for key in keys]

    def read_into(
        self, keys: Sequence[bytes], payloads: Sequence[memoryview], header_bytes: int
    ) -> list[StoredValue | BackendUnavailable | None]:
        seen, on_disk, evicted = self._changes, self._on_disk(keys), []
        with self._lock:
            ready = self._reconcile(keys, on_disk, seen, evicted)
            pinned = [key for key, there in zip(keys, ready) if there]
            self._index.prepare_load(pinned)  # a file being read is never evicted
        self._unlink(evicted)
        values: list[StoredValue | BackendUnavailable | None] = [None] * len(keys)
        wanted = [position for position, there in enumerate(ready) if there]
        try:
            found = self._spread(
                lambda position: self._read_file(keys[position], payloads[position]),
                wanted,
                then=lambda position, value: self._checksummed(
                    keys[position], payloads[position], value
                ),
            )
        finally:
            with self._lock:
                self._index.complete_load(pinned)
        for position, value in zip(wanted, found):
            values[position] = value
        return values

    def close(self) -> None:
        if self._stripes is not None:
            self._stripes.shutdown()

    def delete(self, keys: Sequence[bytes]) -> None:
        with self._lock:
            # a file this process is writing lands after: its store completes as it was planned
            gone = [key for key in keys if not self._index.is_being_stored(key)]
            self._index.remove(gone)
            self._leaving.update(gone)
        self._unlink(gone)

    def clear(self) -> int:
        """Every chunk file of the namespace's directory removed (a file being read is read to
        its end all the same; one being written lands after)."""
        keys = []
        for fan in os.scandir(self.directory):
            if fan.is_dir():
                for entry in os.scandir(fan.path):
                    try:
                        keys.append(bytes.fromhex(entry.name))
                    except ValueError:
                        continue  # a temporary file, or not ours
        self.delete(keys)
        return len(keys)

    def touch(self, keys: Sequence[bytes]) -> None:
        with self._lock:
            self._index.touch(keys)

    def indexed(self, keys: Sequence[bytes]) -> list[bool]:
        """Which keys the index holds ready now (in memory: no file is looked at)."""
        with self._lock:
            return [bool(self._index.lookup((key,))) for key in keys]

    def take_removed(self) -> list[bytes]:
        """Keys whose files this backend removed (evicted, damaged or gone) since the last call;
        always empty unless the backend was made with `track_removals`."""
        with self._lock:
            events = list(self._index.take_events())
        return [key for event in events if event.removed for key in event.block_hashes]

    # --- files ---

    def _path(self, key: bytes) -> str:
        name = key.hex()
        return f"{self.directory}/{name[:2]}/{name}"

    def _on_disk(self, keys: Sequence[bytes]) -> list[bool]:
        """Which keys have a file now (outside the lock: the index never waits on the disk)."""
        return [os.path.exists(self._path(key)) for key in keys]

    def _reconcile(
        self, keys: Sequence[bytes], on_disk: Sequence[bool], seen: int, evicted: list[bytes]
    ) -> list[bool]:
        """Bring the index in line with what the directory held for `keys` (under the lock):
        files another process wrote join it, files another process removed leave it; the files
        their joining evicts are added to `evicted`, for the caller to remove after the lock.
        Which keys are ready. Each key found ready is pinned until all are, so that a later key's
        joining never evicts it.

        `on_disk` was looked at before the lock, when `_changes` was `seen`: if a store or a
        removal of this process has ended since, a key whose file and index disagree may be one
        it just wrote or removed, so the index is left as it is and the key is a miss (dropping
        a file just written would leave it in no index, never evicted)."""
        index = self._index
        settled = self._changes == seen
        ready, held = [], []
        try:
            for key, there in zip(keys, on_disk):
                if index.lookup((key,)):
                    if not there and settled:
                        index.remove((key,))
                elif (
                    there and settled and not index.is_being_stored(key) and not self._leaving[key]
                ):
                    there = self._adopt(key, evicted)
                else:
                    there = False
                if there:
                    index.prepare_load((key,))
                    held.append(key)
                ready.append(there)
        finally:
            index.complete_load(held)
        return ready

    def _adopt(self, key: bytes, evicted: list[bytes]) -> bool:
        plan = self._index.prepare_store((key,))
        if plan is None:
            return False
        evicted += plan.block_hashes_evicted
        self._leaving.update(plan.block_hashes_evicted)
        self._index.complete_store((key,))
        return True

    def _unlink(self, keys: Sequence[bytes]) -> None:
        """Remove the files of `keys`, which the caller marked leaving under the lock."""
        for key in keys:
            _remove_quietly(self._path(key))
        with self._lock:
            for key in keys:
                self._leaving[key] -= 1
                if not self._leaving[key]:
                    del self._leaving[key]
            self._changes += 1

    def _spread(
        self,
        work: Callable[[int], Any],
        positions: list[int],
        then: Callable[[int, Any], Any] | None = None,
    ) -> list:
        """`work(position)` for each of `positions`, on up to `stripes` threads at once, the
        answers in order; `then(position, answer)`, where given, on the calling thread as each
        answer comes in, while the stripes go on with the next files. Every call has ended when
        this returns or raises: the rows they read into or write from go back to the caller.

        Each stripe takes the next position as it finishes one (one task a stripe, not a task a
        file): a file costs its I/O thread no trip through the pool's queue, and the GIL fewer
        hand-offs between reads. A load's checksum is `then`'s: its stripe has the next read in
        the disk's queue meanwhile, where hashing there would leave a request fewer in flight."""
        if self._stripes is None or len(positions) < 2:
            answers = [work(position) for position in positions]
            return answers if then is None else list(map(then, positions, answers))
        answers = [None] * len(positions)
        untaken = iter(enumerate(positions))  # next() is atomic: each position is taken once
        arrived: queue.SimpleQueue[int | None] = queue.SimpleQueue()

        def stripe() -> None:
            try:
                for slot, position in untaken:
                    answers[slot] = work(position)
                    arrived.put(slot)
            finally:
                arrived.put(None)  # this stripe has ended

        count = min(self.settings.stripes, len(positions))
        stripes = [self._stripes.submit(stripe) for _ in range(count)]
        try:
            ended = 0
            while ended < count:
                slot = arrived.get()
                if slot is None:
                    ended += 1
                elif then is not None:
                    answers[slot] = then(positions[slot], answers[slot])
        finally:
            wait_for_futures(stripes)
        for finished in stripes:
            finished.result()  # the first error, once every stripe has ended
        return answers

    def _io_buffer(self) -> memoryview:
        """This thread's page-aligned buffer of one file: the header block, then a payload."""
        buffer = getattr(self._buffers, "view", None)
        if buffer is None:
            buffer = self._buffers.view = memoryview(mmap.mmap(-1, self.file_bytes))
        return buffer

    def _write_file(self, key: bytes, header: bytes, payload: memoryview) -> bool:
        path = self._path(key)
        head, name = os.path.split(path)
        temp = f"{head}/.{name}.{os.getpid()}.{next(self._temp_numbers)}{_TEMP_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if self.direct_io else 0)
        try:
            buffer, pieces = self._io_buffer(), []
            if not self.header_in_attribute:
                buffer[:ALIGNMENT] = bytes(header).ljust(ALIGNMENT, b"\0")
                pieces.append(buffer[:ALIGNMENT])
            if self.direct_io and not _aligned_buffer(payload):
                padded = buffer[ALIGNMENT : ALIGNMENT + _aligned(payload.nbytes)]
                padded[: payload.nbytes] = payload
                padded[payload.nbytes :] = bytes(padded.nbytes - payload.nbytes)
                pieces.append(padded)
            else:
                pieces.append(payload)
            fd = os.open(temp, flags, 0o644)
            try:
                expected = sum(piece.nbytes for piece in pieces)
                if os.pwritev(fd, pieces, 0) != expected:
                    raise OSError(f"short write to {temp}")
                if self.header_in_attribute:
                    os.setxattr(fd, HEADER_ATTRIBUTE, bytes(header))
            finally:
                os.close(fd)
            os.replace(temp, path)
        except OSError as error:
            logger.warning("numbakv disk tier: storing %s failed: %s", key.hex(), error)
            _remove_quietly(temp)
            return False
        return True

    def _read_file(
        self, key: bytes, payload: memoryview
    ) -> StoredValue | BackendUnavailable | None:
        """The header and the payload (with a header block, in one read request), the payload
        straight into its row where O_DIRECT can move it there. The tier checks both before the
        row counts: a chunk that fails any check is a miss, and its row goes back unused."""
        flags = os.O_RDONLY | (os.O_DIRECT if self.direct_io else 0)
        try:
            fd = os.open(self._path(key), flags)
        except FileNotFoundError:
            return None
        except OSError as error:  # this key's alone: a miss, the batch's other files still load
            logger.warning("numbakv disk tier: opening %s failed: %s", key.hex(), error)
            if error.errno in (errno.EMFILE, errno.ENFILE):  # no file descriptor left, for now
                return BackendUnavailable(error.strerror)
            return None  # unreadable here (a directory at its path, another user's file)
        buffer = self._io_buffer()
        straight = not self.direct_io or _aligned_buffer(payload)
        into = payload if straight else buffer[ALIGNMENT:]
        pieces = [into] if self.header_in_attribute else [buffer[:ALIGNMENT], into]
        try:
            header = _stored_header(fd) if self.header_in_attribute else None
            got = os.preadv(fd, pieces, 0)
        except OSError as error:
            logger.warning("numbakv disk tier: reading %s failed: %s", key.hex(), error)
            return None
        finally:
            os.close(fd)
        found = min(max(0, got - self.payload_offset), payload.nbytes)  # short: a length failure
        if not straight:
            payload[:found] = buffer[ALIGNMENT : ALIGNMENT + found]
        if header is None:
            header = bytes(buffer[: min(got, HEADER_BYTES)])
        return StoredValue(header, found)

    def _checksummed(
        self, key: bytes, payload: memoryview, value: StoredValue | BackendUnavailable | None
    ) -> StoredValue | BackendUnavailable | None:
        """`value` with its payload's checksum where the tier will check it: whole, and of this
        namespace (the tier's own check names any other failure)."""
        if not isinstance(value, StoredValue) or value.payload_bytes != payload.nbytes:
            return value
        try:
            ours = parse_header(value.header).namespace == self._namespace
        except CorruptChunk:
            return value
        return value._replace(checksum=checksum(payload, key)) if ours else value

    def _rebuild(self) -> None:
        """Index the chunk files already here, oldest first; drop crashed writers' temporaries
        and files whose size no whole chunk has."""
        found = []
        for fan in os.scandir(self.directory):
            if not fan.is_dir():
                continue
            for entry in os.scandir(fan.path):
                if entry.name.endswith(_TEMP_SUFFIX):
                    if _stale_temp(entry):
                        _remove_quietly(entry.path)
                    continue
                try:
                    key = bytes.fromhex(entry.name)
                    stat = entry.stat()
                except (ValueError, FileNotFoundError):
                    continue  # not a chunk file, or removed meanwhile
                if stat.st_size - self.payload_offset in (
                    self.chunk_bytes,
                    _aligned(self.chunk_bytes),
                ):
                    found.append((stat.st_mtime_ns, key))
                else:
                    _remove_quietly(entry.path)
        found.sort()
        keys = [key for _, key in found]
        step = min(_REBUILD_BATCH, self._index.num_blocks)
        for start in range(0, len(keys), step):
            batch = keys[start : start + step]
            plan = self._index.prepare_store(batch)
            self._leaving.update(plan.block_hashes_evicted)
            self._unlink(plan.block_hashes_evicted)  # more files than bytes_to_use: the oldest go
            self._index.complete_store(batch)
        list(self._index.take_events())  # what a restart finds is no news
        if keys:
            logger.info(
                "numbakv disk tier: %d chunk files in %s (%d kept)",
                len(keys),
                self.directory,
                self.used_files(),
            )


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _aligned_buffer(buffer: memoryview) -> bool:
    """Whether O_DIRECT can move `buffer` as it is: page-aligned address and length."""
    address = np.frombuffer(buffer, np.uint8).ctypes.data
    return address % ALIGNMENT == 0 and buffer.nbytes % ALIGNMENT == 0


@contextlib.contextmanager
def _probe_file(directory: str, purpose: str) -> Iterator[str]:
    """An empty file in `directory` to probe what its file system takes, removed afterwards;
    OSError where no file can be made there at all (a read-only file system, say)."""
    probe = os.path.join(directory, f".{purpose}-probe.{os.getpid()}{_TEMP_SUFFIX}")
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    try:
        yield probe
    finally:
        _remove_quietly(probe)


def _direct_io_works(directory: str) -> bool:
    """Whether O_DIRECT writes and reads work here (tmpfs and some overlay or network file
    systems refuse them), probed with one aligned block."""
    block = memoryview(mmap.mmap(-1, ALIGNMENT))
    with _probe_file(directory, "direct") as probe:
        if not hasattr(os, "O_DIRECT"):
            return False
        try:
            fd = os.open(probe, os.O_RDWR | os.O_DIRECT)
            try:
                return os.pwritev(fd, [block], 0) == ALIGNMENT == os.preadv(fd, [block], 0)
            finally:
                os.close(fd)
        except OSError:
            return False


def _attributes_work(directory: str) -> bool:
    """Whether files here keep user extended attributes (ext4, XFS, Btrfs and tmpfs since Linux
    6.6 do; some network and FUSE file systems do not)."""
    with _probe_file(directory, "attribute") as probe:
        try:
            os.setxattr(probe, HEADER_ATTRIBUTE, MAGIC)
            return os.getxattr(probe, HEADER_ATTRIBUTE) == MAGIC
        except (OSError, AttributeError):  # AttributeError: a platform without them
            return False


def _stored_header(fd: int) -> bytes:
    """A chunk file's header from its extended attribute; empty where it has none (not a chunk
    file of this layout: the header's check names it)."""
    try:
        return os.getxattr(fd, HEADER_ATTRIBUTE)
    except OSError as error:
        if error.errno == errno.ENODATA:
            return b""
        raise


def _stale_temp(entry: os.DirEntry) -> bool:
    """A temporary file no writer will rename: its process is gone, or it is older than any write
    takes. One named with this process's pid goes by its age alone: another backend of this process
    may be writing it."""
    try:
        age = time.time() - entry.stat().st_mtime
    except FileNotFoundError:
        return False
    try:
        pid = int(entry.name[: -len(_TEMP_SUFFIX)].rsplit(".", 2)[-2])
    except (ValueError, IndexError):
        return age > STALE_TEMP_S
    return age > STALE_TEMP_S or (pid != os.getpid() and not _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _remove_quietly(path: str) -> None:
    """Remove a file, gone already or not; one that cannot be removed is logged and left (the
    index forgets it all the same, and a file left there is checked like any other when read)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass  # another process sharing the directory removed it first
    except OSError as error:
        logger.warning("numbakv disk tier: removing %s failed: %s", path, error)
