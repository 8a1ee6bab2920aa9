"""Drive a manager through whole traces with the replay CLI's per-request step."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from numbakv import CPUOffloadingManager
from numbakv.replay import replay_request


def replay_into(manager: CPUOffloadingManager, chains: Iterable[Sequence[int]]) -> None:
    for chain in chains:
        replay_request(manager, chain)
