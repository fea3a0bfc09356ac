"""Tables (HTML, with their plain text) and figure display shared by the `show` modules. Widths are display
widths: non-spacing marks (the Devanagari nukta, virama and upper or lower vowel signs) take no column of their own,
so Hindi tables line up as English ones do."""

from __future__ import annotations

import html
import unicodedata
from typing import Sequence

from IPython.display import display

from ...i18n import _
from ..plots import Plot

# The largest weight difference that is float64 rounding, not a different computation, for the lessons' small
# float64 models: their weights are of order 1, so one rounding is about 2.2e-16 (float64's epsilon) and a few hundred
# steps of a few thousand operations each stay many orders below this bound (measured: at most 2.2e-16).
FLOAT64_ROUNDING = 1e-12


def rounding_or_gap(gap: float, rounding: float) -> str:
    """A difference as a table cell: "< {rounding}" where it is at most `rounding` (float rounding: its own digits
    depend on the CPU's kernels, AVX-512, AVX2 or neither, on the thread count and on the device, so the lesson
    prints the bound it passed), else the difference to two significant digits."""
    return f"< {rounding:.1e}" if gap <= rounding else f"{gap:.1e}"


def measured(value: float) -> str:
    """A result of float32 training (a loss, a statistic) to two significant digits: such runs differ from one CPU,
    thread count or device to another in the third or fourth digit (measured: 9.300 against 9.308)."""
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:#.2g}"


def listing(items: Sequence[str]) -> str:
    """Items as a sentence lists them, the last two joined by the language's "and": "a, b and c"."""
    items = [str(item) for item in items]
    if len(items) < 2:
        return "".join(items)
    return _("{items} and {last}").format(items=", ".join(items[:-1]), last=items[-1])


def width(text: str) -> int:
    """Columns `text` takes in a monospaced font: non-spacing marks (the Devanagari nukta, the virama, vowel signs
    written above or below such as ु) take none; spacing vowel signs such as ा take one."""
    return sum(0 if unicodedata.category(c) in ("Mn", "Me", "Cf") else 1 for c in text)


def _numeric(cell: str) -> bool:
    """Whether a table cell reads as a number ('1,912,152', '< 1.0e-12', '0.25x', '33%', '131,032*' with a
    footnote's mark): such columns are right-aligned."""
    return (
        cell.removeprefix("< ")
        .removesuffix("*")
        .replace(",", "")
        .replace(".", "")
        .replace("x", "")
        .replace("%", "")
        .replace("-", "")
        .replace("e", "")
        .replace("+", "")
        .strip()
        .isdigit()
    )


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, numbers: str = "right") -> str:
    """A text table: the header, then one line per row, columns separated by two spaces. Cells are given as text
    (format numbers before: '1,912,152', '0.25x'); numeric-looking columns are right-aligned."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    columns = len(cells[0])
    if any(len(row) != columns for row in cells):
        raise ValueError(
            _("rows: every row must have {columns} cells like the header, got {lengths}").format(
                columns=columns, lengths=[len(r) for r in cells]
            )
        )
    widths = [max(width(row[i]) for row in cells) for i in range(columns)]

    def numeric(i: int) -> bool:
        return numbers == "right" and all(_numeric(row[i]) for row in cells[1:] if row[i])

    right = [numeric(i) for i in range(columns)]

    def line(row: list[str]) -> str:
        padded = [
            (" " * (w - width(c)) + c) if r else (c + " " * (w - width(c)))
            for c, w, r in zip(row, widths, right, strict=True)
        ]
        return "  ".join(padded).rstrip()

    return "\n".join(line(row) for row in cells)


class TableView:
    """A measured table, shown by Jupyter (and the website, which renders the stored outputs) as an HTML table that
    wraps to the screen it is on, and as its text to a text-only view (GitHub, nbviewer, a printout, a terminal,
    nbval's comparison). The text is `table(...)`, exactly as printed before."""

    def __init__(self, text: str, cells: list[list[str]], right: list[bool]):
        self.text, self.cells, self.right = text, cells, right

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        def row(cells: list[str], tag: str) -> str:
            return (
                "<tr>"
                + "".join(
                    f'<{tag} style="text-align:{"right" if right else "left"}">{html.escape(cell)}</{tag}>'
                    for cell, right in zip(cells, self.right, strict=True)
                )
                + "</tr>"
            )

        head, *body = self.cells
        # the markup the stored Hindi tables have (nbval compares text/html): no class, no thead
        return f"<table>{row(head, 'th')}{''.join(row(cells, 'td') for cells in body)}</table>"


def has_devanagari(text: str) -> bool:
    return any("\u0900" <= c <= "\u097f" for c in text)


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]], *, numbers: str = "right") -> str:
    """Display `table(header, rows)` as a TableView (HTML, and the text as text/plain) and return its text. An
    HTML table keeps its columns aligned whatever font draws the Devanagari (Hindi review X-7) and fits a phone's
    screen, where printed text wrapped mid-row."""
    text = table(header, rows, numbers=numbers)
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    right = [numbers == "right" and all(_numeric(row[i]) for row in cells[1:] if row[i]) for i in range(len(cells[0]))]
    display(TableView(text, cells, right))
    return text


def figure(plot: Plot) -> Plot:
    """Display a figure in the notebook (PNG with its alt text; nbval compares the alt text) and return it."""
    display(plot)
    return plot
