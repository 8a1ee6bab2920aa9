"""What one request did to the host cache, kept until it finishes (vLLM 0.32's request order).

vLLM 0.32 applies a request's accesses to the policy once, when the request finishes, in prefix
order with the head the most recent; until then its loads and stores only pin and fill slots.
The manager records each request's blocks here as it loads and offers them
(`CPUOffloadingManager.prepare_load` and `prepare_store` with `request=`), and hands them to the
policy at `finish_request` (docs/MANAGER.md, "Requests").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from numbakv.specs import BlockHash


@dataclass(eq=False)
class RequestAccess:
    """One request's blocks: those it loaded or offered to store, in the order first seen.

    `inserted` are those it stored itself, `reused` the ready ones it loaded or offered (not its
    own insertions), `store_misses` the new blocks the policy has been shown once already;
    `touched` whether a policy that touches before storing has had its touch. `positions`, where
    the engine knows them (vLLM 0.33), gives the token position each block ends at: LRU then
    ranks the blocks of a running request by it (docs/MANAGER.md, "Requests").
    Made by `CPUOffloadingManager.begin_request`; valid until that manager's next `reset_cache`.
    """

    owner: object
    generation: int
    blocks: dict[BlockHash, None] = field(default_factory=dict)
    inserted: set[BlockHash] = field(default_factory=set)
    reused: set[BlockHash] = field(default_factory=set)
    store_misses: set[BlockHash] = field(default_factory=set)
    touched: bool = False  # by a policy that touches before storing
    positions: Callable[[BlockHash], int | None] | None = None
    finished: bool = False

    def record(self, block_hashes: Iterable[BlockHash], reused: Iterable[BlockHash]) -> None:
        """Note blocks seen (new ones at the end, in order) and which of them were re-used."""
        self.blocks.update(dict.fromkeys(block_hashes))
        inserted = self.inserted
        self.reused.update(h for h in reused if h not in inserted)
