"""Each lesson's time (tools/lesson_time.py): recomputed from the stored English notebooks, it must be what
tools/lesson_times.json, docs/lessons.md's lesson table, INSTRUCTORS.md and each lesson's own time cell (both editions)
say; lesson 0 keeps the seed's promise of ten minutes. The counting rules are checked on small notebooks first.

A failure names what is stale; `python tools/lesson_time.py write` refreshes it. Run with `-rP` to see lesson 0's
measured time printed.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import editions  # noqa: E402
import lesson_time  # noqa: E402

FIX = "run python tools/lesson_time.py write"


@pytest.fixture(scope="module")
def by_language() -> dict[str, list[lesson_time.LessonTime]]:
    return lesson_time.measure_editions()


@pytest.fixture(scope="module")
def times(by_language) -> list[lesson_time.LessonTime]:
    return by_language["en"]


# --- the counting rules, on small notebooks ---------------------------------------------------------------------


def notebook(*cells):
    nb = nbformat.v4.new_notebook()
    for i, cell in enumerate(cells):
        cell.id = f"c{i}"
        nb.cells.append(cell)
    return nb


def code(source, *outputs, tags=None):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": tags} if tags else {})
    cell.outputs = list(outputs)
    return cell


def stream(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def result(data, kind="execute_result"):
    output = nbformat.v4.new_output(kind, data=data)
    if kind == "execute_result":
        output.execution_count = 1
    return output


def test_prose_printed_code_tasks_and_questions_are_counted_as_the_method_says():
    nb = notebook(
        nbformat.v4.new_markdown_cell("# Title\n\nfour words of prose\n\n```python\nx = 1\n\ny = 2\n```\nend"),
        nbformat.v4.new_markdown_cell("⏱ not counted at all", metadata={"tags": [lesson_time.TAG]}),
        code("a = 1\n\nprint(a)  # two lines", stream("one two three\n")),
        code(
            "show()",
            result({"text/plain": "five words shown as text"}),  # a plain result: read
            result({"image/png": "iVBOR", "text/plain": "alt text of a figure"}, "display_data"),
        ),  # a figure: not
        code(
            "show.table()",
            result({"text/plain": "a table of six words here", "text/html": "<table></table>"}, "display_data"),
        ),  # a measured table (its HTML form beside its text): read
        code(
            "widgets.LossDashboard().show()",
            result(
                {
                    "application/vnd.jupyter.widget-view+json": {},
                    "text/plain": "Loss (controls: x)\nTry this:\n1. Do a.\n2. Do b.\n3. Do c.",
                },
                "display_data",
            ),
        ),
        code('quiz.predict("predict-no-division-adam")'),
        code(
            'quiz.check("grad-adds-up")',
            result(
                {
                    "application/vnd.jupyter.widget-view+json": {},
                    "text/plain": "Quiz (English), 1 question:\n1. After three micro-batches …",
                }
            ),
        ),
    )
    t = lesson_time.measure("x", nb)
    # prose: "# Title" (2) + 4 + "end" (1); the fenced block is code (2 lines), the time cell nothing; a table's
    # words count as printed words (tables became HTML displays: left out, four lessons lost a minute they take)
    assert (t.prose_words, t.code_lines, t.printed_words) == (7, 2 + 2 + 1 + 1 + 1 + 1 + 1, 3 + 5 + 6)
    assert (t.dashboard_tasks, t.questions, t.predict_questions, t.exercise_lines) == (3, 2, 1, {})
    reading = 7 / lesson_time.PROSE_WPM + 14 / lesson_time.PRINTED_WPM + 9 / lesson_time.CODE_LPM
    assert t.reading_minutes == pytest.approx(reading, abs=1e-3)
    # start 1, three tasks of 2, one question of 1 and one predict question of 2
    assert t.total_minutes == pytest.approx(reading + 1 + 6 + 1 + 2, abs=1e-3)
    assert t.minutes == 11 and sum(t.parts.values()) == t.minutes and t.parts["reading"] == 1


def test_an_exercise_takes_two_minutes_per_line_to_write_or_change():
    from accumlib.lessons import exercises

    # lesson 3's stub is the ordinary loop: the division, the `if` and the two re-indented calls are 4 lines
    assert lesson_time.lines_to_write(exercises.the_loop.stub, exercises.the_loop.solution_code) == 4
    # lesson 2: one line; comments and blank lines do not count
    assert lesson_time.lines_to_write(exercises.scale_loss.stub, exercises.scale_loss.solution_code) == 1
    assert lesson_time.lines_to_write("x = 1  # a\n\ny = 2\n", "x = 1  # b\ny = 2\n") == 1  # nothing to do: 1
    assert lesson_time.lines_to_write("x = 1\n", "x = 1\nif x:\n    y = 2\n") == 2
    cell = code(exercises.first_loop.stub, tags=["exercise"])
    t = lesson_time.measure("x", notebook(cell))
    assert t.exercise_lines == {"first_loop": 1} and t.exercise_minutes() == {"first_loop": 2}


def test_half_a_minute_rounds_up_and_the_parts_add_up_to_the_total():
    t = lesson_time.LessonTime("x", 0, 0, 0, 1, 1, 0, {"e": 1}, reading_minutes=4.5, total_minutes=10.5)
    assert t.minutes == 11 and t.parts == {"reading": 5, "dashboard": 2, "exercise": 2, "quiz": 1, "start": 1}
    assert lesson_time.time_text(t, "en") == (
        "⏱ **About 11 minutes**: 5 to read, 2 for the dashboard, 2 for the exercise, 1 for the quick check and 1 to "
        "start. [How this is measured](../../INSTRUCTORS.md#how-the-times-are-measured)"
    )


# --- the committed course -----------------------------------------------------------------------------------------


def test_the_stored_numbers_are_those_of_the_notebooks(by_language):
    stored = json.loads(lesson_time.STORE.read_text(encoding="utf-8"))
    fresh = json.loads(lesson_time.store_bytes(by_language))
    assert stored["method"] == fresh["method"], f"the method changed: {FIX}"
    assert set(fresh["editions"]) == set(editions.LANGUAGES) == set(stored.get("editions", {})), FIX
    for where, old, new in [("lessons", stored["lessons"], fresh["lessons"])] + [
        (f"editions/{language}", stored["editions"][language], fresh["editions"][language])
        for language in editions.LANGUAGES
    ]:
        stale = [name for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
        assert not stale, f"stale numbers in {lesson_time.STORE.relative_to(ROOT)} ({where}) for {stale}: {FIX}"


def test_lesson_zero_takes_ten_minutes_or_less(times):
    zero = next(t for t in times if t.lesson.startswith("00_"))
    print(
        f"\n{zero.lesson}: {zero.total_minutes:.2f} minutes ({zero.minutes} min), of which reading "
        f"{zero.reading_minutes:.2f} min ({zero.prose_words} words of prose at {lesson_time.PROSE_WPM} a minute, "
        f"{zero.printed_words} printed words at {lesson_time.PRINTED_WPM}, {zero.code_lines} lines of code at "
        f"{lesson_time.CODE_LPM}); parts: {zero.parts}"
    )
    assert zero.minutes <= 10, f"{zero.lesson} takes {zero.total_minutes:.2f} minutes: more than the seed's ten"
    for language in editions.LANGUAGES:  # the method on each edition's own words (its language cell not counted)
        edition = lesson_time.measure(zero.lesson, editions.read_notebook(editions.edition_path(zero.lesson, language)))
        print(
            f"{language}: {edition.total_minutes:.2f} minutes ({edition.prose_words} words of prose, "
            f"{edition.printed_words} printed, {edition.code_lines} lines of code)"
        )
        assert edition.code_lines == zero.code_lines and edition.exercise_lines == zero.exercise_lines
        assert edition.minutes <= 10, f"{zero.lesson} ({language}) takes {edition.total_minutes:.2f} minutes"


def test_the_readme_and_instructors_tables_are_current(times, by_language):
    readme = lesson_time.README.read_text(encoding="utf-8")
    assert lesson_time.refreshed_readme(readme, times) == readme, f"docs/lessons.md's lesson table is stale: {FIX}"
    assert set(lesson_time.table_rows(readme)) == {t.lesson for t in times}, "docs/lessons.md's table lacks a lesson"
    instructors = lesson_time.INSTRUCTORS.read_text(encoding="utf-8")
    assert lesson_time.refreshed_instructors(instructors, by_language) == instructors, f"INSTRUCTORS.md's times: {FIX}"


@pytest.mark.parametrize("name", lesson_time.lesson_names())
def test_every_lesson_states_its_own_editions_measured_time_at_its_top(name, by_language):
    t = next(t for t in by_language["en"] if t.lesson == name)
    english = editions.read_notebook(editions.english_path(name))
    cell = lesson_time.time_cell(english)
    title = next(i for i, c in enumerate(english.cells) if c.cell_type == "markdown")  # after the Colab set-up cell
    assert cell is not None and english.cells.index(cell) == title + 1, (
        f"{name}: no time cell after the title: {FIX} {name}"
    )
    assert cell.source == lesson_time.time_text(t, "en"), f"{name}: its time cell says {cell.source!r}: {FIX} {name}"
    for language in editions.LANGUAGES:
        entry = next((m for m in editions.translation(name, language) if m.id and m.context == lesson_time.TAG), None)
        assert entry is not None and entry.id == cell.source and not entry.fuzzy, f"{name} ({language}): {FIX} {name}"
        # the edition's own time, measured on its own words, not the English minutes in its words
        own = lesson_time.measure(name, language=language)
        assert own == next(t for t in by_language[language] if t.lesson == name)
        assert entry.string == lesson_time.time_text(own, language), f"{name} ({language}): {FIX} {name}"
        stated = lesson_time.time_cell(editions.read_notebook(editions.edition_path(name, language))).source
        assert stated == entry.string, f"{name} ({language}): notebooks/{language} is not built from its PO: {FIX}"
        total = re.search(r"\*\*\D*(\d+)\D*\*\*", stated)
        assert total and int(total.group(1)) == own.minutes == math.floor(own.total_minutes + 0.5), (
            f"{name} ({language}) states {stated!r}, measures {own.total_minutes:.2f} min: {FIX} {name}"
        )


def test_a_quiz_cell_is_counted_from_its_calls_as_the_quiz_selects_and_an_uncountable_cell_raises():
    from accumlib.lessons import quiz

    bank = lesson_time.question_bank()
    # a lesson's check leaves out the predict questions the lesson asked before (quiz.select)
    lesson_2 = [q["id"] for q in bank if q["lesson"] == 2 and q["kind"] != "predict"]
    assert lesson_time.quiz_ids(code("quiz.check(lesson=2)")) == lesson_2 == [q["id"] for q in quiz.select(lesson=2)]
    assert len(lesson_2) < sum(q["lesson"] == 2 for q in bank)
    assert lesson_time.quiz_ids(code('quiz.check("when-to-step", "loop-order", language="hi")')) == [
        "when-to-step",
        "loop-order",
    ]
    assert lesson_time.quiz_ids(code('quiz.predict("what-memory-shrinks")  # answer first')) == ["what-memory-shrinks"]
    assert len(lesson_time.quiz_ids(code("quiz.check()"))) == len(bank)
    assert lesson_time.quiz_ids(code("print(1)")) == []
    # the stored output is not what is counted: it names no ids (hindi.md X-9)
    cell = code("quiz.check(lesson=3)", result({"text/plain": "Quiz (English), 9 questions:\n1. …"}))
    assert lesson_time.quiz_ids(cell) == [q["id"] for q in quiz.select(lesson=3)]
    for source in ("quiz.check(*mine)", "quiz.predict()", "quiz.check(lesson=n)"):
        with pytest.raises(ValueError, match="cannot be counted"):
            lesson_time.quiz_ids(code(source))
    with pytest.raises(ValueError, match="lists no tasks"):
        lesson_time.measure("x", notebook(code("widgets.LossDashboard().show()")))
