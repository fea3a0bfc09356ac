"""The quiz's record of each learner's answers, kept in a small JSON file so that a kernel restart loses nothing,
and exported as one CSV line per learner for the instructor.

The file: `accumlib-scores.json` in the working directory (a notebook's kernel runs in the notebook's folder, so
the file lies beside the notebook), or the path in the environment variable ACCUMLIB_SCORES. Its format:

    {"format": 1,
     "anonymous": "2864127359",                      # the learner's seed when ACCUMLIB_LEARNER is not set
     "learners": {"asha": {"when-to-step": ["b", "c"], "effective-batch": [32.0]}}}

Each learner's answers to each question, in the order given; the first one is the first try. A file that cannot be
read as that format is never overwritten: the quiz warns, naming the file, and keeps the answers in memory only.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import warnings
from pathlib import Path

from ...i18n import _

FILENAME = "accumlib-scores.json"
FORMAT = 1
PROCESS_SEED = str(random.SystemRandom().getrandbits(32))  # drawn once per process
COLUMNS = ("learner", "answered", "first_try", "in_the_end", "questions", "first_try_percent")


def default_path() -> Path:
    """Where the record lives: $ACCUMLIB_SCORES, else accumlib-scores.json in the working directory."""
    return Path(os.environ.get("ACCUMLIB_SCORES") or FILENAME)


class ScoreFile:
    """One score file. `read()` gives its content (an empty record when there is none); `record()` writes one
    learner's attempts at one question, re-reading the file first, so that two quizzes of one kernel (a lesson's
    predict question and its quick check) never overwrite each other's answers."""

    def __init__(self, path=None):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                _("path must be a file path (str or os.PathLike) or None, got {value!r}").format(value=path)
            )
        self.path = Path(path) if path is not None else default_path()
        self.broken = False  # set when the file exists but is not a score file: then nothing is written to it

    def read(self) -> dict:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"format": FORMAT, "learners": {}}
        try:
            data = json.loads(text)
            if not (
                isinstance(data, dict)
                and data.get("format") == FORMAT
                and isinstance(data.get("learners"), dict)
                and all(
                    isinstance(a, dict) and all(isinstance(v, list) for v in a.values())
                    for a in data["learners"].values()
                )
            ):
                raise ValueError(_("not a format-{format} score file").format(format=FORMAT))
        except ValueError as error:
            if not self.broken:
                warnings.warn(
                    _(
                        "{path}: the quiz cannot read this score file ({error}); it leaves it as it is and keeps your "
                        "answers in memory only. Move the file away to start a new one."
                    ).format(path=self.path, error=error),
                    stacklevel=3,
                )
            self.broken = True
            return {"format": FORMAT, "learners": {}}
        return data

    def anonymous(self) -> str:
        """The seed of the learner of this file when ACCUMLIB_LEARNER is not set: the one the file keeps, else this
        process's (PROCESS_SEED), which the file keeps from its first answer on. Showing a quiz writes nothing."""
        kept = self.read().get("anonymous")
        return kept if isinstance(kept, str) else PROCESS_SEED

    def attempts(self, learner: str) -> dict[str, list]:
        return self.read()["learners"].get(learner, {})

    def record(self, learner: str, qid: str, attempts: list) -> None:
        data = self.read()
        data.setdefault("anonymous", PROCESS_SEED)
        data["learners"].setdefault(learner, {})[qid] = list(attempts)
        self._write(data)

    def _write(self, data: dict) -> None:
        if self.broken:
            return
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(data, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(partial, self.path)  # atomic: a reader sees the old file or the new one, never half of one


def rows(bank_questions: list[dict], grade, *files: ScoreFile) -> list[dict]:
    """One row per learner found in the files (a learner in several files: the answers merged, question by
    question, the longer record kept): answered, right at the first try, right in the end, of the bank's questions."""
    merged: dict[str, dict[str, list]] = {}
    for file in files:
        for learner, answers in file.read()["learners"].items():
            mine = merged.setdefault(learner, {})
            for qid, attempts in answers.items():
                if len(attempts) > len(mine.get(qid, [])):
                    mine[qid] = attempts
    by_id = {q["id"]: q for q in bank_questions}
    table = []
    for learner in sorted(merged):
        answers = {qid: a for qid, a in merged[learner].items() if qid in by_id and a}
        first = sum(1 for qid, a in answers.items() if _right(grade, by_id[qid], a[0]))
        end = sum(1 for qid, a in answers.items() if any(_right(grade, by_id[qid], v) for v in a))
        table.append(
            {
                "learner": learner,
                "answered": len(answers),
                "first_try": first,
                "in_the_end": end,
                "questions": len(by_id),
                "first_try_percent": round(100 * first / len(by_id)),
            }
        )
    return table


def _right(grade, question: dict, value) -> bool:
    try:
        return grade(question, value)[0]
    except (TypeError, ValueError):  # an answer stored by hand that the quiz would have refused
        return False


def to_csv(table: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table)
    return out.getvalue()
