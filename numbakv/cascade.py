"""The rules of a host tier over a lower tier, and the host tier's side of them in an engine.

A block reaches the tier below in one of two ways, its `Tiering`: by demotion (a block host memory
evicts is copied down before its slot is reused) or by write-through (a block host memory stores
is copied down once it is written, and becomes ready when the tier below has it). A host miss the
tier below holds is promoted into host memory before the engine loads it, and a promoted block is
below already: it is never copied down again. `sent_down` says which blocks of a store into host
memory go down. The fleet replay (numbakv.tools.fleet) applies it to tiers that are managers, where
nothing takes time; `Cascade` applies it to a `ChunkTier` under an engine's host pool, for
`KVOffloader`, where the tier's jobs run on its own threads and a host slot being demoted is held
until its demotion lands.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import count
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np

from numbakv.jobs import FinishedJob
from numbakv.manager import CPUOffloadingManager
from numbakv.specs import BlockHash, StorePlan

if TYPE_CHECKING:
    from numbakv.tiers import ChunkTier, TierLookup

logger = logging.getLogger("numbakv.cascade")

Tiering = Literal["demote", "write-through"]
DEMOTE: Tiering = "demote"
WRITE_THROUGH: Tiering = "write-through"
TIERINGS = (DEMOTE, WRITE_THROUGH)
_PROMOTE = "promote"  # the tier job kinds besides the two tierings
_FLUSH = "flush"
MAX_TIER_LOOKUPS = 4096
"""Tier lookups kept under way at once; past it the oldest is forgotten (its request asks anew)."""
ANSWER_KEPT_S = 1.0
"""How long past its deadline a tier lookup's answer waits for its request to come back (an
engine asks again within a step or two); older, the tier is asked anew, as it may hold more."""
FLUSH_BATCH_BLOCKS = 64
"""Blocks a flush hands the tier in one job: several jobs keep the tier's I/O threads busy."""

B = TypeVar("B")


def check_tiering(tiering: object) -> Tiering:
    """`tiering` if it names a tiering; ValueError naming it otherwise."""
    if tiering not in TIERINGS:
        raise ValueError(f"tiering must be 'demote' or 'write-through', got {tiering!r}")
    return tiering  # type: ignore[return-value]


def sent_down(tiering: Tiering, stored: Sequence[B], evicted: Sequence[B]) -> Sequence[B]:
    """The blocks of a store into host memory that go to the tier below: those it evicted when
    demoting (before their slots are reused), those it stored when writing through (once they are
    written). A promotion stores blocks that came from below: it passes none as stored."""
    return evicted if tiering == DEMOTE else stored


_LOW_64_BITS = (1 << 64) - 1


def tier_key(block_hash: BlockHash) -> bytes:
    """The key a block is kept under in a tier: bytes as they are, an int as its 64 bits
    (little-endian; signed or unsigned, -1 and 2**64 - 1 alike), so engines hashing either way
    share a tier with their own kind."""
    if isinstance(block_hash, bytes) and block_hash:
        return block_hash
    if isinstance(block_hash, (int, np.integer)) and not isinstance(block_hash, bool):
        value = int(block_hash)
        if -(1 << 63) <= value < 1 << 64:
            return (value & _LOW_64_BITS).to_bytes(8, "little")
    raise ValueError(
        "block_hashes must be non-empty bytes or 64-bit ints (signed or unsigned) to be kept in "
        f"a tier, got {block_hash!r}"
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


class Cascade:
    """A `ChunkTier` under the host pool `manager` hands out (the tier's rows are its host blocks):
    demotion or write-through, promotion of host misses, and the flush, none of them waiting on
    the engine's thread.

    The engine's own copies stay its caller's (`KVOffloader`): before one writes host slots it
    asks `place`, and holds the copy back until the demotion `place` started has landed
    (`after_demotion`). The tier's jobs are settled by `collect`; the caller never sees them.
    """

    def __init__(
        self, manager: CPUOffloadingManager, tier: ChunkTier, tiering: Tiering = DEMOTE
    ) -> None:
        self.tiering = check_tiering(tiering)
        if tier.num_rows < manager.num_blocks:
            raise ValueError(
                f"the manager hands out {manager.num_blocks} host blocks, the tier reads and "
                f"writes {tier.num_rows} host-pool rows: build the tier over the engine's host pool"
            )
        self.manager = manager
        self.tier = tier
        self._job_ids = count()
        # Tier jobs in flight: kind, block hashes, host ids (for a demotion, the evicted rows).
        self._jobs: dict[int, tuple[str, Sequence, np.ndarray]] = {}
        self._after_demotion: dict[int, Callable[[], None]] = {}  # what waits for its rows
        self._promoting: set[BlockHash] = set()
        self._demoting: set[BlockHash] = set()  # evicted, on their way down: ask again soon
        # Tier lookups under way, by a request's first host miss: the lookup, the hashes asked,
        # and until when (time.monotonic()) its answer stands.
        self._lookups: dict[BlockHash, tuple[TierLookup, list, float]] = {}
        # Blocks whose promotion failed (an unanswered read): the next lookup misses them.
        self._failed_promotions: OrderedDict[BlockHash, None] = OrderedDict()
        # By host slot: the hash last put there, and whether the tier holds that block too
        # (promoted, written through or flushed), so evicting or flushing it copies nothing down.
        self._slot_hashes = np.empty(manager.num_blocks, dtype=object)
        self._below = np.zeros(manager.num_blocks, dtype=bool)

    @property
    def busy(self) -> bool:
        """Whether a tier job is in flight."""
        return bool(self._jobs)

    def check_keys(self, block_hashes: Sequence[BlockHash]) -> None:
        """Refuse (ValueError) a hash the tier cannot keep, before the manager changes anything."""
        for block_hash in block_hashes:
            tier_key(block_hash)

    def promote(self, block_hashes: list, hits: int) -> int | None:
        """The host pool's hits for a request whose blocks after its first `hits` are not in
        host memory; None: ask again after the tier's jobs are collected.

        The leading missed blocks the tier holds are promoted into host memory (None until they
        are there), as many as host memory has room for beside the request's own hits, which a
        promotion never evicts; a failed promotion is a miss.
        """
        host_hits, missed = block_hashes[:hits], block_hashes[hits:]
        if missed[0] in self._promoting:
            return None
        if missed[0] in self._failed_promotions:  # its promotion failed: a miss, this once
            del self._failed_promotions[missed[0]]
            return hits
        if self.manager.is_being_stored(missed[0]):
            return hits  # the engine is storing it: it still has it
        room = self.manager.room()  # free and idle slots, in O(1)
        if room > len(host_hits):  # at least this many beside the hits, however many are idle
            room -= len(host_hits)
        else:  # the hits may be all that is idle: count them (a pass over the hits)
            room = self.manager.room(spared=host_hits)
        if room < 1:
            return hits  # the tier is not even asked
        held = self._held_below(missed)
        if held is None:
            return None
        held = min(held, room)
        if held < 1:
            return hits
        plan = self.manager.prepare_store(missed[:held], spared=host_hits)
        if plan is None or not plan.block_hashes_to_store:
            return hits  # no room in host memory (every block pinned or being stored)
        promoted, slots = plan.block_hashes_to_store, plan.store_spec.block_ids
        try:
            demotion = self.place(plan)
            if demotion is None:
                self._job(_PROMOTE, promoted, slots)
            else:
                self.after_demotion(demotion, partial(self._start_promotion, promoted, slots))
        except Exception:
            self.manager.complete_store(promoted, success=False)
            raise
        self._promoting.update(promoted)
        return None

    def _start_promotion(self, promoted: list, slots: np.ndarray) -> None:
        """Start a promotion that waited for its slots' demotion; one the tier refuses now is a
        miss, and its blocks are free to be asked for again."""
        try:
            self._job(_PROMOTE, promoted, slots)
        except Exception:
            logger.exception(
                "numbakv cascade: the tier refused to promote %d blocks", len(promoted)
            )
            self.manager.complete_store(promoted, success=False)
            self._promoting.difference_update(promoted)

    def _held_below(self, missed: list) -> int | None:
        """How many leading `missed` blocks the tier holds; None while it is being asked.

        The first call for a request (named by its first miss) starts the tier's lookup; a later
        one takes the answer, or misses once the deadline has passed (the tier counts them late).
        """
        if missed[0] in self._demoting:
            return None  # in neither host memory nor the tier until its demotion lands
        asked = self._lookups.pop(missed[0], None)
        if asked is None or time.monotonic() > asked[2]:
            if len(self._lookups) >= MAX_TIER_LOOKUPS:
                del self._lookups[next(iter(self._lookups))]
            lookup = self.tier.lookup([tier_key(block_hash) for block_hash in missed])
            stands_until = time.monotonic() + self.tier.lookup_deadline_s + ANSWER_KEPT_S
            self._lookups[missed[0]] = (lookup, missed, stands_until)
            return None
        lookup, asked_hashes, _ = asked
        answer = lookup.answer()
        if answer is None:
            self._lookups[missed[0]] = asked
            return None
        held = 0
        for wanted, asked_hash, found in zip(missed, asked_hashes, answer):
            if wanted != asked_hash or not found:
                break
            held += 1
        if held < len(missed) and missed[held] in self._demoting:
            return None  # the answer predates that block's demotion: ask again once it lands
        return held

    def place(self, plan: StorePlan) -> int | None:
        """Note which blocks `plan` puts in which host slots, and copy the blocks it evicted that
        go down (`sent_down`) to the tier unless it holds them already; the id of that demotion,
        which the copy into those slots must wait for, or None if there is none."""
        rows = plan.evicted_block_ids.block_ids
        below = self._below[rows]  # read before the new blocks take the victims' slots
        slots = plan.store_spec.block_ids
        self._slot_hashes[slots] = plan.block_hashes_to_store
        for block_hash in plan.block_hashes_to_store:  # in host memory anew: found there
            self._failed_promotions.pop(block_hash, None)
        self._below[slots] = False
        evicted = sent_down(self.tiering, (), plan.block_hashes_evicted)
        if not evicted or below.all():
            return None
        if below.any():
            evicted = [h for h, known in zip(evicted, below.tolist()) if not known]
            rows = rows[~below]
        demotion = self._job(DEMOTE, evicted, rows)
        self._demoting.update(evicted)
        return demotion

    def after_demotion(self, demotion: int, then: Callable[[], None]) -> None:
        """Call `then` once the demotion `place` returned has landed, done or failed."""
        self._after_demotion[demotion] = then

    def wait_for(self, demotion: int) -> None:
        """Wait until the demotion `place` returned has landed (`collect` settles it)."""
        self.tier.wait(demotion)

    def write_through(self, block_hashes: list, host_ids: np.ndarray) -> bool:
        """An engine's store has written these host blocks: whether they go down now
        (`sent_down`); they then become ready once the tier has them. False: the caller makes
        them ready."""
        if not sent_down(self.tiering, block_hashes, ()):
            return False
        self._job(WRITE_THROUGH, block_hashes, host_ids)
        return True

    def _job(self, kind: str, block_hashes: Sequence, host_ids: np.ndarray) -> int:
        job_id = next(self._job_ids)
        keys = [tier_key(block_hash) for block_hash in block_hashes]
        submit = self.tier.submit_load if kind == _PROMOTE else self.tier.submit_store
        submit(job_id, keys, host_ids)
        self._jobs[job_id] = (kind, block_hashes, host_ids)
        return job_id

    def collect(self) -> None:
        """Settle the tier's finished jobs; a landed demotion releases what waits for its rows."""
        for job in self.tier.take_finished():
            self._settle(job)

    def _settle(self, job: FinishedJob) -> None:
        kind, block_hashes, host_ids = self._jobs.pop(job.job_id)
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
            self._failed_promotions.update(dict.fromkeys(lost))
            while len(self._failed_promotions) > MAX_TIER_LOOKUPS:
                self._failed_promotions.popitem(last=False)
            self.manager.complete_store(block_hashes, success=True)
            self._promoting.difference_update(block_hashes)

    def finish(self) -> None:
        """Wait for every tier job in flight, the promotions a demotion released included, and
        settle them (an engine job a demotion released is its caller's to wait for)."""
        while self._jobs:
            self.tier.drain()
            self.collect()

    def answer_lookups(self) -> None:
        """Wait for the lookups under way, each at most its deadline."""
        for lookup, _, _ in self._lookups.values():
            lookup.answer(wait=True)

    def flush(self) -> TierFlush:
        """Store every ready host block the tier does not hold yet down to it, and wait; with no
        copy into host memory in flight (the caller has finished them), nothing evicts meanwhile.

        A store the tier fails is reported in the result and logged, never raised."""
        rows = self.manager.ready_block_ids().block_ids
        rows = rows[~self._below[rows]]
        hashes = self._slot_hashes[rows].tolist()
        for start in range(0, len(rows), FLUSH_BATCH_BLOCKS):
            batch = rows[start : start + FLUSH_BATCH_BLOCKS]
            try:
                self._job(_FLUSH, hashes[start : start + len(batch)], batch)
            except Exception:  # a tier that refuses the job (closed, say) fails its blocks
                logger.exception("numbakv cascade: the tier refused to flush %d blocks", len(batch))
        self.finish()
        left = ~self._below[rows]
        failed = tuple(h for h, lost in zip(hashes, left.tolist()) if lost) if left.any() else ()
        if failed:
            logger.warning(
                "numbakv cascade: %d of %d host blocks could not be flushed to the tier; they "
                "are in host memory only",
                len(failed),
                len(rows),
            )
        return TierFlush(stored=len(rows) - len(failed), failed=failed)

    def forget(self) -> None:
        """Host memory was reset: the tier holds none of its (new) blocks."""
        self._below[:] = False
        self._failed_promotions.clear()
