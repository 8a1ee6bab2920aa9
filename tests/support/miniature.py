"""A miniature of any policy, to test against: what SightingMiniature must match, and a simple
candidate for MiniatureTuner."""

from __future__ import annotations

from collections.abc import Sequence

from numbakv.policies.base import CachePolicy
from numbakv.specs import BlockHash


class Miniature:
    """A policy instance of capacity/sampling blocks fed the sampled hashes of every request,
    with the replay semantics of the real cache: hits are the leading cached run, then a touch,
    then the missing blocks are stored (instantly ready). Hashes only: no bytes, no manager.

    Any `CachePolicy` runs in it; Sighting ARC's own settings run in `SightingMiniature`, which
    decides the same at a fraction of the cost."""

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy
        self.hits = 0.0
        self._free_ids = list(range(policy.capacity))

    def request(self, chain: Sequence[BlockHash], distinct: bool = False) -> int:
        """Replay one request; returns its hits (`distinct` is for faster miniatures)."""
        policy = self.policy
        hits = 0
        for block_hash in chain:
            if policy.get(block_hash) is None:
                break
            hits += 1
        self.hits += hits
        policy.touch(chain)
        tail = dict.fromkeys(chain[hits:])  # in order, without repeats
        missing = [block_hash for block_hash in tail if policy.get(block_hash) is None]
        # Like the manager: all or nothing, and never evict a block the request names.
        if not missing or len(missing) > policy.capacity - (len(tail) - len(missing)):
            return hits
        shortfall = len(missing) - len(self._free_ids)
        if shortfall > 0:
            victims = policy.evict(shortfall, tail.keys())
            self._free_ids += (block_id for _, block_id in victims)
        policy.insert(missing, [self._free_ids.pop() for _ in missing])
        return hits
