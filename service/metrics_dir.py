"""Reading a prometheus-client multiprocess directory that may be missing, empty or hold truncated files."""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector


@dataclass(frozen=True)
class DirectoryState:
    """What the last read found: served by ``/healthz``."""

    path: str
    exists: bool
    files: int
    unreadable: tuple[str, ...] = ()

    @property
    def problem(self) -> str | None:
        if not self.exists:
            return "metrics directory does not exist (no engine has written metrics yet?)"
        if self.files == 0:
            return "metrics directory is empty (no engine has written metrics yet?)"
        if self.unreadable:
            return (
                f"skipped {len(self.unreadable)} unreadable file(s): {', '.join(self.unreadable)}"
            )
        return None


@dataclass(frozen=True)
class Snapshot:
    """The merged metrics of one read and what it found; ``collect()`` lets encoders render it."""

    metrics: tuple[Metric, ...]
    state: DirectoryState
    taken_at: float

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


class MetricsDirectory:
    """The directory's ``*.db`` files merged, never failing a scrape: unreadable files are skipped.

    Reading merges every file (a few ms for tens of files): requests share the last read while it is
    younger than ``max_age_s``, and a background :meth:`refresh` keeps it young, so no request waits
    for a read.
    """

    def __init__(self, path: str, max_age_s: float = 0.0) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._last: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        """The last read if younger than ``max_age_s``, else a fresh one."""
        last = self._last
        if last is not None and time.monotonic() - last.taken_at < self.max_age_s:
            return last
        return self.refresh()

    def refresh(self) -> Snapshot:
        """Read the directory now and keep the result for :meth:`snapshot`."""
        with self._lock:
            taken_at = time.monotonic()
            metrics, state = self.read()
            self._last = Snapshot(tuple(metrics), state, taken_at)
            return self._last

    def read(self) -> tuple[list[Metric], DirectoryState]:
        """Merge every readable file now (counters summed, live gauges summed, histograms merged)."""
        if not os.path.isdir(self.path):
            return [], DirectoryState(self.path, exists=False, files=0)
        files = sorted(glob.glob(os.path.join(self.path, "*.db")))
        try:
            metrics = list(MultiProcessCollector.merge(files, accumulate=True))
            return metrics, DirectoryState(self.path, True, len(files))
        except Exception:  # noqa: BLE001 (a truncated or half-written file: find it, merge the rest)
            good = [f for f in files if _readable(f)]
            unreadable = tuple(os.path.basename(f) for f in files if f not in good)
            metrics = list(MultiProcessCollector.merge(good, accumulate=True))
            return metrics, DirectoryState(self.path, True, len(files), unreadable)


def _readable(path: str) -> bool:
    try:
        MultiProcessCollector.merge([path], accumulate=True)
        return True
    except Exception:  # noqa: BLE001 (any parse error means this one file is unusable)
        return False
