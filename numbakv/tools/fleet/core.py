"""Replaying a trace through a fleet: N engines, each with its own host tier and optional disk
tier, over one optional shared tier; hits counted by the tier that served them.

Every tier is a numbakv `CPUOffloadingManager` used as a slot index with a policy, bounded by its
capacity in blocks. The tiers follow numbakv.cascade's rules, as `KVOffloader` does with a real
tier, tier by tier down: a host miss found in a lower tier (own disk first, then the shared tier)
is a hit and is promoted into host memory; what the engine computes is stored in host memory and
reaches the lower tiers either by demotion (a block evicted from host memory moves to the disk, and
what the disk evicts to the shared tier) or by write-through (stored in every tier at once, as
vLLM 0.32's TieringOffloadingManager does). After the promotions, host memory replays the request
as the one-engine replay does (`numbakv.tools.replay.core.replay_request`), so it follows that
replay's semantics; with one engine and no lower tier a request is exactly one of its steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from numbakv.cascade import DEMOTE, Tiering, check_tiering, sent_down
from numbakv.manager import CPUOffloadingManager
from numbakv.tools.cli import Interrupted, interrupts_between_requests, runs_kept
from numbakv.tools.fleet.routing import SESSION, route
from numbakv.tools.progress import Progress
from numbakv.tools.replay.core import replay_request


@dataclass(frozen=True)
class FleetConfig:
    """One fleet to replay: capacities in blocks (per engine for host and disk; 0: no such tier)."""

    engines: int
    host_capacity: int
    disk_capacity: int = 0
    shared_capacity: int = 0
    policy: str = "lru"
    lower_policy: str = ""  # the disk and shared tiers' policy; "": the host's
    tiering: Tiering = DEMOTE
    route: str = SESSION
    store_threshold: int = 1

    def __post_init__(self) -> None:
        for name in ("engines", "host_capacity", "store_threshold"):
            _check_whole(name, getattr(self, name), lowest=1)
        for name in ("disk_capacity", "shared_capacity"):
            _check_whole(name, getattr(self, name), lowest=0)
        check_tiering(self.tiering)

    @property
    def lower_tiers_policy(self) -> str:
        return self.lower_policy or self.policy


@dataclass(frozen=True)
class FleetResult:
    """Block references of a fleet replay by where they were served from; `misses` were not."""

    config: FleetConfig
    requests: int
    references: int
    host_hits: int
    disk_hits: int
    shared_own_hits: int  # found in the shared tier, written there by the same engine
    shared_other_hits: int  # found in the shared tier, written there by another engine
    misses: int
    disk_writes: int  # blocks written to the engines' disk tiers
    shared_writes: int  # blocks written to the shared tier
    requests_per_engine: tuple[int, ...]
    seconds: float

    @property
    def hits(self) -> int:
        return self.host_hits + self.disk_hits + self.shared_own_hits + self.shared_other_hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.references if self.references else 0.0


class _Engine:
    """One engine's private tiers: host memory and, optionally, a disk."""

    def __init__(self, host: CPUOffloadingManager, disk: CPUOffloadingManager | None) -> None:
        self.host = host
        self.disk = disk
        self.requests = 0


HOST, DISK, SHARED_OWN, SHARED_OTHER = "host", "disk", "shared_own", "shared_other"


class Fleet:
    """The tiers of a fleet and the per-request step that serves a request on one engine."""

    def __init__(self, config: FleetConfig, slot_limit: int | None = None) -> None:
        """`slot_limit` caps every tier's slots (a trace's block references: more never fill)."""

        def tier(capacity: int, policy: str, **options: int | bool) -> CPUOffloadingManager:
            slots = max(1, min(capacity, slot_limit)) if slot_limit else capacity
            return CPUOffloadingManager(1, slots, cache_policy=policy, **options)

        self.config = config
        lower = config.lower_tiers_policy
        has_lower = bool(config.disk_capacity or config.shared_capacity)
        self.engines = [
            _Engine(
                # with lower tiers, host memory's events say what it stored and evicted
                tier(
                    config.host_capacity,
                    config.policy,
                    store_threshold=config.store_threshold,
                    enable_events=has_lower,
                ),
                tier(config.disk_capacity, lower) if config.disk_capacity else None,
            )
            for _ in range(config.engines)
        ]
        self.shared = tier(config.shared_capacity, lower) if config.shared_capacity else None
        self._writer: dict[int, int] = {}  # shared tier's block -> the engine that wrote it
        self.served = dict.fromkeys((HOST, DISK, SHARED_OWN, SHARED_OTHER), 0)
        self.misses = self.disk_writes = self.shared_writes = 0

    def serve(self, engine_number: int, chain: Sequence[int]) -> dict[str, int]:
        """One request on one engine: find its leading run of cached blocks tier by tier, promote
        what the lower tiers held into host memory, then replay the request there as the
        one-engine replay does (its hits, now all in host memory, and its computed tail).
        Returns the request's hits by the tier that served them."""
        engine = self.engines[engine_number]
        engine.requests += 1
        if engine.disk is None and self.shared is None:
            hits, _ = replay_request(engine.host, chain)
            self.served[HOST] += hits
            self.misses += len(chain) - hits
            return {HOST: hits}
        found = self._locate(engine_number, chain)
        for lower in (engine.disk, self.shared):
            if lower is not None:
                lower.touch(chain)
        if any(tier != HOST for tier in found):
            # naming the whole run spares its blocks already in host memory from the eviction
            _, evicted, _ = _put(engine.host, chain[: len(found)])
            self._send_down(engine_number, sent_down(self.config.tiering, (), evicted))
        list(engine.host.take_events())  # drop the promotion's: its blocks are below already
        hits, _ = replay_request(engine.host, chain)  # all of `found`, unless promotion failed
        served = dict.fromkeys(self.served, 0)
        for tier in found[:hits]:
            served[tier] += 1
        for tier, count in served.items():
            self.served[tier] += count
        self.misses += len(chain) - hits
        stored, evicted = [], []
        for event in engine.host.take_events():
            (evicted if event.removed else stored).extend(event.block_hashes)
        self._send_down(engine_number, sent_down(self.config.tiering, stored, evicted))
        return served

    def _locate(self, engine_number: int, chain: Sequence[int]) -> list[str]:
        """The tier that holds each block of the request's leading run of cached blocks."""
        host = self.engines[engine_number].host
        found = [HOST] * host.lookup(chain)
        while len(found) < len(chain):
            tier = self._tier_below(engine_number, chain[len(found)])
            if tier is None:
                break
            found.append(tier)
            while len(found) < len(chain) and host.lookup(chain[len(found) : len(found) + 1]):
                found.append(HOST)
        return found

    def _tier_below(self, engine_number: int, block: int) -> str | None:
        """Which lower tier holds `block` for this engine: its disk first, then the shared tier."""
        disk = self.engines[engine_number].disk
        if disk is not None and disk.lookup((block,)):
            return DISK
        if self.shared is not None and self.shared.lookup((block,)):
            return SHARED_OWN if self._writer[block] == engine_number else SHARED_OTHER
        return None

    def _send_down(self, engine_number: int, blocks: Sequence[int]) -> None:
        """Blocks host memory sends down go to the engine's disk, and what the disk sends down in
        turn (what it evicted or could not take, when demoting) to the shared tier."""
        disk = self.engines[engine_number].disk
        if disk is not None and blocks:
            written, evicted, refused = _put(disk, blocks)
            self.disk_writes += len(written)
            blocks = sent_down(self.config.tiering, blocks, evicted + refused)
        self._put_shared(engine_number, blocks)

    def _put_shared(self, engine_number: int, blocks: Sequence[int]) -> None:
        if self.shared is None or not blocks:
            return
        stored, evicted, _ = _put(self.shared, blocks)
        self.shared_writes += len(stored)
        for block in evicted:
            del self._writer[block]
        for block in stored:
            self._writer[block] = engine_number

    def result(self, seconds: float) -> FleetResult:
        return FleetResult(
            config=self.config,
            requests=sum(engine.requests for engine in self.engines),
            references=sum(self.served.values()) + self.misses,
            host_hits=self.served[HOST],
            disk_hits=self.served[DISK],
            shared_own_hits=self.served[SHARED_OWN],
            shared_other_hits=self.served[SHARED_OTHER],
            misses=self.misses,
            disk_writes=self.disk_writes,
            shared_writes=self.shared_writes,
            requests_per_engine=tuple(engine.requests for engine in self.engines),
            seconds=seconds,
        )


def _put(manager: CPUOffloadingManager, blocks: Sequence[int]) -> tuple[list, list, list]:
    """Store `blocks` (those not cached yet) in one tier: (stored, evicted, refused). A tier
    refuses them all when it cannot free enough room for them (more than it holds)."""
    if not blocks:
        return [], [], []
    plan = manager.prepare_store(blocks)
    if plan is None:
        return [], [], list(blocks)
    manager.complete_store(plan.block_hashes_to_store)
    return plan.block_hashes_to_store, plan.block_hashes_evicted, []


def fleet_replay(
    chains: Sequence[Sequence[int]], config: FleetConfig, progress: bool = False
) -> FleetResult:
    """Route the chains to the fleet's engines and serve them in order, one at a time.

    `progress` reports on stderr; Ctrl-C raises `Interrupted` with the partial result."""
    return fleet_grid(chains, [config], progress)[0]


def fleet_grid(
    chains: Sequence[Sequence[int]],
    configs: Sequence[FleetConfig],
    progress: bool = False,
    request_hits: list[list[dict[str, int]]] | None = None,
) -> list[FleetResult]:
    """One fleet replay per config, in order; Ctrl-C raises `Interrupted` with the runs finished
    and the one cut short. `request_hits`, if given, gets each run's hits per request by the tier
    that served them."""
    slot_limit = max(1, sum(map(len, chains)))
    routes: dict[tuple[int, str], list[int]] = {}
    results: list[FleetResult] = []
    with (
        Progress("replaying", len(configs) * len(chains), "req", enabled=progress) as meter,
        runs_kept(results, len(chains)),
    ):
        for number, config in enumerate(configs, start=1):
            meter.describe(f"fleet {number} of {len(configs)}")
            key = (config.engines, config.route)
            if key not in routes:
                routes[key] = route(chains, config.engines, config.route)
            hits: list[dict[str, int]] | None = None if request_hits is None else []
            if request_hits is not None:
                request_hits.append(hits)
            fleet = Fleet(config, slot_limit)
            results.append(_replay_one(chains, routes[key], fleet, meter, hits))
    return results


def _replay_one(
    chains: Sequence[Sequence[int]],
    engines: Sequence[int],
    fleet: Fleet,
    meter: Progress,
    hits: list[dict[str, int]] | None,
) -> FleetResult:
    started = time.perf_counter()
    try:
        with interrupts_between_requests() as stop_if_interrupted:
            for engine_number, chain in zip(engines, chains):
                stop_if_interrupted()
                served = fleet.serve(engine_number, chain)
                if hits is not None:
                    hits.append(served)
                meter.update()
    except KeyboardInterrupt:
        partial = fleet.result(time.perf_counter() - started)
        raise Interrupted([partial], len(chains)) from None
    return fleet.result(time.perf_counter() - started)


def _check_whole(name: str, value: object, lowest: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
        raise ValueError(f"{name}: got {value!r}, expected a whole number >= {lowest}")
