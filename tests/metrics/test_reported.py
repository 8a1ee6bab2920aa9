"""ReportedSeries: what each report says changed adds up to what the source holds."""

from operator import attrgetter, itemgetter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numbakv.metrics.definitions import no_durations
from numbakv.metrics.reported import ReportedSeries
from numbakv.tiers.tier import Latency

steps = st.lists(st.integers(min_value=0, max_value=3), max_size=30)


@given(steps)
def test_a_counters_increases_add_up_to_its_value_and_nothing_moved_reports_none(increases):
    series = ReportedSeries(itemgetter(0), "counter")
    value, reported = 0, 0
    for increase in increases:
        value += increase
        change = series.change([value])
        assert (change is None) == (increase == 0)
        reported += change or 0
    assert reported == value


@given(st.lists(st.integers(min_value=0, max_value=2), max_size=30))
def test_a_gauge_reports_its_value_first_and_then_only_when_it_changed(values):
    series = ReportedSeries(itemgetter(0), "gauge")
    last = None
    for value in values:
        assert series.change([value]) == (None if value == last else value)
        last = value


@given(st.lists(st.lists(st.floats(min_value=0, max_value=5), max_size=4), max_size=10))
def test_a_histograms_changes_add_up_to_its_buckets_and_sum(steps):
    latency = Latency()
    series = ReportedSeries(attrgetter("buckets", "seconds"), "histogram")
    counts, seconds = no_durations(), 0.0
    for observations in steps:
        for duration in observations:
            latency.observe(duration)
        change = series.change(latency)
        if not observations:
            assert change is None
            continue
        deltas, added = change
        counts = [n + d for n, d in zip(counts, deltas)]
        seconds += added
    assert counts == latency.buckets
    assert seconds == pytest.approx(latency.seconds)
    if steps:  # a copy: the source goes on counting
        assert series.last[0] is not latency.buckets
