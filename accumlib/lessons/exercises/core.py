"""What every exercise shares: a verdict made of named findings, and `check()`, `hint()`, `solution()`.

An exercise is a "your turn" cell: the lesson shows `stub` (code that runs as stored and gets a true, deterministic
verdict), the learner edits it and runs it again; `check(answer)` prints the verdict, `hint()` a hint and
`solution()` one solution's code. Everything printed is in the course language (`accumlib.set_language`); code
stays English.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...i18n import _, ngettext


@dataclass(frozen=True)
class Finding:
    """One thing wrong with an answer."""

    name: str  # a stable identifier of the diagnosis, e.g. "missing-division" (never translated)
    message: str  # what is wrong, where it shows and by how much, and the fix, in the course language


@dataclass(frozen=True)
class Verdict:
    """What `check()` says about an answer: right, or the findings that make it wrong."""

    correct: bool
    text: str  # what check() prints
    findings: tuple[Finding, ...] = ()

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.findings]

    def __str__(self) -> str:
        return self.text


def right(message: str) -> Verdict:
    """A verdict for a right answer; `message` says what was measured to confirm it."""
    return Verdict(True, _("Right! {details}").format(details=message))


def wrong(findings: list[Finding]) -> Verdict:
    """A verdict listing what is wrong, each finding on its own line."""
    header = ngettext("Not yet: {count} problem.", "Not yet: {count} problems.", len(findings)).format(
        count=len(findings))
    return Verdict(False, "\n".join([header, *(f"- {f.message}" for f in findings)]), tuple(findings))


class Exercise:
    """One exercise of one lesson. Subclasses set the class attributes and implement `verdict`."""

    lesson: int  # the lesson (1-10) whose exercise cell this is
    name: str  # its attribute name in accumlib.lessons.exercises
    answer: tuple[str, ...]  # the names the cell defines and passes to check(), in order
    stub: str  # the exercise cell as the lesson stores it (needs `torch`, `nn` and `exercises` imported)
    solution_code: str  # one right answer, as a whole cell
    hint_text: str  # English, marked with N_(); shown translated

    def verdict(self, *answer) -> Verdict:
        raise NotImplementedError

    def check(self, *answer) -> None:
        """Print the verdict on the answer (the values of the names in `answer`)."""
        print(self.verdict(*answer))

    def hint(self) -> None:
        print(_("Hint: {hint}").format(hint=_(self.hint_text)))

    def solution(self) -> None:
        print(_("One solution:"))
        print(self.solution_code.rstrip())


class Prediction(Exercise):
    """Predict, then run: the answer is a number the learner writes down first; check() measures and compares.

    Subclasses implement `measure()` -> (measured value, what the measurement shows, in the course language).
    """

    tolerance: float = 0.1  # a prediction within this relative distance of the measured value counts as right

    def measure(self) -> tuple[float, str]:
        raise NotImplementedError

    def verdict(self, answer) -> Verdict:
        if answer is None:
            return _alone(Finding("no-prediction", _(
                "Write your prediction into {variable} first (a number), then run this cell again: the measurement "
                "comes after the guess.").format(variable=self.answer[0])))
        if isinstance(answer, bool) or not isinstance(answer, (int, float)):
            return _alone(Finding("not-a-number", _("{variable} must be a number; it is {value!r}.").format(
                variable=self.answer[0], value=answer)))
        measured, shows = self.measure()
        if abs(answer - measured) <= self.tolerance * abs(measured):
            return right(_("You predicted {prediction:g}; measured: {measured:.2f}. {shows}").format(
                prediction=answer, measured=measured, shows=shows))
        return _alone(Finding("prediction-off", _("Surprise: you predicted {prediction:g}; measured: {measured:.2f}. "
                                                  "{shows}").format(prediction=answer, measured=measured, shows=shows)))


def _alone(finding: Finding) -> Verdict:
    """A verdict that is one finding, said as it is (predictions: a surprise is not a list of problems)."""
    return Verdict(False, finding.message, (finding,))
