"""Quick-check quiz in English and Hindi: questions from questions.json (validated by schema.json), a pure-Python
`Quiz` that grades answers, and `QuizWidget`, plain ipywidgets on top of it (no JavaScript, no trusted notebook).

Rules: retries are allowed; the first wrong answer to a question reveals its hint (never the answer); every wrong
option explains its own misconception; progress counts questions answered and questions answered correctly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import ipywidgets as w
import jsonschema
import torch

LANGUAGES = {"en": "English", "hi": "हिन्दी"}


@lru_cache(maxsize=None)
def bank() -> dict:
    """The question bank, validated against the schema."""
    folder = resources.files(__name__)
    questions = json.loads((folder / "questions.json").read_text(encoding="utf-8"))
    jsonschema.validate(questions, json.loads((folder / "schema.json").read_text(encoding="utf-8")))
    return questions


@dataclass(frozen=True)
class Feedback:
    correct: bool
    message: str  # why this answer is right or wrong, in the quiz's language
    hint: str | None  # shown from the first wrong answer on; never the answer itself


class Quiz:
    """Grades answers and keeps progress. ids: the questions to ask (default: all, in bank order)."""

    def __init__(self, ids: list[str] | None = None, language: str = "en"):
        questions = {q["id"]: q for q in bank()["questions"]}
        unknown = [i for i in ids or [] if i not in questions]
        if unknown:
            raise ValueError(f"ids: unknown question id(s) {unknown}; valid ids: {sorted(questions)}")
        self.questions = [questions[i] for i in ids] if ids else list(questions.values())
        self.language = language
        self.attempts: dict[str, list] = {q["id"]: [] for q in self.questions}
        self.solved: set[str] = set()

    @property
    def language(self) -> str:
        return self._language

    @language.setter
    def language(self, value: str) -> None:
        if value not in LANGUAGES:
            raise ValueError(f"language must be one of {sorted(LANGUAGES)}, got {value!r}")
        self._language = value

    def text(self, field: dict) -> str:
        return field[self.language]

    def ui(self, key: str, **values) -> str:
        return bank()["ui"][self.language][key].format(**values)

    def question(self, qid: str) -> dict:
        for q in self.questions:
            if q["id"] == qid:
                return q
        raise ValueError(f"qid: {qid!r} is not in this quiz; valid: {[q['id'] for q in self.questions]}")

    def answer(self, qid: str, value) -> Feedback:
        """Grade `value` (an option id, or a number for numeric questions) and record the attempt."""
        q = self.question(qid)
        correct, why = self._grade(q, value)
        self.attempts[qid].append(value)
        if correct:
            self.solved.add(qid)
        wrong_before = any(not self._grade(q, v)[0] for v in self.attempts[qid])
        return Feedback(correct, self.text(why), self.text(q["hint"]) if wrong_before else None)

    @staticmethod
    def _grade(q: dict, value) -> tuple[bool, dict]:
        """(is value right?, the text that explains why) for question q."""
        if q["kind"] == "number":
            try:
                correct = float(value) == q["answer"]
            except (TypeError, ValueError):
                raise ValueError(f"value: question {q['id']!r} needs a number, got {value!r}") from None
            return correct, q["explanation"] if correct else q["wrong_feedback"]
        options = {o["id"]: o for o in q["options"]}
        if value not in options:
            raise ValueError(f"value: {value!r} is not an option of {q['id']!r}; valid: {sorted(options)}")
        correct = value == q["answer"]
        return correct, q["explanation"] if correct else options[value]["feedback"]

    def progress(self) -> tuple[int, int, int]:
        """(questions answered at least once, questions answered correctly, questions in the quiz)."""
        return sum(1 for a in self.attempts.values() if a), len(self.solved), len(self.questions)

    def run_check(self, qid: str) -> str:
        """Run the real experiment behind a "predict, then run it" question; return what it printed."""
        q = self.question(qid)
        if q["kind"] != "predict":
            raise ValueError(f"qid: {qid!r} is a {q['kind']!r} question; only 'predict' questions have a run")
        return EXPERIMENTS[q["run"]]()


def classic_division_last_cycle() -> str:
    """50 samples, micro-batch 4, accum_steps 3: parameter error of loss/accum_steps and of accumlib's weighting."""
    from .. import data, models, parameter_gap, train

    X, y = data.digits(50, flat=True, dtype=torch.float64)

    def fit(m, k, normalize):
        model = models.mlp(dtype=torch.float64)
        train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.5), micro_batch_size=m, accum_steps=k,
              normalize=normalize, measure_memory=False)
        return model

    full = fit(12, 1, "samples")
    errors = {}
    for normalize in ("steps", "samples"):
        errors[normalize] = parameter_gap(fit(4, 3, normalize), full)
    return (f"max |weight difference| against one batch of 12 per step, after one epoch of 50 samples:\n"
            f"  loss / accum_steps (classic): {errors['steps']:.1e}\n"
            f"  weighted by samples (accumlib): {'below 1e-12' if errors['samples'] < 1e-12 else errors['samples']}")


EXPERIMENTS = {"classic_division_last_cycle": classic_division_last_cycle}


class QuizWidget:
    """The quiz as ipywidgets: language switch, question, options or a number box, Check, feedback, progress."""

    def __init__(self, ids: list[str] | None = None, language: str = "en"):
        self.quiz = Quiz(ids, language)
        self.index = 0
        self.language = w.ToggleButtons(options=[(name, code) for code, name in LANGUAGES.items()], value=language,
                                        description="Language / भाषा", style={"description_width": "initial"})
        self.heading = w.HTML()
        self.prompt = w.HTML()
        self.choices = w.RadioButtons(options=[], value=None, layout=w.Layout(width="auto"))
        self.number = w.FloatText(description="")
        self.check = w.Button(button_style="primary")
        self.run = w.Button()
        self.previous, self.next = w.Button(), w.Button()
        self.feedback = w.HTML()
        self.run_output = w.HTML()
        self.progress = w.HTML()
        self.language.observe(lambda _: self._switch_language(), names="value")
        self.check.on_click(lambda _: self.submit())
        self.run.on_click(lambda _: self.run_experiment())
        self.previous.on_click(lambda _: self.go(self.index - 1))
        self.next.on_click(lambda _: self.go(self.index + 1))
        self.widget = w.VBox([self.language, self.heading, self.prompt, self.choices, self.number,
                              w.HBox([self.check, self.run]), self.feedback, self.run_output,
                              w.HBox([self.previous, self.next]), self.progress])
        self._render()

    @property
    def current(self) -> dict:
        return self.quiz.questions[self.index]

    def go(self, index: int) -> None:
        self.index = min(max(index, 0), len(self.quiz.questions) - 1)
        self.feedback.value = self.run_output.value = ""
        self._render()

    def _switch_language(self) -> None:
        self.quiz.language = self.language.value
        self.feedback.value = self.run_output.value = ""
        self._render()

    def _render(self) -> None:
        q, quiz = self.current, self.quiz
        self.heading.value = f"<h3>{quiz.ui('title')}</h3>"
        self.prompt.value = f"<p><b>{self.index + 1}.</b> {quiz.text(q['prompt'])}</p>"
        numeric = q["kind"] == "number"
        self.choices.layout.display = "none" if numeric else None
        self.number.layout.display = None if numeric else "none"
        self.number.description = quiz.ui("your_answer")
        self.choices.description = "" if numeric else quiz.ui("your_answer")
        if not numeric:
            self.choices.options = [(quiz.text(o["text"]), o["id"]) for o in q["options"]]
            self.choices.value = None
        self.check.description = quiz.ui("check")
        self.run.description = quiz.ui("run")
        self.run.layout.display = None if q["kind"] == "predict" else "none"
        self.previous.description, self.next.description = quiz.ui("previous"), quiz.ui("next")
        self._progress()

    def _progress(self) -> None:
        answered, correct, total = self.quiz.progress()
        self.progress.value = self.quiz.ui("progress", number=self.index + 1, total=total, answered=answered,
                                           correct=correct)

    def submit(self) -> Feedback | None:
        """Grade the current selection (as the Check button does)."""
        q = self.current
        value = self.number.value if q["kind"] == "number" else self.choices.value
        if value is None:
            return None
        result = self.quiz.answer(q["id"], value)
        verdict = self.quiz.ui("correct") if result.correct else self.quiz.ui("wrong")
        hint = f"<br><i>{self.quiz.ui('hint')}:</i> {result.hint}" if result.hint and not result.correct else ""
        self.feedback.value = f"<p><b>{verdict}</b> {result.message}{hint}</p>"
        self._progress()
        return result

    def run_experiment(self) -> str:
        """Run the real check behind a predict question (as the Run button does)."""
        text = self.quiz.run_check(self.current["id"])
        self.run_output.value = f"<pre>{text}</pre>"
        return text

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        ids = ", ".join(q["id"] for q in self.quiz.questions)
        bundle["text/plain"] = f"Quiz ({LANGUAGES[self.quiz.language]}), {len(self.quiz.questions)} question(s): {ids}"
        return bundle


def check(*ids: str, language: str = "en") -> QuizWidget:
    """An in-lesson quick check on the given question ids."""
    return QuizWidget(list(ids), language)
