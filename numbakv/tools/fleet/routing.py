"""Routing a trace's requests to engines, as a router in front of a fleet would.

Mooncake's traces carry no session or user id, so the session a request belongs to is read from
its chain of block ids: a conversation's later turns repeat its earlier prompt, so they begin with
the same blocks, one path in the trie of the trace's chains. Where chains part, past a prefix
several requests share (a system prompt: the conversation trace's block 0, or each of a workload's
prompts), the next block names a conversation. A request's session key is therefore its chain up
to and including the block after the first place its chain parts from another's; a chain that
parts from none below its first block keys on that block (docs/TIERS.md, "Routing and sessions").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

SESSION = "session"
ROUND_ROBIN = "round-robin"
ROUTES = (SESSION, ROUND_ROBIN)


def session_keys(chains: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Each request's session: its chain up to and including the block after the first block
    past which the trace's chains part (its first block where none do)."""
    trie: dict = {}
    for chain in chains:
        node = trie
        for block in chain:
            node = node.setdefault(block, {})
    keys = []
    for chain in chains:
        node, key = trie, tuple(chain[:1])
        for depth, block in enumerate(chain):
            node = node[block]
            if len(node) > 1:  # chains part here: the next block names a conversation
                key = tuple(chain[: depth + 2])
                break
        keys.append(key)
    return keys


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
