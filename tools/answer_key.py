"""The answer key of INSTRUCTORS.md, generated from what the course itself checks, so that it cannot drift from it:

- every exercise (accumlib.lessons.exercises.BY_LESSON): the cell the learner starts from, the hint and one right
  answer (the exercise's `solution_code`, the code `exercises.<name>.solution()` prints; the tests run it and
  check that it passes);
- every quick-check question (accumlib/lessons/quiz/questions.json): the question, the right answer by its text
  (option letters may be shown in another order) and the explanation.

    python tools/answer_key.py          # rewrite the answer key between its markers in INSTRUCTORS.md
    python tools/answer_key.py --check  # exit 1 if INSTRUCTORS.md's answer key is not what this writes

English only: it is for the instructor (the Hindi of each text is in accumlib/locale/hi/LC_MESSAGES/accumlib.po).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTORS = ROOT / "INSTRUCTORS.md"
QUESTIONS = ROOT / "accumlib" / "lessons" / "quiz" / "questions.json"
START, END = "<!-- answer key: tools/answer_key.py -->", "<!-- end of answer key -->"


def lesson_names() -> dict[int, str]:
    """Lesson number -> notebook file name, from notebooks/en."""
    return {int(p.name[:2]): p.name for p in sorted((ROOT / "notebooks" / "en").glob("[0-9][0-9]_*.ipynb"))}


def fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def exercises_part() -> list[str]:
    from accumlib.lessons import exercises

    names = lesson_names()
    lines = ["### Exercises", ""]
    for lesson, group in sorted(exercises.BY_LESSON.items()):
        for exercise in group:
            link = f"[lesson {lesson}](notebooks/en/{names[lesson]})" if lesson in names else f"lesson {lesson}"
            lines += [
                f"#### {link}: `exercises.{exercise.name}`",
                "",
                "The cell as the lesson gives it (it runs, and the checker says what is wrong):",
                "",
                fenced(exercise.stub),
                "",
                f"Hint: {exercise.hint_text}",
                "",
                "One right answer (what `exercises.%s.solution()` prints):" % exercise.name,
                "",
                fenced(exercise.solution_code),
                "",
            ]
    return lines


def answer_text(question: dict) -> str:
    if question["kind"] == "number":
        return str(question["answer"])
    return next(option["text"] for option in question["options"] if option["id"] == question["answer"])


def quiz_part() -> list[str]:
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]
    lines = [
        "### Quick-check questions",
        "",
        "By lesson; the answer is given by its text. `quiz.check(lesson=N)` asks a lesson's questions, "
        "`quiz.check()` all of them.",
        "",
    ]
    for lesson in sorted({q["lesson"] for q in questions}):
        lines += [f"#### Lesson {lesson}", ""]
        for q in (q for q in questions if q["lesson"] == lesson):
            kind = " (predict, then run)" if q["kind"] == "predict" else ""
            lines += [
                f"- **{q['id']}**{kind}: {q['prompt']}",
                f"  - Answer: {answer_text(q)}",
                f"  - Why: {q['explanation']}",
            ]
        lines.append("")
    return lines


def answer_key() -> str:
    return "\n".join(exercises_part() + quiz_part()).rstrip() + "\n"


def refreshed(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{answer_key()}{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that INSTRUCTORS.md is up to date")
    args = parser.parse_args()
    text = INSTRUCTORS.read_text(encoding="utf-8")
    new = refreshed(text)
    if args.check:
        if new != text:
            print("INSTRUCTORS.md: the answer key is stale: run python tools/answer_key.py")
            return 1
        print("INSTRUCTORS.md: the answer key is up to date")
        return 0
    if new != text:
        INSTRUCTORS.write_text(new, encoding="utf-8")
    print("INSTRUCTORS.md: answer key written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
