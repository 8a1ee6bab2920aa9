"""Belady's MIN under prefix semantics against a brute-force optimum, and as an upper bound."""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from numbakv import POLICIES
from numbakv.tools.replay import command as replay_command
from numbakv.tools.replay.belady import belady_hits, first_prefix_conflict
from numbakv.tools.replay.core import replay
from numbakv.tools.workloads.core import mixed_traffic


def random_chains(rng: random.Random, requests: int, max_blocks: int) -> list[list[int]]:
    """Requests that extend earlier prompts: an id always implies the same prefix."""
    chains: list[list[int]] = []
    next_id = 0
    for _ in range(requests):
        base = rng.choice(chains)[: rng.randint(0, 3)] if chains and rng.random() < 0.8 else []
        grow = rng.randint(0 if base else 1, 2) if next_id < max_blocks else 0
        chain = base + list(range(next_id, next_id + grow))
        next_id += grow
        chains.append(chain or [0])
    return chains


def prefix_hits(chain: list[int], cache: frozenset) -> int:
    hits = 0
    while hits < len(chain) and chain[hits] in cache:
        hits += 1
    return hits


def brute_force_optimum(chains: list[list[int]], capacity: int) -> int:
    """Most prefix hits of any cache: after each request it may keep any `capacity` blocks of
    what it held or what the request brought."""
    best = {frozenset(): 0}
    for chain in chains:
        following: dict[frozenset, int] = {}
        for cache, hits in best.items():
            hits += prefix_hits(chain, cache)
            pool = sorted(cache | set(chain))
            for size in range(min(capacity, len(pool)) + 1):
                for kept in combinations(pool, size):
                    key = frozenset(kept)
                    if following.get(key, -1) < hits:
                        following[key] = hits
        best = following
    return max(best.values())


@pytest.mark.parametrize("seed", range(40))
def test_belady_matches_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    chains = random_chains(rng, requests=rng.randint(3, 7), max_blocks=7)
    capacity = rng.randint(1, 3)
    hits, references, _ = belady_hits(chains, capacity)
    assert references == sum(len(chain) for chain in chains)
    assert hits == brute_force_optimum(chains, capacity)


def test_ties_evict_the_deeper_block() -> None:
    # 0 and 1 are both used next by the last request; keeping 1 instead of 0 would hit nothing.
    chains = [[0, 1], [2], [0, 1]]
    assert belady_hits(chains, 1)[0] == 1


def test_belady_bounds_every_policy() -> None:
    chains = [request.hash_ids for request in mixed_traffic(requests=1500, seed=3)]
    for capacity in (200, 1000):
        bound = belady_hits(chains, capacity)[0]
        for policy in POLICIES:
            assert replay(chains, policy, capacity).hits <= bound, policy


@pytest.mark.parametrize(
    ("chains", "conflict"),
    [
        ([[1], [0], [0, 1]], (2, 1)),  # 1 first seen with no block before it, then after 0
        ([[0, 1], [2, 1]], (1, 1)),
        ([[5, 5]], (0, 1)),
        ([[0, 1], [0, 1, 2], [3], [0]], None),
    ],
)
def test_an_id_found_after_another_prefix_is_named(chains, conflict):
    assert first_prefix_conflict(chains) == conflict


def test_the_replay_refuses_belady_on_a_trace_it_does_not_bound(tmp_path, capsys):
    chains = [[1], [0], [0, 1]]
    assert replay(chains, "lru", 1).hits > belady_hits(chains, 1)[0]  # why: LRU beats "MIN"
    trace = tmp_path / "unchained.jsonl"
    trace.write_text("".join(f'{{"hash_ids": {chain}}}\n' for chain in chains))
    with pytest.raises(SystemExit) as exit_info:
        replay_command.main([str(trace), "--policy", "lru,belady", "--capacity", "1"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and len(err.splitlines()) == 1
    assert "--policy" in err and "belady" in err and "request 3" in err
