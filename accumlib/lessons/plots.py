"""Figures for the lessons, drawn from measured data. Colour-blind-safe (Okabe-Ito) colours with distinct line
styles and hatches, labelled axes with units, a title that states the finding, and alt text that a screen reader
(and nbval, as text/plain) reads.

Every fixed string a figure shows (axis labels, legends, memory categories) goes through `_()`, so a figure speaks
the language chosen with `accumlib.set_language`. Titles and alt text come from the caller, formatted from measured
values. Text is drawn in the usual font (rcParams["font.family"]) with a Devanagari font as fallback (an installed
Lohit or Noto Sans Devanagari, else the Lohit Devanagari shipped in fonts/), which matplotlib >= 3.11 shapes with
its bundled libraqm: Latin text looks as always, Hindi text gets its matras and conjuncts right.

Figures use fixed margins instead of a layout engine (constrained layout doubled the drawing time of a dashboard
figure); long titles and bar labels are wrapped to the axes' width.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import io
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import matplotlib
from matplotlib import font_manager, ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..i18n import N_, _, language

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
STACK_COLOURS = [*OKABE_ITO, "#999999"]  # nine memory categories: Okabe-Ito and a neutral grey
LINE_STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
HATCHES = ["", "//", "..", "xx", "\\\\"]
MIB = 2 ** 20
DPI = 90
DEVANAGARI_FONTS = ("Lohit Devanagari", "Noto Sans Devanagari")  # installed ones, in order of preference
SHIPPED_FONT = Path(__file__).with_name("fonts") / "Lohit-Devanagari.ttf"  # used where none is installed
TITLE_SIZE, LABEL_SIZE = 10, 9  # points
# The memory categories of accumlib.memory (MemoryReport.categories() keys), as a figure's legend names them.
CATEGORY_LABELS = {"parameters": N_("parameters"), "gradients": N_("gradients"),
                   "incoming gradients": N_("incoming gradients"), "optimizer state": N_("optimizer state"),
                   "optimizer temporaries": N_("optimizer temporaries"), "inputs": N_("inputs"),
                   "activations": N_("activations"), "activation gradients": N_("activation gradients"),
                   "other": N_("other")}

_DRAWING = threading.RLock()  # rcParams are global: one figure is built or rendered at a time


@functools.lru_cache(maxsize=None)
def devanagari_font() -> str:
    """The family name of the Devanagari font that figures fall back to: an installed one of DEVANAGARI_FONTS, or
    else the Lohit Devanagari that ships with accumlib (fonts/, SIL Open Font License), registered with matplotlib
    here, so Hindi figures render on Colab, Kaggle, Windows and macOS with no font installed.
    """
    known = {entry.name for entry in font_manager.fontManager.ttflist}
    installed = next((name for name in DEVANAGARI_FONTS if name in known), None)
    if installed is not None:
        return installed
    font_manager.fontManager.addfont(str(SHIPPED_FONT))
    return font_manager.FontProperties(fname=SHIPPED_FONT).get_name()


SHAPING = (3, 11)  # the first matplotlib that shapes Devanagari (joins matras and conjuncts): its bundled libraqm


def _version(text: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in text.split(".")[:2])


@functools.lru_cache(maxsize=1)
def warn_unshaped() -> bool:
    """Once per process, where the course speaks Hindi on a matplotlib that cannot shape Devanagari (Colab's 3.10,
    which the lessons otherwise work with): warn that the figures' Hindi letters come out unjoined, and how to fix
    it. Returns whether it warned."""
    if _version(matplotlib.__version__) >= SHAPING:
        return False
    import warnings

    needed = ".".join(map(str, SHAPING))
    warnings.warn(_("Hindi text in figures needs matplotlib {needed} or later to join its letters; this is matplotlib "
                    "{version}. Run {command}, then restart the runtime (Colab: {menu}) and run the notebook again "
                    "from the top.").format(needed=needed, version=matplotlib.__version__,
                                            command=f'%pip install -q "matplotlib>={needed}"',
                                            menu="Runtime → Restart session"), stacklevel=3)
    return True


@contextlib.contextmanager
def drawing():
    """Build or render a figure with the course's fonts: the usual family, then a Devanagari fallback.

    Holds a lock, because rcParams are global and dashboards draw in background threads.
    """
    if language() == "hi":
        warn_unshaped()
    with _DRAWING, matplotlib.rc_context({"font.family": [*matplotlib.rcParams["font.family"], devanagari_font()]}):
        yield


def _drawn(build):
    """Run a figure builder inside `drawing()`: tick labels and legends made now use the course's fonts."""
    @functools.wraps(build)
    def builder(*args, **kwargs):
        with drawing():
            return build(*args, **kwargs)
    return builder


@dataclass
class Plot:
    """A finished figure and its alt text. Displays as PNG with the alt text as metadata and as text/plain."""

    figure: Figure
    alt: str

    def png(self) -> bytes:
        buffer = io.BytesIO()
        with drawing():
            self.figure.savefig(buffer, format="png", dpi=DPI)
        return buffer.getvalue()

    def output(self) -> dict:
        """The figure as one notebook display_data output (for an ipywidgets Output's `outputs`)."""
        data, metadata = self._repr_mimebundle_()
        return {"output_type": "display_data", "data": data, "metadata": metadata}

    def _repr_mimebundle_(self, include=None, exclude=None):
        png = base64.b64encode(self.png()).decode("ascii")
        return {"image/png": png, "text/plain": self.alt}, {"image/png": {"alt": self.alt}}


def _figure():
    """A 7 x 3.6 inch figure with one axes."""
    figure = Figure(figsize=(7.0, 3.6), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.subplots()


def _wrap(text: str, points: float, size: float) -> str:
    """`text` broken at spaces into lines of at most `points` wide at font size `size` (points), estimating a
    character's width as half the font size (marks that combine with the letter before them take none)."""
    limit = points / (0.52 * size)
    lines, line = [], ""
    for word in text.split(" "):
        longer = f"{line} {word}" if line else word
        if line and sum(unicodedata.category(c) != "Mn" for c in longer) > limit:
            lines.append(line)
            longer = word
        line = longer
    return "\n".join([*lines, line])


def _finish(ax, title: str, xlabel: str | None, ylabel: str, *, grid: bool = True, legend_size=None,
            legend_at: str = "best", xtick_lines: int = 1) -> None:
    """Axis labels (with units), the title that states the finding, a legend, a light grid, the margins.

    Margins and the axis labels' places are fixed in inches (room for tick labels), the top margin grows with the
    title's lines: nothing is measured while drawing. legend_at: the legend's place ("best" searches for the emptiest
    corner at every draw: give a fixed one where the data leave one free).
    """
    figure = ax.figure
    width, height = figure.get_size_inches()
    ticks = 0.1 + 0.15 * xtick_lines  # inches below the axes taken by tick labels
    left, right, bottom = 0.85, 0.2, 0.12 + ticks + (0.2 if xlabel else 0)
    title = _wrap(title, (width - left - right) * 72, TITLE_SIZE)
    top = 0.15 + 0.19 * (title.count("\n") + 1)
    axes_width, axes_height = width - left - right, height - top - bottom
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
        ax.xaxis.set_label_coords(0.5, -(ticks + 0.04) / axes_height)
    ax.set_ylabel(_wrap(ylabel, axes_height * 72, LABEL_SIZE), fontsize=LABEL_SIZE)
    ax.yaxis.set_label_coords(-0.5 / axes_width, 0.5)
    ax.set_title(title, fontsize=TITLE_SIZE, y=1.0)  # a fixed position: no search for overlapping tick labels
    ax.tick_params(labelsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size or LABEL_SIZE, loc=legend_at)
    if grid:
        ax.grid(alpha=0.3)
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height)


def _plain_log_y(ax) -> None:
    """A logarithmic y axis labelled with plain numbers at 1, 2 and 5 times each power of ten ("0.02"), the minor
    ticks unlabelled. matplotlib's own labels of a log axis are mathtext ("2 × 10⁻²") on the minor ticks too: wider
    than `_finish`'s fixed room for tick labels, they overlapped each other and the axis label (Hindi review N0-4),
    and they take 4 times as long to draw."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _position: f"{value:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def _category_labels(labels: Sequence[str], width_inches: float) -> tuple[list[str], int]:
    """Bar labels wrapped to their share of the axes' width, and the most lines any of them takes."""
    wrapped = [_wrap(label, width_inches * 72 / max(len(labels), 1), 8) for label in labels]
    return wrapped, max((label.count("\n") + 1 for label in wrapped), default=1)


def mib(nbytes: float) -> str:
    """Bytes as mebibytes, e.g. "0.50 MiB"."""
    return _("{mebibytes:.2f} MiB").format(mebibytes=nbytes / MIB)


@_drawn
def loss_curves(curves: dict[str, dict[str, list]], title: str, alt: str, *, logy: bool = False) -> Plot:
    """Loss against samples seen; curves: label -> History.columns(). The first label is the reference.

    logy: a logarithmic loss axis (a diverging run and a converging one on one figure). Non-finite losses leave gaps.
    """
    figure, ax = _figure()
    for i, (label, columns) in enumerate(curves.items()):
        losses = [loss if abs(loss) < float("inf") else float("nan") for loss in columns["loss"]]
        ax.plot(columns["samples_seen"], losses, label=label, color=OKABE_ITO[i % 8],
                linestyle=LINE_STYLES[i % 4], linewidth=3 if i == 0 else 1.6,
                marker=MARKERS[i % 4] if i else None, markevery=max(len(losses) // 12, 1), markersize=4)
    if logy:
        _plain_log_y(ax)
    ylabel = _("training loss (cross-entropy, nats, log scale)") if logy else _("training loss (cross-entropy, nats)")
    _finish(ax, title, _("samples seen"), ylabel, legend_at="upper right")
    return Plot(figure, alt)


@_drawn
def memory_by_batch(batch_sizes: Sequence[int], peaks: Sequence[int], budget_bytes: int, title: str, alt: str) -> Plot:
    """Measured peak bytes of one training step against batch size, with the card's budget line."""
    figure, ax = _figure()
    ax.plot(batch_sizes, [p / MIB for p in peaks], color=OKABE_ITO[0], marker="o", label=_("measured peak"))
    ax.axhline(budget_bytes / MIB, color=OKABE_ITO[3], linestyle="--",
               label=_("card budget ({budget})").format(budget=mib(budget_bytes)))
    ax.set_xscale("log", base=2)
    _finish(ax, title, _("batch size (samples, log scale)"), _("peak memory of one step (MiB)"), legend_at="upper left")
    return Plot(figure, alt)


@_drawn
def memory_stack(reports: dict[str, dict[str, int]], title: str, alt: str, budget_bytes: int | None = None) -> Plot:
    """Stacked bars of bytes by category; reports: bar label -> {category: bytes} (accumlib.memory's categories).

    A category that is zero in every bar is left out of the bars and the legend; each keeps its colour and hatch.
    """
    figure, ax = _figure()
    labels, lines = _category_labels(list(reports), 4.0)
    categories = list(next(iter(reports.values())))
    bottoms = [0.0] * len(labels)
    for i, category in enumerate(categories):
        heights = [report[category] / MIB for report in reports.values()]
        if not any(heights):
            continue
        ax.bar(labels, heights, bottom=bottoms, label=_(CATEGORY_LABELS.get(category, category)),
               color=STACK_COLOURS[i % len(STACK_COLOURS)], hatch=HATCHES[i % 5], edgecolor="white")
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if budget_bytes is not None:
        ax.axhline(budget_bytes / MIB, color="black", linestyle="--",
                   label=_("card budget ({budget})").format(budget=mib(budget_bytes)))
    ax.set_xlim(-0.6, len(labels) + 0.9)  # room on the right for the legend
    _finish(ax, title, None, _("peak memory (MiB)"), grid=False, legend_size=8, legend_at="upper right",
            xtick_lines=lines)
    return Plot(figure, alt)


@_drawn
def bars(labels: Sequence[str], values: Sequence[float], ylabel: str, title: str, alt: str,
         reference: float | None = None) -> Plot:
    """One bar per label, each its own colour and hatch; an optional dotted reference line (1.0 for ratios)."""
    figure, ax = _figure()
    wrapped, lines = _category_labels(labels, 5.9)
    ax.bar(wrapped, values, color=[OKABE_ITO[i % 8] for i in range(len(labels))],
           hatch=[HATCHES[i % 5] for i in range(len(labels))], edgecolor="white")
    if reference is not None:
        ax.axhline(reference, color="black", linestyle=":", linewidth=1)
    _finish(ax, title, None, ylabel, grid=False, xtick_lines=lines)
    return Plot(figure, alt)


@_drawn
def deviation_bars(groups: dict[str, dict[str, float]], ylabel: str, title: str, alt: str) -> Plot:
    """Grouped bars: groups is series label -> {x label: value}."""
    figure, ax = _figure()
    series = list(groups)
    xlabels = list(next(iter(groups.values())))
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(xlabels))]
        ax.bar(xs, [groups[name][x] for x in xlabels], width=width, label=name, color=OKABE_ITO[i % 8],
               hatch=HATCHES[i % 5], edgecolor="white")
    wrapped, lines = _category_labels(xlabels, 5.9)
    ax.set_xticks(range(len(xlabels)), wrapped)
    ax.set_xlim(-0.6, len(xlabels) + 0.4)  # room on the right for the legend
    _finish(ax, title, None, ylabel, grid=False, legend_size=8, legend_at="upper right", xtick_lines=lines)
    return Plot(figure, alt)


@_drawn
def lines(series: dict[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str, title: str,
          alt: str, logy: bool = False) -> Plot:
    """Generic line plot; series: label -> (xs, ys)."""
    figure, ax = _figure()
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, label=label, color=OKABE_ITO[i % 8], linestyle=LINE_STYLES[i % 4],
                marker=MARKERS[i % 4], markevery=max(len(xs) // 10, 1), markersize=4)
    if logy:
        _plain_log_y(ax)
    _finish(ax, title, xlabel, ylabel, legend_size=8)
    return Plot(figure, alt)
