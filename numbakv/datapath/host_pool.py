"""The host tier's memory: one mapped, pinned allocation of equal-sized host blocks.

Mapped (zero-copy) memory lets the transfer kernels read and write host blocks directly over the
link; one allocation means one pinning cost, paid once, and a host block is one contiguous byte
range that a later disk or network tier can write as is. A pool of this process's own is asked for
transparent huge pages: a 2 MiB chunk then lies in one or two physically contiguous pieces, which
a disk tier's O_DIRECT read fills in one request where 512 small pages take several (the block
layer caps the pieces of one request), with a fraction of the page pinning per read. A pool can also
be one copy that the processes of a node share (`shared=`): each maps the same pages for its own
device (a memory file system's pages, small unless the system gives its shared memory huge ones).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from numbakv.checks import positive
from numbakv.datapath._device import (
    CudaAPIError,
    current_device_id,
    map_host,
    word_view,
)
from numbakv.datapath.layouts import KVLayout
from numbakv.datapath.shared_memory import SHARED_DIR, SharedHostMemory


class HostPool:
    """`num_blocks` host blocks of `block_bytes` each, in one allocation mapped for the device.

    The pool belongs to the CUDA device current when it was made (`device`): it is pinned and
    mapped for that context only, so transfer engines of other devices refuse it.

    `shared`: the path of host memory that the node's processes share (`SharedHostMemory`), in
    place of an allocation of this process's own. Every process that opens the same path with the
    same sizes gets the same blocks. The name is removed once `barrier()` returns (every process
    has then mapped it) or, without a barrier, when this pool goes.
    """

    def __init__(
        self,
        num_blocks: int,
        block_bytes: int,
        *,
        shared: str | os.PathLike[str] | None = None,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        self.num_blocks = positive("num_blocks", num_blocks, integer=True)
        self.block_bytes = positive("block_bytes", block_bytes, integer=True)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if self.nbytes > memory:  # pinned memory is never swapped out: it must fit in RAM
            raise ValueError(
                f"num_blocks x block_bytes must fit in this machine's memory ({memory:,} bytes), "
                f"got {self.num_blocks:,} x {self.block_bytes:,} = {self.nbytes:,}"
            )
        self.device = current_device_id()
        started = time.perf_counter()
        if shared is None:
            memory = _private_memory(self.nbytes)
            self._host = np.frombuffer(memory, np.uint8).reshape(self.num_blocks, self.block_bytes)
            self._device_address, registration = map_host(self._host)
            self._memory: Any = (memory, registration)  # unpinned before unmapped (last first)
        else:
            self._map_shared(shared, barrier)
        self.pin_seconds: float = time.perf_counter() - started

    def _map_shared(self, path: str | os.PathLike[str], barrier: Callable[[], None] | None) -> None:
        """Map the node's copy at `path` for this device, then let its name go."""
        memory, mapped = None, False
        try:
            memory = SharedHostMemory(path, self.nbytes)
            self._host = memory.array.reshape(self.num_blocks, self.block_bytes)
            try:
                self._device_address, registration = map_host(self._host)
            except CudaAPIError as error:
                raise OSError(
                    f"shared={str(path)!r}: the GPU cannot pin a mapping of this file ({error}); "
                    f"shared host memory must be on a memory file system such as {SHARED_DIR}"
                ) from error
            mapped = True
        finally:
            if barrier is not None:
                barrier()  # once per process, mapped or failed: none waits for one that failed
            # After the barrier, so no process makes a second file of the same name.
            if memory is not None and (not mapped or barrier is not None):
                memory.unlink()  # a failed pin leaves no file behind in host memory
        self._memory = (memory, registration)
        if barrier is None:
            weakref.finalize(self, memory.unlink)

    @classmethod
    def for_layout(cls, layout: KVLayout, num_blocks: int) -> HostPool:
        """A pool whose host blocks each hold one block of every segment of `layout`."""
        return cls(num_blocks, layout.block_bytes)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def blocks(self) -> np.ndarray:
        """The pool as a host-side `[num_blocks, block_bytes]` uint8 array (no copy)."""
        return self._host

    @property
    def address(self) -> int:
        """Where the pool's first byte is, for the GPU and the copy engines (one address space)."""
        return int(self._device_address)

    def words(self, word: np.dtype) -> Any:
        """The pool as a flat kernel argument of `word`s (the device side of the same memory)."""
        return word_view(self.address, self.nbytes, word, owner=self._memory)


def _private_memory(nbytes: int) -> mmap.mmap:
    """`nbytes` of this process's own memory, page-aligned, backed by transparent huge pages where
    the kernel has them to give (`madvise` mode or `always`; small pages otherwise), and left out
    of a forked child: the kernel copies a pinned private page at a fork, which for a pool would
    be a copy of every GiB of it (and a forked child cannot use CUDA anyway)."""
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory.madvise(mmap.MADV_DONTFORK)
    with contextlib.suppress(OSError):  # a kernel built without huge pages: small pages
        memory.madvise(mmap.MADV_HUGEPAGE)
    return memory
