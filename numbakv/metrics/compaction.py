"""Compaction: the files of dead processes folded into one file per kind, so the directory stays bounded.

prometheus-client keeps the files of every process that ever wrote to the directory (its
``mark_process_dead`` removes only live gauges), so the directory grows by a few files at every
engine restart, and every read merges them all. A writer joining the directory
(:func:`numbakv.metrics.liveness.join`) first folds the files of dead processes into
``KIND_compacted-G.db``: counters, histograms, summaries, and gauges whose mode keeps a dead
process's value (sum, min, max, mostrecent), merged by prometheus-client's own rules. Live gauges of
dead processes are removed, as ``mark_process_dead`` does; ``all``-mode gauges, one series per
process by their contract, are left alone.

A file's process is dead when no process has the file open for writing: prometheus-client keeps its
files open and mapped for the life of the process, and the kernel grants a read lease
(``F_SETLEASE``) only when nobody, in any PID namespace, has the file open for writing. So a PID that
a running process reuses, taking over a dead writer's file, is never taken for dead. Leases need the
files' owner (writers share a user) and a local file system; without them nothing is compacted.

Every step leaves a directory that :func:`~numbakv.metrics.directory.list_directory` reads right:
the merged file is written under a temporary name; the dead files are renamed to
``NAME.in-compacted-G`` (they still count while generation G does not exist); renaming the merged
file to ``KIND_compacted-G.db`` commits; then the older generation and the set-aside files go. The
next compaction first finishes or undoes what an interrupted one left.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
from collections import defaultdict

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key

from numbakv.metrics.directory import (
    DbFile,
    Listing,
    Unreadable,
    compacted_name,
    list_directory,
    merge,
    open_regular,
    read_file,
)

logger = logging.getLogger(__name__)

FOLDED_GAUGE_MODES = frozenset({"sum", "min", "max", "mostrecent"})
"""Gauge modes that keep counting a dead process's value: folded like counters."""


def compact(path: str) -> None:
    """Fold the dead processes' files in ``path``; the caller holds the directory lock exclusively.

    A file is a dead process's when no process has it open for writing, whatever its PID: one
    named with the caller's own PID and not open is a predecessor's that had the same PID (a
    restarted container's engine, say); the caller's own files are open."""
    dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        listing = list_directory(os.listdir(dir_fd))
        if listing.orphans or listing.leftovers:
            if not _recover(dir_fd, listing):
                return
            listing = list_directory(os.listdir(dir_fd))
        newest = {db.kind: db for db in listing.files if db.generation is not None}
        generation = 1 + max((db.generation for db in newest.values()), default=0)
        dead: dict[str, list[DbFile]] = defaultdict(list)
        for db in listing.files:
            if db.pid is None or open_for_writing(dir_fd, db.name):
                continue
            if db.live:
                os.unlink(db.name, dir_fd=dir_fd)
            elif db.typ != "gauge" or db.kind.partition("_")[2] in FOLDED_GAUGE_MODES:
                dead[db.kind].append(db)
        for kind, files in sorted(dead.items()):
            _fold(dir_fd, path, newest.get(kind), files, generation)
    finally:
        os.close(dir_fd)


def open_for_writing(dir_fd: int, name: str) -> bool:
    """Whether some process has the file open for writing; True when it cannot be told."""
    try:
        fd, _ = open_regular(dir_fd, name)
    except (Unreadable, OSError):
        return True
    try:
        # Whoever opens the file for writing while the lease is held breaks it, and the kernel
        # signals the holder, by default with SIGIO, whose default action ends the process: the
        # lease is held for two system calls, and signals with SIGURG, which is ignored by default.
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:  # EAGAIN: open for writing; EACCES: not our file; EINVAL: no leases here
        return True
    else:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def _fold(
    dir_fd: int, path: str, current: DbFile | None, dead: list[DbFile], generation: int
) -> None:
    """Merge ``current`` (the kind's compacted file) and the dead files into generation G."""
    data = []
    for db in [current, *dead] if current is not None else dead:
        try:
            data.append(read_file(dir_fd, db))
        except (Unreadable, OSError) as exc:
            if db is current:
                logger.warning("not compacting %s: %s", db.name, exc)
                return
            logger.warning("not compacting %s, left as it is: %s", db.name, exc)
    merged, skipped = merge(data, accumulate=False, render=lambda metric: None)
    for name, why in skipped.items():
        logger.warning("not compacting %s, left as it is: %s", name, why)
    if current is not None and current.name in skipped:
        return
    folded = [d.file.name for d in data if d.file.name not in skipped and d.file is not current]
    if not folded:
        return
    final = compacted_name(current.kind if current else dead[0].kind, generation)
    stamps = _latest_stamps([d for d in data if d.file.name not in skipped])
    _write(dir_fd, path, f"{final}.tmp", [metric for metric, _ in merged], stamps)
    set_aside = [f"{name}.in-compacted-{generation}" for name in folded]
    for name, aside in zip(folded, set_aside):
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.rename(f"{final}.tmp", final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # the commit
    for name in [current.name, *set_aside] if current is not None else set_aside:
        os.unlink(name, dir_fd=dir_fd)


def _latest_stamps(data: list) -> dict[tuple, float]:
    """The time each mostrecent gauge's series was last set, by (sample name, labels without the
    pid): the merge picks the newest value but drops its time, which the reader ranks it by (a
    time of 0 loses to every other, so the series would never be served again)."""
    stamps: dict[tuple, float] = {}
    for file_data in data:
        if file_data.file.kind.partition("_")[2] != "mostrecent":
            continue
        for _, samples in file_data.families.values():
            for name, labels, _, timestamp in samples:
                key = (name, tuple(labels))
                stamps[key] = max(stamps.get(key, 0.0), timestamp or 0.0)
    return stamps


def _write(
    dir_fd: int, path: str, name: str, metrics: list[Metric], stamps: dict[tuple, float]
) -> None:
    """Write merged metrics as a prometheus-client file, with the library's own writer, each
    sample with its time (`stamps`, where the merge dropped it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    os.close(os.open(name, flags, 0o644, dir_fd=dir_fd))
    values = MmapedDict(os.path.join(path, name))
    try:
        for metric in metrics:
            for sample in metric.samples:
                labels = sample.labels
                key = mmap_key(
                    metric.name,
                    sample.name,
                    list(labels),
                    list(labels.values()),
                    metric.documentation,
                )
                stamp = stamps.get((sample.name, tuple(labels.items())), sample.timestamp)
                values.write_value(key, sample.value, stamp or 0.0)
    finally:
        values.close()


def _recover(dir_fd: int, listing: Listing) -> bool:
    """Finish or undo an interrupted compaction: set-aside files of a generation that never
    committed go back under their names; what holds nothing to count is removed. Whether all of it
    could be done (else compaction waits: nothing may be folded twice)."""
    done = True
    for name, original in listing.orphans.items():
        try:
            os.stat(original, dir_fd=dir_fd, follow_symlinks=False)
            done = False  # a process took the name again since: leave both to the readers
        except FileNotFoundError:
            os.rename(name, original, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    for name in listing.leftovers:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
    return done
