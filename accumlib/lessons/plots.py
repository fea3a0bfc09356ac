"""Figures for the lessons, drawn from measured data. Colour-blind-safe (Okabe-Ito) colours with distinct line
styles and hatches, labelled axes with units, a title that states the finding, and alt text that a screen reader
(and nbval, as text/plain) reads.

Every fixed string a figure shows (axis labels, legends, memory categories) goes through `_()`, so a figure speaks
the language chosen with `accumlib.set_language`. Titles and alt text come from the caller, formatted from measured
values. Text is drawn in the usual font (rcParams["font.family"]) with a Devanagari font as fallback (an installed
Lohit or Noto Sans Devanagari, else the Lohit Devanagari shipped in fonts/), which matplotlib >= 3.11 shapes with
its bundled libraqm: Latin text looks as always, Hindi text gets its matras and conjuncts right.

Figures are drawn for a phone first: 4.4 inches wide at 100 dpi (440 px), their smallest text 9 pt (12.5 px), so
a phone's 390 px screen, which leaves a figure 330-360 px, shows that text at 9.4 px or more; on a wider screen a
figure keeps its 440 px. The axes are 2.1 inches tall in every figure; the figure grows downwards with what it has
to say: the title, wrapped to the axes' width (as many lines as it needs), the bar labels, wrapped to a bar's share
of it, and the legend, below the axes (never over a line or a bar), in as many columns as fit. Margins are computed
from the text's measured sizes (each string measured with the figure's fonts, no layout engine: constrained layout
doubled the drawing time of a dashboard figure). Each PNG records its smallest font size in points (the text chunk
SMALLEST_TEXT), from which a page computes the size its reader sees.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import matplotlib
from matplotlib import font_manager, ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.image import imsave
from matplotlib.text import Text

from ..i18n import N_, _, language

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
STACK_COLOURS = [*OKABE_ITO, "#999999"]  # nine memory categories: Okabe-Ito and a neutral grey
LINE_STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]
HATCHES = ["", "//", "..", "xx", "\\\\"]
MIB = 2**20
DPI = 100
WIDTH, AXES_HEIGHT = 4.4, 2.1  # inches: every figure's width (440 px at DPI) and its axes' height
DEVANAGARI_FONTS = ("Lohit Devanagari", "Noto Sans Devanagari")  # installed ones, in order of preference
SHIPPED_FONT = Path(__file__).with_name("fonts") / "Lohit-Devanagari.ttf"  # used where none is installed
TITLE_SIZE, LABEL_SIZE, TEXT_SIZE = 10.5, 9.5, 9  # points: the title, the axis labels, tick labels and legends
PAD = 0.08  # inches: the figure's edge to its text, and between blocks of text
TICKS = 7 / 72  # inches from the axes to its tick labels: a tick (3.5 pt) and its pad (3.5 pt)
SMALLEST_TEXT = "accumlib:smallest-text-pt"  # the PNG's text chunk: the smallest font size drawn in it, points
# The memory categories of accumlib.memory (MemoryReport.categories() keys), as a figure's legend names them.
CATEGORY_LABELS = {
    "parameters": N_("parameters"),
    "gradients": N_("gradients"),
    "incoming gradients": N_("incoming gradients"),
    "optimizer state": N_("optimizer state"),
    "optimizer temporaries": N_("optimizer temporaries"),
    "inputs": N_("inputs"),
    "activations": N_("activations"),
    "activation gradients": N_("activation gradients"),
    "other": N_("other"),
}

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
    warnings.warn(
        _(
            "Hindi text in figures needs matplotlib {needed} or later to join its letters; this is matplotlib "
            "{version}. Run {command}, then restart the runtime (Colab: {menu}) and run the notebook again "
            "from the top."
        ).format(
            needed=needed,
            version=matplotlib.__version__,
            command=f'%pip install -q "matplotlib>={needed}"',
            menu="Runtime → Restart session",
        ),
        stacklevel=3,
    )
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

    def smallest_text(self) -> float:
        """The smallest font size of the text the figure draws (points): tick labels, legend, labels, title."""
        return min(
            text.get_fontsize() for text in self.figure.findobj(Text) if text.get_visible() and text.get_text().strip()
        )

    def png(self) -> bytes:
        """The figure as PNG at DPI, its smallest font size in the text chunk SMALLEST_TEXT."""
        buffer = io.BytesIO()
        with drawing():
            self.figure.canvas.draw()  # the tick labels get their text here: then the smallest size is known
            imsave(
                buffer,
                self.figure.canvas.buffer_rgba(),
                format="png",
                origin="upper",
                dpi=DPI,
                metadata={SMALLEST_TEXT: f"{self.smallest_text():g}"},
            )
        return buffer.getvalue()

    def output(self) -> dict:
        """The figure as one notebook display_data output (for an ipywidgets Output's `outputs`)."""
        data, metadata = self._repr_mimebundle_()
        return {"output_type": "display_data", "data": data, "metadata": metadata}

    def _repr_mimebundle_(self, include=None, exclude=None):
        png = base64.b64encode(self.png()).decode("ascii")
        return {"image/png": png, "text/plain": self.alt}, {"image/png": {"alt": self.alt}}


def _figure():
    """A figure WIDTH inches wide with one axes AXES_HEIGHT tall (its height and margins are set by `_finish`)."""
    figure = Figure(figsize=(WIDTH, AXES_HEIGHT + 2), dpi=DPI)
    FigureCanvasAgg(figure)
    figure.subplots_adjust(bottom=1 / (AXES_HEIGHT + 2), top=1 - 1 / (AXES_HEIGHT + 2))  # the final axes' height
    return figure, figure.subplots()


GLUED = ("×", "=", "+", "−", "/")  # operators kept on the line of the numbers they join


class _Measure:
    """Sizes of text in inches, measured with the figure's renderer and the fonts of `drawing()` (no drawing)."""

    def __init__(self, figure: Figure):
        self.figure, self.renderer = figure, figure.canvas.get_renderer()

    def width(self, text: str, size: float) -> float:
        return (
            max(
                self.renderer.get_text_width_height_descent(line, FontProperties(size=size), ismath=False)[0]
                for line in text.split("\n")
            )
            / DPI
        )

    def box(self, text: str, size: float, rotation: float = 0) -> tuple[float, float]:
        """(width, height) of `text` as a Text draws it, lines and all."""
        extent = Text(0, 0, text, fontsize=size, rotation=rotation, figure=self.figure).get_window_extent(self.renderer)
        return extent.width / DPI, extent.height / DPI

    def wrap(self, text: str, inches: float, size: float) -> str:
        """`text` broken at spaces into lines at most `inches` wide (a word wider than that on a line of its own),
        never beside an operator: "64 × 1" stays on one line."""
        words = []
        for word in text.split(" "):
            if words and (word in GLUED or words[-1].endswith(GLUED)):
                words[-1] = f"{words[-1]} {word}"
            else:
                words.append(word)
        lines, line = [], ""
        for word in words:
            longer = f"{line} {word}" if line else word
            if line and self.width(longer, size) > inches:
                lines.append(line)
                longer = word
            line = longer
        return "\n".join([*lines, line])


def _tick_labels(axis, view: tuple[float, float]) -> list[str]:
    """The labels `axis` will draw at its major ticks inside `view` (its formatter's, from its locator)."""
    low, high = sorted(view)
    span = (high - low) * 1e-9
    locations = [v for v in axis.get_major_locator()() if low - span <= v <= high + span]
    return [label for label in axis.get_major_formatter().format_ticks(locations) if label]


def _legend_columns(measure: _Measure, labels: list[str], inches: float) -> tuple[list[str], int]:
    """Legend labels (wrapped where one is wider than the figure) and how many columns of them fit in `inches`."""
    em = TEXT_SIZE / 72
    handle = (2.0 + 0.8) * em  # the line or patch (handlelength) and the gap to its text (handletextpad)
    labels = [measure.wrap(label, inches - handle - 0.8 * em, TEXT_SIZE) for label in labels]
    column = handle + max(measure.width(label, TEXT_SIZE) for label in labels)
    columns = 1
    while columns < len(labels) and (columns + 1) * column + columns * 2.0 * em + 0.8 * em <= inches:
        columns += 1
    return labels, columns


def _finish(
    ax, title: str, xlabel: str | None, ylabel: str, *, grid: bool = True, categories: Sequence[str] | None = None
) -> None:
    """Axis labels (with units), the title that states the finding, a legend below the axes, a light grid, and the
    figure's height and margins from the sizes of its text (module docstring).

    categories: the x axis' labels at 0, 1, 2, ... (bars), wrapped to a bar's share of the axes' width.
    """
    figure = ax.figure
    measure = _Measure(figure)
    ax.tick_params(labelsize=TEXT_SIZE)
    ylabel = measure.wrap(ylabel, AXES_HEIGHT, LABEL_SIZE)
    ylabel_width = measure.box(ylabel, LABEL_SIZE, rotation=90)[0]
    yticks = max((measure.width(label, TEXT_SIZE) for label in _tick_labels(ax.yaxis, ax.get_ylim())), default=0)
    offset = ax.yaxis.get_major_formatter().get_offset()  # "1e-7" above the axes, where the formatter uses one
    left = PAD + ylabel_width + PAD + yticks + TICKS
    if categories is not None:
        xticks = list(categories)
    else:
        xticks = _tick_labels(ax.xaxis, ax.get_xlim())
    last = measure.width(xticks[-1], TEXT_SIZE) / 2 if xticks and categories is None else 0
    right = max(0.15, last + PAD)
    axes_width = WIDTH - left - right
    if categories is not None:
        share = axes_width / (ax.get_xlim()[1] - ax.get_xlim()[0])  # inches per bar position
        xticks = [measure.wrap(label, share * 0.95, TEXT_SIZE) for label in categories]
        ax.set_xticks(range(len(xticks)), xticks)
    xticks_height = max((measure.box(label, TEXT_SIZE)[1] for label in xticks), default=0)
    below = TICKS + xticks_height  # the axes' bottom to the tick labels' bottom
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
        ax.xaxis.set_label_coords(0.5, -(below + 0.04) / AXES_HEIGHT)
        below += 0.04 + measure.box(xlabel, LABEL_SIZE)[1]
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.yaxis.set_label_coords(-(yticks + TICKS + PAD) / axes_width, 0.5)
    legend_height = 0.0
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        labels, columns = _legend_columns(measure, labels, WIDTH - 2 * PAD)
        legend = ax.legend(
            handles,
            labels,
            fontsize=TEXT_SIZE,
            ncols=columns,
            loc="lower center",
            frameon=False,
            borderaxespad=0,
            borderpad=0,
        )
        legend_height = legend.get_window_extent(measure.renderer).height / DPI + PAD
    title = measure.wrap(title, axes_width, TITLE_SIZE)
    offset_height = measure.box(offset, TEXT_SIZE)[1] + 0.03 if offset else 0
    ax.set_title(title, fontsize=TITLE_SIZE, y=1.0, pad=6 + offset_height * 72)  # fixed: no search at each draw
    top = PAD + measure.box(title, TITLE_SIZE)[1] + 6 / 72 + offset_height
    bottom = PAD + legend_height + below + PAD
    height = math.ceil((top + AXES_HEIGHT + bottom) * DPI) / DPI  # whole pixels
    figure.set_size_inches(WIDTH, height)
    if handles:
        legend.set_bbox_to_anchor((0.5, PAD / height), transform=figure.transFigure)
    if grid:
        ax.grid(alpha=0.3)
    figure.subplots_adjust(left=left / WIDTH, right=1 - right / WIDTH, bottom=bottom / height, top=1 - top / height)


def _plain_log_y(ax) -> None:
    """A logarithmic y axis labelled with plain numbers at 1, 2 and 5 times each power of ten ("0.02"), the minor
    ticks unlabelled. matplotlib's own labels of a log axis are mathtext ("2 × 10⁻²") on the minor ticks too: wider
    than the room left for tick labels, they overlapped each other and the axis label (Hindi review N0-4), and they
    take 4 times as long to draw."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _position: f"{value:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


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
        ax.plot(
            columns["samples_seen"],
            losses,
            label=label,
            color=OKABE_ITO[i % 8],
            linestyle=LINE_STYLES[i % 4],
            linewidth=3 if i == 0 else 1.6,
            marker=MARKERS[i % 4] if i else None,
            markevery=max(len(losses) // 12, 1),
            markersize=4,
        )
    if logy:
        _plain_log_y(ax)
    ylabel = _("training loss (cross-entropy, nats, log scale)") if logy else _("training loss (cross-entropy, nats)")
    _finish(ax, title, _("samples seen"), ylabel)
    return Plot(figure, alt)


@_drawn
def memory_by_batch(batch_sizes: Sequence[int], peaks: Sequence[int], memory_budget: int, title: str, alt: str) -> Plot:
    """Measured peak bytes of one training step against batch size, with the card's budget line."""
    figure, ax = _figure()
    ax.plot(batch_sizes, [p / MIB for p in peaks], color=OKABE_ITO[0], marker="o", label=_("measured peak"))
    ax.axhline(
        memory_budget / MIB,
        color=OKABE_ITO[3],
        linestyle="--",
        label=_("card budget ({budget})").format(budget=mib(memory_budget)),
    )
    ax.set_xscale("log", base=2)
    _finish(ax, title, _("batch size (samples, log scale)"), _("peak memory of one step (MiB)"))
    return Plot(figure, alt)


@_drawn
def memory_stack(reports: dict[str, dict[str, int]], title: str, alt: str, memory_budget: int | None = None) -> Plot:
    """Stacked bars of bytes by category; reports: bar label -> {category: bytes} (accumlib.memory's categories).

    A category that is zero in every bar is left out of the bars and the legend; each keeps its colour and hatch.
    """
    figure, ax = _figure()
    categories = list(next(iter(reports.values())))
    positions = range(len(reports))
    bottoms = [0.0] * len(reports)
    for i, category in enumerate(categories):
        heights = [report[category] / MIB for report in reports.values()]
        if not any(heights):
            continue
        ax.bar(
            positions,
            heights,
            bottom=bottoms,
            label=_(CATEGORY_LABELS.get(category, category)),
            color=STACK_COLOURS[i % len(STACK_COLOURS)],
            hatch=HATCHES[i % 5],
            edgecolor="white",
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    if memory_budget is not None:
        ax.axhline(
            memory_budget / MIB,
            color="black",
            linestyle="--",
            label=_("card budget ({budget})").format(budget=mib(memory_budget)),
        )
    ax.set_xlim(-0.6, len(reports) - 0.4)
    _finish(ax, title, None, _("peak memory (MiB)"), grid=False, categories=list(reports))
    return Plot(figure, alt)


@_drawn
def bars(
    labels: Sequence[str], values: Sequence[float], ylabel: str, title: str, alt: str, reference: float | None = None
) -> Plot:
    """One bar per label, each its own colour and hatch; an optional dotted reference line (1.0 for ratios)."""
    figure, ax = _figure()
    ax.bar(
        range(len(labels)),
        values,
        color=[OKABE_ITO[i % 8] for i in range(len(labels))],
        hatch=[HATCHES[i % 5] for i in range(len(labels))],
        edgecolor="white",
    )
    if reference is not None:
        ax.axhline(reference, color="black", linestyle=":", linewidth=1)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    _finish(ax, title, None, ylabel, grid=False, categories=labels)
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
        ax.bar(
            xs,
            [groups[name][x] for x in xlabels],
            width=width,
            label=name,
            color=OKABE_ITO[i % 8],
            hatch=HATCHES[i % 5],
            edgecolor="white",
        )
    ax.set_xlim(-0.6, len(xlabels) - 0.4)
    _finish(ax, title, None, ylabel, grid=False, categories=xlabels)
    return Plot(figure, alt)


@_drawn
def lines(
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    alt: str,
    logy: bool = False,
) -> Plot:
    """Generic line plot; series: label -> (xs, ys)."""
    figure, ax = _figure()
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(
            xs,
            ys,
            label=label,
            color=OKABE_ITO[i % 8],
            linestyle=LINE_STYLES[i % 4],
            marker=MARKERS[i % 4],
            markevery=max(len(xs) // 10, 1),
            markersize=4,
        )
    if logy:
        _plain_log_y(ax)
    _finish(ax, title, xlabel, ylabel)
    return Plot(figure, alt)
