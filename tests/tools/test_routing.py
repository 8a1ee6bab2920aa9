"""Routing a trace to engines: session keys read from Mooncake chains, session and round-robin."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from numbakv.tools.fleet.routing import (
    ROUND_ROBIN,
    SESSION,
    route,
    session_keys,
    shared_prefix_length,
)
from numbakv.tools.traces import SAMPLE_TRACES, read_hash_chains


def test_the_shared_prefix_names_no_session():
    chains = [[0, 1, 2], [0, 1, 3], [0, 4], [0, 4, 5, 6], [0]]
    assert shared_prefix_length(chains) == 1
    assert session_keys(chains) == [(0, 1), (0, 1), (0, 4), (0, 4), (0,)]
    assert shared_prefix_length([[1, 2], [3]]) == 0
    assert session_keys([[1, 2], [1, 3], [4]]) == [(1,), (1,), (4,)]
    assert shared_prefix_length([]) == 0


def test_the_conversation_trace_has_7373_sessions():
    """docs/TIERS.md, "Sizing a fleet": every request begins with block 0."""
    chains = read_hash_chains(SAMPLE_TRACES["mooncake_conversation"])
    assert shared_prefix_length(chains) == 1
    assert len(set(session_keys(chains))) == 7373


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
