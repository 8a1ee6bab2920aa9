"""Progress of long work on stderr, on a terminal and off one.

On a terminal it is a tqdm bar. Elsewhere (a pipe, a log file, CI) a bar's carriage returns turn
into noise, so it prints one plain line every few seconds instead; work shorter than that prints
nothing at all.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")

INTERVAL = 5.0  # seconds between two plain lines


class Progress(AbstractContextManager):
    """Counts work done towards `total` (None: unknown) and reports it on `stream` (stderr).

    Disabled, it only counts.
    """

    def __init__(
        self,
        description: str,
        total: int | None = None,
        unit: str = "it",
        unit_scale: bool = False,
        stream: TextIO | None = None,
        interval: float | None = None,
        enabled: bool = True,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.description = description
        self.total = total
        self.unit = unit
        self.unit_scale = unit_scale
        self.done = 0
        self.enabled = enabled
        self._interval = INTERVAL if interval is None else interval
        self._started = time.monotonic()
        self._next_line = self._started + self._interval
        isatty = getattr(self.stream, "isatty", None)
        self._bar = (
            tqdm(
                total=total,
                desc=description,
                unit=unit,
                unit_scale=unit_scale,
                file=self.stream,
                leave=False,
            )
            if enabled and isatty is not None and isatty()
            else None
        )

    def describe(self, description: str) -> None:
        """Say what is being done now (the total stays)."""
        self.description = description
        if self._bar is not None:
            self._bar.set_description_str(description)

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now >= self._next_line:
            self._next_line = now + self._interval
            print(self.line(now - self._started), file=self.stream, flush=True)

    def line(self, elapsed: float) -> str:
        """`serving: 140 of 306 req (46%), 00:05 elapsed, about 00:05 left`."""
        if self.unit_scale:
            amount = tqdm.format_sizeof(self.done, self.unit, divisor=1000)
            if self.total:
                amount += f" of {tqdm.format_sizeof(self.total, self.unit, divisor=1000)}"
        else:
            amount = f"{self.done:,}" + (f" of {self.total:,}" if self.total else "")
            amount += f" {self.unit}"
        text = f"{self.description}: {amount}"
        if self.total:
            text += f" ({100 * self.done / self.total:.0f}%)"
        text += f", {tqdm.format_interval(elapsed)} elapsed"
        if self.total and self.done:
            left = elapsed * (self.total - self.done) / self.done
            text += f", about {tqdm.format_interval(left)} left"
        return text

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def track(
    items: Iterable[T],
    description: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
) -> Iterator[T]:
    """Yield `items`, reporting progress on stderr when `enabled`."""
    with Progress(description, total, unit, enabled=enabled) as progress:
        for item in items:
            yield item
            progress.update()
