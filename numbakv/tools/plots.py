"""The one chart of the planning tools: hit ratio against capacity, one line per configuration,
capacity on a log axis at the sizes asked for (matplotlib, imported when a chart is drawn)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Line:
    """One configuration's hit ratios: its legend label, points (capacity, hit ratio), style."""

    label: str
    points: list[tuple[float, float]] = field(default_factory=list)
    style: Mapping[str, Any] = field(default_factory=dict)


def plot_hit_ratio_lines(
    path: str, lines: Sequence[Line], ticks: Mapping[float, str], x_label: str, title: str
) -> None:
    """Write the chart to `path` (PNG, SVG or PDF, by its suffix); `ticks` labels the capacities
    on the x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    for line in lines:
        axes.plot(
            *zip(*sorted(line.points)), marker="o", markersize=3, label=line.label, **line.style
        )
    axes.set_xscale("log")
    axes.set_xticks(list(ticks), list(ticks.values()))
    axes.minorticks_off()
    axes.set_xlabel(x_label)
    axes.set_ylabel("hit ratio (block references)")
    axes.set_ylim(bottom=0)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
