"""The transfer-job vocabulary every part shares: which way a job moves blocks, and the record of
a finished job. Standard library only, so the metrics and the sidecar can use it too."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum


class Direction(str, Enum):
    """Which way a job moves blocks; equal to its value, so "store" and "load" are accepted too."""

    STORE = "store"  # GPU -> host
    LOAD = "load"  # host -> GPU


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A job that has finished: what it moved, and the device time it took (0 where untimed)."""

    job_id: Hashable
    direction: Direction
    success: bool
    nbytes: int
    seconds: float


JobDoneCallback = Callable[[FinishedJob], None]
"""Called once per finished job, as it is reported (metrics record jobs through it)."""
