"""The shared metrics directory: which files count, reading them safely, merging them per family.

prometheus-client's multiprocess mode gives every process its own memory-mapped files in
``PROMETHEUS_MULTIPROC_DIR``: ``counter_PID.db``, ``histogram_PID.db``, ``summary_PID.db`` and
``gauge_MODE_PID.db``. Each file is a 4-byte count of the bytes in use, 4 bytes of padding, then
entries of a 4-byte key length, the UTF-8 key (a JSON list ``[metric, sample, labels, help]``)
padded to 8-byte alignment, and two doubles: value and timestamp. This module adds what the library
leaves to whoever reads the directory:

- **Names.** Besides the library's own files, the directory holds numbakv's lock files and the
  files of compaction (:mod:`numbakv.metrics.compaction`): ``KIND_compacted-G.db`` holds the merged
  data of dead writers, generation ``G``; a dead writer's file being folded in is first renamed to
  ``NAME.in-compacted-G``. :func:`list_directory` says which files a reader merges in every state
  a compaction can be interrupted in, so that no data is counted twice or lost.
- **Reading.** :func:`read_file` opens regular files only (no FIFO, socket or device, no symbolic
  or hard link), never blocks, reads at most ``MAX_FILE_BYTES``, and type-checks every key.
- **Merging.** :func:`merge` uses prometheus-client's own accumulation, one metric family at a
  time, so that a file whose data cannot be merged (a type clash, a bucket bound that is not a
  number) is found and skipped alone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import struct
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client.metrics import Gauge
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

MAX_FILE_BYTES = 16 << 20
"""The largest metrics file read (a process's file holds about 100 bytes per series)."""

DIRECTORY_LOCK = "numbakv-directory.lock"
"""Compaction holds it exclusively; readers hold it shared while they list and read."""

GAUGE_MODES = frozenset(Gauge._MULTIPROC_MODES)
COMPACTED = "compacted-"

_DB = re.compile(r"(counter|histogram|summary|gauge_([a-z]+))_([A-Za-z0-9-]+)\.db")
_SET_ASIDE = re.compile(r"(.+\.db)\.in-compacted-(\d+)")
_WRITER_LOCK = re.compile(r"numbakv-writer-(\d+)\.lock")
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_PAGE = 4096


@dataclass(frozen=True)
class DbFile:
    """A metrics file: its name in the directory, what it holds, and which process wrote it."""

    name: str
    kind: str
    """``counter``, ``histogram``, ``summary`` or ``gauge_MODE``."""
    owner: str
    """The writer's process identifier (its PID), or ``compacted-G`` for compacted data."""

    @property
    def typ(self) -> str:
        return self.kind.partition("_")[0]

    @property
    def live(self) -> bool:
        """A gauge that counts only while its writer runs (prometheus-client's ``live*`` modes)."""
        return self.kind.startswith("gauge_live")

    @property
    def pid(self) -> int | None:
        return int(self.owner) if self.owner.isdigit() else None

    @property
    def generation(self) -> int | None:
        return int(self.owner[len(COMPACTED) :]) if self.owner.startswith(COMPACTED) else None


def compacted_name(kind: str, generation: int) -> str:
    return f"{kind}_{COMPACTED}{generation}.db"


def writer_lock_name(pid: int) -> str:
    return f"numbakv-writer-{pid}.lock"


def parse_name(name: str) -> DbFile | None:
    """The file ``name`` stands for, if prometheus-client (or compaction) writes such names."""
    match = _DB.fullmatch(name)
    if match is None or (match[2] is not None and match[2] not in GAUGE_MODES):
        return None
    return DbFile(name, match[1], match[3])


@dataclass
class Listing:
    """A directory's names, sorted out (see :func:`list_directory`)."""

    files: list[DbFile] = field(default_factory=list)
    """What a reader merges."""
    writers: dict[int, str] = field(default_factory=dict)
    """PID to lock file, for every writer that announced itself (see :mod:`.liveness`)."""
    unknown: list[str] = field(default_factory=list)
    """``*.db`` names that prometheus-client does not write: never opened."""
    leftovers: list[str] = field(default_factory=list)
    """Files an interrupted compaction left that hold nothing to count (superseded, folded already,
    temporary): recovery removes them."""
    orphans: dict[str, str] = field(default_factory=dict)
    """Files set aside by a compaction that never committed, to their original names: they still
    count, and recovery renames them back."""


def list_directory(names: Iterable[str]) -> Listing:
    """Sort a directory's names: of each kind's compacted files, only the newest generation counts;
    a file set aside for generation G counts unless that kind's compaction reached G."""
    listing = Listing()
    files, set_aside = [], []
    for name in sorted(names):
        if (db := parse_name(name)) is not None:
            files.append(db)
        elif (match := _SET_ASIDE.fullmatch(name)) and (db := parse_name(match[1])) is not None:
            set_aside.append((DbFile(name, db.kind, db.owner), int(match[2]), db.name))
        elif (match := _WRITER_LOCK.fullmatch(name)) is not None:
            listing.writers[int(match[1])] = name
        elif name.endswith(".db.tmp") and parse_name(name[: -len(".tmp")]) is not None:
            listing.leftovers.append(name)
        elif name.endswith(".db"):
            listing.unknown.append(name)
    newest: dict[str, int] = {}
    for db in files:
        if db.generation is not None:
            newest[db.kind] = max(newest.get(db.kind, 0), db.generation)
    for db in files:
        if db.generation is None or db.generation == newest[db.kind]:
            listing.files.append(db)
        else:
            listing.leftovers.append(db.name)
    for db, generation, original in set_aside:
        if newest.get(db.kind, 0) >= generation:
            listing.leftovers.append(db.name)
        else:
            listing.files.append(db)
            listing.orphans[db.name] = original
    return listing


@contextmanager
def directory_lock(dir_fd: int, exclusive: bool, timeout_s: float) -> Iterator[bool | None]:
    """Hold the directory's lock (shared or exclusive) for the block; yields True when it got it,
    False when another held it past ``timeout_s``, None where there is no lock to take (no lock
    file that a reader may open, or a file system without locks: then no one can hold it either).

    Writers create the lock file; a reader on a read-only mount finds it or does without. Waits at
    most ``timeout_s``, polling: an engine or a sidecar never hangs on another's lock.
    """
    flags = os.O_RDWR | os.O_CREAT if exclusive else os.O_RDONLY
    try:
        fd = os.open(DIRECTORY_LOCK, flags | _OPEN_FLAGS, 0o644, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            locked = flock(fd, operation, timeout_s) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        except OSError:  # a file system without locks
            locked = None
        yield locked
    finally:
        os.close(fd)  # releases the lock


def flock(fd: int, operation: int, timeout_s: float) -> bool:
    """Take an flock, polling until ``timeout_s``; whether it was taken (other errors raise)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


class Unreadable(Exception):
    """A file that is skipped; the message says why."""


Sample = tuple[str, tuple[tuple[str, str], ...], float, float]
"""(sample name, sorted label pairs, value, timestamp)."""


@dataclass(frozen=True)
class FileData:
    """One file's samples by metric family: family name to (help text, samples)."""

    file: DbFile
    families: dict[str, tuple[str, list[Sample]]]


def open_regular(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """Open ``name`` in the directory for reading if it is a regular file with one name.

    Raises :class:`Unreadable` for anything else, and ``FileNotFoundError`` when it is gone.
    """
    try:
        fd = os.open(name, os.O_RDONLY | _OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unreadable(
            "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        ) from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file (a FIFO, socket, device or directory)"
    elif info.st_nlink != 1:
        problem = f"a hard link ({info.st_nlink} names)"
    if problem is not None:
        os.close(fd)
        raise Unreadable(problem)
    return fd, info


def read_file(dir_fd: int, db: DbFile, max_bytes: int = MAX_FILE_BYTES) -> FileData:
    """Read and check one metrics file; raises :class:`Unreadable` (or ``FileNotFoundError``).

    Reads only the bytes the header says are in use (a file is allocated in 64 KiB steps).
    """
    fd, _ = open_regular(dir_fd, db.name)
    try:
        data = os.pread(fd, _PAGE, 0)
        used = struct.unpack_from("i", data, 0)[0] if len(data) >= 8 else 0
        if used > max_bytes:
            raise Unreadable(f"{used} bytes in use, over the limit of {max_bytes}")
        if used > len(data):
            data += os.pread(fd, used - len(data), len(data))
    except OSError as exc:
        raise Unreadable(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    families: dict[str, tuple[str, list[Sample]]] = {}
    typ = db.typ
    for key, value, timestamp in _entries(data, used):
        family, sample, labels, help_text = _parse_key(key, typ)
        families.setdefault(family, (help_text, []))[1].append((sample, labels, value, timestamp))
    return FileData(db, families)


def _entries(data: bytes, used: int) -> Iterator[tuple[str, float, float]]:
    """The (key, value, timestamp) entries in the first ``used`` bytes, every bound checked."""
    if used == 0:
        return  # being created: no entry yet
    if not 8 <= used <= len(data):
        raise Unreadable(f"the header says {used} bytes are in use, the file has {len(data)}")
    pos = 8
    while pos < used:
        if pos + 4 > used:
            raise Unreadable(f"an entry is cut off at byte {pos}")
        (length,) = struct.unpack_from("i", data, pos)
        value_at = pos + 4 + length + 8 - (length + 4) % 8
        if length <= 0 or value_at + 16 > used:
            raise Unreadable(f"the entry at byte {pos} overruns the {used} bytes in use")
        try:
            key = data[pos + 4 : pos + 4 + length].decode("utf-8")
        except UnicodeDecodeError:
            raise Unreadable(f"the key at byte {pos} is not UTF-8") from None
        value, timestamp = struct.unpack_from("dd", data, value_at)
        yield key, value, timestamp
        pos = value_at + 16


_parsed_keys: dict[tuple[str, str], tuple[str, str, tuple[tuple[str, str], ...], str] | str] = {}
_parsed_key_chars = 0
_MAX_PARSED_KEY_CHARS = 64 << 20
"""The most characters of keys kept parsed: a key may be long (a help text, a label value), and
keys of files long gone would otherwise pile up."""


def _parse_key(key: str, typ: str) -> tuple[str, str, tuple[tuple[str, str], ...], str]:
    """(family, sample, sorted labels, help) of a key, checked as prometheus-client writes them.

    Parsed once per distinct key and file type (the same keys recur in every read).
    """
    global _parsed_key_chars
    parsed = _parsed_keys.get((key, typ))
    if parsed is None:
        if _parsed_key_chars + len(key) > _MAX_PARSED_KEY_CHARS:
            _parsed_keys.clear()
            _parsed_key_chars = 0
        parsed = _parsed_keys[(key, typ)] = _check_key(key, typ)
        _parsed_key_chars += len(key)
    if isinstance(parsed, str):
        raise Unreadable(parsed)
    return parsed


def _check_key(key: str, typ: str) -> tuple[str, str, tuple[tuple[str, str], ...], str] | str:
    """The parsed key, or why it is not one: non-empty names, label names not Prometheus's own,
    strings that encode as UTF-8."""
    try:
        parts = json.loads(key)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python parses
        return f"a key is not JSON: {key[:80]!r}"
    if not (isinstance(parts, list) and len(parts) == 4):
        return f"a key is not [metric, sample, labels, help]: {key[:80]!r}"
    family, sample, labels, help_text = parts
    if not (isinstance(family, str) and family and isinstance(sample, str) and sample):
        return f"a metric or sample name is not a non-empty string: {key[:80]!r}"
    if not isinstance(help_text, str):
        return f"the help text of {family} is not a string"
    if not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
        return f"a label value of {family} is not a string"
    for name in labels:
        if not name or name.startswith("__"):  # `__` names are Prometheus's own (`__name__`)
            return f"a label name of {family} is empty or reserved: {name[:80]!r}"
    try:  # JSON's escapes can name a lone surrogate, which no exposition can write
        "".join((family, sample, help_text, *labels, *labels.values())).encode("utf-8")
    except UnicodeEncodeError:
        return f"a name, label or help text of {family!r} is not valid Unicode"
    if typ == "histogram" and "le" in labels:
        try:
            float(labels["le"])
        except ValueError:
            return f"a bucket bound of {family} is not a number: le={labels['le']!r}"
    return family, sample, tuple(sorted(labels.items())), help_text


T = TypeVar("T")


def merge(
    files: Sequence[FileData], accumulate: bool, render: Callable[[Metric], T]
) -> tuple[list[tuple[Metric, T]], dict[str, str]]:
    """Merge the files as prometheus-client does, one metric family at a time; returns each family
    with what ``render`` made of it, and the files skipped, with why.

    A family's type is the one most of its files agree on; a file of another type, or one whose
    samples make the family's merge or ``render`` raise, is skipped whole.
    ``accumulate=False`` keeps histogram buckets per bucket, to be written back to a file.
    """
    skipped: dict[str, str] = {}
    while True:
        merged, bad = _merge_once(
            [f for f in files if f.file.name not in skipped], accumulate, render
        )
        if not bad:
            return merged, skipped
        skipped.update(bad)


Part = tuple[DbFile, str, list[Sample]]


def _merge_once(
    files: Sequence[FileData], accumulate: bool, render: Callable[[Metric], T]
) -> tuple[list[tuple[Metric, T]], dict[str, str]]:
    by_family: dict[str, list[Part]] = defaultdict(list)
    for data in files:
        for family, (help_text, samples) in data.families.items():
            by_family[family].append((data.file, help_text, samples))
    merged, bad = [], {}
    for family in sorted(by_family):
        parts = by_family[family]
        kinds = Counter(db.kind for db, _, _ in parts)
        kind = kinds.most_common(1)[0][0]
        for db, _, _ in parts:
            if db.kind != kind:
                bad[db.name] = f"{family} is a {db.kind} here but a {kind} in {kinds[kind]} file(s)"
        parts = [p for p in parts if p[0].kind == kind]
        try:
            merged.append(_merge_family(family, kind, parts, accumulate, render))
        except Exception:  # noqa: BLE001 (find the files that make it fail)
            bad.update(_failing_parts(family, kind, parts, accumulate, render))
    return merged, bad


def _failing_parts(
    family: str, kind: str, parts: list[Part], accumulate: bool, render: Callable[[Metric], T]
) -> dict[str, str]:
    """The files whose part makes a family's merge fail, with why: each whose part fails alone
    (one pass, however many files), or, where none does, each that fails beside the parts
    accepted before it."""
    failing = {}
    for part in parts:
        why = _merge_error(family, kind, [part], accumulate, render)
        if why is not None:
            failing[part[0].name] = why
    if failing:
        return failing
    accepted: list[Part] = []
    for part in parts:
        why = _merge_error(family, kind, [*accepted, part], accumulate, render)
        if why is None:
            accepted.append(part)
        else:
            failing[part[0].name] = why
    return failing


def _merge_error(
    family: str, kind: str, parts: list[Part], accumulate: bool, render: Callable[[Metric], T]
) -> str | None:
    """Why the family's merge of `parts` fails, or None."""
    try:
        _merge_family(family, kind, parts, accumulate, render)
    except Exception as exc:  # noqa: BLE001
        return f"{family} does not merge: {type(exc).__name__}: {exc}"
    return None


def _merge_family(
    family: str, kind: str, parts: list[Part], accumulate: bool, render: Callable[[Metric], T]
) -> tuple[Metric, T]:
    typ, _, mode = kind.partition("_")
    metric = Metric(family, parts[0][1], typ)
    add = metric.add_sample
    for db, _, samples in parts:
        if typ == "gauge":
            pid = ("pid", db.owner)
            for name, labels, value, timestamp in samples:
                add(name, (*labels, pid), value, timestamp)
        else:
            for name, labels, value, _ in samples:
                add(name, labels, value)
    if typ == "gauge":
        metric._multiprocess_mode = mode  # what prometheus-client's reader sets from the name
    # prometheus-client's own merge rules (sums, live and non-live gauge modes, buckets), as its
    # MultiProcessCollector applies them to the metrics it reads.
    (result,) = MultiProcessCollector._accumulate_metrics({family: metric}, accumulate)
    return result, render(result)
