"""Plain-text tables and figure display shared by the `show` modules. Widths are display widths: non-spacing marks
(the Devanagari nukta, virama and upper or lower vowel signs) take no column of their own, so Hindi tables line up
as English ones do."""
from __future__ import annotations

import unicodedata
from typing import Sequence

from IPython.display import display

from ..plots import Plot


def width(text: str) -> int:
    """Columns `text` takes in a monospaced font: non-spacing marks (the Devanagari nukta, the virama, vowel signs
    written above or below such as ु) take none; spacing vowel signs such as ा take one."""
    return sum(0 if unicodedata.category(c) in ("Mn", "Me", "Cf") else 1 for c in text)


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, numbers: str = "right") -> str:
    """A text table: the header, then one line per row, columns separated by two spaces. Cells are given as text
    (format numbers before: '1,912,152', '0.25x'); numeric-looking columns are right-aligned."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    columns = len(cells[0])
    if any(len(row) != columns for row in cells):
        raise ValueError(f"rows: every row must have {columns} cells like the header, got {[len(r) for r in cells]}")
    widths = [max(width(row[i]) for row in cells) for i in range(columns)]

    def numeric(i: int) -> bool:
        return numbers == "right" and all(
            row[i].replace(",", "").replace(".", "").replace("x", "").replace("%", "").replace("-", "")
            .replace("e", "").replace("+", "").strip().isdigit() for row in cells[1:] if row[i])

    right = [numeric(i) for i in range(columns)]

    def line(row: list[str]) -> str:
        padded = [(" " * (w - width(c)) + c) if r else (c + " " * (w - width(c))) for c, w, r in zip(row, widths, right)]
        return "  ".join(padded).rstrip()

    return "\n".join(line(row) for row in cells)


def figure(plot: Plot) -> Plot:
    """Display a figure in the notebook (PNG with its alt text; nbval compares the alt text) and return it."""
    display(plot)
    return plot
