"""What an instructor is given: a LICENSE file (the licence pyproject.toml declares), INSTRUCTORS.md with each
lesson's objectives under the lesson's own title, and an answer key generated from the exercises' solutions and the
question bank (tools/answer_key.py), all linked from the README."""
import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import answer_key  # noqa: E402

INSTRUCTORS = (ROOT / "INSTRUCTORS.md").read_text(encoding="utf-8")
TITLE = re.compile(r"^# Lesson (\d+): (.+)$", re.M)


def test_the_licence_file_is_the_one_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert declared == "MIT" and text.startswith("MIT License\n"), declared
    assert re.search(r"^Copyright \(c\) \d{4} the accumlib authors$", text, re.M)
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


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
            f"INSTRUCTORS.md has no objectives for lesson {number}, {title!r}")


def test_the_answer_key_is_what_the_exercises_and_the_question_bank_give():
    assert answer_key.refreshed(INSTRUCTORS) == INSTRUCTORS, "INSTRUCTORS.md: run python tools/answer_key.py"
    from accumlib.lessons import exercises

    for group in exercises.BY_LESSON.values():
        for exercise in group:
            assert exercise.solution_code.rstrip() in INSTRUCTORS, exercise.name
