"""Capacity planning: host capacities in blocks or bytes, and hit ratios by capacity as a table
or a plot, in the units the capacities were given in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from numbakv.checks import BYTE_UNITS, parse_size
from numbakv.tools.plots import Line, plot_hit_ratio_lines
from numbakv.tools.replay.belady import BELADY
from numbakv.tools.replay.core import ReplayResult

MAX_BLOCKS = 2**63 - 1  # host block ids are int64
BELADY_NOTE = (
    "belady: Belady's MIN, the clairvoyant bound: it knows every future request, "
    "so no real policy can beat it"
)


@dataclass(frozen=True)
class Capacity:
    """A host capacity in blocks, and the size it was asked for in (`number` `unit`), if any."""

    blocks: int
    number: str = ""  # as given: "16", "1.5"
    unit: str = ""  # a BYTE_UNITS key; "" for a capacity given in blocks

    @property
    def label(self) -> str:
        return f"{self.number} {self.unit}" if self.unit else f"{self.blocks:,}"

    @property
    def size_bytes(self) -> float:
        """The size asked for, in bytes (0 for a capacity given in blocks)."""
        return float(self.number) * BYTE_UNITS[self.unit] if self.unit else 0.0


def parse_capacity(text: str, block_bytes: int | None = None) -> Capacity:
    """A capacity of `10000` blocks, or of a size such as `64GiB` or `1.5TB` given `block_bytes`."""
    number, unit = parse_size(text, "a number of blocks (10000) or a size (64GiB)")
    if not unit:
        if "." in number:
            raise ValueError(f"got {text!r}, expected a whole number of blocks")
        capacity = Capacity(int(number))
    elif block_bytes is None:
        raise ValueError(f"got {text!r}, a size: give --block-bytes too")
    else:
        capacity = Capacity(int(Fraction(number) * BYTE_UNITS[unit] // block_bytes), number, unit)
    if capacity.blocks < 1:
        raise ValueError(f"got {text!r}, expected at least one block")
    if capacity.blocks > MAX_BLOCKS:
        raise ValueError(
            f"got {text!r}, expected at most {MAX_BLOCKS:,} blocks (host block ids are 64-bit)"
        )
    return capacity


def bytes_label(n: int) -> str:
    """`64 MiB` for a whole number of binary units, else `1,234,567 bytes`."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n >= BYTE_UNITS[unit] and n % BYTE_UNITS[unit] == 0:
            return f"{n // BYTE_UNITS[unit]:,} {unit}"
    return f"{n:,} bytes"


def format_table(
    results: Sequence[ReplayResult],
    policies: Sequence[str],
    capacities: Sequence[Capacity],
    block_bytes: int | None = None,
    requests: int | None = None,
) -> str:
    """Hit ratios, one row per policy, one column per capacity in its own unit (blocks beneath
    a size), then microseconds per block reference; a note on Belady's row when there is one.
    A run that replayed fewer than `requests` requests (cut short) is marked partial, one not
    replayed at all is a dash."""
    by_run = {(result.policy, result.capacity): result for result in results}
    sized = any(capacity.unit for capacity in capacities)
    blocks = [f"{capacity.blocks:,} blk" if sized else "" for capacity in capacities]
    width = 2 + max(10, *(len(c.label) for c in capacities), *(len(b) for b in blocks))
    name_width = 2 + max(8, *(len(policy) for policy in policies))
    of_blocks = f" (blocks of {bytes_label(block_bytes)})" if sized and block_bytes else ""
    lines = [
        f"hit ratio by host capacity{of_blocks}",
        "policy".ljust(name_width)
        + "".join(capacity.label.rjust(width) for capacity in capacities)
        + "us/ref".rjust(9),
    ]
    if sized:
        lines.append(" " * name_width + "".join(text.rjust(width) for text in blocks))
    for policy in policies:
        runs = [by_run[key] for c in capacities if (key := (policy, c.blocks)) in by_run]
        seconds = sum(run.seconds for run in runs)
        references = sum(run.references for run in runs)
        cells = "".join(
            _cell(by_run[policy, c.blocks], requests).rjust(width)
            if (policy, c.blocks) in by_run
            else "-".rjust(width)
            for c in capacities
        )
        lines.append(
            policy.ljust(name_width) + cells + f"{1e6 * seconds / max(references, 1):9.2f}"
        )
    if BELADY in policies:
        lines.append(BELADY_NOTE)
    cut = [result for result in results if requests is not None and result.requests < requests]
    for result in cut:
        lines.append(
            f"* partial: {result.policy} at {result.capacity:,} blocks stopped after "
            f"{result.requests:,} of {requests:,} requests"
        )
    if len(results) < len(policies) * len(capacities):
        lines.append("- not replayed")
    return "\n".join(lines)


def _cell(result: ReplayResult, requests: int | None) -> str:
    partial = requests is not None and result.requests < requests
    return f"{result.hit_ratio:.4f}" + ("*" if partial else "")


def plot_hit_ratios(
    results: Sequence[ReplayResult],
    capacities: Sequence[Capacity],
    path: str,
    title: str = "",
) -> None:
    """Write a picture (PNG, SVG or PDF, by `path`'s suffix) of hit ratio against capacity, one
    line per policy, capacity in the unit of the first one given (needs matplotlib)."""
    unit = capacities[0].unit
    x_of = {c.blocks: c.size_bytes / BYTE_UNITS[unit] if unit else c.blocks for c in capacities}
    lines: dict[str, Line] = {}
    for result in results:
        line = lines.get(result.policy)
        if line is None:
            line = lines[result.policy] = (
                Line("belady (clairvoyant bound)", style={"color": "black", "linestyle": "--"})
                if result.policy == BELADY
                else Line(result.policy)
            )
        line.points.append((x_of[result.capacity], result.hit_ratio))
    plot_hit_ratio_lines(
        path,
        list(lines.values()),
        {x_of[c.blocks]: c.label for c in capacities},
        f"host capacity ({unit or 'blocks'})",
        title,
    )
