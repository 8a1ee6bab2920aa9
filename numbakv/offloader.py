"""The one place where the two halves meet, for an engine that runs them in one process.

The manager decides (which host slots, what to evict) and the transfer engine moves bytes; the
offloader turns one into the other and closes the loop when a job finishes: a finished store makes
its blocks ready, a failed one frees them (nothing half-written ever becomes ready), and a finished
load releases its pins. Engines with separate scheduler and worker processes ship the manager's
plain specs across instead (see docs/OFFLOADER.md).

With a second tier (a `numbakv.tiers.ChunkTier` over the same host pool) it also wires the tier
in: blocks reach it by demotion or write-through, a host miss the tier holds is promoted into host
memory off the engine's thread, and `flush_to_tier` hands host memory's blocks down before the
engine goes away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import count
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from numbakv.jobs import Direction, FinishedJob
from numbakv.manager import CPUOffloadingManager
from numbakv.specs import BlockHash, StorePlan

if TYPE_CHECKING:
    from numbakv.tiers import ChunkTier, TierLookup

logger = logging.getLogger("numbakv.offloader")

OffloadMode = Literal["eager", "lazy"]
Tiering = Literal["demote", "write-through"]
DEMOTE: Tiering = "demote"
WRITE_THROUGH: Tiering = "write-through"
TIERINGS = (DEMOTE, WRITE_THROUGH)
_PROMOTE = "promote"  # the tier job kinds besides the two tierings
_FLUSH = "flush"
MAX_TIER_LOOKUPS = 4096
"""Tier lookups kept under way at once; past it the oldest is forgotten (its request asks anew)."""
FLUSH_BATCH_BLOCKS = 64
"""Blocks a flush hands the tier in one job: several jobs keep the tier's I/O threads busy."""


def tier_key(block_hash: BlockHash) -> bytes:
    """The key a block is kept under in a tier: bytes as they are, an int as 8 bytes
    (little-endian, signed), so engines hashing either way share a tier with their own kind."""
    if isinstance(block_hash, bytes) and block_hash:
        return block_hash
    if isinstance(block_hash, (int, np.integer)) and not isinstance(block_hash, bool):
        try:
            return int(block_hash).to_bytes(8, "little", signed=True)
        except OverflowError:
            pass
    raise ValueError(
        "block_hashes must be non-empty bytes or 64-bit ints to be kept in a tier, got "
        f"{block_hash!r}"
    )


@dataclass(frozen=True)
class TierFlush:
    """What `KVOffloader.flush_to_tier` handed down: how many host blocks the tier took, and the
    hashes of those it failed to store (still in host memory only; a later flush retries them)."""

    stored: int
    failed: tuple[BlockHash, ...] = ()

    @property
    def success(self) -> bool:
        return not self.failed


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

    `tier`, a `ChunkTier` over this engine's host pool (its rows are the host blocks), is a second
    tier below host memory. `tiering` says how blocks reach it: "demote" (a block evicted from
    host memory is copied down before its slot is reused; the default, it keeps more hits) or
    "write-through" (every stored block is copied down before it becomes ready).
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
        if tiering not in TIERINGS:
            raise ValueError(f"tiering must be 'demote' or 'write-through', got {tiering!r}")
        if manager.num_blocks > transfers.num_host_blocks:
            raise ValueError(
                f"the manager hands out {manager.num_blocks} host blocks, the transfer engine's "
                f"host pool has {transfers.num_host_blocks}: size them alike"
            )
        if tier is not None and tier.num_rows < manager.num_blocks:
            raise ValueError(
                f"the manager hands out {manager.num_blocks} host blocks, the tier reads and "
                f"writes {tier.num_rows} host-pool rows: build the tier over the engine's host pool"
            )
        self.manager = manager
        self.transfers = transfers
        self.mode = mode
        self.tier = tier
        self.tiering = tiering
        # Engine jobs in flight: direction, block hashes, host ids.
        self._jobs: dict[int, tuple[Direction, list, np.ndarray]] = {}
        self._job_ids = count()
        self._finished: list[FinishedJob] = []
        # Tier jobs in flight: kind, block hashes, host ids (for a demotion, the evicted rows).
        self._tier_jobs: dict[int, tuple[str, list, np.ndarray]] = {}
        self._after_demotion: dict[int, Callable[[], None]] = {}  # what waits for its rows
        # Engine jobs not handed to the transfer engine yet: the demotion each waits for.
        self._waiting: dict[int, int] = {}
        self._promoting: set[BlockHash] = set()
        self._demoting: set[BlockHash] = set()  # evicted, on their way down: ask again soon
        # Tier lookups under way, by a request's first host miss: the lookup, the hashes asked.
        self._tier_lookups: dict[BlockHash, tuple[TierLookup, list]] = {}
        # With a tier, by host slot: the hash the offloader last put there, and whether the tier
        # holds that block too (promoted, written through or flushed), so evicting or flushing it
        # again copies nothing down.
        slots = manager.num_blocks if tier is not None else 0
        self._slot_hashes = np.empty(slots, dtype=object)
        self._below = np.zeros(slots, dtype=bool)

    def lookup(self, block_hashes: Sequence[BlockHash]) -> int | None:
        """How many leading blocks the host pool can load; None: ask again after a `poll`.

        With a tier, a host miss is looked up in the tier (None while it answers; an answer later
        than its deadline is a miss), and the blocks after the host hits that it holds are
        promoted into host memory (None again until they are there). Neither waits on this
        thread; a failed promotion is a miss.
        """
        hits = self.manager.lookup(block_hashes)
        if self.tier is None or hits == len(block_hashes):
            return hits
        return self._promote(list(block_hashes)[hits:], hits)

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
        if self.tier is not None:
            for block_hash in block_hashes:
                tier_key(block_hash)
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

    def _submit(self, direction, block_hashes, gpu_ids, host_ids, wait_event, plan=None) -> int:
        """Hand the job to the transfer engine, or, when its host slots still hold evicted blocks
        being demoted, once the demotion has finished (`_collect` does)."""
        job_id = next(self._job_ids)
        try:  # host ids come from the manager, sized to the pool: the gpu ids are checked
            demotion = self._take_slots(plan)
            if demotion is None:
                self.transfers.enqueue(job_id, direction, gpu_ids, host_ids, wait_event)
            else:
                self._waiting[job_id] = demotion
                self._after_demotion[demotion] = partial(
                    self._enqueue_waiting, job_id, direction, gpu_ids, host_ids, wait_event
                )
        except Exception:
            self._settle(direction, block_hashes, success=False)
            raise
        self._jobs[job_id] = (direction, block_hashes, host_ids)
        return job_id

    def _enqueue_waiting(self, job_id, direction, gpu_ids, host_ids, wait_event) -> None:
        del self._waiting[job_id]
        try:
            self.transfers.enqueue(job_id, direction, gpu_ids, host_ids, wait_event)
        except Exception:  # any refusal fails the job, reported by poll
            logger.exception("numbakv offloader: job %s could not be queued", job_id)
            self._settle(direction, self._jobs.pop(job_id)[1], success=False)
            self._finished.append(FinishedJob(job_id, direction, False, 0, 0.0))

    def _take_slots(self, plan: StorePlan | None) -> int | None:
        """Note which blocks `plan` puts in which host slots, and copy the blocks it evicted down
        to the tier unless it holds them already; the tier job id, None if none."""
        if self.tier is None or plan is None:
            return None
        rows = plan.evicted_block_ids.block_ids
        below = self._below[rows]  # read before the new blocks take the victims' slots
        slots = plan.store_spec.block_ids
        self._slot_hashes[slots] = plan.block_hashes_to_store
        self._below[slots] = False
        if self.tiering != DEMOTE or below.all():
            return None
        evicted = plan.block_hashes_evicted
        if below.any():
            evicted = [h for h, known in zip(evicted, below.tolist()) if not known]
            rows = rows[~below]
        self._demoting.update(evicted)
        return self._tier_job(DEMOTE, evicted, rows)

    def _tier_job(self, kind: str, block_hashes: list, host_ids: np.ndarray) -> int:
        job_id = next(self._job_ids)
        keys = [tier_key(block_hash) for block_hash in block_hashes]
        submit = self.tier.submit_load if kind == _PROMOTE else self.tier.submit_store
        submit(job_id, keys, host_ids)
        self._tier_jobs[job_id] = (kind, block_hashes, host_ids)
        return job_id

    def _promote(self, missed: list, hits: int) -> int | None:
        """Start promoting the leading `missed` blocks the tier holds; `hits` if there are none."""
        if missed[0] in self._promoting:
            return None
        if self.manager.is_being_stored(missed[0]):
            return hits  # the engine is storing it: it still has it
        held = self._held_below(missed)
        if held is None:
            return None
        stats = self.manager.stats()  # what host memory can take: free and evictable slots
        held = min(held, stats.free + stats.used - stats.being_stored - stats.being_read)
        if held < 1:
            return hits
        plan = self.manager.prepare_store(missed[:held])
        if plan is None or not plan.block_hashes_to_store:
            return hits  # no room in host memory (every block pinned or being stored)
        promoted = plan.block_hashes_to_store
        try:
            start = partial(self._tier_job, _PROMOTE, promoted, plan.store_spec.block_ids)
            demotion = self._take_slots(plan)
            if demotion is None:
                start()
            else:
                self._after_demotion[demotion] = start
        except Exception:
            self.manager.complete_store(promoted, success=False)
            raise
        self._promoting.update(promoted)
        return None

    def _held_below(self, missed: list) -> int | None:
        """How many leading `missed` blocks the tier holds; None while it is being asked.

        The first call for a request (named by its first miss) starts the tier's lookup; a later
        one takes the answer, or misses once the deadline has passed (the tier counts them late).
        """
        if missed[0] in self._demoting:
            return None  # in neither host memory nor the tier until its demotion lands
        asked = self._tier_lookups.pop(missed[0], None)
        if asked is None:
            if len(self._tier_lookups) >= MAX_TIER_LOOKUPS:
                del self._tier_lookups[next(iter(self._tier_lookups))]
            lookup = self.tier.lookup([tier_key(block_hash) for block_hash in missed])
            self._tier_lookups[missed[0]] = (lookup, missed)
            return None
        lookup, asked_hashes = asked
        answer = lookup.answer()
        if answer is None:
            self._tier_lookups[missed[0]] = asked
            return None
        held = 0
        for wanted, asked_hash, found in zip(missed, asked_hashes, answer):
            if wanted != asked_hash or not found:
                break
            held += 1
        if held < len(missed) and missed[held] in self._demoting:
            return None  # the answer predates that block's demotion: ask again once it lands
        return held

    def poll(self) -> list[FinishedJob]:
        """The jobs finished since the last poll, with the manager updated."""
        self._collect()
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_id: int) -> bool:
        """Block until the job finishes; returns its success. It is still reported by `poll`."""
        while job_id in self._jobs:
            demotion = self._waiting.get(job_id)
            if demotion is None:
                self.transfers.wait(job_id)
            else:
                self.tier.wait(demotion)  # its host slots' old blocks on their way down
            self._collect()
        reported = [job.success for job in self._finished if job.job_id == job_id]
        if not reported:
            raise KeyError(f"job {job_id!r} is not in flight")
        return reported[0]

    def drain(self) -> list[FinishedJob]:
        """Wait for every job in flight, the tier's jobs and lookups too (at shutdown, say);
        returns what `poll` would."""
        self._finish_jobs()
        for lookup, _ in self._tier_lookups.values():
            lookup.answer(wait=True)
        return self.poll()

    def _finish_jobs(self) -> None:
        """Wait for every engine and tier job in flight and settle it; `poll` reports them."""
        while self._jobs or self._tier_jobs:
            if self._jobs:
                self.wait(next(iter(self._jobs)))
            else:
                self.tier.drain()
                self._collect()

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
        if self.tier is None:
            return TierFlush(stored=0)
        self._finish_jobs()
        rows = self.manager.ready_block_ids().block_ids
        rows = rows[~self._below[rows]]
        hashes = self._slot_hashes[rows].tolist()
        for start in range(0, len(rows), FLUSH_BATCH_BLOCKS):
            batch = rows[start : start + FLUSH_BATCH_BLOCKS]
            try:
                self._tier_job(_FLUSH, hashes[start : start + len(batch)], batch)
            except Exception:  # a tier that refuses the job (closed, say) fails its blocks
                logger.exception(
                    "numbakv offloader: the tier refused to flush %d blocks", len(batch)
                )
        self._finish_jobs()
        left = ~self._below[rows]
        failed = tuple(h for h, lost in zip(hashes, left.tolist()) if lost) if left.any() else ()
        if failed:
            logger.warning(
                "numbakv offloader: %d of %d host blocks could not be flushed to the tier; they "
                "are in host memory only",
                len(failed),
                len(rows),
            )
        return TierFlush(stored=len(rows) - len(failed), failed=failed)

    def reset(self) -> list[FinishedJob]:
        """Forget every cached block, safely while jobs are in flight; returns what `poll` would.

        Jobs in flight are finished and settled first (stores made ready, loads' pins released),
        then the manager is reset: no job begun before the reset completes into the new cache,
        and no host slot is handed out again while a copy still writes or reads it. Call this, not
        `manager.reset_cache()`, while the offloader has jobs in flight.
        """
        finished = self.drain()
        self.manager.reset_cache()
        self._below[:] = False
        return finished

    def _collect(self) -> None:
        if self.tier is not None:
            for job in self.tier.take_finished():
                self._settle_tier_job(job)
        for job in self.transfers.get_finished():
            direction, block_hashes, host_ids = self._jobs.pop(job.job_id)
            if direction is Direction.STORE and job.success and self._writes_through:
                self._tier_job(WRITE_THROUGH, block_hashes, host_ids)  # ready once it is down
            else:
                self._settle(direction, block_hashes, job.success)
            self._finished.append(job)

    @property
    def _writes_through(self) -> bool:
        return self.tier is not None and self.tiering == WRITE_THROUGH

    def _settle_tier_job(self, job: FinishedJob) -> None:
        """A tier job is the offloader's own: the engine sees its effect, never the job."""
        kind, block_hashes, host_ids = self._tier_jobs.pop(job.job_id)
        if kind == DEMOTE:  # done or failed, the evicted blocks' slots are free to overwrite
            self._demoting.difference_update(block_hashes)
            self._after_demotion.pop(job.job_id)()
            return
        moved = np.ones(len(host_ids), dtype=bool)
        if job.failed_keys:
            failed = set(job.failed_keys)
            moved = np.array([tier_key(h) not in failed for h in block_hashes], dtype=bool)
        self._below[host_ids[moved]] = True  # the tier holds these blocks of host memory too
        if kind == WRITE_THROUGH:  # the host copy is good whether the tier kept one or not
            self.manager.complete_store(block_hashes, success=True)
        elif kind == _PROMOTE:  # a failed promotion is a miss, never wrong bytes
            lost = [h for h, ok in zip(block_hashes, moved.tolist()) if not ok]
            self.manager.complete_store(lost, success=False)
            self.manager.complete_store(block_hashes, success=True)
            self._promoting.difference_update(block_hashes)

    def _settle(self, direction: Direction, block_hashes: list, success: bool) -> None:
        if direction is Direction.STORE:
            self.manager.complete_store(block_hashes, success=success)
        else:
            self.manager.complete_load(block_hashes)

    def completion_event(self, job_id: int) -> Any | None:
        """What the compute stream waits on before it reads a load's blocks (None once done)."""
        demotion = self._waiting.get(job_id)
        if demotion is not None:  # a store whose slots are being demoted: hand it over now
            self.tier.wait(demotion)
            self._collect()
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
