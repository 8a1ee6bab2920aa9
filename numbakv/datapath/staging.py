"""The staged path: blocks packed into a device staging buffer and moved over the link by the
copy engines instead of the SMs.

A staged store runs the gather kernel into a contiguous staging buffer in device memory (whole
host blocks, in the job's pair order, at HBM speed), then one batched copy (`BatchCopy`, one
driver call) moves each packed block to its host block; a staged load copies the host blocks into
the buffer, then runs the scatter kernel out of it. The kernels are the zero-copy path's own: the
buffer stands where the host pool stood, and the job's "host ids" become positions in the buffer.
A job larger than the buffer moves in rounds of `capacity` blocks, one after the other on the
lane's stream. Everything is allocated once per lane; a round costs two driver calls and one
NumPy pass over its host ids (a lookup in a table of the pool's block addresses), whatever its
blocks and layers.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from numbakv.datapath._device import BatchCopy, Launcher, array_interface, word_view
from numbakv.jobs import Direction


class Staging:
    """One direction's staging buffer of `capacity` host blocks, the addresses its batched copy
    reads, and the kernels' view of it."""

    def __init__(
        self,
        direction: Direction,
        stream: object,
        block_bytes: int,
        capacity: int,
        pool_address: int,
        pool_blocks: int,
        max_pairs: int,
        word: np.dtype,
    ) -> None:
        self.direction = direction
        self.capacity = capacity
        self.buffer = cuda.device_array(capacity * block_bytes, dtype=np.uint8)
        base = int(array_interface(self.buffer)["data"][0])
        self.words = word_view(base, capacity * block_bytes, np.dtype(word), owner=self.buffer)
        self.positions = np.arange(max_pairs, dtype=np.int64) % capacity
        """Pair i's block in the buffer: what the kernels take as its host block id."""
        self._block_addresses = pool_address + np.arange(pool_blocks, dtype=np.int64) * block_bytes
        self._host_addresses = np.empty(capacity, dtype=np.int64)  # refilled every round
        staged = base + np.arange(capacity, dtype=np.int64) * block_bytes
        sizes = np.full(capacity, block_bytes, dtype=np.int64)
        if direction is Direction.STORE:
            self._copy = BatchCopy(stream, self._host_addresses, staged, sizes)
        else:
            self._copy = BatchCopy(stream, staged, self._host_addresses, sizes)

    def queue(self, launch: Launcher, grid: int, host_ids: np.ndarray, count: int) -> None:
        """Queue a job of `count` pairs, round by round: pack then copy (a store), or copy then
        unpack (a load). `launch(grid, n, first, pairs)` runs the lane's kernel over the pairs
        `first` to `first + pairs` of the job's uploaded ids, in `grid` thread blocks (sized for
        a full round)."""
        addresses = self._host_addresses
        for first in range(0, count, self.capacity):
            pairs = min(self.capacity, count - first)
            np.take(self._block_addresses, host_ids[first : first + pairs], out=addresses[:pairs])
            if self.direction is Direction.STORE:
                launch(grid, count, first, pairs)
                self._copy(pairs)
            else:
                self._copy(pairs)
                launch(grid, count, first, pairs)
