"""SIEVE against a plain-list model of the paper's algorithm (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from numbakv.policies.sieve import SIEVEPolicy

CAPACITY = 6
HASHES = st.integers(0, 9)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(HASHES, max_size=3)),
        st.tuples(st.just("touch"), st.lists(HASHES, max_size=4)),
        st.tuples(st.just("remove"), HASHES),
        st.tuples(st.just("pin"), HASHES),
        st.tuples(st.just("evict"), st.integers(1, 3), st.frozensets(HASHES, max_size=3)),
    ),
    max_size=60,
)


class ListSIEVE:
    """The queue as a list, oldest first, of [hash, block id, visited]; the hand as the hash it
    points at (None: the oldest)."""

    def __init__(self) -> None:
        self.queue: list[list] = []
        self.hand: int | None = None

    def newer_than(self, index: int) -> int | None:
        return self.queue[index + 1][0] if index + 1 < len(self.queue) else None

    def index(self, block_hash: int) -> int:
        return next(i for i, entry in enumerate(self.queue) if entry[0] == block_hash)

    def remove(self, block_hash: int) -> None:
        index = self.index(block_hash)
        if self.hand == block_hash:
            self.hand = self.newer_than(index)
        del self.queue[index]

    def evict(self, n: int, pinned, protected) -> list[tuple[int, int]]:
        victims = []
        while len(victims) < n:
            if self.hand is None:
                self.hand = self.queue[0][0]
            index = self.index(self.hand)
            block_hash, block_id, visited = entry = self.queue[index]
            newer = self.newer_than(index)
            if pinned[block_id] or block_hash in protected:
                self.hand = newer
            elif visited:
                entry[2] = False
                self.hand = newer
            else:
                del self.queue[index]
                victims.append((block_hash, block_id))
                self.hand = newer
        return victims


@given(steps=STEPS)
def test_sieve_evicts_as_the_list_model_does(steps) -> None:
    """Same victims, in order, under inserts, touches, removals, pinned blocks and protected
    hashes; the hand survives the removal of the block it points at."""
    ref_counts = [0] * CAPACITY
    policy, model = SIEVEPolicy(CAPACITY, ref_counts), ListSIEVE()
    free = list(range(CAPACITY))
    for action, *arguments in steps:
        cached = {entry[0]: entry for entry in model.queue}
        if action == "insert":
            new = [h for h in dict.fromkeys(arguments[0]) if h not in cached][: len(free)]
            ids = [free.pop() for _ in new]
            policy.insert(new, ids)
            model.queue += [[h, block_id, False] for h, block_id in zip(new, ids)]
        elif action == "touch":
            policy.touch(arguments[0])
            for block_hash in arguments[0]:
                if block_hash in cached:
                    cached[block_hash][2] = True
        elif action == "remove" and arguments[0] in cached:
            policy.remove(arguments[0])
            model.remove(arguments[0])
            free.append(cached[arguments[0]][1])
        elif action == "pin" and arguments[0] in cached:
            block_id = cached[arguments[0]][1]
            ref_counts[block_id] = 1 - ref_counts[block_id]
        elif action == "evict":
            n, protected = arguments
            evictable = [
                entry
                for entry in model.queue
                if not ref_counts[entry[1]] and entry[0] not in protected
            ]
            if n <= len(evictable):  # as the manager calls it: only when enough may leave
                victims = policy.evict(n, protected)
                assert victims == model.evict(n, ref_counts, protected)
                free += [block_id for _, block_id in victims]
        assert len(policy) == len(model.queue)
        for block_hash, block_id, _ in model.queue:
            assert policy.get(block_hash) == block_id


def test_removing_the_block_under_the_hand_moves_the_hand_on() -> None:
    policy = SIEVEPolicy(4, [0] * 4)
    policy.insert([10, 11, 12], [0, 1, 2])
    assert policy.evict(1, frozenset()) == [(10, 0)]  # the hand stays where 10 was: on 11
    policy.remove(11)
    assert policy.evict(1, frozenset()) == [(12, 2)]
    assert len(policy) == 0
