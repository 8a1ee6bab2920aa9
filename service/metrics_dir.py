"""Reading a prometheus-client multiprocess directory that may be missing, empty or hold truncated files."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector


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
            return f"skipped {len(self.unreadable)} unreadable file(s): {', '.join(self.unreadable)}"
        return None


class MetricsDirectory(Collector):
    """A collector over the directory's ``*.db`` files that never fails a scrape: bad files are skipped."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> tuple[list[Metric], DirectoryState]:
        """Merge every readable file (counters summed, live gauges summed, histograms merged)."""
        if not os.path.isdir(self.path):
            return [], DirectoryState(self.path, exists=False, files=0)
        files = sorted(glob.glob(os.path.join(self.path, "*.db")))
        try:
            return list(MultiProcessCollector.merge(files, accumulate=True)), DirectoryState(self.path, True, len(files))
        except Exception:  # a truncated or half-written file: find it, merge the rest
            good = [f for f in files if _readable(f)]
            unreadable = tuple(os.path.basename(f) for f in files if f not in good)
            metrics = list(MultiProcessCollector.merge(good, accumulate=True))
            return metrics, DirectoryState(self.path, True, len(files), unreadable)

    def collect(self) -> Iterator[Metric]:
        yield from self.read()[0]


def _readable(path: str) -> bool:
    try:
        MultiProcessCollector.merge([path], accumulate=True)
        return True
    except Exception:  # any parse error means this one file is unusable
        return False
