"""One read of the metrics directory: every file merged and rendered, what cannot be is skipped and named.

A read never fails and never blocks: a missing directory, a FIFO, a link, an oversized, truncated,
vanishing or malformed file, or data that does not merge with the others' each end up in
``DirectoryState.skipped`` (or ``error``), and the rest is served. Live gauges of writers that died
(:mod:`numbakv.metrics.liveness`) are left out, as prometheus-client's ``mark_process_dead`` would.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics

from numbakv.metrics.directory import (
    MAX_FILE_BYTES,
    FileData,
    Unreadable,
    directory_lock,
    list_directory,
    merge,
    read_file,
)
from numbakv.metrics.liveness import writer_alive

LOCK_WAIT_S = 2.0
"""How long a read waits for a writer's compaction to finish; past it, the read is not made."""
_EOF = b"# EOF\n"
_LEGACY_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LEGACY_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class DirectoryState:
    """What a read found: served by ``/healthz``."""

    path: str
    exists: bool | None
    """None before the first read."""
    files: int = 0
    """Metrics files merged."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Files left out, each with the reason."""
    dead_writers: int = 0
    error: str | None = None
    """Why the directory could not be read at all."""

    @property
    def problems(self) -> list[str]:
        if self.error is not None:
            return [self.error]
        if not self.exists:
            return ["the metrics directory does not exist (no engine has written metrics yet?)"]
        found = [] if self.files else ["no metrics files (no engine has written metrics yet?)"]
        if self.skipped:
            shown = [f"{name} ({why})" for name, why in sorted(self.skipped.items())[:20]]
            more = f" and {len(self.skipped) - 20} more" if len(self.skipped) > 20 else ""
            found.append(f"skipped {len(self.skipped)} file(s): {'; '.join(shown)}{more}")
        return found


@dataclass(frozen=True)
class Reading:
    """The merged metrics, rendered once in both formats, and the directory's state."""

    metrics: tuple[Metric, ...]
    text: bytes
    """Prometheus text format 0.0.4."""
    openmetrics: bytes
    """OpenMetrics 1.0.0."""
    state: DirectoryState
    legacy_names: bool
    """Every metric and label name is valid without UTF-8 (numbakv's are): then the name escaping
    a scraper asks for (Prometheus 3 asks for ``allow-utf-8``) changes nothing in the renderings."""

    @classmethod
    def of(
        cls, families: list[tuple[Metric, tuple[bytes, bytes]]], state: DirectoryState
    ) -> Reading:
        """Families, each with its text and OpenMetrics renderings, as one reading."""
        metrics = tuple(metric for metric, _ in families)
        return cls(
            metrics=metrics,
            text=b"".join(text for _, (text, _) in families),
            openmetrics=b"".join(om for _, (_, om) in families) + _EOF,
            state=state,
            legacy_names=all(map(_has_legacy_names, metrics)),
        )


def _has_legacy_names(metric: Metric) -> bool:
    """Whether the family's metric and label names are all valid without UTF-8."""
    return bool(_LEGACY_METRIC_NAME.fullmatch(metric.name)) and all(
        _LEGACY_METRIC_NAME.fullmatch(sample.name)
        and all(map(_LEGACY_LABEL_NAME.fullmatch, sample.labels))
        for sample in metric.samples
    )


class MetricsDirectory:
    """Reads a prometheus-client multiprocess directory as the engines' processes left it."""

    def __init__(self, path: str, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.path = path
        self.max_file_bytes = max_file_bytes

    def read(self) -> Reading | None:
        """Merge every file that can be read and merged now; never raises for what is on disk.
        None while a writer compacts the directory (past LOCK_WAIT_S): read in the middle of its
        renames, the files would count some series twice or not at all."""
        try:
            dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return Reading.of([], DirectoryState(self.path, exists=False))
        except NotADirectoryError:
            error = "the metrics directory's path names a file, not a directory"
            return Reading.of([], DirectoryState(self.path, exists=True, error=error))
        except OSError as exc:
            error = f"cannot open the metrics directory: {exc.strerror}"
            return Reading.of([], DirectoryState(self.path, exists=True, error=error))
        try:
            read = self._read_files(dir_fd)
            if read is None:
                return None
            files, skipped, dead = read
        except OSError as exc:
            error = f"cannot list the metrics directory: {exc.strerror}"
            return Reading.of([], DirectoryState(self.path, exists=True, error=error))
        finally:
            os.close(dir_fd)
        families, unmerged = merge(files, accumulate=True, render=_render)
        skipped.update(unmerged)
        state = DirectoryState(self.path, True, len(files) - len(unmerged), skipped, dead)
        return Reading.of(families, state)

    def _read_files(self, dir_fd: int) -> tuple[list[FileData], dict[str, str], int] | None:
        """The files' data, the files skipped, and how many writers are dead; None while a
        writer compacts the directory."""
        # Shared with other readers; a compacting writer waits for it, and we for its few ms.
        with directory_lock(dir_fd, exclusive=False, timeout_s=LOCK_WAIT_S) as locked:
            if locked is False:
                return None
            listing = list_directory(os.listdir(dir_fd))
            dead = {pid for pid, lock in listing.writers.items() if not writer_alive(dir_fd, lock)}
            skipped = dict.fromkeys(listing.unknown, "not a file name prometheus-client writes")
            files = []
            for db in listing.files:
                if db.live and db.pid in dead:
                    continue
                try:
                    files.append(read_file(dir_fd, db, self.max_file_bytes))
                except FileNotFoundError:
                    continue  # removed since the listing: its writer exited or was compacted
                except Unreadable as exc:
                    skipped[db.name] = str(exc)
                except OSError as exc:
                    skipped[db.name] = exc.strerror or str(exc)
                except Exception as exc:  # noqa: BLE001 (whatever a file does, the others are served)
                    skipped[db.name] = f"{type(exc).__name__}: {exc}"
        return files, skipped, len(dead)


class _Family:
    """One metric as a collector, for the encoders."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> list[Metric]:
        return [self.metric]


def _render(metric: Metric) -> tuple[bytes, bytes]:
    """The family in both formats: a family that cannot be rendered is found while reading."""
    family = _Family(metric)
    return generate_latest(family), openmetrics.generate_latest(family).removesuffix(_EOF)
