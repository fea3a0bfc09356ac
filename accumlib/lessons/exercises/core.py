"""What every exercise shares: a verdict made of named findings, and `check()`, `hint()`, `solution()`.

An exercise is a "your turn" cell: the lesson shows `stub` (code that runs as stored and gets a true, deterministic
verdict), the learner edits it and runs it again; `check(answer)` prints the verdict, `hint()` a hint and
`solution()` one solution's code. Everything printed is in the course language (`accumlib.set_language`); code
stays English.
"""

from __future__ import annotations

import contextlib
import ctypes
import decimal
import io
import math
import numbers
import operator
import re
import signal
import threading
import time
import tokenize
from dataclasses import dataclass
from collections.abc import Callable

import torch

from ...i18n import N_, _, ngettext, pgettext
from . import contained


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


def _as_data(verdict: Verdict) -> dict:
    """A verdict as JSON-able data: what a check's child process sends back (contained.py)."""
    return {
        "kind": "verdict",
        "correct": verdict.correct,
        "text": verdict.text,
        "findings": [[f.name, f.message] for f in verdict.findings],
    }


def right(message: str) -> Verdict:
    """A verdict for a right answer; `message` says what was measured to confirm it."""
    return Verdict(True, _("Right! {details}").format(details=message))


def wrong(findings: list[Finding]) -> Verdict:
    """A verdict listing what is wrong, each finding on its own line."""
    header = ngettext("Not yet: {count} problem.", "Not yet: {count} problems.", len(findings)).format(
        count=len(findings)
    )
    return Verdict(False, "\n".join([header, *(f"- {f.message}" for f in findings)]), tuple(findings))


class TimeLimitExceeded(BaseException):
    """Raised inside the learner's code when its time is up. A BaseException, so that the learner's own
    `except Exception:` cannot swallow it."""


class CallBudgetExceeded(BaseException):
    """Raised inside the learner's code when it calls a function the check hands it more often than any answer
    needs (a search that never ends). Carries the finding that says so."""

    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


class Watchdog:
    """A time limit on the learner's code inside the block: the clock runs only inside `running()` (the learner's
    code) and stops inside `paused()` (the check's own measurements, called from the learner's code). When the limit
    is reached, TimeLimitExceeded is raised in the thread that entered the block: by SIGALRM sent to the main thread
    (which also interrupts a sleep), or, in any other thread, as an asynchronous exception (raised at its next Python
    instruction). Nothing of it outlives the block."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.used = 0.0  # seconds counted before the current stretch
        self.since: float | None = None  # start of the current counted stretch (None while the clock stands)
        self.fired = self.done = False
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return self.used + (time.monotonic() - self.since if self.since is not None else 0.0)

    def _publish(self) -> None:
        """Tell the kernel when the learner's time runs out (contained.py ends a child that runs on past it)."""
        contained.clock_moved(self.since + self.seconds - self.used if self.since is not None else math.inf)

    @contextlib.contextmanager
    def _clock(self, run: bool):
        with self._lock:
            was = self.since is not None
            if was and not run:
                self.used += time.monotonic() - self.since
                self.since = None
            elif run and not was:
                self.since = time.monotonic()
            self._publish()
        try:
            yield
        finally:
            with self._lock:
                if self.since is not None and not was:
                    self.used += time.monotonic() - self.since
                    self.since = None
                elif was and self.since is None:
                    self.since = time.monotonic()
                self._publish()

    def running(self):
        """Count the block's time: the learner's code runs."""
        return self._clock(True)

    def paused(self):
        """Do not count the block's time: the check measures, from inside the learner's code."""
        return self._clock(False)

    def _on_signal(self, signum, frame):
        if self.fired and not self.done:
            raise TimeLimitExceeded()

    def _watch(self) -> None:
        while True:
            time.sleep(min(0.02, self.seconds / 4))
            with self._lock:
                if self.done:
                    return
                if self.elapsed() <= self.seconds:
                    continue
                self.fired = True
                if self.by_signal:
                    signal.pthread_kill(self.target, signal.SIGALRM)
                else:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self.target), ctypes.py_object(TimeLimitExceeded)
                    )
                return

    def __enter__(self) -> Watchdog:
        self.target = threading.get_ident()
        self.by_signal = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_kill")
        if self.by_signal:
            self._old_handler = signal.signal(signal.SIGALRM, self._on_signal)
        self._thread = threading.Thread(target=self._watch, name="accumlib-exercise-time-limit", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self.done = True
            if self.fired and not self.by_signal:  # a pending asynchronous exception not raised yet: cancel it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.target), None)
        self._thread.join()
        if self.by_signal:
            signal.signal(signal.SIGALRM, self._old_handler)


_active: list[Watchdog] = []  # the watchdog of the check that is running (innermost last)


def learner_code():
    """Count the block against the time limit of the check that runs: the learner's code."""
    return _active[-1].running() if _active else contextlib.nullcontext()


def checker_work():
    """Stop the learner's clock for the block: the check's own measurement, called from the learner's code."""
    return _active[-1].paused() if _active else contextlib.nullcontext()


class Budget:
    """A function handed to the learner's code that may be called at most `calls` times per check."""

    def __init__(self, function, calls: int, finding):
        self.function, self.calls, self.finding, self.made = function, calls, finding, 0

    def __call__(self, *args, **kwargs):
        self.made += 1
        if self.made > self.calls:
            raise CallBudgetExceeded(self.finding(self.calls))
        with checker_work():
            return self.function(*args, **kwargs)


# Raw PyTorch errors a learner meets in these exercises, said in the learner's words: (pattern, finding name, text)
TORCH_ERRORS = [
    (
        r"num_channels \((?P<channels>\d+)\) must be divisible by num_groups \((?P<groups>\d+)\)",
        "groupnorm-groups",
        N_(
            "nn.GroupNorm(num_groups, num_channels) takes the number of groups first and the channels second: here "
            "{channels} channels cannot be split into {groups} groups. If you swapped the two, write "
            "nn.GroupNorm(groups, channels), for example nn.GroupNorm(4, 16): the groups must divide the channels."
        ),
    ),
    (
        r"mat1 and mat2 shapes cannot be multiplied \((?P<rows>\d+)x(?P<got>\d+) and (?P<expected>\d+)x(?P<out>\d+)\)",
        "shape-mismatch",
        N_(
            "A linear layer gets {got} features per sample but expects {expected}: the in_features of each nn.Linear "
            "must equal what the layer before it gives (after nn.Flatten, channels x height x width)."
        ),
    ),
    (
        r"expected input\[.*\] to have (?P<expected>\d+) channels, but got (?P<got>\d+) channels",
        "channels-mismatch",
        N_(
            "A layer expects {expected} channels but gets {got}: each layer's input channels must equal the output "
            "channels of the layer before it."
        ),
    ),
    (
        r"running_mean should contain (?P<expected>\d+) elements not (?P<got>\d+)",
        "channels-mismatch",
        N_(
            "A normalisation layer is built for {got} channels but gets {expected}: give it the output channels of the "
            "layer before it."
        ),
    ),
    (
        r"Trying to backward through the graph a second time",
        "backward-twice",
        N_(
            "backward() ran twice through the same loss: the first backward() frees what the second needs. Call "
            "backward() once per micro-batch, on that micro-batch's scaled loss."
        ),
    ),
    (
        r"element 0 of tensors does not require grad",
        "no-graph",
        N_(
            "backward() was called on a tensor that is not connected to the model's weights: it was detached "
            "(.detach(), .item(), torch.no_grad()), or every weight is frozen (requires_grad=False). Compute the loss "
            "from the model's output and keep it as a tensor."
        ),
    ),
]
# (An input in another dtype than the check's model is told from the dtypes themselves, not from PyTorch's message,
# which changes between versions: fingerprint.DtypeMismatch.)


def explained(error: BaseException) -> Finding | None:
    """A raw PyTorch error said in the learner's words, or None when it is not one of TORCH_ERRORS."""
    text = message_of(error)
    for pattern, name, message in TORCH_ERRORS:
        found = re.search(pattern, text)
        if found:
            return Finding(name, _(message).format(**found.groupdict()))
    return None


def whole_number(value) -> int | None:
    """value as an int when it is a whole number of any real numeric type (8, 8.0, numpy ints and floats, a tensor
    of one element, Fraction(16, 2), Decimal("8")); None otherwise (a bool, a string, 8.5, NaN)."""
    number = real_number(value)
    if number is None:
        return None
    try:
        return operator.index(number)
    except TypeError:
        pass
    try:
        whole = int(number)
    except (OverflowError, ValueError, TypeError):
        return None
    return whole if whole == number else None


def real_number(value):
    """value as a real number (kept exact where it is: int, Fraction, Decimal) of any real numeric type; None for a
    bool, a string, a complex number, NaN or infinity, or a tensor of more than one element. The value's own
    methods (__float__, __index__) are counted as the learner's code."""
    with learner_code():
        return _real_number(value)


def _real_number(value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex() or value.is_meta:
            return None
        value = value.detach().cpu().item()
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    if not isinstance(value, (numbers.Real, decimal.Decimal)):
        return None
    try:
        if not math.isfinite(float(value)):
            return None
    except (OverflowError, ValueError, TypeError):
        return None
    if isinstance(value, numbers.Integral):
        return operator.index(value)
    return value if isinstance(value, (decimal.Decimal, numbers.Rational)) else float(value)


class Exercise:
    """One exercise of one lesson. Subclasses set the class attributes and implement `judge`.

    `verdict` runs `judge` on the learner's answer under a time limit counted while the learner's code runs, and
    turns whatever escapes it (the time limit, a call budget, any error) into a verdict in words: no answer makes a
    check raise, hang, or leave anything behind (the grad mode and default dtype are restored).
    """

    lesson: int  # the lesson (1-10) whose exercise cell this is
    name: str  # its attribute name in accumlib.lessons.exercises
    answer: tuple[str, ...]  # the names the cell defines and passes to check(), in order
    stub: str  # the exercise cell as the lesson stores it (needs `torch`, `nn` and `exercises` imported)
    solution_code: str  # one right answer, as a whole cell
    hint_text: str  # English, marked with N_(); shown translated
    time_limit: float = 15.0  # seconds the learner's code may run per check (the check's own measurements excluded)
    check_limit: float = 60.0  # seconds of wall time a whole check may take, its measurements included (every
    # right answer's check takes under 1.5 s on one CPU thread)
    # what to look for when the learner's code runs past the time limit (English, marked with N_())
    hang_text: str = N_(
        "Look for a loop that never ends: a while loop whose condition stays true, or a loop over something endless."
    )

    def judge(self, *answer) -> Verdict:
        raise NotImplementedError

    def verdict(self, *answer, progress: Callable[[dict], None] | None = None) -> Verdict:
        """The verdict on the answer (the values of the names in `answer`), as data.

        The check runs in a child process where it can be ended at a hard limit (contained.py): its verdict comes
        back as data, and nothing the answer does (a swallowed time-out, an ignored alarm, os._exit(), changes to
        torch's global state) reaches the kernel. progress(report) is called, at most every few seconds, while a
        long check runs (reports come from contained.progress() in the check)."""
        outcome = contained.run(
            lambda: _as_data(self.judged(*answer)), check_limit=self.check_limit, on_progress=progress
        )
        kind = outcome["kind"]
        if kind == "verdict":
            return Verdict(
                outcome["correct"],
                outcome["text"],
                tuple(Finding(name, message) for name, message in outcome["findings"]),
            )
        if kind == "ignored":
            return wrong(
                [
                    Finding(
                        "time-limit-ignored",
                        _(
                            "Your code was still running {grace:g} second after the {seconds:g} seconds it may run, "
                            "because it "
                            "did not stop when the check asked it to, so the check ended it. A bare except: (or except "
                            "BaseException:) catches that request too, a change to the alarm signal (signal.SIGALRM) "
                            "blocks it, "
                            "and a long call into C code (sum() over an endless iterator) never sees it: catch only "
                            "the errors "
                            "you expect, as in except ValueError:. {look}"
                        ).format(grace=contained.GRACE, seconds=self.time_limit, look=_(self.hang_text)),
                    )
                ]
            )
        if kind == "overtime":
            return wrong([self.overtime(outcome["progress"])])
        if kind == "ended":
            if outcome["signal"] is not None:
                return wrong(
                    [
                        Finding(
                            "process-ended",
                            _(
                                "The process the check ran your code in was ended by signal {number} ({name}) before "
                                "the check "
                                "finished: your code crashed it or sent it that signal. The kernel is still running; "
                                "the check "
                                "has no verdict on your answer."
                            ).format(number=outcome["signal"], name=signal.Signals(outcome["signal"]).name),
                        )
                    ]
                )
            return wrong(
                [
                    Finding(
                        "process-ended",
                        _(
                            "Your code ended the process the check ran it in (exit status {code}, as os._exit() does) "
                            "before "
                            "the check finished. The kernel is still running; the check has no verdict on your answer. "
                            "Return "
                            "from your function with return."
                        ).format(code=outcome["code"]),
                    )
                ]
            )
        return wrong(
            [
                Finding(
                    "check-failed",
                    _("The check could not run your answer: {error}: {message}").format(
                        error=outcome["error"], message=outcome["message"].strip().split("\n")[0]
                    ),
                )
            ]
        )

    def overtime(self, report: dict | None) -> Finding:
        """The finding for a check stopped after check_limit seconds of wall time; report: the check's last
        contained.progress() report, or None."""
        return Finding(
            "check-too-long",
            _(
                "The check of your answer ran for {seconds:g} seconds in all (your code and the measurements it asked "
                "for), so it stopped it. {look}"
            ).format(seconds=self.check_limit, look=_(self.hang_text)),
        )

    def progress_text(self, report: dict) -> str | None:
        """What check() prints while a long check runs, from its last progress report (None: nothing)."""
        return None

    def judged(self, *answer) -> Verdict:
        """The verdict, judged in this process under the cooperative time limit (Watchdog)."""
        grad_mode, dtype = torch.is_grad_enabled(), torch.get_default_dtype()
        watchdog = Watchdog(self.time_limit)
        _active.append(watchdog)
        try:
            with watchdog:
                return self.judge(*answer)
        except TimeLimitExceeded:
            return wrong(
                [
                    Finding(
                        "time-limit",
                        _(
                            "Your code was still running after {seconds:g} seconds, so the check stopped it. {look}"
                        ).format(seconds=self.time_limit, look=_(self.hang_text)),
                    )
                ]
            )
        except CallBudgetExceeded as budget:
            return wrong([budget.finding])
        except SystemExit:  # exit() or sys.exit() in the learner's code: it would end the kernel's cell, or Python
            return wrong(
                [
                    Finding(
                        "exit",
                        _(
                            "Your code called exit() (or sys.exit()), which stops Python itself; the check stopped it "
                            "instead. "
                            "Return from your function with return."
                        ),
                    )
                ]
            )
        except Exception as error:  # whatever the learner's code made the check meet: said in words, not raised
            return wrong(
                [
                    explained(error)
                    or Finding(
                        "check-failed",
                        _("The check could not run your answer: {error}: {message}").format(
                            error=type(error).__name__, message=first_line(error)
                        ),
                    )
                ]
            )
        finally:
            _active.remove(watchdog)
            torch.set_grad_enabled(grad_mode)
            torch.set_default_dtype(dtype)

    def check(self, *answer) -> None:
        """Print the verdict on the answer (the values of the names in `answer`); while a long check runs, how far
        it is."""

        def shown(report: dict) -> None:
            text = self.progress_text(report)
            if text:
                print(text, flush=True)

        print(self.verdict(*answer, progress=shown))

    def hint(self) -> None:
        print(_("Hint: {hint}").format(hint=_(self.hint_text)))

    def solution(self) -> None:
        """Print one solution's code, its comments in the course language."""
        print(_("One solution:"))
        print(commented(self.solution_code.rstrip(), f"{type(self).__name__}.solution_code"))


def commented(code: str, context: str) -> str:
    """`code` with the text of each comment in the course language (pgettext(context, text); tools/catalogs.py
    extracts them), everything else, the comments' places included, unchanged."""
    lines = code.splitlines(keepends=True)
    comments = [
        t
        for t in tokenize.generate_tokens(io.StringIO(code).readline)
        if t.type == tokenize.COMMENT and t.string[1:].strip()
    ]
    for token in reversed(comments):  # from the end, so that earlier columns stay where they are
        (row, start), (_row, end) = token.start, token.end
        line = lines[row - 1]
        lines[row - 1] = f"{line[:start]}# {pgettext(context, token.string[1:].strip())}{line[end:]}"
    return "".join(lines)


def first_line(error: BaseException) -> str:
    text = message_of(error).strip()
    return text.splitlines()[0] if text else ""


def message_of(error: BaseException) -> str:
    """str(error), counted as the learner's code (an exception the learner's code raised may have its own
    __str__); an error whose __str__ fails is named by its type."""
    with learner_code():
        try:
            return _plain(str(error))
        except Exception:  # noqa: BLE001 - the learner's __str__
            return type(error).__name__


class Shown:
    """A learner's value as repr() shows it, computed once, as the learner's code (a __repr__ that never returns
    meets the time limit), cut to `LONGEST` characters: format it with {value!r}."""

    LONGEST = 200

    def __init__(self, value):
        with learner_code():
            try:
                text = _plain(repr(value))
            except Exception:  # noqa: BLE001 - the learner's __repr__
                text = f"<{type(value).__name__}>"
        self.text = text if len(text) <= self.LONGEST else text[: self.LONGEST - 3] + "..."

    def __repr__(self) -> str:
        return self.text


def _plain(text: str) -> str:
    """text as a plain str (a str subclass could format itself with code of its own)."""
    return str.__getitem__(text, slice(None))


class Prediction(Exercise):
    """Predict, then run: the answer is a number the learner writes down first; check() measures and compares.

    Subclasses implement `measure()` -> (measured value, what the measurement shows, in the course language).
    """

    tolerance: float = 0.1  # a prediction within this relative distance of the measured value counts as right

    def measure(self) -> tuple[float, str]:
        raise NotImplementedError

    def judge(self, answer) -> Verdict:
        if answer is None:
            return _alone(
                Finding(
                    "no-prediction",
                    _(
                        "Write your prediction into {variable} first (a number), then run this cell again: the "
                        "measurement "
                        "comes after the guess."
                    ).format(variable=self.answer[0]),
                )
            )
        with learner_code():  # the answer's own methods (float(), __index__) are the learner's code
            number = real_number(answer)
        if number is None:
            return _alone(
                Finding(
                    "not-a-number",
                    _("{variable} must be a number; it is {value!r}.").format(
                        variable=self.answer[0], value=Shown(answer)
                    ),
                )
            )
        answer = float(number)
        measured, shows = self.measure()
        if abs(answer - measured) <= self.tolerance * abs(measured):
            return right(
                _("You predicted {prediction:g}; measured: {measured:.2f}. {shows}").format(
                    prediction=answer, measured=measured, shows=shows
                )
            )
        return _alone(
            Finding(
                "prediction-off",
                _("Surprise: you predicted {prediction:g}; measured: {measured:.2f}. {shows}").format(
                    prediction=answer, measured=measured, shows=shows
                ),
            )
        )


def _alone(finding: Finding) -> Verdict:
    """A verdict that is one finding, said as it is (predictions: a surprise is not a list of problems)."""
    return Verdict(False, finding.message, (finding,))
