"""The one place where the two halves meet, for an engine that runs them in one process.

The manager decides (which host slots, what to evict) and the transfer engine moves bytes; the
offloader turns one into the other and closes the loop when a job finishes: a finished store makes
its blocks ready, a failed one frees them (nothing half-written ever becomes ready), and a finished
load releases its pins. Engines with separate scheduler and worker processes ship the manager's
plain specs across instead (see docs/OFFLOADER.md).

With a second tier (a `numbakv.tiers.ChunkTier` over the same host pool) it hands the tier's side
to a `numbakv.cascade.Cascade`: blocks reach the tier by demotion or write-through, a host miss the
tier holds is promoted into host memory off the engine's thread, and `flush_to_tier` hands host
memory's blocks down before the engine goes away. The offloader holds back a copy into host slots
whose evicted blocks are still being demoted.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import count
from numbers import Integral
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from numbakv.cascade import DEMOTE, Cascade, TierFlush, Tiering, check_tiering
from numbakv.jobs import Direction, FinishedJob
from numbakv.manager import CPUOffloadingManager
from numbakv.specs import BlockHash

if TYPE_CHECKING:
    from numbakv.datapath import KVLayout
    from numbakv.tiers import ChunkTier
    from numbakv.tiers.tier import HostPoolLike

logger = logging.getLogger("numbakv.offloader")

OffloadMode = Literal["eager", "lazy"]


class Transfers(Protocol):
    """What the offloader needs of a transfer engine (numbakv.datapath.TransferEngine has it)."""

    layout: KVLayout
    host_pool: HostPoolLike

    @property
    def num_host_blocks(self) -> int: ...

    def check_gpu_ids(self, direction: Direction, gpu_block_ids: Any) -> np.ndarray: ...

    def check_wait_event(self, wait_event: Any) -> None: ...

    def enqueue(
        self,
        job_id: Hashable,
        direction: Direction,
        gpu_ids: np.ndarray,
        host_ids: np.ndarray,
        wait_event: Any = None,
        *,
        layers: range | None = None,
    ) -> None: ...

    def get_finished(self) -> list[FinishedJob]: ...

    def wait(self, job_id: Hashable) -> bool: ...

    def completion_event(self, job_id: Hashable) -> Any | None: ...


@dataclass(eq=False)
class _LayeredLoad:
    """A load queued as one transfer job per group of layers, `(job id, group)` each; one job to
    `poll`, `wait` and the manager, finished once its last group has landed."""

    groups: list[range]
    pending: set[int]  # groups whose transfer job has not been collected
    nbytes: int = 0
    seconds: float = 0.0
    success: bool = True


class KVOffloader:
    """Stores GPU KV blocks into the host pool and loads them back, keeping the manager in step.

    `mode` says when the engine offloads: "eager" stores every block as soon as it is filled
    (`blocks_filled`), "lazy" only blocks the engine is about to free (`blocks_freeing`), which
    moves fewer bytes but makes the engine wait for the store before it reuses those GPU blocks.

    `tier`, a `ChunkTier` over this engine's host pool (its rows are the host blocks), is a second
    tier below host memory. `tiering` says how blocks reach it: "demote" (a block evicted from
    host memory is copied down before its slot is reused; the default, it keeps more hits) or
    "write-through" (every stored block is copied down before it becomes ready). Its rules are
    `numbakv.cascade`'s.
    """

    def __init__(
        self,
        manager: CPUOffloadingManager,
        transfers: Transfers,
        mode: OffloadMode = "eager",
        tier: ChunkTier | None = None,
        tiering: Tiering = DEMOTE,
    ) -> None:
        if mode not in ("eager", "lazy"):
            raise ValueError(f"mode must be 'eager' or 'lazy', got {mode!r}")
        check_tiering(tiering)
        if manager.num_blocks > transfers.num_host_blocks:
            raise ValueError(
                f"the manager hands out {manager.num_blocks} host blocks, the transfer engine's "
                f"host pool has {transfers.num_host_blocks}: size them alike"
            )
        if tier is not None and not _same_rows(tier.rows, transfers.host_pool.blocks):
            raise ValueError(
                "tier must be built over the transfer engine's host pool (its HostPool, or "
                "HostPool.blocks): the tier reads and writes the rows the engine copies"
            )
        self._cascade = None if tier is None else Cascade(manager, tier, tiering)
        self.manager = manager
        self.transfers = transfers
        self.mode = mode
        self.tier = tier
        # Engine jobs in flight: direction, block hashes, host ids.
        self._jobs: dict[int, tuple[Direction, list, np.ndarray]] = {}
        self._job_ids = count()
        self._finished: list[FinishedJob] = []
        # Engine jobs held until a demotion frees their slots: the demotion each waits for.
        self._waiting: dict[int, int] = {}
        self._layered: dict[int, _LayeredLoad] = {}

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int | None:
        """How many leading blocks the host pool can load; None: ask again after a `poll`.

        With a tier, a host miss is looked up in the tier (None while it answers; an answer later
        than its deadline is a miss), and the blocks after the host hits that it holds are
        promoted into host memory (None again until they are there). Neither waits on this
        thread; a failed promotion is a miss.
        """
        hits = self.manager.lookup(block_hashes)
        if self._cascade is None or hits == len(block_hashes):
            return hits
        return self._cascade.promote(list(block_hashes), hits)

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
        self.transfers.check_wait_event(wait_event)  # before the manager evicts for the store
        if self._cascade is not None:
            self._cascade.check_keys(block_hashes)
        output = self.manager.prepare_store(block_hashes)
        if output is None or not output.block_hashes_to_store:
            return None
        to_store = output.block_hashes_to_store
        if len(to_store) < len(block_hashes):
            position = dict(zip(block_hashes, range(len(block_hashes))))
            gpu_ids = gpu_ids[[position[block_hash] for block_hash in to_store]]
        return self._submit(
            Direction.STORE, to_store, gpu_ids, output.store_spec.block_ids, wait_event, output
        )

    def load(
        self,
        block_hashes: Sequence[BlockHash],
        gpu_block_ids: Sequence[int],
        wait_event: Any = None,
        *,
        layer_groups: Sequence[range] | None = None,
    ) -> int:
        """Bring these host blocks into the given GPU blocks; all must be ready (see `lookup`).

        `wait_event` holds the copy back until kernels the engine queued before it (which may
        still read the GPU blocks being overwritten) have run. `completion_event(job)` is what
        the engine's stream waits on before it reads the loaded blocks.

        `layer_groups` loads layer by layer: consecutive ranges covering every layer from 0
        (`[range(0, 1), range(1, 8), range(8, 32)]`), moved in that order, one after another.
        `completion_event(job, layer=i)` is then the event of the group holding layer i, so the
        engine's forward pass starts on the first layers while the later ones still cross the
        link. The load is still one job to `poll`, `wait` and the manager; to the transfer engine
        each group is a job, which takes one of its `max_jobs_in_flight` slots.
        """
        gpu_ids = self._checked_gpu_ids(Direction.LOAD, block_hashes, gpu_block_ids)
        self.transfers.check_wait_event(wait_event)
        groups = None if layer_groups is None else self._checked_layer_groups(layer_groups)
        spec = self.manager.prepare_load(block_hashes)
        return self._submit(
            Direction.LOAD, list(block_hashes), gpu_ids, spec.block_ids, wait_event, groups=groups
        )

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

    def _submit(
        self, direction, block_hashes, gpu_ids, host_ids, wait_event, plan=None, groups=None
    ) -> int:
        """Hand the job to the transfer engine (a load by `groups` of layers, a job per group),
        or, when a store's host slots still hold evicted blocks being demoted, once the demotion
        has finished (`_collect` does)."""
        job_id = next(self._job_ids)
        try:  # host ids come from the manager, sized to the pool: the gpu ids are checked
            demotion = None
            if self._cascade is not None and plan is not None:
                demotion = self._cascade.place(plan)
            if groups is not None:
                self._enqueue_layered(job_id, gpu_ids, host_ids, wait_event, groups)
            elif demotion is None:
                self.transfers.enqueue(job_id, direction, gpu_ids, host_ids, wait_event)
            else:
                self._waiting[job_id] = demotion
                # a copy of the ids: the caller may reuse its array before the demotion ends
                queue = partial(
                    self._enqueue_waiting, job_id, direction, gpu_ids.copy(), host_ids, wait_event
                )
                self._cascade.after_demotion(demotion, queue)
        except Exception:
            self._settle(direction, block_hashes, success=False)
            raise
        self._jobs[job_id] = (direction, block_hashes, host_ids)
        return job_id

    def _enqueue_layered(self, job_id, gpu_ids, host_ids, wait_event, groups) -> None:
        """A load's transfer jobs, one per group of layers. Jobs of one direction run in order on
        the engine's stream, so only the first waits for `wait_event`. If one cannot be queued,
        those queued before it are waited for and their reports dropped."""
        self._layered[job_id] = _LayeredLoad(groups, set(range(len(groups))))
        for group, layers in enumerate(groups):
            try:
                self.transfers.enqueue(
                    (job_id, group),
                    Direction.LOAD,
                    gpu_ids,
                    host_ids,
                    wait_event if group == 0 else None,
                    layers=layers,
                )
            except BaseException:
                del self._layered[job_id]
                for queued in range(group):
                    self.transfers.wait((job_id, queued))
                raise

    def _checked_layer_groups(self, layer_groups: Sequence[range]) -> list[range]:
        """`layer_groups` as a list, each a range the transfer engine can move alone, together
        every layer from 0 in order; one line naming `layer_groups` otherwise."""
        layout = self.transfers.layout
        if isinstance(layer_groups, range) or not isinstance(layer_groups, Sequence):
            raise TypeError(
                "layer_groups must be a list of ranges of layers (consecutive, from 0), got "
                f"{type(layer_groups).__name__}"
            )
        groups = list(layer_groups)
        for position, layers in enumerate(groups):
            try:
                layout.layer_segments(layers)
            except (TypeError, ValueError) as error:
                raise type(error)(f"layer_groups[{position}]: {error}") from None
        stops = [layers.stop for layers in groups]
        starts = [layers.start for layers in groups]
        if not groups or starts != [0, *stops[:-1]] or stops[-1] != layout.num_layers:
            raise ValueError(
                f"layer_groups must be consecutive ranges covering layers 0 to "
                f"{layout.num_layers} in order, got {groups!r}"
            )
        return groups

    def _enqueue_waiting(self, job_id, direction, gpu_ids, host_ids, wait_event) -> None:
        del self._waiting[job_id]
        try:
            self.transfers.enqueue(job_id, direction, gpu_ids, host_ids, wait_event)
        except Exception:  # any refusal fails the job, reported by poll
            logger.exception("numbakv offloader: job %s could not be queued", job_id)
            self._settle(direction, self._jobs.pop(job_id)[1], success=False)
            self._finished.append(FinishedJob(job_id, direction, False, 0, 0.0))

    def poll(self) -> list[FinishedJob]:
        """The jobs finished since the last poll, with the manager updated."""
        self._collect()
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_id: int) -> bool:
        """Block until the job finishes; returns its success. It is still reported by `poll`."""
        while job_id in self._jobs:
            demotion = self._waiting.get(job_id)
            layered = self._layered.get(job_id)
            if layered is not None:
                for group in sorted(layered.pending):
                    self.transfers.wait((job_id, group))
            elif demotion is None:
                self.transfers.wait(job_id)
            else:
                self._cascade.wait_for(demotion)  # its host slots' old blocks on their way down
            self._collect()
        reported = [job.success for job in self._finished if job.job_id == job_id]
        if not reported:
            raise KeyError(f"job {job_id!r} is not in flight")
        return reported[0]

    def drain(self) -> list[FinishedJob]:
        """Wait for every job in flight, the tier's jobs and lookups too (at shutdown, say);
        returns what `poll` would."""
        self._finish_jobs()
        if self._cascade is not None:
            self._cascade.answer_lookups()
        return self.poll()

    def _finish_jobs(self) -> None:
        """Wait for every engine and tier job in flight and settle it; `poll` reports them."""
        while self._jobs or (self._cascade is not None and self._cascade.busy):
            if self._jobs:
                self.wait(next(iter(self._jobs)))
            else:
                self._cascade.finish()

    def flush_to_tier(self) -> TierFlush:
        """Store every ready host block the tier does not hold yet down to it, and wait: what an
        engine that demotes calls before it goes away, so that host memory's blocks outlive it.

        Jobs in flight are finished first (a store's blocks are flushed once written; `poll`
        still reports the jobs), and the blocks are copied while nothing can evict them. Blocks
        the tier holds already (promoted, written through, flushed) are not copied again, so a
        second flush copies nothing. A store the tier fails is reported in the result and logged,
        never raised: host memory keeps the blocks, and a later flush retries them. Without a
        tier there is nothing to do.
        """
        if self._cascade is None:
            return TierFlush(stored=0)
        self._finish_jobs()
        return self._cascade.flush()

    def reset(self) -> list[FinishedJob]:
        """Forget every cached block, safely while jobs are in flight; returns what `poll` would.

        Jobs in flight are finished and settled first (stores made ready, loads' pins released),
        then the manager is reset: no job begun before the reset completes into the new cache,
        and no host slot is handed out again while a copy still writes or reads it. Call this, not
        `manager.reset_cache()`, while the offloader has jobs in flight.
        """
        finished = self.drain()
        self.manager.reset_cache()
        if self._cascade is not None:
            self._cascade.forget()
        return finished

    def _collect(self) -> None:
        if self._cascade is not None:
            self._cascade.collect()
        for part in self.transfers.get_finished():
            job = self._whole(part)
            if job is None:
                continue
            direction, block_hashes, host_ids = self._jobs.pop(job.job_id)
            written_through = (  # then ready once the tier has it
                direction is Direction.STORE
                and job.success
                and self._cascade is not None
                and self._cascade.write_through(block_hashes, host_ids)
            )
            if not written_through:
                self._settle(direction, block_hashes, job.success)
            self._finished.append(job)

    def _whole(self, part: FinishedJob) -> FinishedJob | None:
        """The offloader's job `part` finishes, or None: a group of a layered load whose other
        groups are still under way (or one queued before its load was refused)."""
        if not isinstance(part.job_id, tuple):
            return part
        job_id, group = part.job_id
        load = self._layered.get(job_id)
        if load is None:
            return None
        load.pending.discard(group)
        load.nbytes += part.nbytes
        load.seconds += part.seconds  # the groups run one after another, on one stream
        load.success &= part.success
        if load.pending:
            return None
        del self._layered[job_id]
        return FinishedJob(job_id, Direction.LOAD, load.success, load.nbytes, load.seconds)

    def _settle(self, direction: Direction, block_hashes: list, success: bool) -> None:
        if direction is Direction.STORE:
            self.manager.complete_store(block_hashes, success=success)
        else:
            self.manager.complete_load(block_hashes)

    def completion_event(self, job_id: int, layer: int | None = None) -> Any | None:
        """What the compute stream waits on before it reads a load's blocks (None once the job is
        collected: `poll`, `wait`).
        `layer`, for a load by `layer_groups`: the event of the group holding that layer (the
        last group's without it: every layer's)."""
        num_layers = self.transfers.layout.num_layers
        if layer is not None and (
            isinstance(layer, bool)
            or not isinstance(layer, Integral)
            or not 0 <= layer < num_layers
        ):
            raise ValueError(f"layer must be a layer index in [0, {num_layers}), got {layer!r}")
        demotion = self._waiting.get(job_id)
        if demotion is not None:  # a store whose slots are being demoted: hand it over now
            self._cascade.wait_for(demotion)
            self._collect()
        if job_id not in self._jobs:
            return None
        layered = self._layered.get(job_id)
        if layered is None:
            return self.transfers.completion_event(job_id)
        groups = layered.groups
        last = num_layers - 1 if layer is None else layer
        group = next(position for position, layers in enumerate(groups) if last in layers)
        return self.transfers.completion_event((job_id, group))

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
        if isinstance(block_hashes, (bytes, str)) or not hasattr(block_hashes, "__len__"):
            raise TypeError(
                "block_hashes must be a sequence of block hashes (a list, say), got "
                f"{type(block_hashes).__name__}"
            )
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


def _same_rows(rows: np.ndarray, pool: np.ndarray) -> bool:
    """Whether two 2-D C-contiguous arrays are the same memory, row for row."""
    return rows.shape == pool.shape and (
        rows.__array_interface__["data"][0] == pool.__array_interface__["data"][0]
    )
