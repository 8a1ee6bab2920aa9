"""ARC, step by step, against the plain implementation of the spec on long random traces."""

import random

import pytest

from numbakv import CPUOffloadingManager
from tests.support.reference import ReferenceManager


def arc_state(manager):
    arc = manager._policy
    return (list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2), arc.p)


@pytest.mark.parametrize("seed", range(6))
def test_arc_lists_and_target_match_the_plain_implementation(seed):
    rng = random.Random(seed)
    capacity = rng.choice([4, 8, 16])
    universe = 3 * capacity
    real = CPUOffloadingManager(16, capacity, cache_policy="arc")
    model = ReferenceManager(capacity, "arc")
    pending_stores: list[list] = []
    pending_loads: list[list] = []
    ghost_hits = pinned_evictions_refused = 0
    for _ in range(3000):
        # Prefix-shaped requests, as an engine sends them: a random start, a short run.
        start = rng.randrange(universe)
        chain = [(start + i) % universe for i in range(rng.randint(1, 5))]
        action = rng.random()
        if action < 0.35:
            ghost_hits += sum(h in model.policy.b1 or h in model.policy.b2 for h in chain)
            real.touch(chain)
            model.touch(chain)
        elif action < 0.65:
            out, expected = real.prepare_store(chain), model.prepare_store(chain)
            if expected is None:
                assert out is None
                pinned_evictions_refused += 1
            else:
                assert (out.block_hashes_to_store, out.block_hashes_evicted) == expected
                if rng.random() < 0.5:
                    success = rng.random() < 0.9
                    real.complete_store(expected[0], success=success)
                    model.complete_store(expected[0], success)
                else:
                    pending_stores.append(expected[0])
        elif action < 0.75 and pending_stores:
            batch = pending_stores.pop(rng.randrange(len(pending_stores)))
            real.complete_store(batch)
            model.complete_store(batch, True)
        elif action < 0.85:
            hits = real.lookup(chain)
            assert hits == model.lookup(chain)
            if hits:
                real.prepare_load(chain[:hits])
                model.prepare_load(chain[:hits])
                pending_loads.append(chain[:hits])
        elif pending_loads:
            batch = pending_loads.pop(rng.randrange(len(pending_loads)))
            real.complete_load(batch)
            model.complete_load(batch)
        assert arc_state(real) == model.policy.state()
    assert (
        ghost_hits > 50 and pinned_evictions_refused > 0
    )  # the trace reached the interesting paths
