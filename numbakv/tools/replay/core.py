"""Replaying request traces through the manager: hit ratios of a policy at a capacity.

Each request is looked up, its hits loaded, its missing tail stored, and then it finishes, in
vLLM 0.32's request order (docs/MANAGER.md, "Replay");
`python3 -m numbakv.replay` is the command line over it (numbakv.tools.replay.command).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from numbakv.manager import CPUOffloadingManager
from numbakv.tools.cli import Interrupted, interrupts_between_requests, runs_kept
from numbakv.tools.progress import Progress
from numbakv.tools.replay.belady import BELADY, belady_hits


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    capacity: int
    requests: int
    references: int
    hits: int
    hit_ratio: float
    evictions: int
    stores_skipped: int
    block_operations: int
    seconds: float

    @property
    def block_operations_per_second(self) -> float:
        return self.block_operations / self.seconds if self.seconds > 0 else float("inf")


def replay_request(manager: CPUOffloadingManager, chain: Sequence[int]) -> tuple[int, int]:
    """One request under the trace's replay semantics, as vLLM 0.32's connector drives a manager:
    look it up, load its hits, store its missing tail, finish it (its blocks then become recent,
    the head the most recent). Returns (blocks hit, blocks stored)."""
    request = manager.begin_request()
    hits = manager.lookup(chain)
    if hits:
        manager.prepare_load(chain[:hits], request)
        manager.complete_load(chain[:hits])
    stored = 0
    if hits < len(chain):
        output = manager.prepare_store(chain[hits:], request)
        if output is not None:
            manager.complete_store(output.block_hashes_to_store)
            stored = len(output.block_hashes_to_store)
    manager.finish_request(request)
    return hits, stored


def replay(
    chains: Sequence[Sequence[int]],
    policy: str = "lru",
    capacity: int = 10_000,
    store_threshold: int = 1,
    progress: bool = False,
) -> ReplayResult:
    """Replay the chains in order, one request at a time, through a fresh manager.

    `policy="belady"` replays Belady's MIN instead (clairvoyant; no manager involved). A capacity
    beyond the trace's block references is never filled, so the manager gets only that many
    slots. `progress` reports on stderr; Ctrl-C raises `Interrupted` with the partial result.
    """
    with Progress("replaying", len(chains), "req", enabled=progress) as meter:
        return _replay(chains, policy, capacity, store_threshold, meter)


def replay_grid(
    chains: Sequence[Sequence[int]],
    policies: Sequence[str],
    capacities: Sequence[int],
    store_threshold: int = 1,
    progress: bool = False,
    request_hits: list[list[int] | None] | None = None,
) -> list[ReplayResult]:
    """One replay per policy and capacity, policy by policy, capacities in the order given.

    `progress` reports on the whole grid; Ctrl-C raises `Interrupted` with the runs finished
    and the one cut short. `request_hits`, if given, gets each run's blocks hit per request (None
    for Belady's MIN, which counts hits in all)."""
    runs = [(policy, capacity) for policy in policies for capacity in capacities]
    results: list[ReplayResult] = []
    with (
        Progress("replaying", len(runs) * len(chains), "req", enabled=progress) as meter,
        runs_kept(results, len(chains)),
    ):
        for number, (policy, capacity) in enumerate(runs, start=1):
            meter.describe(f"{policy} at {capacity:,} blocks (run {number} of {len(runs)})")
            hits = None if request_hits is None or policy == BELADY else []
            if request_hits is not None:
                request_hits.append(hits)
            results.append(_replay(chains, policy, capacity, store_threshold, meter, hits))
    return results


def _replay(
    chains: Sequence[Sequence[int]],
    policy: str,
    capacity: int,
    store_threshold: int,
    meter: Progress,
    hits_per_request: list[int] | None = None,
) -> ReplayResult:
    if policy == BELADY:
        return _replay_belady(chains, capacity, meter)
    slots = max(1, min(capacity, sum(map(len, chains))))
    manager = CPUOffloadingManager(
        block_size=1, num_blocks=slots, cache_policy=policy, store_threshold=store_threshold
    )
    requests = block_operations = 0
    started = time.perf_counter()
    try:
        with interrupts_between_requests() as stop_if_interrupted:
            for chain in chains:
                stop_if_interrupted()
                hits, stored = replay_request(manager, chain)
                if hits_per_request is not None:
                    hits_per_request.append(hits)
                block_operations += 3 * len(chain) + hits + stored
                requests += 1
                meter.update()
    except KeyboardInterrupt:
        partial = _manager_result(manager, policy, capacity, requests, block_operations, started)
        raise Interrupted([partial], len(chains)) from None
    return _manager_result(manager, policy, capacity, requests, block_operations, started)


def _manager_result(
    manager: CPUOffloadingManager,
    policy: str,
    capacity: int,
    requests: int,
    block_operations: int,
    started: float,
) -> ReplayResult:
    seconds = time.perf_counter() - started
    stats = manager.stats()
    references = stats.hit_blocks + stats.missed_blocks
    return ReplayResult(
        policy=policy,
        capacity=capacity,
        requests=requests,
        references=references,
        hits=stats.hit_blocks,
        hit_ratio=stats.hit_blocks / references if references else 0.0,
        evictions=stats.evicted_blocks,
        stores_skipped=stats.stores_skipped,
        block_operations=block_operations,
        seconds=seconds,
    )


def _replay_belady(chains: Sequence[Sequence[int]], capacity: int, meter: Progress) -> ReplayResult:
    started = time.perf_counter()
    try:
        hits, references, evictions = belady_hits(chains, capacity, meter)
    except KeyboardInterrupt:  # MIN keeps no partial result
        raise Interrupted([], len(chains)) from None
    return ReplayResult(
        policy=BELADY,
        capacity=capacity,
        requests=len(chains),
        references=references,
        hits=hits,
        hit_ratio=hits / references if references else 0.0,
        evictions=evictions,
        stores_skipped=0,
        block_operations=references,
        seconds=time.perf_counter() - started,
    )
