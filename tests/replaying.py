"""Drive a manager with the trace README's replay semantics (lookup, touch, store the rest)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from numbakv import CPUOffloadingManager


def replay_into(manager: CPUOffloadingManager, chains: Iterable[Sequence[int]]) -> None:
    for chain in chains:
        hits = manager.lookup(chain)
        manager.touch(chain)
        output = manager.prepare_store(chain[hits:])
        if output is not None:
            manager.complete_store(output.block_hashes_to_store)
