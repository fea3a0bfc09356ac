"""What an instructor is given: a LICENSE file (the licence pyproject.toml declares), INSTRUCTORS.md with each
lesson's objectives under the lesson's own title, and an answer key generated from the exercises' solutions and the
question bank (tools/answer_key.py), all linked from the README."""

import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import answer_key  # noqa: E402

INSTRUCTORS = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
TITLE = re.compile(r"^# Lesson (\d+): (.+)$", re.M)


def test_the_licence_file_is_the_one_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert declared == "MIT" and text.startswith("MIT License\n"), declared
    assert re.search(r"^Copyright \(c\) \d{4} the accumlib authors$", text, re.M)
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def test_the_readme_links_the_instructors_guide_and_the_licence():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](INSTRUCTORS.md)" in readme and "](LICENSE)" in readme


def test_every_lesson_has_its_objectives_under_its_own_title():
    for path in sorted((ROOT / "notebooks" / "en").glob("[0-9][0-9]_*.ipynb")):
        title = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        found = TITLE.search(title.source)  # the first markdown cell (the Colab set-up cell may come before it)
        assert found, f"{path.name}: its first markdown cell has no '# Lesson N: title'"
        number, title = found.groups()
        assert f"- **{int(number)}, {title.strip()}:**" in INSTRUCTORS, (
            f"INSTRUCTORS.md has no objectives for lesson {number}, {title!r}"
        )


def test_the_answer_key_is_what_the_exercises_and_the_question_bank_give():
    assert answer_key.refreshed(INSTRUCTORS) == INSTRUCTORS, "INSTRUCTORS.md: run python tools/answer_key.py"
    from accumlib.lessons import exercises

    for group in exercises.BY_LESSON.values():
        for exercise in group:
            assert exercise.solution_code.rstrip() in INSTRUCTORS, exercise.name


def test_the_python_floor_is_the_one_pyproject_requires():
    required = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    floor = re.fullmatch(r">=\s*(3\.\d+)", required).group(1)
    assert f"Python {floor} or later" in INSTRUCTORS
    assert not re.search(r"Python 3\.\d+\+", INSTRUCTORS), "an older 'Python 3.x+' floor is still there"


def test_the_memory_dashboards_expected_observations_are_what_it_measures():
    """INSTRUCTORS.md's answers to the memory dashboard's tasks: the peaks (bytes, the same on every CPU) as the
    dashboard measures them, and 0.5 MiB fits 8 and (only at accum_steps 1) 16."""
    from accumlib.lessons import widgets

    class Job:
        def check(self):
            pass

    board = widgets.MemoryDashboard(device="cpu")
    peaks = {
        (m, k): board._report(m, k, Job()).peak
        for m, k in [(64, 1), (8, 8), (4, 16), (16, 1), (16, 4), (16, 16), (8, 1), (128, 1)]
    }
    section = INSTRUCTORS.split("**Memory dashboard**")[1].split("**BatchNorm dashboard**")[0]
    for peak in peaks.values():
        assert f"{peak:,}" in section, peak
    budget = 524_288
    assert peaks[8, 8] <= budget < peaks[16, 4] == peaks[16, 16] and peaks[16, 1] <= budget


def test_the_class_plan_counts_the_lessons_time_as_measured():
    """The 50-minute plan says how long lessons 0, 2 and 3 take in full: the sum of their measured times."""
    import json

    times = json.loads((ROOT / "tools" / "lesson_times.json").read_text(encoding="utf-8"))["lessons"]
    full = sum(times[name]["minutes"] for name in ("00_in_ten_minutes", "02_grad_accumulates", "03_the_loop"))
    assert f"Lessons 0, 2 and 3 in full take {full} minutes" in INSTRUCTORS


def test_the_predict_questions_runs_are_what_instructors_md_says():
    """The memory run's bytes (the same on every CPU) and the other runs' printed values as INSTRUCTORS.md gives
    them, from each predict question's own experiment."""
    from accumlib.lessons import quiz

    section = INSTRUCTORS.split("## The predict questions: what their runs show")[1].split("\n## ")[0]
    for q in quiz.bank()["questions"]:
        if q["kind"] != "predict":
            continue
        graded = quiz.Quiz([q["id"]], "en", seed=0)
        graded.answer(q["id"], q["answer"])
        shown = graded.run_check(q["id"])
        numbers = re.findall(r"\d[\d,]*(?:\.\d+)?(?:e-\d+)?", shown)
        if q["id"] == "predict-batchnorm-gap":  # GroupNorm's value is rounding: only BatchNorm's is stable
            numbers = [re.search(r"BatchNorm: (\S+)", shown).group(1)]
        for number in numbers:
            if number not in {"4", "8", "12", "16", "50", "64", "3", "5", "2"}:  # the set-up, not a measurement
                assert number in section, (q["id"], number)
