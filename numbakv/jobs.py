"""The transfer-job vocabulary every part shares: which way a job moves blocks, and the record of
a finished job. Standard library only, so the metrics and the sidecar can use it too."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum


class Direction(str, Enum):
    """Which way a job moves blocks; equal to its value, so "store" and "load" are accepted too."""

    STORE = "store"  # down a tier: GPU -> host, host -> a tier below
    LOAD = "load"  # up a tier: host -> GPU, a tier below -> host


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """A job that has finished: what it moved, and the time it took (0 where untimed).

    `failed_keys` names the chunks a tier job could not move (a tier fails chunk by chunk; the
    data path moves a job whole or not at all, and leaves it empty).
    """

    job_id: Hashable
    direction: Direction
    success: bool
    nbytes: int
    seconds: float
    failed_keys: tuple[Hashable, ...] = ()


JobDoneCallback = Callable[[FinishedJob], None]
"""Called once per finished job, as it is reported (metrics record jobs through it)."""
