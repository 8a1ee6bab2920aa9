"""Checks of what a transfer is given (block ids, job id, group sizes, callback), made once
before anything is queued.

Vectorised: a few NumPy passes per job, whatever its length. Each error names the argument and
what it expected.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

_BOOL_TYPES = frozenset((bool, np.bool_))


def as_ids(name: str, ids: Any) -> np.ndarray:
    """`ids` as a 1-D int64 array: integer NumPy arrays as they are, lists converted once (a bool
    among the ints is refused, as a bool array is: NumPy would read True as id 1)."""
    if not isinstance(ids, np.ndarray):
        if not isinstance(ids, (list, tuple)):
            raise TypeError(
                f"{name} must be an integer NumPy array or a list of ints, got {type(ids).__name__}"
            )
        if not _BOOL_TYPES.isdisjoint(map(type, ids)):
            raise TypeError(f"{name} must hold integers, got a bool among them")
        ids = np.asarray(ids) if len(ids) else np.empty(0, dtype=np.int64)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int64 or int32), got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {ids.shape}")
    return ids.astype(np.int64, copy=False)


def check_job_id(job_id: Any) -> None:
    """Raise TypeError naming `job_id` unless it can key the jobs in flight (it is hashable)."""
    try:
        hash(job_id)
    except TypeError:
        raise TypeError(
            f"job_id must be hashable (an int or a str, say), got {type(job_id).__name__} "
            f"{job_id!r}"
        ) from None


def check_count(name: str, value: Any) -> int:
    """`value` as an int once it is a whole number >= 0 (a bool is not), else an error naming
    `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int >= 0, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def check_callback(name: str, callback: Any) -> None:
    """Raise TypeError naming `name` unless `callback` is None or callable."""
    if callback is not None and not callable(callback):
        raise TypeError(
            f"{name} must be a callable taking a FinishedJob, or None, got "
            f"{type(callback).__name__}"
        )


def check_range(name: str, ids: np.ndarray, limit: int) -> None:
    """Every id in [0, `limit`), else an IndexError naming `name` and the first bad id."""
    # One pass: as unsigned, a negative id is larger than any limit.
    if len(ids) and ids.view(np.uint64).max() >= limit:
        bad = ids[(ids < 0) | (ids >= limit)][0]
        raise IndexError(f"{name} must lie in [0, {limit}), got {bad}")


class IdCheck:
    """Block ids in [0, `limit`), as one job names them: integers, in range, and, where they are
    the job's destinations, unique. The uniqueness test sorts nothing and allocates nothing the
    size of the pool: each id stamps its position in a buffer kept across calls, and a repeated
    id overwrites an earlier stamp."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._stamps = np.empty(limit, dtype=np.int64)
        self._positions = np.arange(limit, dtype=np.int64)

    def __call__(self, name: str, ids: Any, destinations: bool) -> np.ndarray:
        """`ids` as int64, checked; errors name the argument `name`."""
        ids = as_ids(name, ids)
        check_range(name, ids, self.limit)
        if destinations and self._repeats(ids):
            raise ValueError(
                f"{name} are this job's destinations and must be unique, got a repeated id"
            )
        return ids

    def _repeats(self, ids: np.ndarray) -> bool:
        if len(ids) > self.limit:  # more ids than values: some must repeat
            return True
        positions = self._positions[: len(ids)]
        self._stamps[ids] = positions
        return bool((self._stamps[ids] != positions).any())
