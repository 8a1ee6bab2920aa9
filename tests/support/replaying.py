"""Drive a manager through whole traces with the replay CLI's per-request step."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from numbakv import CPUOffloadingManager
from numbakv.tools.replay.core import replay_request


def replay_into(manager: CPUOffloadingManager, chains: Iterable[Sequence[int]]) -> None:
    for chain in chains:
        replay_request(manager, chain)


def interrupted_at(request: int):
    """A replay_request that raises KeyboardInterrupt at its `request`-th call, as Ctrl-C would."""
    calls = 0

    def step(manager: CPUOffloadingManager, chain: Sequence[int]) -> tuple[int, int]:
        nonlocal calls
        calls += 1
        if calls == request:
            raise KeyboardInterrupt
        return replay_request(manager, chain)

    return step
