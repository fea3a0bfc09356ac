"""accumlib.lessons.show: the shared text tables line up in Hindi as in English; topics load on first use."""
import pytest

from accumlib.lessons import show
from accumlib.lessons.show import _format


def test_table_columns_line_up_by_display_width_in_devanagari():
    text = _format.table(["batch", "हिस्सा"], [["8", "ज़्यादा"], ["128", "कम"]])
    lines = text.splitlines()
    # every line's second column starts at the same display column
    starts = [_format.width(line[:line.index(cell)]) for line, cell in zip(lines, ["हिस्सा", "ज़्यादा", "कम"])]
    assert len(set(starts)) == 1
    assert lines[1].startswith("    8") and lines[2].startswith("  128")  # numbers right-aligned
    assert _format.width("ज़्यादा") == 5  # ज ़ ् य ा द ा: the nukta and the virama take no column, the ा signs do


def test_table_refuses_ragged_rows_naming_them():
    with pytest.raises(ValueError, match="rows: every row must have 2 cells"):
        _format.table(["a", "b"], [["1"]])


def test_unknown_topic_names_the_topics():
    with pytest.raises(AttributeError, match="the topics are large_batch"):
        show.not_a_topic  # noqa: B018
