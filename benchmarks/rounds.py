"""Two sources timed side by side, round by round: what the tier benchmarks print beside their
medians. On a small shared machine a slow moment falls on one round, so the ratio within each
round shows a steady difference that each source's median alone can hide."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def by_round(ours: Sequence[float], theirs: Sequence[float]) -> tuple[float, int]:
    """Our rate over theirs in each round (both ran in every round): the median ratio, and in
    how many rounds ours was ahead."""
    ratios = [mine / other for mine, other in zip(ours, theirs, strict=True)]
    return statistics.median(ratios), sum(ratio > 1 for ratio in ratios)
