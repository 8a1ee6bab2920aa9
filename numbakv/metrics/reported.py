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
    from no observations (as many empty buckets as its first read has), a gauge from nothing (its
    first read is reported).
    """

    __slots__ = ("last", "read", "type")

    def __init__(self, read: Callable[[Any], Any], type: MetricType) -> None:
        self.read = read
        self.type = type
        self.last: Any = 0 if type == "counter" else None

    def start_from(self, source: Any) -> None:
        """Take what ``source`` holds now as reported already: a counter or a histogram then
        reports only what it moves from here; a gauge reports its next read, whatever it is."""
        self.last = None if self.type == "gauge" else self._value(source)

    def _value(self, source: Any) -> Any:
        """The series' value in ``source``; a histogram's per-bucket counts copied as read (its
        source goes on counting)."""
        value = self.read(source)
        return (list(value[0]), value[1]) if self.type == "histogram" else value

    def change(self, source: Any) -> Any:
        """What changed in ``source`` since the last report, now reported; None if nothing did."""
        value = self._value(source)
        last = self.last
        if self.type == "histogram" and last is None:
            last = [0] * len(value[0]), 0.0
        self.last = value
        if value == last:
            return None
        if self.type == "counter":
            return value - last
        if self.type == "gauge":
            return value
        return [n - m for n, m in zip(value[0], last[0])], value[1] - last[1]
