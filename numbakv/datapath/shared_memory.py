"""Host memory that the processes of one node share: a file on a memory file system, mapped.

An engine's workers are processes; where their KV is the same on every rank (MLA under tensor
parallelism), one host copy can serve them all. Every process opens the same path: whichever comes
first sizes the file, the others map what it holds, and every mapping reaches the same pages. The
name can be removed as soon as every process has mapped it; the pages live until the last mapping
goes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import numpy as np

SHARED_DIR = Path("/dev/shm")
"""Where a node's shared host memory is named: Linux's memory file system."""


class SharedHostMemory:
    """`nbytes` of host memory named by `path`, mapped into this process (`array`, uint8)."""

    def __init__(self, path: str | os.PathLike[str], nbytes: int) -> None:
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        self.path = Path(path)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(descriptor).st_size
            if size == 0:  # the first to open it (or one of several at once: sizing is idempotent)
                try:
                    _check_free(self.path.parent, nbytes)
                    os.ftruncate(descriptor, nbytes)
                except OSError:
                    self.unlink()
                    raise
            elif size != nbytes:
                raise ValueError(
                    f"{self.path} holds {size} bytes, expected {nbytes}: another engine's shared "
                    "host memory under the same name (remove the file if no engine uses it)"
                )
            self._mapping = mmap.mmap(descriptor, nbytes, flags=mmap.MAP_SHARED)
        finally:
            os.close(descriptor)
        self.array = np.frombuffer(self._mapping, dtype=np.uint8)

    def unlink(self) -> None:
        """Remove the name (done already is fine): mappings stay valid, no new process joins."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _check_free(directory: Path, nbytes: int) -> None:
    """Refuse before sizing, not with a SIGBUS when a page is first touched."""
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    if free < nbytes:
        raise OSError(
            f"{directory} has {free / 2**30:.2f} GiB free, the shared host copy needs "
            f"{nbytes / 2**30:.2f} GiB (in a container, raise its shared memory: --shm-size)"
        )
