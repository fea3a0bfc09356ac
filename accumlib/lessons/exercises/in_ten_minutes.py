"""Lesson 0's exercise: the seed's loop with its one decision left out, when to step (the cycle is complete).

The learner replaces `...` in `if ...:`; the check is lesson 3's (`TheLoop`: the same fingerprint of every step's
gradient, the same confirmation by training against `accumlib.train`) on a problem of its own, with the seed's
accum_steps of 4: 16 micro-batches of 2 digits, 4 full cycles. The lesson's question names that 4, so a loop that
passes is run again with accum_steps = 3 (LoopExercise's second problem): a condition with the number 4 written in
(`(step + 1) % 4 == 0`) steps at the wrong micro-batches there, and is told so ("not-general").

The lesson asks this as its quick check, and learners see the stored output of the cell, so nothing the stub gets
may answer it: the stub (its `...` still in place) gets a prompt that says what to write and what the loop does as
it stands, and a loop that steps after every micro-batch is told so without the condition. The hint, which does not
state it either, comes only when the learner calls `hint()`.
"""

import ast
import inspect
import textwrap

from ...i18n import N_, _
from .core import Finding, Verdict
from .fingerprint import Problem
from .loops import TheLoop

# the lesson's quick check is the condition itself: these findings of lesson 3 would state it, so they are said here
# without it
QUIET = {
    "step-every-micro-batch": N_(
        "It steps after every micro-batch: {steps} optimizer steps for {micro_batches} micro-batches, where a cycle of "
        "{accum_steps} gives {reference} steps. The condition must be true only at the last micro-batch of each cycle."
    )
}


def untouched(function) -> bool:
    """Whether the learner's function still holds the stub's `if ...:`. Read from its source, which Jupyter keeps
    for every cell it ran (`inspect`); CPython compiles the always-true `...` away, so without the source it cannot
    be told from `if True:`, and such a loop gets the finding that it steps after every micro-batch instead."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(
        isinstance(node, ast.If) and isinstance(node.test, ast.Constant) and node.test.value is Ellipsis
        for node in ast.walk(tree)
    )


class FirstLoop(TheLoop):
    lesson, name = 0, "first_loop"
    problem = Problem(samples=32, micro_batch_size=2, accum_steps=4)  # 16 micro-batches, 4 full cycles
    # the second problem of LoopExercise.judge: another accum_steps, so that a condition with the 4 written in fails
    other_problem = Problem(samples=30, micro_batch_size=2, accum_steps=3)  # 15 micro-batches, 5 full cycles
    stub = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if ...:
            optimizer.step()
            optimizer.zero_grad()


exercises.first_loop.check(accumulate)
"""
    solution_code = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:  # the cycle is complete
            optimizer.step()
            optimizer.zero_grad()


exercises.first_loop.check(accumulate)
"""
    hint_text = N_(
        "step counts the micro-batches from 0: with accum_steps = 4, the cycles end at step 3, 7, 11, "
        "and so on. Which condition on step and accum_steps is true there and nowhere else? In Python, "
        "7 % 4 is the remainder of 7 divided by 4, that is 3."
    )

    def judge(self, function) -> Verdict:
        if callable(function) and untouched(function):
            finding = Finding(
                "your-turn",
                _(
                    "Your turn: replace ... with the condition, then run the cell (as it is, it steps after every "
                    "micro-batch). Hint: exercises.first_loop.hint()"
                ),
            )
            return Verdict(False, finding.message, (finding,))
        verdict = super().judge(function)
        if not any(f.name in QUIET for f in verdict.findings):
            return verdict
        findings = [Finding(f.name, self._quiet(f)) if f.name in QUIET else f for f in verdict.findings]
        header = verdict.text.splitlines()[0]  # "Not yet: N problems."
        return Verdict(False, "\n".join([header, *(f"- {f.message}" for f in findings)]), tuple(findings))

    def _quiet(self, finding: Finding) -> str:
        k = self.problem.accum_steps
        micro_batches = self.problem.samples // self.problem.micro_batch_size
        return _(QUIET[finding.name]).format(
            steps=micro_batches, micro_batches=micro_batches, accum_steps=k, reference=micro_batches // k
        )


first_loop = FirstLoop()
