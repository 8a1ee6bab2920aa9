"""Routing a trace to engines: session keys read from Mooncake chains, session and round-robin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from numbakv.tools.fleet.routing import ROUND_ROBIN, SESSION, route, session_keys
from numbakv.tools.traces import SAMPLE_TRACES, read_hash_chains
from numbakv.tools.workloads.core import WORKLOADS


def test_a_shared_prefix_names_no_session():
    chains = [[0, 1, 2], [0, 1, 3], [0, 4], [0, 4, 5, 6], [0]]
    assert session_keys(chains) == [(0, 1), (0, 1), (0, 4), (0, 4), (0,)]
    assert session_keys([[1, 2], [1, 3], [4], []]) == [(1, 2), (1, 3), (4,), ()]
    assert session_keys([]) == []


def test_each_system_prompt_s_conversations_are_sessions_of_their_own():
    """Two prompts, each opening several conversations of a few turns: a session per
    conversation (before, a trace's chains sharing no prefix keyed on their first block: one
    session per prompt, every conversation of a prompt on one engine)."""
    chains = [
        [prompt, prompt + 1, 100 * prompt + conversation, *range(1000, 1000 + turn)]
        for turn in range(3)
        for prompt in (10, 20)
        for conversation in range(5)
    ]
    assert len(set(session_keys(chains))) == 10


def test_one_odd_request_moves_no_session():
    """An empty chain (or any chain sharing nothing) once re-keyed the whole trace on its first
    block, and sent it to one engine."""
    chains = read_hash_chains(SAMPLE_TRACES["mooncake_conversation"])[:3000]
    assert route([*chains, []], 4)[:3000] == route(chains, 4)


def test_the_conversation_trace_has_7373_sessions():
    """docs/TIERS.md, "Routing and sessions": every request begins with block 0."""
    chains = read_hash_chains(SAMPLE_TRACES["mooncake_conversation"])
    assert len(set(session_keys(chains))) == 7373
    assert [route(chains, 4).count(engine) for engine in range(4)] == [2978, 2975, 3171, 2907]


@pytest.mark.parametrize("kind", ["chat", "mixed"])
def test_the_workloads_sessions_spread_over_the_engines(kind):
    chains = [request.hash_ids for request in WORKLOADS[kind](seed=0)]
    per_engine = [route(chains, 4).count(engine) for engine in range(4)]
    assert max(per_engine) < 1.25 * len(chains) / 4, per_engine


def test_a_session_stays_on_one_engine():
    chains = [[0, session, turn] for turn in range(5) for session in range(40)]
    engines = route(chains, 4, SESSION)
    by_session: dict[int, set[int]] = {}
    for chain, engine in zip(chains, engines):
        by_session.setdefault(chain[1], set()).add(engine)
    assert all(len(placed) == 1 for placed in by_session.values())
    assert set(engines) == {0, 1, 2, 3}
    assert route(chains, 1) == [0] * len(chains)


def test_round_robin_deals_requests_in_turn():
    assert route([[1]] * 7, 3, ROUND_ROBIN) == [0, 1, 2, 0, 1, 2, 0]


def test_session_routing_is_the_same_in_every_process():
    """The engine of a session does not depend on Python's salted string hashing."""
    code = (
        "from numbakv.tools.fleet.routing import route; "
        "print(route([[0, s] for s in range(50)], 8))"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1


@pytest.mark.parametrize(
    "engines, how, message",
    [(0, SESSION, "engines"), (True, SESSION, "engines"), (2, "random", "how")],
)
def test_bad_routes_are_named(engines, how, message):
    with pytest.raises(ValueError, match=message):
        route([[1]], engines, how)
