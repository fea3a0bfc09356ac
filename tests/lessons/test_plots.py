"""Figures: Hindi text renders with a Devanagari font (no missing glyphs), Latin text keeps its usual font, every
fixed label goes through the catalogue, axes are labelled and every figure has alt text."""

import gettext
from pathlib import Path
import re
import warnings

import matplotlib
import numpy as np
import pytest
from matplotlib import font_manager

from accumlib import i18n
from accumlib.lessons import plots

CURVE = {"samples_seen": [32, 64, 96, 128], "loss": [2.3, 1.7, 1.2, 0.9]}
HINDI_TITLE = "संचित gradient पूरे batch के gradient के बराबर: क्षति घटती है"
HINDI_LEGEND = ["पूरा batch (संदर्भ)", "4 micro-batches, संचित"]


def glyph_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


@pytest.fixture
def devanagari():
    return plots.devanagari_font()


NO_DEVANAGARI = "DejaVu Sans"  # matplotlib's own font: Latin, Greek, Cyrillic, no Devanagari


def test_hindi_title_axis_label_and_legend_render_without_missing_glyphs(devanagari):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure = plots.loss_curves(dict(zip(HINDI_LEGEND, (CURVE, CURVE), strict=True)), HINDI_TITLE, "वैकल्पिक पाठ")
        figure.figure.axes[0].set_xlabel("देखे गए samples")
        png = figure.png()
    assert glyph_warnings(caught) == [] and png.startswith(b"\x89PNG")
    ax = figure.figure.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == HINDI_LEGEND
    assert devanagari not in matplotlib.rcParams["font.family"]  # the user's settings outside a drawing: untouched


def test_without_the_fallback_the_same_figure_misses_glyphs(devanagari, monkeypatch):
    """The check above can fail: drawn with the usual font alone, Devanagari has no glyphs."""
    monkeypatch.setattr(plots, "devanagari_font", lambda: NO_DEVANAGARI)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plots.loss_curves(dict(zip(HINDI_LEGEND, (CURVE, CURVE), strict=True)), HINDI_TITLE, "alt").png()
    assert glyph_warnings(caught)


def test_latin_text_keeps_its_usual_font(devanagari, monkeypatch):
    """An English figure drawn with the Devanagari fallback is pixel for pixel the figure drawn without it."""

    def pixels():
        figure = plots.loss_curves({"one batch of 32": CURVE, "4 micro-batches of 8": CURVE}, "The same title", "alt")
        with plots.drawing():
            figure.figure.canvas.draw()
        return np.asarray(figure.figure.canvas.buffer_rgba()).copy()

    with_fallback = pixels()
    monkeypatch.setattr(plots, "devanagari_font", lambda: NO_DEVANAGARI)
    assert np.array_equal(with_fallback, pixels())


def test_without_an_installed_devanagari_font_the_shipped_one_is_registered(monkeypatch):
    manager = font_manager.fontManager
    monkeypatch.setattr(manager, "ttflist", [f for f in manager.ttflist if "Devanagari" not in f.name])
    plots.devanagari_font.cache_clear()
    try:
        assert plots.devanagari_font() == "Lohit Devanagari"
        found = font_manager.findfont(font_manager.FontProperties(family="Lohit Devanagari"), fallback_to_default=False)
        assert Path(found).resolve() == plots.SHIPPED_FONT.resolve()
    finally:
        plots.devanagari_font.cache_clear()


HIDDEN_SYSTEM_FONTS = r"""
import json, sys, warnings
from pathlib import Path
import matplotlib
from matplotlib import font_manager
# What a machine without a Devanagari font gives matplotlib: its own fonts (mpl-data/fonts) and nothing else.
own = Path(matplotlib.get_data_path()).resolve()
manager = font_manager.fontManager
manager.ttflist = [f for f in manager.ttflist if Path(f.fname).resolve().is_relative_to(own)]
manager._findfont_cached.cache_clear()
before = sorted({f.name for f in manager.ttflist})
from accumlib import i18n
from accumlib.lessons import plots
i18n.set_language("hi")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    curve = {"samples_seen": [32, 64, 96, 128], "loss": [2.3, 1.7, 1.2, 0.9]}
    figure = plots.loss_curves({"32 का एक batch (पूरा batch)": curve, "8-8 के 4 micro-batches, संचित": curve},
                               "संचित gradient पूरे batch के gradient के बराबर: क्षति घटती है", "वैकल्पिक पाठ")
    png = figure.png()
Path(sys.argv[1]).write_bytes(png)
used = font_manager.findfont(font_manager.FontProperties(family=plots.devanagari_font()), fallback_to_default=False)
print(json.dumps({"before": before, "used": used, "shipped": str(plots.SHIPPED_FONT),
                  "warnings": [str(w.message) for w in caught]}))
"""


def test_a_hindi_figure_renders_with_the_systems_fonts_hidden(tmp_path):
    """A fresh process (its own matplotlib cache) that sees only matplotlib's own fonts, as on Colab, Kaggle,
    Windows or macOS without a Devanagari font: the Hindi figure finds every glyph in the shipped font.
    The PNG is kept in build/screenshots/ to be looked at."""
    import json
    import os
    import subprocess
    import sys

    out = Path(__file__).resolve().parents[2] / "build" / "screenshots" / "hindi-figure-no-system-font.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, MPLCONFIGDIR=str(tmp_path / "mplconfig"), PYTHONPATH=str(Path(plots.__file__).parents[2]))
    run = subprocess.run(
        [sys.executable, "-c", HIDDEN_SYSTEM_FONTS, str(out)], env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert not [name for name in result["before"] if "Devanagari" in name]  # the hiding worked
    assert Path(result["used"]).resolve() == Path(result["shipped"]).resolve()
    assert [w for w in result["warnings"] if "missing from font" in w] == []
    assert out.read_bytes().startswith(b"\x89PNG")


def test_fixed_labels_come_from_the_catalogue(monkeypatch):
    class Upper(gettext.NullTranslations):
        def gettext(self, message):  # upper case, placeholders kept
            return "".join(p if p.startswith("{") else p.upper() for p in re.split(r"(\{[^}]*\})", message))

    monkeypatch.setattr(i18n, "catalogue", lambda code: Upper())
    figure = plots.memory_stack({"a": {"parameters": 2**20, "other": 2**19}}, "T", "alt", memory_budget=2**20)
    ax = figure.figure.axes[0]
    assert ax.get_ylabel() == "PEAK MEMORY (MIB)"
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"PARAMETERS", "OTHER", "CARD BUDGET (1.00 MIB)"}


def test_every_figure_has_labelled_axes_with_units_alt_text_and_a_wrapped_title():
    long_title = "A title that states a measured finding and runs on for longer than one line of the figure can hold"
    figures = [
        plots.loss_curves({"a": CURVE}, long_title, "alt 1"),
        plots.memory_by_batch([1, 2, 4], [10, 20, 40], 30, long_title, "alt 2"),
        plots.memory_stack({"a": {"parameters": 1, "other": 2}}, long_title, "alt 3"),
        plots.bars(["a", "b"], [1, 2], "ratio (x)", long_title, "alt 4", reference=1.0),
        plots.deviation_bars(
            {"mean": {"layer 1": 0.1}, "variance": {"layer 1": 0.2}}, "deviation (relative)", long_title, "alt 5"
        ),
        plots.lines({"a": ([1, 2], [3, 4])}, "step", "learning rate", long_title, "alt 6"),
    ]
    for i, figure in enumerate(figures, 1):
        ax = figure.figure.axes[0]
        assert "(" in ax.get_ylabel() or ax.get_ylabel() == "learning rate"
        assert ax.get_title().count("\n") >= 1 and ax.get_title().replace("\n", " ") == long_title
        assert figure.alt == f"alt {i}"
        data, metadata = figure._repr_mimebundle_()
        assert data["text/plain"] == metadata["image/png"]["alt"] == f"alt {i}"
    assert figures[0].figure.axes[0].get_xlabel() == "samples seen"


def test_a_diverging_curve_on_a_log_axis_keeps_its_gaps_and_plain_tick_labels():
    figure = plots.loss_curves(
        {
            "reference": CURVE,
            "diverging": {"samples_seen": [32, 64, 96, 128], "loss": [2.3, 40.0, float("inf"), float("nan")]},
        },
        "title",
        "alt",
        logy=True,
    )
    ax = figure.figure.axes[0]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel().replace("\n", " ")
    assert np.isnan(ax.get_lines()[1].get_ydata()[2:]).all()
    figure.png()
    assert all("$" not in t.get_text() for t in ax.get_yticklabels())


def overlaps(a, b) -> bool:
    """Whether two display-space bounding boxes share any area (touching edges do not count)."""
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def drawn_text_boxes(figure):
    """The y axis label's box and the boxes of the y tick labels drawn with text, after rendering the figure."""
    figure.png()
    ax = figure.figure.axes[0]
    renderer = figure.figure.canvas.get_renderer()
    ticks = [
        t.get_window_extent(renderer)
        for t in ax.get_yticklabels(minor=False) + ax.get_yticklabels(minor=True)
        if t.get_visible() and t.get_text() and ax.get_ylim()[0] <= t.get_position()[1] <= ax.get_ylim()[1]
    ]
    return ax.yaxis.label.get_window_extent(renderer), ticks


@pytest.mark.parametrize("language", ["en", "hi"])
def test_a_log_axis_label_and_its_tick_labels_do_not_overlap(language):
    """Lesson 0's BatchNorm figure as it is drawn (plots.lines, log y, its own label, deviations 0.01-0.08 in both
    editions): the y label clears every tick label, and no two tick labels overlap (Hindi review N0-4: the label sat on
    the mathtext minor labels 4×10⁻², 3×10⁻², 2×10⁻², which overlapped each other)."""
    i18n.set_language(language)
    try:
        label = i18n._("deviation from the whole batch (relative)")
        figure = plots.lines(
            {"a": ([4, 64], [0.077, 0.024]), "b": ([4, 64], [0.030, 0.010])},
            i18n._("micro-batch size (samples)"),
            label,
            "title",
            "alt",
            logy=True,
        )
    finally:
        i18n.set_language("en")
    ylabel, ticks = drawn_text_boxes(figure)
    assert len(ticks) >= 2, "the axis needs at least two labelled ticks to be read"
    assert not [t for t in ticks if overlaps(ylabel, t)], f"the y label {label!r} overlaps a tick label"
    assert not [(a, b) for i, a in enumerate(ticks) for b in ticks[i + 1 :] if overlaps(a, b)]


@pytest.mark.parametrize(
    "version, language, warns", [("3.10.0", "hi", True), ("3.10.0", "en", False), ("3.11.2", "hi", False)]
)
def test_hindi_figures_on_a_matplotlib_that_cannot_shape_say_how_to_fix_it(monkeypatch, version, language, warns):
    """Colab's matplotlib 3.10 draws Devanagari unjoined (its matras and conjuncts apart: looked at, 3.10.0 against
    3.11.2); the lessons otherwise work with it, so a Hindi course warns once, in Hindi, with the command and the
    restart; English figures, and a matplotlib that shapes, say nothing."""
    monkeypatch.setattr(matplotlib, "__version__", version)
    plots.warn_unshaped.cache_clear()
    previous = i18n.language()
    i18n.set_language(language)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plots.loss_curves({"a": {"samples_seen": [1, 2], "loss": [2.0, 1.0]}}, "t", "alt").png()
            plots.loss_curves({"a": {"samples_seen": [1, 2], "loss": [2.0, 1.0]}}, "t", "alt").png()
    finally:
        i18n.set_language(previous)
        plots.warn_unshaped.cache_clear()
    said = [str(w.message) for w in caught if 'pip install -q "matplotlib' in str(w.message)]
    assert len(said) == (1 if warns else 0), said  # once per process, however many figures
    if warns:
        assert "matplotlib 3.10.0" in said[0] and 'pip install -q "matplotlib>=3.11"' in said[0]
        assert "अक्षर" in said[0]  # in the course's language


# --- figures drawn for a phone ------------------------------------------------------------------------------------
# A figure's box on a 390 px phone, px: the narrowest the website gives one is 346 (a dashboard's, inside the page's
# and the dashboard's margins; measured in Chromium by tests/course/test_site.py, which checks every page's figures
# at that width); Voila's cell is wider. 330 leaves a theme room to change its margins.
PHONE_FIGURE_PX = 330


class _Job:
    def check(self):
        pass

    def draw(self, figures):
        pass


def lesson_figures(monkeypatch) -> list:
    """The figures of the dashboards (their default settings) and of five lessons' findings, computed from real runs
    and measurements with the lessons' own code, in the language set now."""
    from accumlib import batchnorm, memory, timing, train
    from accumlib.lessons import data, models, widgets
    from accumlib.lessons.show import batchnorm as show_batchnorm, large_batch, memory as show_memory, time as show_time
    import torch

    made = []
    for module in (show_batchnorm, large_batch, show_memory, show_time):
        monkeypatch.setattr(module, "figure", lambda plot: made.append(plot) or plot)
    for dashboard in (
        widgets.LossDashboard(samples=256, epochs=1),
        widgets.MemoryDashboard(),
        widgets.BatchNormDashboard(),
    ):
        made += dashboard.compute(dashboard.current_settings(), _Job())[0]
    digits = data.digits()
    X, _y = data.digits(256)
    show_batchnorm.deviation(
        {m: batchnorm.micro_batch_deviation(models.cnn(norm="batch"), X[:64], m) for m in (4, 16, 64)}, batch=64
    )
    reports = [memory.measure_step(models.cnn(), *memory.batch_of(digits, size)) for size in (8, 16, 32, 64)]
    large_batch.memory_by_batch(reports, (reports[1].peak + reports[2].peak) // 2)
    flat = data.digits(64, flat=True)
    runs = {}
    for size in (4, 32):
        model = models.mlp(seed=0)
        runs[size] = train(
            model,
            flat,
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=size,
            accum_steps=1,
            epochs=2,
            measure_memory=False,
        )
    large_batch.compare_batches(runs)
    show_memory.categories(
        [memory.measure_step(models.cnn(), X[:m], _y[:m], accum_steps=64 // m, fake=True) for m in (64, 32, 16, 8, 4)]
    )  # lesson 5's five splits of 64: five labelled bars
    decomposition = timing.decompose_time(models.cnn(), data.digits(64), accum_steps=(1, 4, 16), repeats=1, warmup=0)
    show_time.passes(decomposition)  # layout only: the measured times differ from run to run, the checks do not
    return made


def drawn_texts(plot) -> dict[str, object]:
    """Every piece of text the drawn figure shows, by a name that says where it is: its display-space box."""
    plot.png()
    figure = plot.figure
    renderer = figure.canvas.get_renderer()
    ax = figure.axes[0]
    texts = {
        "title": ax.title,
        "x label": ax.xaxis.label,
        "y label": ax.yaxis.label,
        "x offset": ax.xaxis.offsetText,
        "y offset": ax.yaxis.offsetText,
    }
    if ax.get_legend() is not None:
        texts |= {f"legend {i}": t for i, t in enumerate(ax.get_legend().get_texts())}
    for name, axis, limits, coordinate in (("x", ax.xaxis, ax.get_xlim(), 0), ("y", ax.yaxis, ax.get_ylim(), 1)):
        low, high = sorted(limits)
        for i, label in enumerate(axis.get_ticklabels()):
            if low <= label.get_position()[coordinate] <= high:  # ticks outside the axes are not drawn
                texts[f"{name} tick {i}"] = label
    return {name: t.get_window_extent(renderer) for name, t in texts.items() if t.get_visible() and t.get_text()}


@pytest.mark.parametrize("language", ["en", "hi"])
def test_every_text_of_a_lesson_figure_is_inside_it_apart_from_the_rest_and_legible_on_a_phone(language, monkeypatch):
    """Each figure as the lessons and the dashboards draw it from measured data, in both editions (Hindi strings are
    longer): every text (title, axis labels, tick labels, legend) lies inside the figure, no two overlap, the legend
    covers no line or bar (it sits outside the axes), and the smallest text, scaled down to the narrowest box a
    phone gives a figure, is drawn at 9 px or more (before: 8 pt on a 7-inch figure, 5.7 px at 358 px)."""
    i18n.set_language(language)
    try:
        figures = lesson_figures(monkeypatch)
        assert len(figures) >= 9
        for plot in figures:
            where = plot.figure.axes[0].get_title()[:60]
            boxes = drawn_texts(plot)
            assert {"title", "y label"} <= set(boxes) and any("tick" in name for name in boxes), where
            whole = plot.figure.bbox
            outside = [
                name
                for name, b in boxes.items()
                if b.x0 < whole.x0 - 0.5 or b.y0 < whole.y0 - 0.5 or b.x1 > whole.x1 + 0.5 or b.y1 > whole.y1 + 0.5
            ]
            assert outside == [], (where, outside)
            names = list(boxes)
            crossing = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :] if overlaps(boxes[a], boxes[b])]
            assert crossing == [], (where, crossing)
            legend = plot.figure.axes[0].get_legend()
            if legend is not None:
                renderer = plot.figure.canvas.get_renderer()
                assert not overlaps(legend.get_window_extent(renderer), plot.figure.axes[0].bbox), where
            rendered = plot.smallest_text() / 72 * PHONE_FIGURE_PX / plot.figure.get_size_inches()[0]
            assert rendered >= 9, (where, rendered)
    finally:
        i18n.set_language("en")


def test_the_png_records_its_smallest_font_size():
    """The text chunk a page reads to compute the size its reader sees: the smallest size the figure draws."""
    from PIL import Image
    import io

    plot = plots.lines({"a": ([1, 2], [3, 4])}, "step", "learning rate", "title", "alt")
    assert Image.open(io.BytesIO(plot.png())).text[plots.SMALLEST_TEXT] == f"{plots.TEXT_SIZE:g}"
    plot.figure.axes[0].tick_params(labelsize=6)
    assert Image.open(io.BytesIO(plot.png())).text[plots.SMALLEST_TEXT] == "6"
