"""accumlib.lessons.show: the shared text tables line up in Hindi as in English; topics load on first use."""

import pytest

from accumlib.lessons import show
from accumlib.lessons.show import _format


def test_table_columns_line_up_by_display_width_in_devanagari():
    text = _format.table(["batch", "हिस्सा"], [["8", "ज़्यादा"], ["128", "कम"]])
    lines = text.splitlines()
    # every line's second column starts at the same display column
    starts = [
        _format.width(line[: line.index(cell)]) for line, cell in zip(lines, ["हिस्सा", "ज़्यादा", "कम"], strict=True)
    ]
    assert len(set(starts)) == 1
    assert lines[1].startswith("    8") and lines[2].startswith("  128")  # numbers right-aligned
    assert _format.width("ज़्यादा") == 5  # ज ़ ् य ा द ा: the nukta and the virama take no column, the ा signs do


def test_table_refuses_ragged_rows_naming_them():
    with pytest.raises(ValueError, match="rows: every row must have 2 cells"):
        _format.table(["a", "b"], [["1"]])


def test_unknown_topic_names_the_topics():
    with pytest.raises(AttributeError, match="the topics are large_batch"):
        show.not_a_topic  # noqa: B018


@pytest.fixture
def in_hindi():
    import accumlib

    accumlib.set_language("hi")
    yield
    accumlib.set_language("en")


def test_a_lessons_refusals_speak_the_course_language(in_hindi):
    """show's argument errors go through the catalogue (tests/library/test_i18n.py walks show/ for the rest): a
    Hindi learner reads them in Hindi, with the same values."""
    with pytest.raises(ValueError, match=r"^`rows`: हर पंक्ति में .* 2 खाने होने चाहिए; पर \[2, 1\] मिले$"):
        _format.table(["a", "b"], [["1"]])
    with pytest.raises(ValueError, match=r"^`sizes` में हर micro-batch के samples की गिनती .* पर \[4, 0\] मिला$"):
        show.last_cycle.weights([4, 0], 2)
    with pytest.raises(AttributeError, match="विषय ये हैं: large_batch"):
        show.not_a_topic  # noqa: B018


def test_every_table_is_shown_as_html_with_its_text_as_before(capsys, monkeypatch):
    """A measured table is displayed as an HTML table (it wraps to a phone's screen, and Devanagari from a
    proportional fallback font no longer shifts its columns: Hindi review X-7) whose text/plain is the text table,
    exactly as it was printed before (nbval compares it); English and Hindi alike."""
    shown = []
    monkeypatch.setattr(_format, "display", shown.append)
    for header, rows in (
        (["split", "peak (bytes)"], [["8 × 4", "310,944"], ["32 × 1", "986,204"]]),
        (["बँटवारा", "peak (bytes)"], [["8 × 4", "310,944"], ["एक batch", "986,204"]]),
    ):
        text = _format.print_table(header, rows)
        assert capsys.readouterr().out == "" and len(shown) == 1
        view = shown.pop()
        assert str(view) == repr(view) == text == _format.table(header, rows)
        page = view._repr_html_()
        assert page.startswith("<table><tr><th") and page.count("<tr>") == 3
        assert '<td style="text-align:right">986,204</td>' in page  # numbers right-aligned, as in the text
        assert f'<th style="text-align:left">{header[0]}</th>' in page
        assert f'<td style="text-align:left">{rows[1][0]}</td>' in page
    from IPython.core.formatters import DisplayFormatter

    data, _metadata = DisplayFormatter().format(_format.TableView("a  b", [["a", "b"], ["1", "2"]], [True, True]))
    assert data["text/plain"] == "a  b" and data["text/html"].startswith("<table")  # what Jupyter stores
    assert "&lt;" in _format.TableView("x", [["a"], ["< 1.0e-12"]], [True])._repr_html_()  # cells are escaped
