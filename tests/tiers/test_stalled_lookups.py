"""Lookups never queue behind a store that stopped answering: once one has gone unanswered for
STALLED_DEADLINES deadlines, and while the breaker is open, a lookup is misses at once; one whose
deadline passed while it waited its turn is never asked."""

from __future__ import annotations

import statistics
import time

from numbakv.tiers.tier import STALLED_DEADLINES
from tests.support.tiers import KEYS, DictBackend, finished, tier_over

DEADLINE_S = 0.01


def waited(tier, keys) -> tuple[list[bool], float]:
    started = time.perf_counter()
    answer = tier.contains(keys)
    return answer, time.perf_counter() - started


def test_a_stalled_store_answers_misses_at_once_until_it_answers_again():
    backend = DictBackend()
    tier = tier_over(backend, lookup_deadline_s=DEADLINE_S)
    tier.submit_store(1, KEYS, range(4))
    finished(tier)
    backend.gate.clear()
    try:
        # Each waits its deadline, queued behind the first, until that one has gone unanswered
        # for STALLED_DEADLINES deadlines; from then on none waits.
        answers = [waited(tier, KEYS) for _ in range(STALLED_DEADLINES + 40)]
        assert all(answer == [False] * 4 for answer, _ in answers)
        waits = [seconds for _, seconds in answers]
        assert sum(seconds >= DEADLINE_S for seconds in waits) <= STALLED_DEADLINES + 1
        assert statistics.median(waits[-20:]) < DEADLINE_S / 2  # a median: the machine is shared
        assert tier.counters.late_lookups == len(answers)
    finally:
        backend.gate.set()
    time.sleep(0.05)  # the stalled lookup is answered: lookups are asked again
    assert tier.contains(KEYS) == [True] * 4


def test_while_the_breaker_is_open_a_lookup_is_answered_on_the_callers_thread():
    backend = DictBackend()
    tier = tier_over(backend, lookup_deadline_s=DEADLINE_S, breaker_cooldown_s=60)
    backend.unavailable = True
    assert tier.contains(KEYS) == [False] * 4 and tier.breaker_open
    before = tier.counters.unavailable
    backend.gate.clear()  # a call to the store would now hang: none is made
    try:
        lookup = tier.lookup(KEYS)
        assert lookup.answer() == [False] * 4  # answered already, without waiting
        assert tier.counters.unavailable == before + 1
        assert tier.counters.lookups == 8 and tier.counters.late_lookups == 0
    finally:
        backend.gate.set()


class CountedLookups(DictBackend):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def exists(self, keys):
        self.asked += 1
        return super().exists(keys)


def test_lookups_queued_behind_a_slow_answer_are_never_asked_once_late():
    """The store answers one lookup late, not stalled long enough to be taken as stalled: the
    lookups queued behind it meanwhile are past their deadline when their turn comes, so none is
    asked, and close() does not wait for them (it asked each, as long as the store took)."""
    backend = CountedLookups()
    tier = tier_over(backend, lookup_deadline_s=DEADLINE_S)
    backend.gate.clear()
    lookups = [tier.lookup(KEYS) for _ in range(STALLED_DEADLINES)]
    time.sleep(3 * DEADLINE_S)  # every one past its deadline
    backend.gate.set()
    tier.close()
    assert backend.asked == 1
    assert all(lookup.answer() == [False] * 4 for lookup in lookups)
    assert tier.counters.late_lookups >= len(lookups) - 1  # the first was answered, late
