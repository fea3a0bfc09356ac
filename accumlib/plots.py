"""Figures for the lessons, drawn from measured data. Colour-blind-safe (Okabe-Ito) colours with distinct line
styles, labelled axes with units, a title that states the finding, and alt text that a screen reader (and nbval,
as text/plain) reads.
"""
from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
LINE_STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
MIB = 2 ** 20


@dataclass
class Plot:
    """A finished figure and its alt text. Displays as PNG with the alt text as metadata and as text/plain."""

    figure: Figure
    alt: str

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
        return buffer.getvalue()

    def output(self) -> dict:
        """The figure as one notebook display_data output (for an ipywidgets Output's `outputs`)."""
        data, metadata = self._repr_mimebundle_()
        return {"output_type": "display_data", "data": data, "metadata": metadata}

    def _repr_mimebundle_(self, include=None, exclude=None):
        png = base64.b64encode(self.png()).decode("ascii")
        return {"image/png": png, "text/plain": self.alt}, {"image/png": {"alt": self.alt}}


def _figure(width: float = 7.0, height: float = 3.6, ncols: int = 1):
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, ncols)
    return figure, axes


def _finish(ax, title: str, xlabel: str | None, ylabel: str, *, grid: bool = True, legend_size=None) -> None:
    """Axis labels (with units), the title that states the finding, a legend, a light grid."""
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size)
    if grid:
        ax.grid(alpha=0.3)


def mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.2f} MiB"


def loss_curves(curves: dict[str, dict[str, list]], title: str, alt: str) -> Plot:
    """Loss against samples seen; curves: label -> History.columns(). The first label is the reference."""
    figure, ax = _figure()
    for i, (label, columns) in enumerate(curves.items()):
        ax.plot(columns["samples_seen"], columns["loss"], label=label, color=OKABE_ITO[i % 8],
                linestyle=LINE_STYLES[i % 4], linewidth=3 if i == 0 else 1.6,
                marker=MARKERS[i % 4] if i else None, markevery=max(len(columns["loss"]) // 12, 1), markersize=4)
    _finish(ax, title, "samples seen", "training loss (cross-entropy, nats)")
    return Plot(figure, alt)


def memory_by_batch(batch_sizes: Sequence[int], peaks: Sequence[int], budget_bytes: int, title: str, alt: str) -> Plot:
    """Measured peak bytes of one training step against batch size, with the card's budget line."""
    figure, ax = _figure()
    ax.plot(batch_sizes, [p / MIB for p in peaks], color=OKABE_ITO[0], marker="o", label="measured peak")
    ax.axhline(budget_bytes / MIB, color=OKABE_ITO[3], linestyle="--", label=f"card budget ({mib(budget_bytes)})")
    ax.set_xscale("log", base=2)
    _finish(ax, title, "batch size (samples, log scale)", "peak memory of one step (MiB)")
    return Plot(figure, alt)


def memory_stack(reports: dict[str, dict[str, int]], title: str, alt: str, budget_bytes: int | None = None) -> Plot:
    """Stacked bars of bytes by category; reports: bar label -> {category: bytes}."""
    figure, ax = _figure()
    labels = list(reports)
    categories = list(next(iter(reports.values())))
    bottoms = [0.0] * len(labels)
    hatches = ["", "//", "..", "xx", "\\\\"]
    for i, category in enumerate(categories):
        heights = [reports[label][category] / MIB for label in labels]
        ax.bar(labels, heights, bottom=bottoms, label=category, color=OKABE_ITO[i % 8], hatch=hatches[i % 5],
               edgecolor="white")
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    if budget_bytes is not None:
        ax.axhline(budget_bytes / MIB, color="black", linestyle="--", label=f"card budget ({mib(budget_bytes)})")
    _finish(ax, title, None, "peak memory (MiB)", grid=False, legend_size=8)
    return Plot(figure, alt)


def bars(labels: Sequence[str], values: Sequence[float], ylabel: str, title: str, alt: str,
         reference: float | None = None) -> Plot:
    """One bar per label, each its own colour and hatch; an optional dotted reference line (1.0 for ratios)."""
    figure, ax = _figure()
    hatches = ["", "//", "..", "xx", "\\\\"]
    ax.bar(labels, values, color=[OKABE_ITO[i % 8] for i in range(len(labels))],
           hatch=[hatches[i % 5] for i in range(len(labels))], edgecolor="white")
    if reference is not None:
        ax.axhline(reference, color="black", linestyle=":", linewidth=1)
    _finish(ax, title, None, ylabel, grid=False)
    return Plot(figure, alt)


def deviation_bars(groups: dict[str, dict[str, float]], ylabel: str, title: str, alt: str) -> Plot:
    """Grouped bars: groups is series label -> {x label: value}."""
    figure, ax = _figure()
    series = list(groups)
    xlabels = list(next(iter(groups.values())))
    width = 0.8 / len(series)
    hatches = ["", "//", "..", "xx"]
    for i, name in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(xlabels))]
        ax.bar(xs, [groups[name][x] for x in xlabels], width=width, label=name, color=OKABE_ITO[i % 8],
               hatch=hatches[i % 4], edgecolor="white")
    ax.set_xticks(range(len(xlabels)), xlabels)
    _finish(ax, title, None, ylabel, grid=False, legend_size=8)
    return Plot(figure, alt)


def lines(series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str, title: str,
          alt: str, logy: bool = False) -> Plot:
    """Generic line plot; series: label -> (xs, ys)."""
    figure, ax = _figure()
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, label=label, color=OKABE_ITO[i % 8], linestyle=LINE_STYLES[i % 4],
                marker=MARKERS[i % 4], markevery=max(len(xs) // 10, 1), markersize=4)
    if logy:
        ax.set_yscale("log")
    _finish(ax, title, xlabel, ylabel, legend_size=8)
    return Plot(figure, alt)
