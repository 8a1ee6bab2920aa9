"""What a series last reported, for reports that add up what each one says changed.

The multi-process writer (into prometheus-client's shared files) and the vLLM adapters' stats
(vLLM's ``OffloadingConnectorStats``) both read running totals and report what moved since their
last report: :class:`ReportedSeries` is that bookkeeping, kept once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numbakv.metrics.definitions import MetricType


class ReportedSeries:
    """One series, read from what its source gives, and the value it last reported.

    :meth:`change` reads it anew and says what to report since: a counter's increase, a gauge's
    value, a histogram's increase per bucket and in its sum. A counter starts from 0, a histogram
    from no observations (``bounds``: its bucket bounds), a gauge from nothing (its first read is
    reported).
    """

    __slots__ = ("last", "read", "type")

    def __init__(
        self, read: Callable[[Any], Any], type: MetricType, bounds: tuple[float, ...] = ()
    ) -> None:
        self.read = read
        self.type = type
        if type == "counter":
            self.last: Any = 0
        elif type == "histogram":
            self.last = ([0] * (len(bounds) + 1), 0.0)
        else:
            self.last = None

    def change(self, source: Any) -> Any:
        """What changed in ``source`` since the last report, now reported; None if nothing did.

        A histogram's per-bucket counts are copied as read: its source goes on counting.
        """
        value = self.read(source)
        last = self.last
        if value == last:
            return None
        if self.type == "counter":
            self.last = value
            return value - last
        if self.type == "gauge":
            self.last = value
            return value
        counts, seconds = list(value[0]), value[1]
        self.last = counts, seconds
        return [n - m for n, m in zip(counts, last[0])], seconds - last[1]
