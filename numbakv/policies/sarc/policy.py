"""Sighting ARC: ARC's lists, a long memory of blocks seen once, and a bound on them chosen by
miniature simulations of itself."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import compress
from math import ceil
from typing import NamedTuple

from numbakv.policies.block_lists import BlockLists
from numbakv.policies.block_table import BlockTable
from numbakv.policies.sarc.chain_ends import ChainEndWatch
from numbakv.policies.sarc.ghosts import GhostList
from numbakv.policies.sarc.miniatures import MiniatureTuner, SightingMiniature, sampling_for
from numbakv.policies.sarc.reuse_classes import ReuseClasses, tail_classes
from numbakv.specs import BlockHash

SIGHTING_MEMORY = 4  # hashes of once-seen evicted blocks remembered, in cache capacities
WATCHED = 4  # chain ends and siblings remembered: capacity / WATCHED hashes (results flat to 16),
WATCHED_AT_MOST = 10_000  # ... at most this many (as at 40,000 blocks: memory stays bounded)


class Setting(NamedTuple):
    """What the miniatures choose among."""

    bound: float  # on blocks seen once, x capacity
    returns_to_t2: bool  # a block whose hash is a ghost is stored into T2 (else into T1)


SETTINGS = (
    Setting(0.0, True),  # admit on the second sighting
    Setting(0.125, True),
    Setting(0.25, True),
    Setting(0.5, True),
    Setting(1.0, True),  # LRU
    Setting(0.0, False),  # keep what was hit while cached: survives loops larger than the cache
)
LRU = SETTINGS.index(Setting(1.0, True))  # the challenger whenever it ties for the most hits
UNDECIDED = SETTINGS.index(Setting(0.5, True))  # leads while all miniatures tie: the middle bound
DEMOTED = -1  # the tick of a demoted chain end: older than every block


class SightingARCPolicy(BlockTable):
    """Chooses online between LRU and "admit on the second sighting"; no knob.

    Most KV blocks are never used again, and those that are come back after a long gap (the next
    turn of a conversation). Like ARC (Megiddo & Modha, FAST 2003) it keeps T1 (blocks seen once),
    T2 (seen again), ghost lists B1 and B2 of evicted hashes, and a bound p on T1. Differences:

    - a block whose hash is a ghost is stored straight into T2, as in the paper (vLLM puts it back
      into T1, where the next burst of one-off blocks pushes it out again);
    - B1 remembers `SIGHTING_MEMORY` capacities of hashes, so a second sighting is recognised even
      when the gap is longer than the cache;
    - while T1 is within p, victims are the least recent blocks of either list (LRU); beyond p,
      once-seen blocks go first;
    - p is not moved by ghost hits but chosen among `SETTINGS`: miniature copies of this policy,
      one per setting, replay a sample of the traffic, and p follows the one that hits most once
      its lead is beyond noise (half the capacity until they differ);
    - one setting stores returning ghosts into T1 instead, so that T2 holds only blocks hit while
      cached: on a loop larger than the cache that part stays put and hits, where LRU hits nothing;
    - the blocks of one store are ranked like a touched chain, the first the most recent: a hit on
      any of them needs the ones before it;
    - a chain's last block is ranked below every other block while it comes back far less often
      than the block before it (`ChainEndWatch`);
    - when T1 is over p, its victim is not simply the least recent: a block of a class of requests
      whose blocks come back less often goes sooner (`ReuseClasses`).

    `setting` fixes p and where ghosts return, and turns the last three rules off (the miniatures
    run those settings, in `SightingMiniature`).

    Blocks are kept by host block id: a dict from hash to id, T1 and T2 as `BlockLists`, and per
    id its hash, list and clock tick. Stored blocks are ranked as they are stored, so every call
    costs O(1) per block it names or evicts, plus one heap over the reuse classes per eviction.
    """

    def __init__(
        self, capacity: int, ref_counts: Sequence[int], setting: Setting | None = None
    ) -> None:
        super().__init__(capacity, ref_counts)
        self.setting = setting
        self._lists = BlockLists(capacity, 2)
        self._t1_end, self._t2_end = self._lists.sentinel(0), self._lists.sentinel(1)
        self._hash_of: list[BlockHash] = [None] * capacity
        # When each block was last ranked or touched (machine ints: no int object per block).
        self._tick = array("q", bytes(8 * capacity))
        self._home = [self._t1_end] * capacity  # the sentinel of the list each block is in
        self.b1 = GhostList(SIGHTING_MEMORY * capacity)
        self.b2 = GhostList(capacity)
        self._start()

    def _start(self) -> None:
        """Fresh clock, lists, setting, and (when self-tuned) miniatures and chain-end watch."""
        self._clock = 0  # the next tick
        self._t1_size = 0  # T2 holds the rest of the cached blocks
        self._touched_length = 0  # blocks in the last touched chain
        if self.setting is not None:
            self._follow(self.setting)
            self._tuner = self.chain_ends = self.reuse = None
            return
        self._follow(SETTINGS[UNDECIDED])
        sampling = sampling_for(self.capacity)
        size = max(1, self.capacity // sampling)
        miniatures = [
            SightingMiniature(size, setting.bound, setting.returns_to_t2, SIGHTING_MEMORY)
            for setting in SETTINGS
        ]
        self._tuner = MiniatureTuner(miniatures, sampling, default=LRU, undecided=UNDECIDED)
        self.chain_ends = ChainEndWatch(max(1, min(self.capacity // WATCHED, WATCHED_AT_MOST)))
        self.reuse = ReuseClasses(
            self.capacity,
            (SIGHTING_MEMORY + 1) * self.capacity,
            self._tick,
            self.ref_counts,
            self._hash_of,
        )

    def _follow(self, setting: Setting) -> None:
        self.p = setting.bound * self.capacity
        self.returns_to_t2 = setting.returns_to_t2

    def insert(self, block_hashes: Sequence[BlockHash], block_ids: Sequence[int]) -> None:
        # The blocks of one store are ranked like a touched chain as they go in: the first the
        # newest, the last the oldest (a hit on any of them needs the ones before it).
        count = len(block_hashes)
        clock = self._clock
        self._clock = clock + count
        hashes, ids = block_hashes[::-1], block_ids[::-1]  # last first: the order of their ticks
        returning = self._returning(hashes)
        hash_of, tick, home, t1_end = self._hash_of, self._tick, self._home, self._t1_end
        for block_hash, block_id, block_tick in zip(hashes, ids, range(clock, clock + count)):
            hash_of[block_id] = block_hash
            tick[block_id] = block_tick
            home[block_id] = t1_end
        self._where.update(zip(block_hashes, block_ids))
        classes = None if self.reuse is None else tail_classes(self._touched_length - count, count)
        if returning and self.returns_to_t2:  # returning ghosts go to T2, the others to T1
            once = [block_hash not in returning for block_hash in hashes]
            t2_end = self._t2_end
            to_t2 = [block_id for block_id, seen_once in zip(ids, once) if not seen_once]
            for block_id in to_t2:
                home[block_id] = t2_end
            self._lists.push_newest_all(to_t2, t2_end)
            hashes, ids = list(compress(hashes, once)), list(compress(ids, once))
            if classes is not None:
                classes = list(compress(classes, once))
        self._lists.push_newest_all(ids, t1_end)
        self._t1_size += len(ids)
        if classes is not None:
            self.reuse.add_all(ids, hashes, classes)
        chain_ends = self.chain_ends
        if chain_ends is not None and count and block_hashes[-1] == chain_ends.last_touched:
            chain_ends.watch(block_hashes[-1], block_hashes[-2] if count > 1 else None)
            if chain_ends.demote:
                self._demote(block_ids[-1])

    def _returning(self, hashes: Sequence[BlockHash]) -> AbstractSet[BlockHash]:
        """The hashes that are ghosts, taken out of the ghost lists (most stores have none)."""
        b1, b2 = self.b1, self.b2
        if b1.members.isdisjoint(hashes) and b2.members.isdisjoint(hashes):
            return frozenset()
        returning = {h for h in hashes if h in b1.members or h in b2.members}
        for block_hash in returning:
            (b1 if block_hash in b1.members else b2).remove(block_hash)
        return returning

    def _demote(self, block_id: int) -> None:
        """A block goes to the old end of its list (and of its class), older than any other."""
        end = self._home[block_id]
        self._lists.unlink(block_id)
        self._lists.push_oldest(block_id, end)
        if end == self._t1_end:
            self.reuse.demote(block_id)
        self._tick[block_id] = DEMOTED

    def remove(self, block_hash: BlockHash) -> None:
        block_id = self._where.pop(block_hash)
        end = self._home[block_id]
        self._lists.unlink(block_id)
        if end == self._t1_end:
            self._t1_size -= 1
            if self.reuse is not None:
                self.reuse.leave_all((block_id,))

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        self._touched_length = len(block_hashes)
        reuse = self.reuse
        if self._tuner is not None:
            self._follow(SETTINGS[self._tuner.observe(block_hashes)])
            self.chain_ends.seen(block_hashes)
            reuse.seen(block_hashes)
        now = self._clock
        self._clock = now + 1
        get, tick, home, ready = self._where.get, self._tick, self._home, self.ref_counts
        newer, older = self._lists.newer, self._lists.older
        b1, b2, t1_end, t2_end = self.b1, self.b2, self._t1_end, self._t2_end
        in_b1, in_b2 = b1.members, b2.members
        promoted = []
        # As ARC does, from the last hash to the first, so that the first ends the most recent.
        # Each block is moved as it is met: gathering the moves for `BlockLists`' batch calls
        # cost 1.6-2.3% more instructions (and a chain may name a block twice).
        for block_hash in reversed(block_hashes):
            block_id = get(block_hash)
            if block_id is None:
                if block_hash in in_b1:
                    b1.refresh(block_hash)
                elif block_hash in in_b2:
                    b2.refresh(block_hash)
                continue
            tick[block_id] = now
            before, after = older[block_id], newer[block_id]
            newer[before] = after
            older[after] = before
            end = home[block_id]
            # Seen again: T1 -> T2, unless its store is still in flight (not really seen twice).
            if end == t1_end:
                if ready[block_id] >= 0:
                    end = home[block_id] = t2_end
                    promoted.append(block_id)
                elif reuse is not None:
                    reuse.renew(block_id)
            newest = older[end]
            newer[newest] = block_id
            older[block_id] = newest
            newer[block_id] = end
            older[end] = block_id
        self._t1_size -= len(promoted)
        if reuse is not None:
            reuse.leave_all(promoted)

    def evict(self, n: int, protected: AbstractSet[BlockHash]) -> list[tuple[BlockHash, int]]:
        # One victim at a time, as if the earlier ones were gone: while T1 is over p, T1's victim
        # (by reuse class when self-tuned, else its least recent); otherwise the least recent of
        # the two lists.
        ticks, pinned, hash_of, reuse = self._tick, self.ref_counts, self._hash_of, self.reuse
        newer = self._lists.newer
        t1_end, t2_end = self._t1_end, self._t2_end
        t1_left, p = self._t1_size, self.p
        # The first rounds, while what is left of T1 is over p, all take from T1.
        over_bound = min(n, max(0, ceil(t1_left - p)))
        chosen_t1: list[int] = []
        if reuse is not None:
            now = self._clock
            self._clock = now + 1
            if over_bound:
                chosen_t1 = reuse.take_victims(over_bound, now, protected)
        by_class = len(chosen_t1)
        walked = n - by_class
        taken = set(chosen_t1) if walked else ()  # the walk from T1's old end skips these
        chosen_t2: list[int] = []
        # Walk each list from its old end, past blocks that may not leave (ref count not 0,
        # named in the call, or taken by class). One skipping loop written for both lists cost
        # 0.9-1.1% more instructions.
        head_t1, head_t2 = newer[t1_end], newer[t2_end]
        for _ in range(walked):
            while head_t1 != t1_end and (
                pinned[head_t1] or head_t1 in taken or hash_of[head_t1] in protected
            ):
                head_t1 = newer[head_t1]
            while head_t2 != t2_end and (pinned[head_t2] or hash_of[head_t2] in protected):
                head_t2 = newer[head_t2]
            if head_t1 != t1_end and (
                head_t2 == t2_end
                or t1_left - len(chosen_t1) > p
                or ticks[head_t1] <= ticks[head_t2]
            ):
                chosen_t1.append(head_t1)
                head_t1 = newer[head_t1]
            else:
                chosen_t2.append(head_t2)
                head_t2 = newer[head_t2]
        # Lists change only now: the walks above read them.
        chosen = chosen_t1 + chosen_t2
        self._lists.unlink_all(chosen)
        hashes = [hash_of[block_id] for block_id in chosen]
        where = self._where
        for block_hash in hashes:
            del where[block_hash]
        if chosen_t1:
            self.b1.add_all(hashes[: len(chosen_t1)])
            if reuse is not None and len(chosen_t1) > by_class:
                reuse.leave_all(chosen_t1[by_class:])  # those taken by class have left already
        if chosen_t2:
            self.b2.add_all(hashes[len(chosen_t1) :])
        self._t1_size -= len(chosen_t1)
        return list(zip(hashes, chosen))

    def clear(self) -> None:
        super().clear()
        self._lists.clear()
        self.b1.clear()
        self.b2.clear()
        self._start()

    @property
    def t1(self) -> list[BlockHash]:
        """T1's hashes, least recent first (O(|T1|): for inspection)."""
        return [self._hash_of[block_id] for block_id in self._lists.oldest_first(self._t1_end)]

    @property
    def t2(self) -> list[BlockHash]:
        """T2's hashes, least recent first (O(|T2|): for inspection)."""
        return [self._hash_of[block_id] for block_id in self._lists.oldest_first(self._t2_end)]

    def stats(self) -> dict[str, float]:
        return {
            "p": self.p,
            "t1": self._t1_size,
            "t2": len(self._where) - self._t1_size,
            "b1": len(self.b1),
            "b2": len(self.b2),
        }
