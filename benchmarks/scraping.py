"""What the sidecar benchmarks share: a sidecar process on 127.0.0.1, and scrapes at a fixed rate
from a client light enough to leave the machine's cores to the sidecar.

httpx's async client costs about a millisecond of CPU per request: at 200 scrapes/s on a loaded
2-core machine it, not the sidecar, made the latency tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.support.servers import free_port, sidecar  # the repository root is on the path now

TIMEOUT_S = 2.0
"""A scrape not answered in this long fails (the image's health check allows the sidecar as long)."""


@contextlib.contextmanager
def running_sidecar(directory: str, **popen) -> Iterator[tuple[subprocess.Popen, int]]:
    """``python -m numbakv.service`` (the ``numbakv-sidecar`` entry point, default settings) on a free
    port of 127.0.0.1, ready; stopped on exit."""
    port = free_port()
    with sidecar(directory, port, **popen) as process:
        yield process, port


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


class Scraper:
    """GET /metrics over one kept-alive HTTP/1.1 connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self) -> tuple[int, bytes]:
        """(status, body). A kept-alive connection the sidecar closed since is opened again, once."""
        reused = self.streams is not None
        try:
            return await self._exchange()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close()
            if not reused:
                raise
            return await self._exchange()

    async def _exchange(self) -> tuple[int, bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.streams
        writer.write(self.request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)[1])
        return int(head[9:12]), await reader.readexactly(length)

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


@dataclass
class Scrapes:
    """What a run of scrapes saw."""

    latencies_ms: list[float] = field(default_factory=list)
    """Of the scrapes answered, from each one's scheduled send."""
    errors: list[str] = field(default_factory=list)
    unsent: int = 0
    """Scrapes not sent: their time came after the run's end (the sidecar fell behind)."""
    elapsed_s: float = 0.0


Answer = Callable[[int, bytes, float, float], None]
"""Called with (lane, body, sent, received) for every 200 answer (``time.monotonic()`` times)."""


async def scrape(
    port: int, rate: float, duration_s: float, lanes: int = 8, on_answer: Answer | None = None
) -> Scrapes:
    """GET /metrics at ``rate``/s for ``duration_s`` from ``lanes`` connections, each sending its
    share one request after the other. Latency counts from each request's scheduled time, so a
    stalled sidecar cannot hide queueing; what falls past the end is not sent, so neither can it
    stretch the run."""
    scrapes = Scrapes()
    start = time.perf_counter()
    count = int(rate * duration_s)

    async def lane(index: int) -> None:
        scraper = Scraper(port)
        for i in range(index, count, lanes):
            scheduled = start + i / rate
            if time.perf_counter() > start + duration_s + TIMEOUT_S:
                scrapes.unsent += len(range(i, count, lanes))
                break
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            sent = time.monotonic()
            try:
                status, body = await asyncio.wait_for(scraper.get(), TIMEOUT_S)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
                scrapes.errors.append(f"{type(exc).__name__} at {sent:.1f}")
                scraper.close()
                continue
            received = time.monotonic()
            scrapes.latencies_ms.append((time.perf_counter() - scheduled) * 1000)
            if status != 200:
                scrapes.errors.append(f"status {status}")
            elif on_answer is not None:
                on_answer(index, body, sent, received)
        scraper.close()

    await asyncio.gather(*(lane(i) for i in range(lanes)))
    scrapes.elapsed_s = time.perf_counter() - start
    return scrapes
