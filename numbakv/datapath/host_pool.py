"""The host tier's memory: one mapped, pinned allocation of equal-sized host blocks.

Mapped (zero-copy) memory lets the transfer kernels read and write host blocks directly over the
link; one allocation means one pinning cost, paid once, and a host block is one contiguous byte
range that a later disk or network tier can write as is.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import cuda

from numbakv.datapath._device import array_interface, current_device_id, word_view


class HostPool:
    """`num_blocks` host blocks of `block_bytes` each, in one `cuda.mapped_array`.

    The pool belongs to the CUDA device current when it was made (`device`): Numba maps it for
    that context only (`mapped_array` ignores `portable`), so transfer engines of other devices
    refuse it.
    """

    def __init__(self, num_blocks: int, block_bytes: int) -> None:
        if num_blocks <= 0 or block_bytes <= 0:
            raise ValueError(
                f"num_blocks and block_bytes must be positive, got {num_blocks} and {block_bytes}"
            )
        self.device = current_device_id()
        started = time.perf_counter()
        self._mapped = cuda.mapped_array((num_blocks, block_bytes), dtype=np.uint8)
        self.pin_seconds: float = time.perf_counter() - started
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes

    @classmethod
    def for_layout(cls, layout: Any, num_blocks: int) -> HostPool:
        """A pool whose host blocks each hold one block of every segment of `layout` (a KVLayout)."""
        return cls(num_blocks, layout.block_bytes)

    @property
    def nbytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def blocks(self) -> np.ndarray:
        """The pool as a host-side `[num_blocks, block_bytes]` uint8 array (no copy)."""
        return np.asarray(getattr(self._mapped, "_ary", self._mapped)).view(np.ndarray)

    @property
    def address(self) -> int:
        """Where the pool's first byte is, for the GPU and the copy engines (one address space)."""
        return int(array_interface(self._mapped)["data"][0])

    def words(self, word: np.dtype) -> Any:
        """The pool as a flat kernel argument of `word`s (the device side of the same memory)."""
        return word_view(self.address, self.nbytes, word, owner=self._mapped)
