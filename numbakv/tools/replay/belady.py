"""Belady's MIN under the replay semantics: the clairvoyant upper bound for any policy.

It reads the whole trace first, so it is a reference for replays, not a policy for the manager.
On a miss it keeps the blocks used soonest: a new block replaces the cached block whose next use is
farthest away, or is not stored at all when it is itself the farthest. Ties are broken by evicting
the deeper block of a chain, which keeps the cache prefix-closed (see docs/POLICIES.md): every
cached block can then hit, so MIN's block hits under prefix semantics equal its hits for
independent blocks, the optimum that bounds every policy.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from numbakv.tools.progress import Progress

BELADY = "belady"  # its name where policies are named; a replay-only reference, not a policy
NEVER = float("inf")


def next_uses(chains: Sequence[Sequence[int]]) -> list[list[float]]:
    """For each request and position, the index of the next request that uses that block."""
    upcoming: dict[int, float] = {}
    result: list[list[float]] = [[] for _ in chains]
    for index in range(len(chains) - 1, -1, -1):
        chain = chains[index]
        result[index] = [upcoming.get(block, NEVER) for block in chain]
        for block in chain:
            upcoming[block] = index
    return result


def first_prefix_conflict(chains: Sequence[Sequence[int]]) -> tuple[int, int] | None:
    """(request, position) of the first block id found after another block than where it was
    first seen (or after none, or twice in a request), or None. MIN is a bound only on a trace
    where each id implies its prefix, as a chained hash does: elsewhere its tie-break can leave a
    block cached without the blocks before it, and a real policy can beat it."""
    parents: dict[int, int | None] = {}
    for request, chain in enumerate(chains):
        before = None
        for position, block in enumerate(chain):
            if parents.setdefault(block, before) != before:
                return request, position
            before = block
    return None


def belady_hits(
    chains: Sequence[Sequence[int]], capacity: int, meter: Progress | None = None
) -> tuple[int, int, int]:
    """(hits, references, evictions) of MIN replaying the chains with `capacity` blocks;
    `meter`, if given, counts the requests replayed."""
    upcoming = next_uses(chains)
    cached: dict[int, tuple[float, int]] = {}  # block -> (next use, depth): its eviction key
    farthest: list[tuple[float, int, int]] = []  # max-heap by key, with stale entries
    hits = references = evictions = 0
    for chain, next_use in zip(chains, upcoming):
        if meter is not None:
            meter.update()
        hit = 0
        while hit < len(chain) and chain[hit] in cached:
            hit += 1
        hits += hit
        references += len(chain)
        for depth, (block, use) in enumerate(zip(chain, next_use)):
            if block in cached:
                cached[block] = (use, depth)
                heapq.heappush(farthest, (-use, -depth, block))
                continue
            if use == NEVER:
                continue
            if len(cached) >= capacity:
                while True:
                    negative_use, negative_depth, victim = farthest[0]
                    if cached.get(victim) == (-negative_use, -negative_depth):
                        break
                    heapq.heappop(farthest)  # stale
                if (-negative_use, -negative_depth) <= (use, depth):
                    continue  # this block is the farthest: do not store it
                heapq.heappop(farthest)
                del cached[victim]
                evictions += 1
            cached[block] = (use, depth)
            heapq.heappush(farthest, (-use, -depth, block))
    return hits, references, evictions
