"""Exercises on the loop itself: scale the micro-batch loss (lesson 2), write the loop (lesson 3), handle the last,
incomplete cycle (lesson 4). Each runs the learner's code on a tiny float64 model against the exact reference and
reads the bug off the gradients (see fingerprint.py).
"""

from __future__ import annotations

import copy
from typing import Callable

import torch

from ...i18n import N_, _
from .core import Exercise, Finding, Verdict, explained, right, wrong
from .fingerprint import (
    EXACT,
    Fingerprint,
    Problem,
    Recording,
    call_with,
    error_finding,
    frozen_finding,
    loop_findings,
    loss_fn,
    trained_gap,
)


def not_a_function(name: str) -> Verdict:
    """The verdict when check() gets something other than the learner's function `name`."""
    return wrong(
        [
            Finding(
                "not-a-function",
                _("check() needs your function itself: pass {name} without calling it, as in check({name}).").format(
                    name=name
                ),
            )
        ]
    )


class ScaleLoss(Exercise):
    lesson, name, answer = 2, "scale_loss", ("scale_loss",)
    problem = Problem(samples=12, micro_batch_size=3, accum_steps=4)
    stub = """\
def scale_loss(loss, accum_steps):
    return loss  # scale it so that the accum_steps micro-batch gradients add up to the full-batch gradient


exercises.scale_loss.check(scale_loss)
"""
    solution_code = """\
def scale_loss(loss, accum_steps):
    return loss / accum_steps  # each of the accum_steps equal micro-batches is 1/accum_steps of the batch


exercises.scale_loss.check(scale_loss)
"""
    hint_text = N_(
        "The full-batch loss is the mean over all its samples: with accum_steps equal micro-batches, it is "
        "the mean of their accum_steps mean losses, so each micro-batch's loss counts 1/accum_steps."
    )

    # the same function must be right for every accum_steps, not just the lesson's 4
    other_problems = (
        Problem(samples=12, micro_batch_size=4, accum_steps=3),
        Problem(samples=12, micro_batch_size=2, accum_steps=6),
    )
    hang_text = N_("scale_loss only scales one loss: it needs no loop. Look for a while loop that never ends.")

    def accumulate(self, scale_loss, problem: Problem) -> tuple[torch.Tensor, torch.Tensor] | Finding:
        """Backward each scale_loss(micro-batch loss, k) of problem: (accumulated gradient, full-batch gradient),
        or the finding that says why that could not be done."""
        k = problem.accum_steps
        X, y = problem.data()
        model = problem.model()
        params = list(model.parameters())
        full = torch.cat([g.flatten() for g in torch.autograd.grad(loss_fn(model(X), y), params)])

        def gradient() -> torch.Tensor:
            return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])

        for xs, ys in zip(X.split(problem.micro_batch_size), y.split(problem.micro_batch_size), strict=True):
            before = gradient()
            try:
                scaled = call_with(scale_loss, {"loss": loss_fn(model(xs), ys), "accum_steps": k})
            except Exception as error:  # the learner's code
                return error_finding(error)
            if not torch.equal(gradient(), before):
                return Finding(
                    "backward-inside",
                    _(
                        "scale_loss calls backward() itself: it must only return the scaled loss. The loop calls "
                        "backward() on what scale_loss returns, so with it inside, each micro-batch's gradient is "
                        "added "
                        "twice. Remove loss.backward() from scale_loss."
                    ),
                )
            if not isinstance(scaled, torch.Tensor):
                return Finding(
                    "not-a-tensor",
                    _(
                        "scale_loss returned {kind}, not a tensor: backward() needs the loss tensor itself "
                        "(loss / accum_steps, not loss.item() / accum_steps)."
                    ).format(kind=type(scaled).__name__),
                )
            if scaled.dim() != 0 or not scaled.requires_grad or scaled.grad_fn is None:
                return Finding(
                    "detached",
                    _(
                        "scale_loss must return one number still connected to the model (a tensor of shape (), with a "
                        "gradient flowing through it); keep the loss as it is, without .detach(), .item() or "
                        "indexing."
                    ),
                )
            try:
                scaled.backward()
            except RuntimeError as error:  # a graph the learner's code already used up, or cut
                return explained(error) or error_finding(error)
        return gradient(), full

    def judge(self, scale_loss) -> Verdict:
        """Split 12 samples into 4 micro-batches of 3, backward() each scale_loss(loss, 4), compare the sum; then
        the same with accum_steps 3 and 6."""
        if not callable(scale_loss):
            return not_a_function("scale_loss")
        problem, k = self.problem, self.problem.accum_steps
        result = self.accumulate(scale_loss, problem)
        if isinstance(result, Finding):
            return wrong([result])
        accumulated, full = result
        gap = (accumulated - full).abs().max().item()
        if gap <= EXACT:
            for other in self.other_problems:
                result = self.accumulate(scale_loss, other)
                if isinstance(result, Finding):
                    return wrong([result])
                there, there_full = result
                if (there - there_full).abs().max().item() > EXACT:
                    ratio = (there @ there_full / (there_full @ there_full)).item()
                    return wrong(
                        [
                            Finding(
                                "not-general",
                                _(
                                    "Right for accum_steps = {accum_steps}, but with accum_steps = {other} the "
                                    "micro-batch "
                                    "gradients add up to {ratio:.3g} times the full-batch gradient: divide by the "
                                    "parameter "
                                    "accum_steps, not by the number {accum_steps}."
                                ).format(accum_steps=k, other=other.accum_steps, ratio=ratio),
                            )
                        ]
                    )
            return right(
                _(
                    "The {accum_steps} scaled micro-batch gradients add up to the full-batch gradient of the "
                    "{samples} samples (largest difference {gap:.1e}), and so they do with accum_steps = {one} "
                    "and {two}."
                ).format(
                    accum_steps=k,
                    samples=problem.samples,
                    gap=gap,
                    one=self.other_problems[0].accum_steps,
                    two=self.other_problems[1].accum_steps,
                )
            )
        if accumulated.abs().max().item() == 0:
            return wrong(
                [
                    Finding(
                        "no-gradient",
                        _(
                            "After backward() on what scale_loss returned, every gradient is zero: the loss it returns "
                            "does not "
                            "depend on the model's weights. Return loss / accum_steps."
                        ),
                    )
                ]
            )
        ratio = (accumulated @ full / (full @ full)).item()
        residual = ((accumulated - ratio * full).norm() / accumulated.norm()).item()
        if residual > 1e-6:
            return wrong(
                [
                    Finding(
                        "not-proportional",
                        _(
                            "The accumulated gradient is not a multiple of the full-batch gradient (the best multiple "
                            "misses "
                            "{residual:.1%} of it): scale every micro-batch's loss the same way."
                        ).format(residual=residual),
                    )
                ]
            )
        if abs(ratio - k) <= 1e-6 * k:
            return wrong(
                [
                    Finding(
                        "missing-division",
                        _(
                            "The {accum_steps} micro-batch gradients add up to {ratio:.3g} times the full-batch "
                            "gradient: the loss "
                            "is not divided by accum_steps. With SGD, that is like a learning rate {ratio:.3g} times "
                            "too "
                            "high."
                        ).format(accum_steps=k, ratio=ratio),
                    )
                ]
            )
        return wrong(
            [
                Finding(
                    "wrong-scale",
                    _(
                        "The {accum_steps} micro-batch gradients add up to {ratio:.3g} times the full-batch gradient; "
                        "they must "
                        "add up to exactly 1 times it. Each of the {accum_steps} equal micro-batches is "
                        "1/{accum_steps} of the "
                        "batch: return loss / accum_steps."
                    ).format(accum_steps=k, ratio=ratio),
                )
            ]
        )


class LoopExercise(Exercise):
    """The learner writes an accumulation loop; check() reads its fingerprint and confirms a right one by training."""

    problem: Problem
    parameters: tuple[str, ...] = ("model", "optimizer", "loader", "loss_fn", "accum_steps")
    answer = ("accumulate",)
    amp = ddp = False

    def arguments(self, recording: Recording) -> dict:
        everything = dict(
            model=recording.model,
            optimizer=recording.optimizer,
            scaler=recording.scaler,
            loader=recording.loader,
            loss_fn=loss_fn,
            accum_steps=self.problem.accum_steps,
            epochs=self.problem.epochs,
        )
        return {name: everything[name] for name in self.parameters}

    def run(self, function, recording: Recording) -> None:
        """Run the learner's function on the recording's model, optimizer, loader (and scaler)."""
        call_with(function, self.arguments(recording))

    def reference(self) -> dict:
        """Keyword arguments that make accumlib.train do what a right answer does."""
        return {}

    def weight_tolerance(self) -> float:
        """Largest weight difference from accumlib.train's that a right answer may leave: float64 rounding."""
        return EXACT

    def findings(self, fp: Fingerprint) -> list[Finding]:
        return error_or(fp, lambda: loop_findings(fp))

    # a second problem the same function must get right: another accum_steps (and sizes), so that a loop with the
    # first problem's numbers written in does not pass
    other_problem = Problem(samples=32, micro_batch_size=4, accum_steps=4)

    def variant(self) -> LoopExercise:
        """This exercise on its other problem."""
        other = copy.copy(self)
        other.problem = self.other_problem
        return other

    def setting(self) -> str:
        """The problem's numbers, as the learner's function gets them."""
        return _("accum_steps = {accum_steps}, {samples} samples in micro-batches of {micro}").format(
            accum_steps=self.problem.accum_steps, samples=self.problem.samples, micro=self.problem.micro_batch_size
        )

    def judge(self, function) -> Verdict:
        if not callable(function):
            return not_a_function(self.answer[0])
        verdict = self.judge_on(function)
        if not verdict.correct:
            return verdict
        other = self.variant()
        again = other.judge_on(function)
        if not again.correct:
            return wrong(
                [
                    Finding(
                        "not-general",
                        _(
                            "Right on the first problem ({setting}), but not on a second one ({other}): {problem} Use "
                            "the "
                            "parameters your function gets, not numbers copied from the first problem."
                        ).format(setting=self.setting(), other=other.setting(), problem=again.findings[0].message),
                    )
                ]
            )
        return verdict

    def judge_on(self, function) -> Verdict:
        """The verdict on this exercise's problem alone."""

        def call(recording):
            return self.run(function, recording)

        recording = Recording(self.problem, amp=self.amp, ddp=self.ddp).run(call)
        frozen = frozen_finding(recording.module)  # said as it is, not as the error backward() then raises
        if frozen is not None:
            return wrong([frozen])
        fp = Fingerprint(recording)
        findings = self.findings(fp)
        if findings:
            return wrong(findings)
        weight_gap, error = trained_gap(self.problem, call, self.reference(), amp=self.amp, ddp=self.ddp)
        if error is not None:
            return wrong([error_finding(error)])
        if weight_gap > self.weight_tolerance():
            return wrong(
                [
                    Finding(
                        "training-differs",
                        _(
                            "At learning rate 0 every step's gradient is right, but trained for real at learning rate "
                            "{lr:g} "
                            "your weights differ from accumlib.train's by up to {gap:.2e}: the loop must do the same "
                            "whatever "
                            "the weights are."
                        ).format(lr=self.problem.lr, gap=weight_gap),
                    )
                ]
            )
        return right(self.confirmation(fp, weight_gap))

    def confirmation(self, fp: Fingerprint, weight_gap: float) -> str:
        return _(
            "{steps} optimizer steps for {micro_batches} micro-batches, and each step's gradient equals the "
            "full-batch gradient of its cycle (largest difference {gradient_gap:.1e}). Trained for real at "
            "learning rate {lr:g}, your weights match accumlib.train's (largest difference "
            "{weight_gap:.1e})."
        ).format(
            steps=len(fp.readings),
            micro_batches=len(fp.reference.sizes),
            gradient_gap=fp.gradient_gap(),
            lr=self.problem.lr,
            weight_gap=weight_gap,
        )


def error_or(fp: Fingerprint, findings: Callable[[], list[Finding]]) -> list[Finding]:
    """What the learner's code raised, if it raised; otherwise findings()."""
    rec = fp.recording
    return [error_finding(rec.error, len(rec.forwards))] if rec.error is not None else findings()


class TheLoop(LoopExercise):
    lesson, name = 3, "the_loop"
    problem = Problem(samples=36, micro_batch_size=4, accum_steps=3)  # 9 micro-batches, 3 full cycles
    stub = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    # The ordinary training loop: one step per batch. Turn it into gradient accumulation.
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


exercises.the_loop.check(accumulate)
"""
    solution_code = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps  # each micro-batch is 1/accum_steps of the batch
        loss.backward()  # adds into .grad
        if (step + 1) % accum_steps == 0:  # the cycle is complete
            optimizer.step()
            optimizer.zero_grad()  # once per cycle, after the step


exercises.the_loop.check(accumulate)
"""
    hint_text = N_(
        "Divide each micro-batch's loss by accum_steps before backward(), and call optimizer.step() and "
        "then optimizer.zero_grad() only when (step + 1) % accum_steps == 0."
    )


class LastCycle(LoopExercise):
    lesson, name = 4, "last_cycle"
    # 22 samples in micro-batches of 3: 7 of 3 and one of 1 per epoch; cycles of 3 micro-batches leave a last cycle
    # of two micro-batches (3 and 1 samples), so dividing by accum_steps, or by the micro-batches, is visibly wrong.
    problem = Problem(samples=22, micro_batch_size=3, accum_steps=3, epochs=2)
    other_problem = Problem(samples=26, micro_batch_size=3, accum_steps=4, epochs=2)  # a last cycle of 1 (2 samples)
    parameters = ("model", "optimizer", "loader", "loss_fn", "accum_steps", "epochs")
    stub = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps, epochs):
    # Each epoch is cut into cycles of accum_steps micro-batches, and every cycle is stepped, the short last one too.
    # Each loss is still divided by accum_steps: how much does the short cycle's step then count?
    for epoch in range(epochs):
        micro_batches = list(loader)  # this epoch's micro-batches
        for first in range(0, len(micro_batches), accum_steps):
            cycle = micro_batches[first:first + accum_steps]  # the last cycle may be shorter
            for x, y in cycle:
                loss = loss_fn(model(x), y) / accum_steps
                loss.backward()
            optimizer.step()  # after every cycle, the short one included
            optimizer.zero_grad()


exercises.last_cycle.check(accumulate)
"""
    solution_code = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps, epochs):
    for epoch in range(epochs):
        micro_batches = list(loader)  # this epoch's micro-batches
        for first in range(0, len(micro_batches), accum_steps):
            cycle = micro_batches[first:first + accum_steps]  # the last cycle may be shorter
            samples = sum(len(y) for x, y in cycle)
            for x, y in cycle:
                loss = loss_fn(model(x), y) * len(y) / samples  # its share of the cycle's samples
                loss.backward()
            optimizer.step()  # after every cycle, the short one included
            optimizer.zero_grad()


exercises.last_cycle.check(accumulate)
"""
    hint_text = N_(
        "Count the samples of each cycle (the len(y) of its micro-batches, added up) and multiply each "
        "micro-batch's loss by len(y) / that count instead of dividing it by accum_steps: the weights of "
        "every cycle, the short one too, then add up to 1."
    )


scale_loss = ScaleLoss()
the_loop = TheLoop()
last_cycle = LastCycle()
