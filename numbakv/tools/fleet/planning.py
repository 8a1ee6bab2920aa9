"""Fleet capacity planning: hit ratios of N engines x host + disk + shared, by the tier that served
them, as a table or a plot, in the units the capacities were given in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from numbakv.checks import BYTE_UNITS
from numbakv.tools.fleet.core import FleetConfig, FleetResult
from numbakv.tools.plots import Line, plot_hit_ratio_lines
from numbakv.tools.replay.planning import Capacity, bytes_label

NONE = Capacity(0)  # a tier the fleet does not have


@dataclass(frozen=True)
class FleetSizes:
    """The capacities of one fleet as the user gave them (NONE for a tier it does not have)."""

    host: Capacity
    disk: Capacity = NONE
    shared: Capacity = NONE

    def label(self, tier: str) -> str:
        capacity = getattr(self, tier)
        return capacity.label if capacity.blocks else "none"


def describe_fleet(config: FleetConfig) -> str:
    """`4 engines routed by session`."""
    return f"{config.engines} engine{'s' if config.engines > 1 else ''} routed by {config.route}"


def format_fleet_table(
    results: Sequence[FleetResult],
    sizes: Sequence[FleetSizes],
    block_bytes: int | None = None,
    requests: int | None = None,
) -> str:
    """One row per fleet: its capacities (per engine for host and disk), the hit ratio, and the
    share of block references each tier served. `sizes[i]` are `results[i]`'s capacities; a run
    that replayed fewer than `requests` requests (cut short) is marked partial."""
    sized = any(capacity.unit for size in sizes for capacity in (size.host, size.disk, size.shared))
    of_blocks = f" (blocks of {bytes_label(block_bytes)})" if sized and block_bytes else ""
    header = ["policy", "tiering", "host/engine", "disk/engine", "shared", "hit ratio"]
    header += ["own host", "own disk", "shared:own", "shared:other"]
    rows = []
    for result, size in zip(results, sizes):
        config = result.config
        partial = "*" if requests is not None and result.requests < requests else ""
        lower = config.disk_capacity or config.shared_capacity
        row = [config.policy, config.tiering if lower else "-"]
        row += [_capacity_cell(getattr(size, tier), sized) for tier in ("host", "disk", "shared")]
        row.append(f"{result.hit_ratio:.4f}{partial}")
        served = (
            result.host_hits,
            result.disk_hits,
            result.shared_own_hits,
            result.shared_other_hits,
        )
        row += [f"{hits / max(result.references, 1):.4f}" for hits in served]
        rows.append(row)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = [f"hit ratio by fleet capacity{of_blocks}; tiers' columns: share of references served"]
    for cells in (header, *rows):
        first = cells[0].ljust(widths[0] + 2) + cells[1].ljust(widths[1] + 2)
        lines.append(first + "".join(c.rjust(w + 2) for c, w in zip(cells[2:], widths[2:])))
    for result in results:
        if requests is not None and result.requests < requests:
            lines.append(f"* partial: stopped after {result.requests:,} of {requests:,} requests")
    return "\n".join(lines)


def _capacity_cell(capacity: Capacity, sized: bool) -> str:
    if not capacity.blocks:
        return "none"
    return f"{capacity.label} ({capacity.blocks:,} blk)" if sized else capacity.label


def plot_fleet(
    results: Sequence[FleetResult], sizes: Sequence[FleetSizes], path: str, title: str = ""
) -> None:
    """Write a picture (PNG, SVG or PDF, by `path`'s suffix) of hit ratio against host capacity
    per engine, one line per policy, tiering, disk and shared capacity (needs matplotlib)."""
    unit = sizes[0].host.unit
    hosts = {size.host.blocks: size.host for size in sizes}
    x_of = {b: c.size_bytes / BYTE_UNITS[unit] if unit else b for b, c in hosts.items()}
    lines: dict[str, Line] = {}
    for result, size in zip(results, sizes):
        config = result.config
        lower = config.disk_capacity or config.shared_capacity
        name = f"{config.policy}, disk {size.label('disk')}, shared {size.label('shared')}"
        if lower:
            name += f", {config.tiering}"
        line = lines.setdefault(name, Line(name))
        line.points.append((x_of[size.host.blocks], result.hit_ratio))
    plot_hit_ratio_lines(
        path,
        list(lines.values()),
        {x_of[b]: c.label for b, c in hosts.items()},
        f"host capacity per engine ({unit or 'blocks'})",
        f"{title}: {describe_fleet(results[0].config)}" if title else "",
    )
