"""The staged path: blocks packed into a device staging buffer and moved over the link by the
copy engines instead of the SMs.

A staged store runs the gather kernel into a contiguous staging buffer in device memory (the job's
part of each host block, in the job's pair order, at HBM speed), then one batched copy (`BatchCopy`,
one driver call) moves each packed part to its host block; a staged load copies the host blocks'
parts into the buffer, then runs the scatter kernel out of it. The kernels are the zero-copy path's
own: the buffer stands where the host pool stood, and the job's "host ids" become positions in the
buffer. A job's part of a block is every segment, or the segments of the layers it names (`use`,
then `queue`): the buffer then packs more blocks a round. A job larger than the buffer moves in
rounds of `capacity` blocks, one after the other on the lane's stream. Everything is allocated once
per lane; a round costs two driver calls and one NumPy pass over its host ids (a lookup in a table
of the pool's block addresses), whatever its blocks and layers.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from numbakv.datapath._device import BatchCopy, Launcher, array_interface, word_view
from numbakv.jobs import Direction


class Staging:
    """One direction's staging buffer of `capacity_blocks` whole host blocks, the addresses its
    batched copy reads, and the kernels' view of it."""

    def __init__(
        self,
        direction: Direction,
        stream: object,
        chunk_bytes: int,
        num_segments: int,
        capacity_blocks: int,
        pool_address: int,
        pool_blocks: int,
        max_pairs: int,
        word: np.dtype,
    ) -> None:
        self.direction = direction
        self._chunk_bytes = chunk_bytes
        self._max_pairs = max_pairs
        self._buffer_bytes = capacity_blocks * num_segments * chunk_bytes
        self.buffer = cuda.device_array(self._buffer_bytes, dtype=np.uint8)
        self._base = int(array_interface(self.buffer)["data"][0])
        self.words = word_view(self._base, self._buffer_bytes, np.dtype(word), owner=self.buffer)
        self._block_addresses = (
            pool_address + np.arange(pool_blocks, dtype=np.int64) * num_segments * chunk_bytes
        )
        # Sized for the most parts a round can hold (one segment each); refilled by `use`.
        most = min(self._buffer_bytes // chunk_bytes, max_pairs)
        self._host_addresses = np.empty(most, dtype=np.int64)  # refilled every round
        self._staged_addresses = np.empty(most, dtype=np.int64)
        self._sizes = np.empty(most, dtype=np.int64)
        if direction is Direction.STORE:
            self._copy = BatchCopy(
                stream, self._host_addresses, self._staged_addresses, self._sizes
            )
        else:
            self._copy = BatchCopy(
                stream, self._staged_addresses, self._host_addresses, self._sizes
            )
        self._pair_indexes = np.arange(max_pairs, dtype=np.int64)
        self._seg_count = 0  # none yet
        self.use(num_segments)

    def use(self, seg_count: int) -> None:
        """Pack `seg_count` segments of each block from now on: sets `capacity` (blocks a round)
        and the copy's buffer addresses, a NumPy pass over a round's blocks when the number of
        segments differs from the last job's."""
        if seg_count == self._seg_count:
            return
        part = seg_count * self._chunk_bytes
        self.capacity = min(self._buffer_bytes // part, self._max_pairs)
        np.multiply(
            self._pair_indexes[: self.capacity], part, out=self._staged_addresses[: self.capacity]
        )
        self._staged_addresses[: self.capacity] += self._base
        self._sizes[: self.capacity] = part
        self._seg_count = seg_count

    def positions(self, out: np.ndarray) -> None:
        """Write each of a job's pairs' places in the buffer (what the kernels take as its host
        block id: pair i goes to place i mod `capacity`) into `out`, one per pair."""
        if len(out) <= self.capacity:  # one round: the places in order
            out[:] = self._pair_indexes[: len(out)]
        else:
            np.remainder(self._pair_indexes[: len(out)], self.capacity, out=out)

    def queue(
        self, launch: Launcher, grid: int, host_ids: np.ndarray, count: int, segments: tuple
    ) -> None:
        """Queue a job of `count` pairs, round by round: pack then copy (a store), or copy then
        unpack (a load). `launch(grid, n, first, pairs, *segments)` runs the lane's kernel over
        the pairs `first` to `first + pairs` of the job's uploaded ids and its `segments` (the
        kernels' four segment arguments), in `grid` thread blocks (sized for a full round)."""
        addresses = self._host_addresses
        offset = segments[0] * self._chunk_bytes  # of the job's part in a host block
        for first in range(0, count, self.capacity):
            pairs = min(self.capacity, count - first)
            self._block_addresses.take(host_ids[first : first + pairs], out=addresses[:pairs])
            if offset:
                addresses[:pairs] += offset
            if self.direction is Direction.STORE:
                launch(grid, count, first, pairs, *segments)
                self._copy(pairs)
            else:
                self._copy(pairs)
                launch(grid, count, first, pairs, *segments)
