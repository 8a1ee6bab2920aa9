"""The one place where the two halves meet, for an engine that runs them in one process.

The manager decides (which host slots, what to evict) and the transfer engine moves bytes; the
offloader turns one into the other and closes the loop when a job finishes: a finished store makes
its blocks ready, a failed one frees them (nothing half-written ever becomes ready), and a finished
load releases its pins. Engines with separate scheduler and worker processes ship the manager's
plain specs across instead (see docs/OFFLOADER.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import count
from typing import Any, Literal, Protocol

import numpy as np

from numbakv.jobs import Direction, FinishedJob
from numbakv.manager import CPUOffloadingManager
from numbakv.specs import BlockHash

OffloadMode = Literal["eager", "lazy"]


class Transfers(Protocol):
    """What the offloader needs of a transfer engine (numbakv.datapath.TransferEngine has it)."""

    @property
    def num_host_blocks(self) -> int: ...

    def check_gpu_ids(self, direction: Direction, gpu_block_ids: Any) -> np.ndarray: ...

    def enqueue(
        self,
        job_id: Hashable,
        direction: Direction,
        gpu_ids: np.ndarray,
        host_ids: np.ndarray,
        wait_event: Any = None,
    ) -> None: ...

    def get_finished(self) -> list[FinishedJob]: ...

    def wait(self, job_id: Hashable) -> bool: ...

    def completion_event(self, job_id: Hashable) -> Any | None: ...


class KVOffloader:
    """Stores GPU KV blocks into the host pool and loads them back, keeping the manager in step.

    `mode` says when the engine offloads: "eager" stores every block as soon as it is filled
    (`blocks_filled`), "lazy" only blocks the engine is about to free (`blocks_freeing`), which
    moves fewer bytes but makes the engine wait for the store before it reuses those GPU blocks.
    """

    def __init__(
        self,
        manager: CPUOffloadingManager,
        transfers: Transfers,
        mode: OffloadMode = "eager",
    ) -> None:
        if mode not in ("eager", "lazy"):
            raise ValueError(f"mode must be 'eager' or 'lazy', got {mode!r}")
        if manager.num_blocks > transfers.num_host_blocks:
            raise ValueError(
                f"the manager hands out {manager.num_blocks} host blocks, the transfer engine's "
                f"host pool has {transfers.num_host_blocks}: size them alike"
            )
        self.manager = manager
        self.transfers = transfers
        self.mode = mode
        self._jobs: dict[int, tuple[Direction, list]] = {}  # in flight: direction, block hashes
        self._job_ids = count()
        self._finished: list[FinishedJob] = []

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks the host pool can load."""
        return self.manager.lookup(block_hashes)

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Tell the host tier's policy the engine is using these blocks (first = most recent)."""
        self.manager.touch(block_hashes)

    def store(
        self,
        block_hashes: Sequence[BlockHash],
        gpu_block_ids: Sequence[int],
        wait_event: Any = None,
    ) -> int | None:
        """Offload these GPU blocks; returns the job id, or None if nothing needs (or can) be stored.

        `wait_event` holds the copy back until the engine's compute has written the blocks.
        """
        gpu_ids = self._checked_gpu_ids(Direction.STORE, block_hashes, gpu_block_ids)
        output = self.manager.prepare_store(block_hashes)
        if output is None or not output.block_hashes_to_store:
            return None
        to_store = output.block_hashes_to_store
        if len(to_store) < len(block_hashes):
            position = dict(zip(block_hashes, range(len(block_hashes))))
            gpu_ids = gpu_ids[[position[block_hash] for block_hash in to_store]]
        return self._submit(
            Direction.STORE, to_store, gpu_ids, output.store_spec.block_ids, wait_event
        )

    def load(
        self,
        block_hashes: Sequence[BlockHash],
        gpu_block_ids: Sequence[int],
        wait_event: Any = None,
    ) -> int:
        """Bring these host blocks into the given GPU blocks; all must be ready (see `lookup`).

        `wait_event` holds the copy back until kernels the engine queued before it (which may
        still read the GPU blocks being overwritten) have run. `completion_event(job)` is what
        the engine's stream waits on before it reads the loaded blocks.
        """
        gpu_ids = self._checked_gpu_ids(Direction.LOAD, block_hashes, gpu_block_ids)
        spec = self.manager.prepare_load(block_hashes)
        return self._submit(Direction.LOAD, list(block_hashes), gpu_ids, spec.block_ids, wait_event)

    def blocks_filled(
        self,
        block_hashes: Sequence[BlockHash],
        gpu_block_ids: Sequence[int],
        wait_event: Any = None,
    ) -> int | None:
        """The engine has computed these blocks: eager mode stores them now."""
        if self.mode == "eager":
            return self.store(block_hashes, gpu_block_ids, wait_event)
        return None

    def blocks_freeing(
        self,
        block_hashes: Sequence[BlockHash],
        gpu_block_ids: Sequence[int],
        wait_event: Any = None,
    ) -> int | None:
        """The engine is about to reuse these GPU blocks: lazy mode stores them first.

        The engine must `wait` for the returned job before it overwrites the blocks.
        """
        if self.mode == "lazy":
            return self.store(block_hashes, gpu_block_ids, wait_event)
        return None

    def _submit(self, direction, block_hashes, gpu_ids, host_ids, wait_event) -> int:
        job_id = next(self._job_ids)
        try:  # host ids come from the manager, sized to the pool: the gpu ids are checked
            self.transfers.enqueue(job_id, direction, gpu_ids, host_ids, wait_event)
        except Exception:
            self._settle(direction, block_hashes, success=False)
            raise
        self._jobs[job_id] = (direction, block_hashes)
        return job_id

    def poll(self) -> list[FinishedJob]:
        """The jobs finished since the last poll, with the manager updated."""
        self._collect()
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_id: int) -> bool:
        """Block until the job finishes; returns its success. It is still reported by `poll`."""
        if job_id in self._jobs:
            self.transfers.wait(job_id)
            self._collect()
        reported = [job.success for job in self._finished if job.job_id == job_id]
        if not reported:
            raise KeyError(f"job {job_id!r} is not in flight")
        return reported[0]

    def drain(self) -> list[FinishedJob]:
        """Wait for every job in flight (at shutdown, say); returns what `poll` would."""
        while self._jobs:
            self.wait(next(iter(self._jobs)))
        return self.poll()

    def reset(self) -> list[FinishedJob]:
        """Forget every cached block, safely while jobs are in flight; returns what `poll` would.

        Jobs in flight are finished and settled first (stores made ready, loads' pins released),
        then the manager is reset: no job begun before the reset completes into the new cache,
        and no host slot is handed out again while a copy still writes or reads it. Call this, not
        `manager.reset_cache()`, while the offloader has jobs in flight.
        """
        finished = self.drain()
        self.manager.reset_cache()
        return finished

    def _collect(self) -> None:
        for job in self.transfers.get_finished():
            self._settle(*self._jobs.pop(job.job_id), job.success)
            self._finished.append(job)

    def _settle(self, direction: Direction, block_hashes: list, success: bool) -> None:
        if direction is Direction.STORE:
            self.manager.complete_store(block_hashes, success=success)
        else:
            self.manager.complete_load(block_hashes)

    def completion_event(self, job_id: int) -> Any | None:
        """What the compute stream waits on before it reads a load's blocks (None once done)."""
        return self.transfers.completion_event(job_id) if job_id in self._jobs else None

    def in_flight(self, job_id: int) -> bool:
        """Whether the job has not finished yet (as far as the last poll or wait saw)."""
        return job_id in self._jobs

    @property
    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    def _checked_gpu_ids(
        self, direction: Direction, block_hashes: Sequence[BlockHash], gpu_block_ids: Any
    ) -> np.ndarray:
        """The GPU ids, checked before the manager commits to anything: one per hash, each a
        GPU block, none repeated."""
        gpu_ids = self.transfers.check_gpu_ids(direction, gpu_block_ids)
        if len(gpu_ids) != len(block_hashes):
            raise ValueError(
                f"gpu_block_ids must be as long as block_hashes ({len(block_hashes)}), "
                f"got {len(gpu_ids)}"
            )
        # A load's GPU ids are its destinations, checked unique by the engine; a store's are not.
        if direction is Direction.STORE and len(np.unique(gpu_ids)) != len(gpu_ids):
            raise ValueError("gpu_block_ids must not repeat a block")
        return gpu_ids
