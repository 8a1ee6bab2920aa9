"""Routing a trace's requests to engines, as a router in front of a fleet would.

Mooncake's traces carry no session or user id, so the session a request belongs to is read from
its chain of block ids: a conversation's later turns repeat its earlier prompt, so they begin with
the same blocks. Every chain of a trace may also begin with a prefix all requests share (the
conversation trace's block 0, a system prompt): that prefix names no conversation. A request's
session key is therefore its chain up to and including the first block past the prefix every
request shares (docs/TIERS.md, "Sizing a fleet").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

SESSION = "session"
ROUND_ROBIN = "round-robin"
ROUTES = (SESSION, ROUND_ROBIN)


def shared_prefix_length(chains: Sequence[Sequence[int]]) -> int:
    """How many leading block ids every chain has in common (0 for no chains)."""
    if not chains:
        return 0
    first = chains[0]
    length = min(map(len, chains))
    for chain in chains:
        for position in range(length):
            if chain[position] != first[position]:
                length = position
                break
    return length


def session_keys(chains: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Each request's session: its chain up to the first block past the trace's shared prefix."""
    depth = shared_prefix_length(chains) + 1
    return [tuple(chain[:depth]) for chain in chains]


def route(chains: Sequence[Sequence[int]], engines: int, how: str = SESSION) -> list[int]:
    """The engine (0 to `engines` - 1) each request goes to.

    `session`: a hash of the request's session key picks the engine, as a stateless
    session-affinity router does, so a conversation stays on one engine whatever the order.
    `round-robin`: request i goes to engine i mod `engines`.
    """
    if not isinstance(engines, int) or isinstance(engines, bool) or engines < 1:
        raise ValueError(f"engines: got {engines!r}, expected a whole number >= 1")
    if how == ROUND_ROBIN:
        return [number % engines for number in range(len(chains))]
    if how != SESSION:
        raise ValueError(f"how: got {how!r}, expected one of {', '.join(ROUTES)}")
    return [_stable_hash(key) % engines for key in session_keys(chains)]


def _stable_hash(key: tuple[int, ...]) -> int:
    """The same number for the same key in every process (Python's hash of a str is salted)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
