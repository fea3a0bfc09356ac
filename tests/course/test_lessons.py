"""Issue 11 section 2, checked on the stored English lessons: one lesson per idea, at most about 700 words of prose
(the time cell that tools/lesson_time.py writes left out: tests/course/test_lesson_time.py checks the times), the
lesson's exercise in a cell tagged `exercise` that calls its checker, and the lesson's own quick check as the last cell;
lesson 0, the whole idea in ten minutes, ends instead with a cell that links every other lesson. Each failure names the
notebook."""

import re
from pathlib import Path

import nbformat
import pytest

from accumlib.lessons import exercises

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "notebooks" / "en").glob("[0-9][0-9]_*.ipynb"))
MOST_WORDS = 700
FENCED = re.compile(r"```.*?```", re.S)


def number(path: Path) -> int:
    return int(path.name[:2])


def prose_words(notebook) -> int:
    """Words of the markdown cells, fenced code blocks and the time cell (tagged `lesson-time`) left out."""
    return sum(
        len(FENCED.sub(" ", cell.source).split())
        for cell in notebook.cells
        if cell.cell_type == "markdown" and "lesson-time" not in cell.metadata.get("tags", [])
    )


def test_the_lessons_are_numbered_zero_to_ten_without_gaps():
    assert [number(path) for path in LESSONS] == list(range(0, 11))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_a_lesson_reads_in_under_ten_minutes(path):
    words = prose_words(nbformat.read(path, as_version=4))
    assert words <= MOST_WORDS, f"{path.name}: {words} words of prose, more than {MOST_WORDS}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_the_exercise_cells_call_the_lessons_checkers(path):
    notebook = nbformat.read(path, as_version=4)
    cells = [cell for cell in notebook.cells if "exercise" in cell.metadata.get("tags", [])]
    expected = [e.name for e in exercises.BY_LESSON.get(number(path), ())]
    called = [name for cell in cells for name in re.findall(r"exercises\.(\w+)\.check\(", cell.source)]
    assert called == expected, f"{path.name}: exercise cells call {called}, the lesson's exercises are {expected}"
    assert all(cell.cell_type == "code" for cell in cells), f"{path.name}: an `exercise` tag on a markdown cell"


@pytest.mark.parametrize("path", LESSONS[1:-1], ids=lambda p: p.stem)
def test_a_lesson_ends_with_its_own_quick_check(path):
    notebook = nbformat.read(path, as_version=4)
    last = notebook.cells[-1]
    assert last.cell_type == "code" and last.source.strip() == f"quiz.check(lesson={number(path)})", (
        f"{path.name}: the last cell is {last.source!r}, not its quick check"
    )


def test_lesson_zero_ends_by_linking_every_other_lesson():
    """Its last cell points, section by section, to the lesson that goes deeper: every other lesson, by file name."""
    last = nbformat.read(LESSONS[0], as_version=4).cells[-1]
    linked = set(re.findall(r"\]\(([0-9][0-9]_\w+\.ipynb)\)", last.source))
    assert last.cell_type == "markdown" and linked == {path.name for path in LESSONS[1:]}, (
        f"{LESSONS[0].name}: the last cell links {sorted(linked)}"
    )


# Lesson 0's quick check is the loop's step condition. Every form that states it: the code, its pieces, and its
# words in English and Hindi (a multiple of accum_steps, a remainder of 0: गुणज, शेषफल, पूरा-पूरा भाग).
STEP_CONDITION = re.compile(
    r"%\s*accum_steps|%\s*4\b|\(?\s*step\s*\+\s*1\s*\)?\s*%|accum_steps\s*-\s*1\b|step\s*\+\s*1\b"
    r"|multiple of accum_steps|divisible by accum_steps|remainder|गुणज|शेषफल|पूरा-पूरा भाग",
    re.I,
)


def shown_text(cell) -> list[str]:
    """What a learner sees of a cell before running anything: a markdown cell's text, a code cell's stored outputs
    (printed text, every text form of a result, a figure's alt text)."""
    if cell.cell_type == "markdown":
        return [cell.source]
    texts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            texts.append(output.text)
        for value in output.get("data", {}).values():
            texts.append(value if isinstance(value, str) else "")
        texts.append(str(output.get("metadata", {})))
    return texts


@pytest.mark.parametrize("edition", ["en", "hi"])
def test_nothing_shown_above_or_in_lesson_zeros_exercise_states_the_step_condition(edition):
    """Learners see stored outputs (`make lab` copies the notebooks as stored, the website shows them): lesson 0 asks
    for the condition as its quick check, so no cell up to its exercise shows it, in text or output; the recap after
    it does."""
    notebook = nbformat.read(ROOT / "notebooks" / edition / LESSONS[0].name, as_version=4)
    exercise = next(i for i, cell in enumerate(notebook.cells) if "exercise" in cell.metadata.get("tags", []))
    assert notebook.cells[exercise].outputs, "the exercise cell has no stored output: execute the lesson"
    found = [
        (i, match.group(0))
        for i, cell in enumerate(notebook.cells[: exercise + 1])
        for text in shown_text(cell)
        for match in [STEP_CONDITION.search(text)]
        if match
    ]
    assert not found, f"{edition}/{LESSONS[0].name}: cells before the check state the step condition: {found}"
    assert "`(step + 1) % accum_steps == 0`" in notebook.cells[-1].source, "the recap gives the answer, after the check"
    assert "if ...:" in notebook.cells[exercise].source


# What answered a predict question before it was asked (lessons review, turn 4): the sentence or output above it.
GIVEAWAYS = {
    "predict-no-division-adam": ("largely cancel", "exactly like an `accum_steps` times larger learning rate"),
    "predict-classic-division": ("its step gets", "Divided by accum_steps"),
    "predict-batchnorm-gap": ("no longer exact", "stops being exact", "normalises each sample on its own"),
}


@pytest.mark.parametrize("qid", sorted(GIVEAWAYS))
def test_a_predict_question_comes_before_anything_that_answers_it(qid):
    """No markdown, code or stored output above a predict question's cell says its answer (the three the review
    found, each moved below its question: lesson 2's SGD and Adam, lesson 4's weights table, lesson 7's GroupNorm)."""
    for path in LESSONS:
        cells = nbformat.read(path, as_version=4).cells
        asking = [
            i for i, cell in enumerate(cells) if cell.cell_type == "code" and f'quiz.predict("{qid}")' in cell.source
        ]
        if not asking:
            continue
        above = [
            " ".join((cell.source + "".join(str(o.get("text", "")) for o in cell.get("outputs", []))).split())
            for cell in cells[: asking[0]]
        ]
        for phrase in GIVEAWAYS[qid]:
            assert not any(phrase in text for text in above), f"{path.name}: {phrase!r} above {qid}"
        below = " ".join(
            " ".join(cell.source.split() + [str(o.get("text", "")) for o in cell.get("outputs", [])])
            for cell in cells[asking[0] :]
        )
        below = " ".join(below.split())
        assert any(phrase in below for phrase in GIVEAWAYS[qid]), f"{path.name}: {qid}'s answer is never given"
        break
    else:
        pytest.fail(f"no lesson asks {qid}")
