"""The quick checks: questions from questions.json, a pure-Python `Quiz` that grades answers, and `QuizWidget`,
plain ipywidgets on top of it (no JavaScript, no trusted notebook). `check(...)` is what a lesson calls.

The bank holds English text only; the Hindi (and any later language) is the message catalogue's, looked up when a
text is shown (`accumlib/locale/<language>/LC_MESSAGES/accumlib.po`, the English text as msgid). A quiz opens in
the course language (`accumlib.language()`); its own switch changes the quiz only. The bank's schema
(schema.json) is checked by the tests, not here: jsonschema costs seconds at import.

Rules: retries are allowed; the first wrong answer to a question reveals its hint (never the answer); every wrong
option, and every wrong number with a known cause, explains its own misconception; a "predict, then run it"
question runs its real experiment only after an answer was given; progress counts questions answered, questions
right at the first try and questions right in the end (after retries).

Options are shown in an order shuffled per learner: seeded by the learner's seed and the question id only, so a
learner sees the same order in both languages, on Back and Next and in every run (`Quiz(seed=...)`; by default
the environment variable ACCUMLIB_LEARNER, else the seed drawn once and kept in the score file, else (a quiz
without a score file) a seed drawn once per process).

A lesson's quiz (`check`, `predict`) keeps every answer in a score file beside the notebook (scores.py), keyed by
the learner: after a kernel restart the first tries are still counted, and `scores()` prints one CSV line per
learner for the instructor. `Quiz` itself records nothing unless it is given a `ScoreFile`. A lesson asks its "predict"
questions before it shows the answer (`predict(qid)` in the cell before the experiment), so its quick check at the
end leaves them out; lesson 10's check (`check(lesson=10)`) asks questions of its own, which no lesson asked.
"""

from __future__ import annotations

import copy
import html
import json
import math
import numbers
import os
import random
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import ipywidgets as w

from ...i18n import LANGUAGES, N_, _, catalogue, language as course_language
from .._view import view_bundle
from .experiments import RUNS
from .scores import PROCESS_SEED, ScoreFile, rows as _score_rows, to_csv

LESSONS = range(1, 11)  # the course's lessons, numbered as in notebooks/en (10: the recap)

# What the widget shows around the questions (marked for the catalogue; translated in the quiz's language).
UI = {
    "title": N_("Quick check"),
    "language": N_("Language"),
    "check": N_("Check"),
    "run": N_("Run it with accumlib"),
    "previous": N_("Back"),
    "next": N_("Next"),
    "your_answer": N_("Your answer"),
    "number_placeholder": N_("a number, for example 12"),
    "progress": N_(
        "Question {number} of {total} · answered {answered} · right at the first try {first} · right in "
        "the end {correct}"
    ),
    "correct": N_("Correct!"),
    "wrong": N_("That is not it. Try again."),
    "hint": N_("Hint"),
    "choose_first": N_("Choose an answer first."),
    "not_a_number": N_("Type a number, for example 12."),
    "run_after_answer": N_("Answer first: predict, then run it."),
    # the whole quiz (every question of the course) is not one lesson's quick check
    "whole_title": N_("The whole quiz"),
    "whole_summary": N_("The whole quiz ({language}), {count} questions:"),
    "score": N_("Score: {first} of {total} right at the first try, {correct} of {total} in the end"),
    "final_title": N_("End-of-course check"),
    "predict_title": N_("Predict first"),
}


def learner_seed(store: ScoreFile | None = None) -> str:
    """The learner's seed: $ACCUMLIB_LEARNER, else the one kept in the score file, else this process's."""
    return os.environ.get("ACCUMLIB_LEARNER") or (store.anonymous() if store is not None else PROCESS_SEED)


def shown_order(question: dict, seed) -> list[dict]:
    """The options of a choice or predict question in the order a learner with this seed sees them.

    Each learner's right answers are spread evenly over the places: over the bank's choice questions (in bank
    order) the places 1, 2, 3, 4, 1, 2, ... are dealt out in an order shuffled by the seed, so every place holds the
    right answer equally often (within one) for every learner; the wrong options are shuffled around it. Only the
    seed and the bank decide, never the language or the quiz it is shown in."""
    rng = random.Random(f"{seed}:{question['id']}")
    wrong = [o for o in question["options"] if o["id"] != question["answer"]]
    rng.shuffle(wrong)
    right = next(o for o in question["options"] if o["id"] == question["answer"])
    place = _places(seed).get(question["id"], rng.randrange(len(question["options"]))) % len(question["options"])
    return wrong[:place] + [right] + wrong[place:]


@lru_cache(maxsize=64)
def _places(seed) -> dict[str, int]:
    """Question id -> the place (0-based) of its right option for this learner, for every choice question."""
    ids = [q["id"] for q in _bank()["questions"] if q["kind"] != "number"]
    rng = random.Random(f"{seed}:places")
    start = rng.randrange(4)  # which places get the one extra when the count is not a multiple of 4
    places = [(start + i) % 4 for i in range(len(ids))]
    rng.shuffle(places)
    return dict(zip(ids, places, strict=True))


@lru_cache(maxsize=None)
def _bank() -> dict:
    """The bank as loaded once; never handed out (see `bank`)."""
    return json.loads((resources.files(__name__) / "questions.json").read_text(encoding="utf-8"))


def bank() -> dict:
    """The question bank (questions.json): English text, ids, lessons, answers. A copy: changing it changes no quiz."""
    return copy.deepcopy(_bank())


def _by_id() -> dict[str, dict]:
    return {q["id"]: q for q in _bank()["questions"]}


@dataclass(frozen=True)
class Feedback:
    correct: bool
    message: str  # why this answer is right or wrong, in the quiz's language
    hint: str | None  # shown from the first wrong answer on; never the answer itself


def _check_language(language) -> str:
    """The quiz language: `language`, or the course language when None."""
    if language is None:
        return course_language()
    if not isinstance(language, str) or language not in LANGUAGES:
        raise ValueError(
            _("language must be one of {valid} (or None: the course language); got {value}").format(
                valid=", ".join(map(repr, LANGUAGES)), value=repr(language)
            )
        )
    return language


def select(ids=None, lesson: int | None = None) -> list[dict]:
    """The questions a quiz asks, in the order given; checked before anything is built.

    ids: question ids (strings); None (or empty) means every question, or with `lesson`, that lesson's questions.
    lesson: the lesson (1-10) whose quick check this is; every id must belong to it or to an earlier lesson.
    """
    questions = _by_id()
    if lesson is not None:
        if isinstance(lesson, bool) or not isinstance(lesson, numbers.Integral) or lesson not in LESSONS:
            raise ValueError(
                _("lesson must be a lesson number from {first} to {last}; got {value}").format(
                    first=LESSONS[0], last=LESSONS[-1], value=repr(lesson)
                )
            )
    if ids is None or (not isinstance(ids, str) and isinstance(ids, (list, tuple)) and not ids):
        # a lesson's quick check: its questions but the "predict" ones, which it asks before it shows the answer
        chosen = [q for q in questions.values() if lesson is None or (q["lesson"] == lesson and q["kind"] != "predict")]
        if not chosen:
            raise ValueError(
                _("lesson: no question belongs to lesson {number}; lessons with questions: {numbers}").format(
                    number=lesson, numbers=sorted({q["lesson"] for q in questions.values()})
                )
            )
        return copy.deepcopy(chosen)
    if isinstance(ids, str) or not isinstance(ids, (list, tuple)):
        raise TypeError(_("ids must be a list of question ids (strings), got {value}").format(value=repr(ids)))
    for qid in ids:
        if not isinstance(qid, str):
            raise TypeError(
                _(
                    "ids: each question id must be a string, got {value} ({kind}); name the questions one "
                    "by one, as in quiz.check('when-to-step', 'loop-order')"
                ).format(value=repr(qid), kind=type(qid).__name__)
            )
    unknown = [qid for qid in ids if qid not in questions]
    if unknown:
        raise ValueError(
            _("ids: unknown question id(s) {unknown}; valid ids: {valid}").format(
                unknown=unknown, valid=", ".join(questions)
            )
        )
    repeated = sorted({qid for qid in ids if ids.count(qid) > 1})
    if repeated:
        raise ValueError(
            _("ids: {repeated} given more than once; name each question once").format(
                repeated=", ".join(map(repr, repeated))
            )
        )
    later = [
        _("{qid} (lesson {number})").format(qid=repr(qid), number=questions[qid]["lesson"])
        for qid in ids
        if lesson is not None and questions[qid]["lesson"] > lesson
    ]
    if later:
        raise ValueError(
            _(
                "ids: the quick check of lesson {number} may only ask questions of lessons 1 to {number}; "
                "these belong to later lessons: {later}"
            ).format(number=lesson, later=", ".join(later))
        )
    return copy.deepcopy([questions[qid] for qid in ids])


class Quiz:
    """Grades answers and keeps progress; every text it returns is in `language`.

    ids: the questions to ask (default: all, in bank order); lesson: see `select`. language: "en" or "hi"
    (default: the course language, `accumlib.language()`). seed: the learner's seed for the order of the options
    (any int or string; default `learner_seed(store)`). store: a `ScoreFile` that keeps this learner's answers
    (the seed is the learner's key): the attempts it holds are restored, and every answer is written to it.
    """

    def __init__(
        self,
        ids=None,
        language: str | None = None,
        *,
        lesson: int | None = None,
        seed=None,
        store: ScoreFile | None = None,
    ):
        self.language = language
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, str))):
            raise TypeError(_("seed must be an int or a string (the learner's seed), got {value!r}").format(value=seed))
        if store is not None and not isinstance(store, ScoreFile):
            raise TypeError(_("store must be a quiz.ScoreFile or None, got {value!r}").format(value=store))
        self.questions = select(ids, lesson)
        self.store = store
        self.seed = learner_seed(store) if seed is None else seed
        self.attempts: dict[str, list] = {q["id"]: [] for q in self.questions}
        self.solved: set[str] = set()
        kept = store.attempts(str(self.seed)) if store is not None else {}
        for q in self.questions:
            for value in kept.get(q["id"], []):
                try:
                    correct = self._grade(q, value)[0]
                except (TypeError, ValueError):  # not an answer this question takes: the file was edited by hand
                    continue
                self.attempts[q["id"]].append(value)
                if correct:
                    self.solved.add(q["id"])

    @property
    def language(self) -> str:
        return self._language

    @language.setter
    def language(self, value) -> None:
        self._language = _check_language(value)

    def text(self, message: str) -> str:
        """An English text of the bank (or of this module) in the quiz's language."""
        return catalogue(self.language).gettext(message)

    def ui(self, key: str, **values) -> str:
        return self.text(UI[key]).format(**values)

    def question(self, qid) -> dict:
        if not isinstance(qid, str):
            raise TypeError(
                _("qid must be a question id (a string), got {value!r} ({kind})").format(
                    value=qid, kind=type(qid).__name__
                )
            )
        for q in self.questions:
            if q["id"] == qid:
                return q
        raise ValueError(
            _("qid: {qid!r} is not in this quiz; valid: {valid}").format(
                qid=qid, valid=", ".join(q["id"] for q in self.questions)
            )
        )

    def answer(self, qid: str, value) -> Feedback:
        """Grade `value` and record the attempt: an option id (a string such as "b") for a choice or predict
        question, a number (int or float, not bool) for a number question. A bad value is refused unrecorded."""
        q = self.question(qid)
        correct, why = self._grade(q, value)
        self.attempts[qid].append(value)
        if correct:
            self.solved.add(qid)
        if self.store is not None:
            self.store.record(str(self.seed), qid, self.attempts[qid])
        wrong_before = any(not self._grade(q, v)[0] for v in self.attempts[qid])
        return Feedback(correct, self.text(why), self.text(q["hint"]) if wrong_before else None)

    @staticmethod
    def _grade(q: dict, value) -> tuple[bool, str]:
        """(is value right?, the English text that explains why) for question q."""
        if q["kind"] == "number":
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    _("value: question {qid!r} needs a number (int or float), got {value!r} ({kind})").format(
                        qid=q["id"], value=value, kind=type(value).__name__
                    )
                )
            if not math.isfinite(value):
                raise ValueError(
                    _("value: question {qid!r} needs a finite number, got {value!r}").format(qid=q["id"], value=value)
                )
            if value == q["answer"]:
                return True, q["explanation"]
            known = {cause["answer"]: cause["feedback"] for cause in q.get("known_wrong", [])}
            return False, known.get(value, q["wrong_feedback"])
        options = {o["id"]: o for o in q["options"]}
        if not isinstance(value, str) or value not in options:
            raise (ValueError if isinstance(value, str) else TypeError)(
                _("value: question {qid!r} takes one option id, one of {options}; got {value!r}").format(
                    qid=q["id"], options=", ".join(map(repr, options)), value=value
                )
            )
        return (True, q["explanation"]) if value == q["answer"] else (False, options[value]["feedback"])

    def options(self, qid: str) -> list[dict]:
        """The options of question qid in the order this learner sees them (see `shown_order`)."""
        return shown_order(self.question(qid), self.seed)

    def progress(self) -> tuple[int, int, int]:
        """(questions answered at least once, questions answered correctly, questions in the quiz)."""
        return sum(1 for a in self.attempts.values() if a), len(self.solved), len(self.questions)

    def first_try(self) -> int:
        """Questions whose first answer was right: the score that measures, since retries end right anyway."""
        return sum(1 for q in self.questions if self.attempts[q["id"]] and self._grade(q, self.attempts[q["id"]][0])[0])

    def score(self) -> str:
        """The first-try score beside the eventual one, in the quiz's language."""
        answered, correct, total = self.progress()
        return self.ui("score", first=self.first_try(), correct=correct, total=total)

    def run_check(self, qid: str) -> str:
        """Run the real experiment behind a "predict, then run it" question, once an answer to it was given;
        return what it measured, in the quiz's language."""
        q = self.question(qid)
        if q["kind"] != "predict":
            raise ValueError(
                _("qid: {qid!r} is a {kind!r} question; only 'predict' questions have a run").format(
                    qid=qid, kind=q["kind"]
                )
            )
        if not self.attempts[qid]:
            raise ValueError(_("qid: answer {qid!r} before running it (predict, then run it)").format(qid=qid))
        experiment, message = RUNS[q["run"]]
        return self.text(message).format(**experiment())


# The quiz's layout, from a phone's 390 px to a desktop: rows wrap, buttons are as wide as their text, and an option
# longer than the line wraps onto more lines (ipywidgets gives each radio label one line's height, so a long option
# ran over the Check button below it). Scoped to the quiz's box by its class.
_LAYOUT_CSS = (
    "<style>"
    ".accumlib-quiz .widget-radio-box label{height:auto;min-height:var(--jp-widgets-radio-item-height);"
    "line-height:1.4;white-space:normal;padding:0.25em 0;display:flex;align-items:flex-start;gap:0.4em}"
    ".accumlib-quiz .widget-radio-box input{order:-1;flex:none;float:none;margin:0.2em 0 0 1px}"
    ".accumlib-quiz .widget-html-content{line-height:1.5;white-space:normal;overflow-wrap:anywhere}"
    "</style>"
)


def _button(**kwargs) -> w.Button:
    return w.Button(layout=w.Layout(width="auto", min_width="8rem", max_width="100%"), **kwargs)


def _row(children) -> w.HBox:
    return w.HBox(children, layout=w.Layout(flex_flow="row wrap", max_width="100%"))


class QuizWidget:
    """The quiz as ipywidgets: language switch, question, options or a number box, Check, Run (predict questions,
    enabled once answered), feedback, Back/Next and progress. Arguments as for `Quiz`."""

    def __init__(
        self,
        ids=None,
        language: str | None = None,
        *,
        lesson: int | None = None,
        seed=None,
        title: str = "title",
        store: ScoreFile | None = None,
    ):
        self.quiz = Quiz(ids, language, lesson=lesson, seed=seed, store=store)
        self.whole = not ids and lesson is None  # every question of the course, not one lesson's quick check
        self.title = "whole_title" if self.whole else "final_title" if lesson == LESSONS[-1] and not ids else title
        self.index = 0
        self.language = w.ToggleButtons(
            options=[(name, code) for code, name in LANGUAGES.items()],
            value=self.quiz.language,
            style={"description_width": "initial"},
        )
        self.heading = w.HTML()
        self.prompt = w.HTML()
        self.choices = w.RadioButtons(options=[], value=None, layout=w.Layout(width="auto", max_width="100%"))
        self.number = w.Text(
            layout=w.Layout(width="calc(100% - 4px)", max_width="24rem"),  # less its 2 px margins
            style={"description_width": "initial"},
        )
        self.check = _button(button_style="primary")
        self.run = _button()
        self.previous, self.next = _button(), _button()
        self.feedback = w.HTML()
        self.run_output = w.HTML()
        self.progress = w.HTML()
        self.language.observe(lambda _: self._switch_language(), names="value")
        self.check.on_click(lambda _: self.submit())
        self.run.on_click(lambda _: self.run_experiment())
        self.previous.on_click(lambda _: self.go(self.index - 1))
        self.next.on_click(lambda _: self.go(self.index + 1))
        self.widget = w.VBox(
            [
                w.HTML(_LAYOUT_CSS, layout=w.Layout(display="none")),
                self.language,
                self.heading,
                self.prompt,
                self.choices,
                self.number,
                _row([self.check, self.run]),
                self.feedback,
                self.run_output,
                _row([self.previous, self.next]),
                self.progress,
            ],
            layout=w.Layout(max_width="100%"),
        )
        self.widget.add_class("accumlib-quiz")
        self._render()

    @property
    def current(self) -> dict:
        return self.quiz.questions[self.index]

    def go(self, index: int) -> None:
        """Show question `index` (clamped to the quiz: Back on the first and Next on the last stay put)."""
        self.index = min(max(index, 0), len(self.quiz.questions) - 1)
        self.feedback.value = self.run_output.value = ""
        self._render()

    def _switch_language(self) -> None:
        self.quiz.language = self.language.value
        self.feedback.value = self.run_output.value = ""
        self._render()

    def _render(self) -> None:
        q, quiz = self.current, self.quiz
        self.language.description = quiz.ui("language")
        self.heading.value = f"<h3>{html.escape(quiz.ui(self.title))}</h3>"
        self.prompt.value = f"<p><b>{self.index + 1}.</b> {html.escape(quiz.text(q['prompt']))}</p>"
        numeric = q["kind"] == "number"
        self.choices.layout.display = "none" if numeric else None
        self.number.layout.display = None if numeric else "none"
        self.number.description = quiz.ui("your_answer")
        self.number.placeholder = quiz.ui("number_placeholder")
        self.number.value = ""
        self.choices.description = "" if numeric else quiz.ui("your_answer")
        self.choices.options = [] if numeric else [(quiz.text(o["text"]), o["id"]) for o in quiz.options(q["id"])]
        self.choices.value = None
        self.check.description = quiz.ui("check")
        self.run.description = quiz.ui("run")
        self.run.tooltip = quiz.ui("run_after_answer")
        self.run.layout.display = None if q["kind"] == "predict" else "none"
        self.run.disabled = not quiz.attempts[q["id"]]
        self.previous.description, self.next.description = quiz.ui("previous"), quiz.ui("next")
        self._progress()

    def _progress(self) -> None:
        answered, correct, total = self.quiz.progress()
        self.progress.value = self.quiz.ui(
            "progress",
            number=self.index + 1,
            total=total,
            answered=answered,
            first=self.quiz.first_try(),
            correct=correct,
        )

    def _value(self):
        """The current answer as the quiz takes it, or None (and a message in the feedback) when there is none."""
        if self.current["kind"] != "number":
            if self.choices.value is None:
                self.feedback.value = f"<p>{html.escape(self.quiz.ui('choose_first'))}</p>"
            return self.choices.value
        try:
            value = float(self.number.value.strip().replace(",", ""))
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            self.feedback.value = f"<p>{html.escape(self.quiz.ui('not_a_number'))}</p>"
            return None
        return value

    def submit(self) -> Feedback | None:
        """Grade the current answer (as the Check button does); None, with a message, when none is given."""
        value = self._value()
        if value is None:
            return None
        result = self.quiz.answer(self.current["id"], value)
        verdict = self.quiz.ui("correct") if result.correct else self.quiz.ui("wrong")
        hint = (
            f"<br><i>{html.escape(self.quiz.ui('hint'))}:</i> {html.escape(result.hint)}"
            if result.hint and not result.correct
            else ""
        )
        self.feedback.value = f"<p><b>{html.escape(verdict)}</b> {html.escape(result.message)}{hint}</p>"
        self.run.disabled = False
        self._progress()
        return result

    def run_experiment(self) -> str | None:
        """Run the real check behind a predict question (as the Run button does); None before an answer."""
        if self.run.disabled:
            self.run_output.value = f"<p>{html.escape(self.quiz.ui('run_after_answer'))}</p>"
            return None
        text = self.quiz.run_check(self.current["id"])
        self.run_output.value = f"<pre>{html.escape(text)}</pre>"
        return text

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = view_bundle(self.widget, include, exclude)
        count, name = len(self.quiz.questions), LANGUAGES[self.quiz.language]
        # the count and the numbered questions below it, never the bank's ids (internal names a learner cannot use)
        summary = (
            self.quiz.ui("whole_summary", language=name, count=count)
            if self.whole
            else catalogue(self.quiz.language)
            .ngettext("Quiz ({language}), {count} question:", "Quiz ({language}), {count} questions:", count)
            .format(language=name, count=count)
        )
        # each question by its number and the first words of its prompt, in the quiz's language: a text-only view
        # (GitHub, nbviewer, a printout) then says what is asked
        asked = [
            f"{number}. {prompt_start(self.quiz.text(q['prompt']))}" for number, q in enumerate(self.quiz.questions, 1)
        ]
        bundle["text/plain"] = "\n".join([summary, *asked, self.quiz.score()])
        # the ids in the output's metadata, which no view shows: the website's quiz (tools/site.py) asks these
        return bundle, {QUESTIONS_METADATA: [q["id"] for q in self.quiz.questions]}


QUESTIONS_METADATA = "accumlib-quiz-questions"  # a stored quiz output's metadata key: the ids of what it asks


def prompt_start(prompt: str, words: int = 8) -> str:
    """The first `words` words of a prompt, with "…" where it goes on."""
    split = prompt.split()
    return " ".join(split[:words]) + (" …" if len(split) > words else "")


def check(*ids: str, lesson: int | None = None, language: str | None = None) -> QuizWidget:
    """A lesson's quick check: the named questions (all of them when none is named, or that lesson's with
    `lesson=`), opening in the course language unless `language` is given.

        quiz.check("when-to-step", "loop-order", lesson=3)   # refuses questions of lessons after 3
    """
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        raise TypeError(
            _("ids: pass the question ids as separate arguments, quiz.check({ids}), not as one {kind}").format(
                ids=", ".join(map(repr, ids[0])), kind=type(ids[0]).__name__
            )
        )
    return QuizWidget(list(ids), language, lesson=lesson, store=ScoreFile())


def predict(qid: str, *, language: str | None = None) -> QuizWidget:
    """One "predict, then run it" question, asked in the lesson before the cell that shows its answer:

        quiz.predict("predict-no-division-adam")   # lesson 2, before the experiment's cell

    The lesson's quick check at the end (check(lesson=N)) leaves its predict questions out."""
    question = select([qid])[0] if isinstance(qid, str) else None
    if question is None or question["kind"] != "predict":
        kinds = ", ".join(q["id"] for q in _bank()["questions"] if q["kind"] == "predict")
        raise ValueError(
            _("qid must be the id of a 'predict' question ({kinds}); got {value}").format(kinds=kinds, value=repr(qid))
        )
    return QuizWidget([qid], language, title="predict_title", store=ScoreFile())


def scores(*paths, save=None) -> str:
    """The first-try scores of every learner in the score files, as CSV with a header line: learner, questions
    answered, right at the first try, right in the end (after retries), questions in the course's quiz, and the
    first-try share in percent. Default file: this notebook's (`ScoreFile()`); give several paths to merge a
    class's files. save: a path to write the CSV to as well (None: only return it).

        print(quiz.scores())                      # in lesson 10: one line per learner of this machine
        quiz.scores("a/accumlib-scores.json", "b/accumlib-scores.json", save="class.csv")
    """
    files = [ScoreFile(path) for path in paths] or [ScoreFile()]
    missing = [str(file.path) for file in files if paths and not file.path.is_file()]
    if missing:
        raise FileNotFoundError(_("paths: no score file at {paths}").format(paths=", ".join(missing)))
    text = to_csv(_score_rows(_bank()["questions"], Quiz._grade, *files))
    if save is not None:
        if not isinstance(save, (str, os.PathLike)):
            raise TypeError(
                _("save must be a file path (str or os.PathLike) or None, got {value!r}").format(value=save)
            )
        Path(save).write_text(text, encoding="utf-8")
    return text
