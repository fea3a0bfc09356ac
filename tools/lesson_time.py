"""How long each lesson takes a beginner, computed from the stored notebooks of each edition: the one place that holds
the method, and `lesson_times.json` beside this file the one place that holds the numbers.

    python tools/lesson_time.py            # the table: counts and minutes per lesson (nothing written)
    python tools/lesson_time.py write      # refresh everything below, for every lesson
    python tools/lesson_time.py write 00_in_ten_minutes   # the time cell of these lessons only; the rest for all

`write` puts (or refreshes) each named lesson's time cell, a markdown cell tagged and identified `lesson-time`
right after the title, with its Hindi translation in translations/lessons/hi/<lesson>.po, and rebuilds
notebooks/hi (tools/editions.py build: stored outputs are kept, since no code cell changes); it then stores the
method and every lesson's numbers in tools/lesson_times.json and rewrites the time columns of docs/lessons.md's lesson
table and of INSTRUCTORS.md. tests/course/test_lesson_time.py recomputes all of it from the notebooks and fails when
anything is stale.

Each edition states its own time: the Hindi time cell is not a translation of the English minutes but the method
applied to the Hindi notebook (its prose, its printed words, its dashboards' tasks under their Hindi heading), which
reads longer than the English. Left out of an edition's count, besides the set-up cell: its language cell (the
start) and the word list that ends its last lesson (a reference to look terms up in, not read through).

The method is the one of the course review (/work/shared/reviews/lessons.md, section 3), made countable:

- prose: the words of every markdown cell, fenced code blocks left out, read at PROSE_WPM words a minute. The time
  cell itself is not counted (it reports the time; counting it would change what it reports).
- code: the non-blank lines of every code cell and of every fenced block in a markdown cell, read at CODE_LPM lines
  a minute (a beginner's pace, as the review counts it).
- printed: the words a cell prints as text (stdout and stderr, and a result shown only as plain text), read at
  PRINTED_WPM words a minute. Figures and widgets are not counted as text: a figure is looked at together with the
  finding printed beside it, and a widget's time is that of its tasks or questions (below). This is how the review
  counted.
- start: START_MINUTES to open the notebook, start its kernel and run its cells (they take seconds). The
  Colab/Kaggle set-up cell at the top (tools/platform_cell.py) is part of the start, not of the lesson: it does
  nothing on a learner's own machine and is run, not studied, on Colab and Kaggle; it is not counted, nor is the
  cell on top of a translated edition that sets its language (tools/editions.py), when an edition is measured.
- a dashboard task: TASK_MINUTES each. A dashboard is a code cell whose stored plain-text output lists its tasks
  under "Try this:" as "1. ...", "2. ...".
- a quick-check question: QUESTION_MINUTES each, PREDICT_MINUTES for a "predict, then run" question. The questions
  are those the quiz cell's calls ask: `quiz.predict(qid)`, and `quiz.check(...)` (ids, `lesson=N`, or every
  question) as the quiz itself selects them (a lesson's check leaves out the predict questions it asked before);
  their kinds come from the question bank (accumlib/lessons/quiz/questions.json). The stored output is not read:
  it shows the count and the questions' numbers, not their ids. A dashboard or quiz cell that cannot be counted
  raises.
- an exercise: a code cell tagged `exercise`, calling `exercises.<name>.check(...)`. It takes EXERCISE_MINUTES_PER_LINE
  for each line of the exercise's solution that the learner must write or change, found by comparing the stored
  cell with `exercises.<name>.solution_code` line by line, comments and blank lines left out, indentation kept
  (at least one line). The rate reproduces the review's own estimates, which assumed a first try and one or two
  retries: 2 minutes for lesson 2's one line, 8 for lesson 3's four, 4 for lesson 5's two.

The total is rounded to whole minutes (half up); the reading time shown in a lesson is that total less the whole
minutes of its other parts, so the parts a lesson states add up to the total it states.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import json
import math
import re
import sys
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import editions  # noqa: E402

ROOT = editions.ROOT
STORE = Path(__file__).resolve().parent / "lesson_times.json"
README = ROOT / "docs" / "lessons.md"  # the lesson table (docs/lessons.md; the README links it)
INSTRUCTORS = ROOT / "INSTRUCTORS.md"
QUESTIONS = ROOT / "accumlib" / "lessons" / "quiz" / "questions.json"

PROSE_WPM = 180  # words of prose a minute
PRINTED_WPM = 120  # words of printed tables and findings a minute
CODE_LPM = 8  # lines of code a minute
START_MINUTES = 1  # open the notebook, start the kernel, run the cells
TASK_MINUTES = 2  # one dashboard task
QUESTION_MINUTES = 1  # one quick-check question
PREDICT_MINUTES = 2  # one "predict, then run" question
EXERCISE_MINUTES_PER_LINE = 2  # each line of an exercise's solution that the learner writes or changes
METHOD = {
    "prose_words_per_minute": PROSE_WPM,
    "printed_words_per_minute": PRINTED_WPM,
    "code_lines_per_minute": CODE_LPM,
    "start_minutes": START_MINUTES,
    "task_minutes": TASK_MINUTES,
    "question_minutes": QUESTION_MINUTES,
    "predict_question_minutes": PREDICT_MINUTES,
    "exercise_minutes_per_line": EXERCISE_MINUTES_PER_LINE,
}

TAG = "lesson-time"  # tag and id of the time cell
FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.S)
TASK = re.compile(r"^\d+\. ", re.M)
CHECK = re.compile(r"exercises\.(\w+)\.check\(")

# The time cell, in each language; {parts} is a list of the parts joined by the language's own "and".
TEXT = {
    "en": {
        "line": "⏱ **About {total} minutes**: {parts}. [How this is measured](../../INSTRUCTORS.md#how-the-times-"
        "are-measured)",
        "reading": "{n} to read",
        "dashboard": "{n} for the dashboard",
        "exercise": "{n} for the exercise",
        "exercises": "{n} for the exercises",
        "quiz": "{n} for the quick check",
        "start": "{n} to start",
        "and": " and ",
    },
    "hi": {
        "line": "⏱ **लगभग {total} मिनट**: {parts}। [यह समय कैसे मापा गया](../../INSTRUCTORS.md#how-the-times-are-"
        "measured)",
        "reading": "पढ़ने में {n}",
        "dashboard": "dashboard में {n}",
        "exercise": "अभ्यास (exercise) में {n}",
        "exercises": "अभ्यासों (exercises) में {n}",
        "quiz": "त्वरित जाँच (quick check) में {n}",
        "start": "शुरू करने में {n}",
        "and": " और ",
    },
}


@dataclass(frozen=True)
class LessonTime:
    """What a lesson asks of a beginner, counted from its stored notebook, and the minutes it takes."""

    lesson: str  # file stem, e.g. "03_the_loop"
    prose_words: int
    printed_words: int
    code_lines: int
    dashboard_tasks: int
    questions: int
    predict_questions: int
    exercise_lines: dict  # exercise name -> lines of its solution the learner writes or changes
    reading_minutes: float  # prose + printed + code, unrounded
    total_minutes: float  # everything, unrounded

    @property
    def minutes(self) -> int:
        """The total in whole minutes, half up."""
        return math.floor(self.total_minutes + 0.5)

    @property
    def parts(self) -> dict[str, int]:
        """Whole minutes per part, adding up to `minutes`: reading gets what the others leave."""
        fixed = {
            "dashboard": self.dashboard_tasks * TASK_MINUTES,
            "exercise": sum(self.exercise_minutes().values()),
            "quiz": (self.questions * QUESTION_MINUTES + self.predict_questions * (PREDICT_MINUTES - QUESTION_MINUTES)),
            "start": START_MINUTES,
        }
        return {"reading": self.minutes - sum(fixed.values()), **fixed}

    def exercise_minutes(self) -> dict[str, int]:
        return {name: EXERCISE_MINUTES_PER_LINE * lines for name, lines in self.exercise_lines.items()}


# --- counting ------------------------------------------------------------------------------------------------------


def is_time_cell(cell) -> bool:
    return TAG in cell.metadata.get("tags", [])


def prose_words(cell) -> int:
    return len(FENCED.sub(" ", cell.source).split())


def fenced_lines(cell) -> int:
    return sum(1 for block in FENCED.findall(cell.source) for line in block.splitlines() if line.strip())


def code_lines(cell) -> int:
    return sum(1 for line in cell.source.splitlines() if line.strip())


TEXT_FORMS = {"text/plain", "text/html"}  # a figure (image/png) or a widget (its view) is not read as text


def printed_words(cell) -> int:
    """Words a code cell's stored outputs show as text: streams, and results shown as text: nothing but text/plain,
    or a measured table (text/plain with its HTML form, accumlib.lessons.show's TableView): a learner reads it."""
    words = 0
    for output in cell.outputs:
        if output.output_type == "stream":
            words += len(output.text.split())
        elif output.output_type in ("execute_result", "display_data") and set(output.data) <= TEXT_FORMS:
            words += len(output.data["text/plain"].split())
    return words


def plain_outputs(cell) -> str:
    return "\n".join(o.data.get("text/plain", "") for o in cell.outputs if "data" in o)


def dashboard_tasks(cell, language: str = "en") -> int:
    """Tasks a dashboard lists under "Try this:" (in the edition's language) in its stored plain-text output."""
    from accumlib.i18n import catalogue  # the dashboard's own heading, as the edition shows it

    marker = catalogue(language).gettext("Try this:")
    text = plain_outputs(cell)
    return len(TASK.findall(text.split(marker, 1)[1])) if marker in text else 0


def quiz_ids(cell) -> list[str]:
    """The question ids a quiz cell asks, from its calls: `quiz.check(...)` (ids, `lesson=N`, or none: every question),
    resolved by the quiz itself (`accumlib.lessons.quiz.select`: a lesson's check leaves out its predict questions),
    and `quiz.predict(qid)`. A quiz cell whose questions cannot be told from its source raises."""
    calls = [
        node
        for node in ast.walk(ast.parse(cell.source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("check", "predict")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "quiz"
    ]
    if not calls:
        return []
    from accumlib.lessons import quiz  # the quiz's own selection; imported only when a lesson has a quiz

    ids: list[str] = []
    for call in calls:
        named = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
        lesson = next(
            (kw.value.value for kw in call.keywords if kw.arg == "lesson" and isinstance(kw.value, ast.Constant)), None
        )
        countable = len(named) == len(call.args) and all(
            kw.arg == "language" or (kw.arg == "lesson" and isinstance(kw.value, ast.Constant)) for kw in call.keywords
        )
        if not countable or (call.func.attr == "predict" and len(named) != 1):
            raise ValueError(f"a quiz cell whose questions cannot be counted: {cell.source!r}")
        ids += named if call.func.attr == "predict" else [q["id"] for q in quiz.select(named or None, lesson=lesson)]
    return ids


def question_bank() -> list[dict]:
    return json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]


def statements(code: str) -> list[str]:
    """A cell's code lines without comments and blank lines, indentation kept (what a learner writes)."""
    comments = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.COMMENT:
                comments.add((token.start[0], token.start[1]))
    except (tokenize.TokenError, IndentationError):
        pass
    lines = []
    for number, line in enumerate(code.splitlines(), start=1):
        cut = min((col for row, col in comments if row == number), default=len(line))
        line = line[:cut].rstrip()
        if line.strip():
            lines.append(line)
    return lines


def lines_to_write(stub: str, solution: str) -> int:
    """Lines of `solution` the learner writes or changes, starting from `stub` (at least one)."""
    a, b = statements(stub), statements(solution)
    changed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            changed += max(i2 - i1, j2 - j1)
    return max(changed, 1)


def exercise_lines(cell) -> dict[str, int]:
    from accumlib.lessons import exercises  # the solutions; imported only when a lesson has an exercise

    return {
        name: lines_to_write(cell.source, getattr(exercises, name).solution_code) for name in CHECK.findall(cell.source)
    }


def edition_path(name: str, language: str) -> Path:
    return editions.english_path(name) if language == "en" else editions.edition_path(name, language)


def measure(name: str, notebook=None, language: str = "en") -> LessonTime:
    """Count a stored lesson of an edition (default: the English one) and compute its time."""
    notebook = notebook if notebook is not None else editions.read_notebook(edition_path(name, language))
    kinds = {q["id"]: q["kind"] for q in question_bank()}
    prose = printed = code = tasks = questions = predict = 0
    exercises: dict[str, int] = {}
    for cell in notebook.cells:
        if cell.get("id") in (editions.PLATFORM_CELL, editions.LANGUAGE_TAG, editions.WORD_LIST_ID):
            continue  # the set-up and an edition's language cell (the start) and its word list (see the method)
        if cell.cell_type == "markdown" and not is_time_cell(cell):
            prose += prose_words(cell)
            code += fenced_lines(cell)
        elif cell.cell_type == "code":
            code += code_lines(cell)
            printed += printed_words(cell)
            tasks += dashboard_tasks(cell, language)
            if re.search(r"Dashboard\(.*\)\.show\(\)", cell.source) and not dashboard_tasks(cell, language):
                raise ValueError(
                    f"{name}: a dashboard cell whose stored output lists no tasks under 'Try this:' "
                    f"(run the notebook, or teach tools/lesson_time.py its new output): {cell.source!r}"
                )
            for qid in quiz_ids(cell):
                questions += 1
                predict += kinds.get(qid) == "predict"
            if "exercise" in cell.metadata.get("tags", []):
                exercises.update(exercise_lines(cell))
    reading = prose / PROSE_WPM + printed / PRINTED_WPM + code / CODE_LPM
    total = (
        reading
        + START_MINUTES
        + tasks * TASK_MINUTES
        + questions * QUESTION_MINUTES
        + predict * (PREDICT_MINUTES - QUESTION_MINUTES)
        + sum(EXERCISE_MINUTES_PER_LINE * n for n in exercises.values())
    )
    return LessonTime(
        name, prose, printed, code, tasks, questions, predict, exercises, round(reading, 3), round(total, 3)
    )


def lesson_names() -> list[str]:
    """The numbered lessons (not the dashboards app)."""
    return [name for name in editions.lessons() if re.match(r"\d\d_", name)]


def measure_all(language: str = "en") -> list[LessonTime]:
    return [measure(name, language=language) for name in lesson_names()]


def measure_editions() -> dict[str, list[LessonTime]]:
    """Every lesson of every edition, each measured on its own words: English first."""
    return {language: measure_all(language) for language in ("en", *editions.LANGUAGES)}


# --- what is stored and written --------------------------------------------------------------------------------------


def stored_form(by_language: dict[str, list[LessonTime]]) -> dict:
    """The method, the English lessons' numbers ("lessons") and each translated edition's ("editions")."""

    def lessons(times):
        return {t.lesson: {**asdict(t), "minutes": t.minutes, "parts": t.parts} for t in times}

    return {
        "method": METHOD,
        "lessons": lessons(by_language["en"]),
        "editions": {language: lessons(times) for language, times in by_language.items() if language != "en"},
    }


def store_bytes(by_language: dict[str, list[LessonTime]]) -> bytes:
    return (json.dumps(stored_form(by_language), indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def time_text(t: LessonTime, language: str) -> str:
    words = TEXT[language]
    parts = [words["reading"].format(n=t.parts["reading"])]
    if t.dashboard_tasks:
        parts.append(words["dashboard"].format(n=t.parts["dashboard"]))
    if t.exercise_lines:
        key = "exercise" if len(t.exercise_lines) == 1 else "exercises"
        parts.append(words[key].format(n=t.parts["exercise"]))
    if t.questions:
        parts.append(words["quiz"].format(n=t.parts["quiz"]))
    parts.append(words["start"].format(n=t.parts["start"]))
    joined = ", ".join(parts[:-1]) + words["and"] + parts[-1]
    return words["line"].format(total=t.minutes, parts=joined)


def with_time_cell(notebook, t: LessonTime):
    """The notebook with its time cell right after the title (its first markdown cell: the Colab/Kaggle set-up
    cell may come before it), added or refreshed."""
    notebook = nbformat.from_dict(json.loads(json.dumps(notebook)))
    notebook.cells = [c for c in notebook.cells if not is_time_cell(c)]
    cell = nbformat.v4.new_markdown_cell(time_text(t, "en"), metadata={"tags": [TAG]})
    cell.id = TAG
    title = next(i for i, c in enumerate(notebook.cells) if c.cell_type == "markdown")
    notebook.cells.insert(title + 1, cell)
    return notebook


def time_cell(notebook):
    return next((c for c in notebook.cells if is_time_cell(c)), None)


def write_time_cell(name: str, by_language: dict[str, LessonTime]) -> None:
    """Put the time cell into the English lesson, and into the lesson's PO file of each translated edition the time
    measured on that edition (its own words: a Hindi lesson reads longer or shorter than the English one)."""
    path = editions.english_path(name)
    english = with_time_cell(editions.read_notebook(path), by_language["en"])
    editions._write_if_changed(path, editions.notebook_bytes(english))
    for language in editions.LANGUAGES:
        old = editions.translation(name, language)
        catalog = editions.updated(editions.template(english, name), old, language)
        message = next(m for m in catalog if m.id and m.context == TAG)
        message.string = time_text(by_language[language], language)
        message.flags.discard("fuzzy")
        message.previous_id = ()
        editions._write_if_changed(editions.po_path(name, language), editions.po_bytes(catalog))


# The README's lesson table and INSTRUCTORS.md's plan: a "time" column computed here, between markers.
README_START, README_END = "<!-- lesson table: tools/lesson_time.py write -->", "<!-- end of lesson table -->"


def minutes_cell(t: LessonTime) -> str:
    return f"{t.minutes} min"


def readme_table(times: list[LessonTime], rows: dict[str, tuple[str, str, str]]) -> str:
    """The README's lesson table: rows maps lesson -> (title link, what you see, exercise); time from `times`."""
    lines = ["| lesson | time | what you see, by running it | exercise |", "|---|---|---|---|"]
    for t in times:
        title, seen, exercise = rows[t.lesson]
        lines.append(f"| {title} | {minutes_cell(t)} | {seen} | {exercise} |")
    total = sum(t.minutes for t in times)
    lines.append(f"| **all** | **{total} min** ({total // 60} h {total % 60} min) | | |")
    return "\n".join(lines)


def table_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """The README table's rows as they stand, by lesson file stem (the time column is recomputed)."""
    rows = {}
    for line in text.split(README_START, 1)[1].split(README_END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.search(r"notebooks/en/(\d\d_\w+)\.ipynb", line)
        if found and len(cells) == 4:
            rows[found.group(1)] = (cells[0], cells[2], cells[3])
    return rows


def refreshed_readme(text: str, times: list[LessonTime]) -> str:
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_START}\n{readme_table(times, table_rows(text))}\n{README_END}{tail}"


INSTRUCTORS_START, INSTRUCTORS_END = "<!-- times: tools/lesson_time.py write -->", "<!-- end of times -->"


def method_text() -> str:
    """The method in a few sentences, from the constants above (for INSTRUCTORS.md)."""
    return (
        f"Prose is read at {PROSE_WPM} words a minute, printed tables and findings at {PRINTED_WPM}, code at "
        f"{CODE_LPM} lines a minute (fenced code in the text counts as code). A dashboard task takes "
        f'{TASK_MINUTES} minutes, a quick-check question {QUESTION_MINUTES} ({PREDICT_MINUTES} for a "predict, '
        f'then run" one), an exercise {EXERCISE_MINUTES_PER_LINE} minutes per line of its solution that the '
        f"learner writes or changes, and starting the notebook and running its cells {START_MINUTES}. Figures "
        "and widgets count through their printed findings, tasks and questions. The counts come from the stored "
        "notebooks (`python tools/lesson_time.py` prints them; the module's docstring defines each count); "
        "`tests/course/test_lesson_time.py` recomputes them and fails when this table, the README's or a lesson's "
        "own time line is stale. Each edition is measured on its own words and states its own time (the "
        "translated editions' totals are in the columns after the English one; the other columns are English)."
    )


def instructors_table(by_language: dict[str, list[LessonTime]]) -> str:
    others = [language for language in by_language if language != "en"]
    lines = [
        method_text(),
        "",
        "| lesson | total | "
        + "".join(f"{language} edition | " for language in others)
        + "reading | dashboard tasks | exercise | quick check | prose words | printed words | code lines |",
        "|---|---|" + "---|" * len(others) + "---|---|---|---|---|---|---|",
    ]
    minutes = {language: {t.lesson: t.minutes for t in times} for language, times in by_language.items()}
    for t in by_language["en"]:
        p = t.parts
        exercise = (
            ", ".join(
                f"{name}: {m} min ({t.exercise_lines[name]} line{'s' if t.exercise_lines[name] > 1 else ''})"
                for name, m in t.exercise_minutes().items()
            )
            or "-"
        )
        quiz = (
            (
                f"{t.questions} q ({t.predict_questions} predict): {p['quiz']} min"
                if t.predict_questions
                else f"{t.questions} q: {p['quiz']} min"
            )
            if t.questions
            else "-"
        )
        tasks = f"{t.dashboard_tasks}: {p['dashboard']} min" if t.dashboard_tasks else "-"
        lines.append(
            f"| {t.lesson} | **{t.minutes} min** | "
            + "".join(f"{minutes[language][t.lesson]} min | " for language in others)
            + f"{p['reading']} min ({t.reading_minutes:.1f}) | {tasks} | "
            f"{exercise} | {quiz} | {t.prose_words} | {t.printed_words} | {t.code_lines} |"
        )
    return "\n".join(lines)


def refreshed_instructors(text: str, by_language: dict[str, list[LessonTime]]) -> str:
    head, rest = text.split(INSTRUCTORS_START, 1)
    _, tail = rest.split(INSTRUCTORS_END, 1)
    return f"{head}{INSTRUCTORS_START}\n{instructors_table(by_language)}\n{INSTRUCTORS_END}{tail}"


def write(names: list[str] | None = None) -> list[str]:
    """Refresh the time cells of `names` (default: every lesson), then the stored numbers and both tables."""
    unknown = sorted(set(names or ()) - set(lesson_names()))
    if unknown:
        raise SystemExit(f"unknown lesson(s) {unknown}; the lessons: {', '.join(lesson_names())}")
    done = []
    for language in editions.LANGUAGES:  # the editions as their PO files say now: each is measured on its own words
        done += editions.build(language)
    by_language = measure_editions()
    by_name = {language: {t.lesson: t for t in times} for language, times in by_language.items()}
    for name in names or lesson_names():
        write_time_cell(name, {language: times[name] for language, times in by_name.items()})
        minutes = ", ".join(f"{language} {times[name].minutes}" for language, times in by_name.items())
        done.append(f"notebooks/en/{name}.ipynb and translations/lessons/*/{name}.po: {minutes} min")
    for language in editions.LANGUAGES:
        done += editions.build(language)
    by_language = measure_editions()  # the same numbers: the time cell is not counted
    times = by_language["en"]
    editions._write_if_changed(STORE, store_bytes(by_language))
    editions._write_if_changed(README, refreshed_readme(README.read_text(encoding="utf-8"), times).encode("utf-8"))
    editions._write_if_changed(
        INSTRUCTORS, refreshed_instructors(INSTRUCTORS.read_text(encoding="utf-8"), by_language).encode("utf-8")
    )
    done.append(f"{STORE.relative_to(ROOT)}, docs/lessons.md, INSTRUCTORS.md: {len(times)} lessons")
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["show", "write"], default="show")
    parser.add_argument("lessons", nargs="*", help="write: the lessons whose time cell to write (default: all)")
    args = parser.parse_args()
    if args.command == "write":
        print("\n".join(write(args.lessons or None)))
        return 0
    if args.lessons:
        parser.error("lessons are given only to write")
    print(instructors_table(measure_editions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
