"""Which writers are alive, and this process's part as a writer of the metrics directory.

A writer (a process recording metrics in multiprocess mode) creates ``numbakv-writer-PID.lock`` in
the directory and holds an exclusive ``flock`` on it for its whole life. The kernel releases it when
the process ends, however it ends: exit, SIGTERM, SIGKILL, a crash. Testing the lock needs only read
access to the file, so the sidecar tells a live writer from a dead one on the same host and from a
container that shares the directory (a bind mount or volume on the same kernel) but not the PID
namespace, where a PID names nothing the sidecar can see and ``kill(pid, 0)`` cannot answer. A PID
reused by an unrelated process does not look alive either: only the lock counts. A PID without a
lock file (a process writing to the directory without numbakv) is never judged.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import threading
import time

from prometheus_client import multiprocess

from numbakv.metrics.compaction import compact, open_for_writing
from numbakv.metrics.directory import (
    Unreadable,
    directory_lock,
    flock,
    list_directory,
    open_regular,
    writer_lock_name,
)

logger = logging.getLogger(__name__)

LOCK_WAIT_S = 10.0
"""How long a joining writer waits for the directory lock (a sidecar holds it while it reads)."""
CLAIM_WAIT_S = 1.0
"""How long a writer waits for its own lock file (a reader tests it for microseconds)."""


def writer_alive(dir_fd: int, lock_name: str) -> bool:
    """Whether the writer that holds ``lock_name`` still runs; True when it cannot be told."""
    try:
        fd, _ = open_regular(dir_fd, lock_name)
    except FileNotFoundError:
        return False
    except (Unreadable, OSError):
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK), or a file system without locks
        return True
    else:
        return False
    finally:
        os.close(fd)  # releases the test's own lock


def claim(dir_fd: int, path: str, pid: int) -> int | None:
    """Lock this process's lock file; the descriptor returned must stay open for its life.

    None on a file system without locks: readers then count this process as alive to the end.
    """
    name = writer_lock_name(pid)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    deadline = time.monotonic() + CLAIM_WAIT_S
    while True:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
        try:
            locked = flock(fd, fcntl.LOCK_EX, deadline - time.monotonic())
        except OSError:
            os.close(fd)
            logger.warning("%s: no file locks here; dead writers' live gauges will count", path)
            return None
        if not locked:
            os.close(fd)
            raise RuntimeError(
                f"another live process holds {name} in the metrics directory {path}: processes "
                "in different PID namespaces (containers) cannot share one directory, since "
                "prometheus-client names its files by PID; give each its own "
                "PROMETHEUS_MULTIPROC_DIR"
            )
        if _names(dir_fd, name, fd):
            return fd
        os.close(fd)  # removed as a dead writer's lock before we held it: claim a new one


def _names(dir_fd: int, name: str, fd: int) -> bool:
    """Whether ``name`` in the directory is the file open as ``fd``."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def forget_dead_writers(dir_fd: int) -> None:
    """Remove the lock files of dead writers, unless their files still need them to tell readers
    the writer is dead: kept while such a file is there and nobody has it open for writing; a
    process that has it open reused the PID without claiming it (it would hold the lock), and
    its live gauges must count."""
    listing = list_directory(os.listdir(dir_fd))
    owned: dict[int, list[str]] = {}
    for db in listing.files:
        owned.setdefault(db.pid, []).append(db.name)
    for pid, name in listing.writers.items():
        files = owned.get(pid, [])
        if files and not any(open_for_writing(dir_fd, file) for file in files):
            continue
        try:
            fd, _ = open_regular(dir_fd, name)
        except (Unreadable, OSError):
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(name, dir_fd=dir_fd)  # held: no one can claim it until it is gone
        except OSError:
            pass  # alive
        finally:
            os.close(fd)


_joined: tuple[int, int | None] | None = None
"""(PID, lock descriptor) of this process once it joined a directory."""
_join_lock = threading.Lock()
forked = False
"""True in a forked child of a writer until it joins under its own PID: a flag for the writer's
``sync()`` to check (a ``getpid()`` per sync would cost a system call)."""


def join(path: str) -> None:
    """Make this process a writer of ``path``, once per process: fold what dead processes left
    (compaction), then claim this PID's lock; at exit, remove this process's live gauges."""
    with _join_lock:
        _join(path)


def _join(path: str) -> None:
    global _joined, forked
    forked = False
    pid = os.getpid()
    if _joined is not None and _joined[0] == pid:
        return
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise NotADirectoryError(
            f"PROMETHEUS_MULTIPROC_DIR={path!r}: not a directory this process can open "
            f"({exc.strerror})"
        ) from None
    try:
        with directory_lock(dir_fd, exclusive=True, timeout_s=LOCK_WAIT_S) as locked:
            if locked:
                try:
                    compact(path)
                    forget_dead_writers(dir_fd)
                except Exception:  # metrics must not stop an engine from starting
                    logger.warning("%s: compaction failed", path, exc_info=True)
            else:
                logger.warning("%s: directory lock busy, compaction skipped", path)
            fd = claim(dir_fd, path, pid)
    finally:
        os.close(dir_fd)
    if _joined is None:  # the first time in this process or its parent
        atexit.register(lambda: multiprocess.mark_process_dead(os.getpid(), path))
        os.register_at_fork(after_in_child=_forget_parent_claim)
    _joined = (pid, fd)


def _forget_parent_claim() -> None:
    """In a forked child: drop the parent's lock descriptor, so the parent's death shows (the
    child joins under its own PID when it records metrics)."""
    global _joined, _join_lock, forked
    _join_lock = threading.Lock()  # another thread may have held it at the fork
    forked = True
    if _joined is not None and _joined[1] is not None:
        os.close(_joined[1])
        _joined = (_joined[0], None)
