"""What the website shows that only the lessons' own code can compute: the quiz, graded by accumlib's quiz, and
the dashboards' figures and findings for each setting. Run with the lessons' Python (torch, matplotlib,
ipywidgets); tools/site.py runs it and reads what it writes (the site's builder has none of the lessons' stack).

    python tools/site_data.py --out build/site-data [--only quiz|dashboards]

Writes <out>/quiz.json: per language, the quiz's labels and every question of the bank as accumlib.lessons.quiz
loads and grades it (the prompt, the options in the order a learner with the website's seed sees them, what each
option's answer says, the hint; for a number question the answer and its known wrong answers; for a "predict, then
run it" question the text of its experiment, run here on the CPU). Nothing is copied from questions.json by hand:
a question changed in the bank changes on the website at its next build.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the website shows the CPU's results, as the stored notebooks do
os.environ.setdefault("ACCUMLIB_DEVICE", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accumlib.i18n import LANGUAGES, catalogue  # noqa: E402
from accumlib.lessons import quiz  # noqa: E402
from accumlib.lessons.quiz.experiments import RUNS  # noqa: E402

SEED = "website"  # one order of the options for every reader of the website (a notebook shuffles per learner)


def quiz_data() -> dict:
    """{language: {"ui": {key: text}, "questions": {id: question}}}: everything the page's script needs."""
    measured = {}  # each experiment once: its numbers do not depend on the language
    for question in quiz.bank()["questions"]:
        if question["kind"] == "predict" and question["run"] not in measured:
            measured[question["run"]] = RUNS[question["run"]][0]()
    data = {}
    for language in LANGUAGES:
        grader = quiz.Quiz(language=language, seed=SEED)
        ui = {key: grader.text(text) for key, text in quiz.UI.items()}
        questions = {}
        for question in grader.questions:
            qid, entry = question["id"], {"kind": question["kind"], "lesson": question["lesson"]}
            entry["prompt"] = grader.text(question["prompt"])
            entry["hint"] = grader.text(question["hint"])
            if question["kind"] == "number":
                entry["answer"] = question["answer"]
                entry["right"] = grader.answer(qid, question["answer"]).message
                entry["known"] = [[cause["answer"], grader.answer(qid, cause["answer"]).message]
                                  for cause in question.get("known_wrong", [])]
                entry["otherwise"] = grader.text(question["wrong_feedback"])
            else:
                entry["options"] = []
                for option in grader.options(qid):
                    feedback = grader.answer(qid, option["id"])
                    entry["options"].append({"text": grader.text(option["text"]), "right": feedback.correct,
                                             "feedback": feedback.message})
            if question["kind"] == "predict":
                entry["result"] = catalogue(language).gettext(RUNS[question["run"]][1]).format(
                    **measured[question["run"]])
            questions[qid] = entry
        data[language] = {"ui": ui, "questions": questions}
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site-data")
    parser.add_argument("--only", choices=["quiz", "dashboards"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "quiz"):
        (args.out / "quiz.json").write_text(json.dumps(quiz_data(), ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"site data: {args.out}")


if __name__ == "__main__":
    main()
