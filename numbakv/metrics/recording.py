"""Transfer jobs recorded into plain Python ints: prometheus-client sees them only when exported.

:meth:`TransferRecorder.on_job_done` is the transfer engine's completion callback, on the hot
path: about 200 ns a call.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from numbakv.metrics.definitions import DIRECTIONS, DURATION_BUCKETS_SECONDS, no_durations

if TYPE_CHECKING:  # the sidecar's image holds numbakv/metrics/ alone
    from numbakv.jobs import FinishedJob


@dataclass(slots=True)
class TransferTotals:
    """Running totals of one direction's transfer jobs."""

    jobs: int = 0
    """Jobs finished, successful or not: every other total moves only when this one does."""
    failed_jobs: int = 0
    nbytes: int = 0
    """Bytes of successful jobs."""
    buckets: list[int] = field(default_factory=no_durations)
    """Jobs per duration bucket (per bucket, not cumulative; the last one past every bound)."""
    seconds: float = 0.0
    """The sum of the jobs' durations."""

    def copy(self) -> TransferTotals:
        return TransferTotals(
            self.jobs, self.failed_jobs, self.nbytes, list(self.buckets), self.seconds
        )


class TransferRecorder:
    """Accumulates finished transfer jobs in plain ints: the engine's ``on_job_done`` callback.

    Calls must come from one thread at a time (the engine's completion loop); readers may run
    concurrently and may miss the job being recorded, which the next read includes.
    """

    def __init__(self) -> None:
        self.totals = {direction: TransferTotals() for direction in DIRECTIONS}

    def on_job_done(self, job: FinishedJob) -> None:
        t = self.totals[job.direction]
        t.jobs += 1
        t.seconds += job.seconds
        t.buckets[bisect.bisect_left(DURATION_BUCKETS_SECONDS, job.seconds)] += 1
        if job.success:
            t.nbytes += job.nbytes
        else:
            t.failed_jobs += 1
