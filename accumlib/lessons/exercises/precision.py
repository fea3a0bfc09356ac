"""Exercises of lesson 8 on mixed precision: the AMP accumulation loop (the GradScaler works once per step) and
clipping after `unscale_`.

The checks run the learner's code with a float64 model under float16 autocast: autocast leaves float64 tensors
alone, so every gradient stays exact, while the GradScaler scales, unscales, checks and updates exactly as it does
in float16 training. Which scaler mistakes PyTorch catches and which run silently is measured in
`accumlib.lessons.pitfalls` (module docstring); the checks name each.
"""

from __future__ import annotations

import torch

from ...i18n import N_, _, ngettext
from .core import Finding
from .fingerprint import (
    CLOSE,
    EXACT,
    NO_GRAD,
    ZERO,
    Fingerprint,
    Problem,
    Reading,
    Recording,
    call_with,
    error_finding,
    loop_findings,
    loss_fn,
)
from .loops import LoopExercise

# What PyTorch's GradScaler raises, by the start of its message: (finding name, what it means)
SCALER_ERRORS = {
    "unscale_() has already been called": (
        "unscale-per-micro-batch",
        N_(
            "PyTorch stopped your loop at micro-batch {number}: scaler.unscale_() ran twice before scaler.update(). "
            "Unscale at most once per step, after the cycle's last backward() (scaler.step() unscales by itself)."
        ),
    ),
    "No inf checks were recorded prior to update": (
        "update-before-step",
        N_(
            "PyTorch stopped your loop at micro-batch {number}: scaler.update() ran before scaler.step() had checked "
            "the gradients for inf and NaN, as when it runs after every micro-batch. Call scaler.update() once per "
            "step, "
            "right after scaler.step(optimizer)."
        ),
    ),
    "step() has already been called since the last update()": (
        "update-missing",
        N_(
            "PyTorch stopped your loop at micro-batch {number}: scaler.step() ran again after scaler.step() without "
            "scaler.update() in between. Call scaler.update() once per step, right after scaler.step(optimizer)."
        ),
    ),
    "unscale_() is being called after step()": (
        "update-missing",
        N_(
            "PyTorch stopped your loop at micro-batch {number}: scaler.unscale_() ran after scaler.step() without "
            "scaler.update() in between. Call scaler.update() once per step, right after scaler.step(optimizer)."
        ),
    ),
    "No inf checks were recorded for this optimizer": (
        "zeroed-before-step",
        N_(
            "PyTorch stopped your code at micro-batch {number}: scaler.step() found no gradient to check, because "
            "optimizer.zero_grad() ran before it and removed them. Zero the gradients last, after "
            "scaler.step(optimizer) "
            "and scaler.update()."
        ),
    ),
    "Attempted step but _scale is None": (
        "loss-not-scaled",
        N_(
            "PyTorch stopped your loop at micro-batch {number}: scaler.step() ran, but scaler.scale() never did. "
            "Call scaler.scale(loss).backward() for every micro-batch."
        ),
    ),
}


def smallest_float16() -> float:
    """The smallest positive float16 number: a gradient below about half of it rounds to zero."""
    zero = torch.zeros((), dtype=torch.float16)
    return torch.nextafter(zero, torch.ones((), dtype=torch.float16)).item()


def clip(gradient: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The gradient as torch.nn.utils.clip_grad_norm_ leaves it (scaled down to norm max_norm if it is longer)."""
    return gradient * min(1.0, max_norm / (gradient.norm().item() + 1e-6))


def rescaled(fp: Fingerprint) -> tuple[Reading, float] | None:
    """The first step whose gradient is the right one times one factor (the same for every micro-batch of its cycle)
    other than 1 and accum_steps (the missing division): (its reading, the factor), or None."""
    ref = fp.reference
    if len(fp.readings) != len(ref.cycles):
        return None
    for reading, cycle in zip(fp.readings, ref.cycles, strict=True):
        counted = {j for j, c in reading.coefficients.items() if abs(c) > ZERO}
        if reading.residual > CLOSE or counted != set(cycle):
            continue
        ratios = [reading.share(j) / ref.weights[j] for j in cycle]
        uniform = all(abs(q - ratios[0]) <= CLOSE * abs(ratios[0]) for q in ratios)
        if uniform and abs(ratios[0] - 1) > CLOSE and abs(ratios[0] - ref.accum_steps) > CLOSE * ref.accum_steps:
            return reading, ratios[0]
    return None


def while_scaled(ratio: float, scale: float) -> bool:
    """Whether a gradient made `ratio` times smaller, all alike, was clipped while still multiplied by `scale`.

    Clipped to a norm c before unscale_, a gradient of norm n ends at c / scale, `ratio` = c / (n * scale); clipped
    after, it ends at c, `ratio` = c / n. Told apart at 1 / sqrt(scale) (1/256 at the scale's 65536), the two are
    mistaken for each other only for a clip after unscale_ to below n / 256 (0.003 at this problem's norms, 0.57 to
    0.80), or one before it to above 256 n (about 200), which leaves a true gradient alone."""
    return ratio < scale**-0.5


def _direct_step(number: int, seen, scale: float) -> Finding:
    """The finding for optimizer.step() called directly at step `number` instead of scaler.step(optimizer)."""
    message = (
        _(
            "optimizer.step() is called directly (step {step}): the gradient is unscaled, but a step with "
            "inf or NaN in it is not skipped, as scaler.step(optimizer) would skip it. Step with "
            "scaler.step(optimizer), then scaler.update()."
        )
        if seen.unscaled
        else _(
            "optimizer.step() is called directly (step {step}): it sees the gradient still multiplied by the "
            "scale ({scale:g}), and nothing checks it for inf or NaN. Step with scaler.step(optimizer), then "
            "scaler.update()."
        )
    )
    return Finding("optimizer-step-direct", message.format(step=number, scale=scale))


def scaler_findings(fp: Fingerprint) -> list[Finding]:
    """What the learner's code did wrong with the GradScaler, from its calls and the gradients the steps saw."""
    rec = fp.recording
    k = rec.problem.accum_steps
    steps_at = [position for method, position in rec.scaler_calls if method == "step"]
    if rec.error is not None and len(steps_at) >= 2 and steps_at[0] < k:
        return [
            Finding(
                "step-every-micro-batch",
                _(
                    "scaler.step(optimizer) runs after micro-batch {first} and again after micro-batch {second}, "
                    "before the "
                    "cycle of {accum_steps} is complete (PyTorch stops the second one: a step without scaler.update() "
                    "in "
                    "between). Step only when (step + 1) % accum_steps == 0: scaler.step(optimizer), then "
                    "scaler.update()."
                ).format(first=steps_at[0], second=steps_at[1], accum_steps=k),
            )
        ]
    direct = [(number, seen) for number, seen in enumerate(rec.steps, 1) if not seen.via_scaler]
    if rec.error is not None and direct and "step" not in [method for method, _position in rec.scaler_calls]:
        # PyTorch then stops scaler.update() ("No inf checks were recorded"), but the mistake is the direct step
        return [_direct_step(*direct[0], rec.scaler.get_scale())]
    if rec.error is not None:
        message = str(rec.error)
        for start, (name, text) in SCALER_ERRORS.items():
            if message.startswith(start):
                return [Finding(name, _(text).format(number=len(rec.forwards)))]
        return [error_finding(rec.error, len(rec.forwards))]
    calls = [method for method, position in rec.scaler_calls]
    scale = rec.scaler.get_scale()
    if "scale" not in calls and "step" not in calls and rec.own_scaler:
        return [
            Finding(
                "own-scaler",
                _(
                    "Your loop scales the loss with a GradScaler of its own, not with the scaler the check passes to "
                    "it: "
                    "make no GradScaler inside the loop (each new one starts again from the first scale, and on a "
                    "machine "
                    "without CUDA torch.amp.GradScaler() turns itself off). Use the parameter: "
                    "scaler.scale(loss).backward() "
                    "for every micro-batch, and once per step scaler.step(optimizer) and scaler.update()."
                ),
            )
        ]
    if "scale" not in calls and "step" not in calls:
        return [
            Finding(
                "scaler-unused",
                _(
                    "The GradScaler is never used. In float16, a gradient smaller than about half of {smallest:.1e} "
                    "(the "
                    "smallest float16 number) rounds to zero; "
                    "the scaler multiplies the loss by {scale:g} so that small gradients survive. Call "
                    "scaler.scale(loss).backward() for every micro-batch, and once per step scaler.step(optimizer) and "
                    "scaler.update() instead of optimizer.step()."
                ).format(smallest=smallest_float16(), scale=scale),
            )
        ]
    findings = []
    micro_batches = len([j for j in rec.forwards if j >= 0])
    if calls.count("scale") < micro_batches:
        findings.append(
            Finding(
                "loss-not-scaled",
                _(
                    "scaler.scale() ran for {scaled} of the {micro_batches} micro-batches: the gradient of a loss that "
                    "is not "
                    "scaled is divided by the scale ({scale:g}) all the same at the step, so it counts {scale:g} times "
                    "too "
                    "little. Call scaler.scale(loss).backward() for every micro-batch."
                ).format(scaled=calls.count("scale"), micro_batches=micro_batches, scale=scale),
            )
        )
    if direct:
        findings.append(_direct_step(*direct[0], scale))
    steps = len(rec.steps)
    if calls.count("update") > steps:
        first = fp.readings[0]
        full = fp.full_batch_gradient(fp.reference.cycle_of(first.last))
        findings.append(
            Finding(
                "update-per-micro-batch",
                ngettext(
                    "scaler.update() runs after every micro-batch ({updates} times for {steps} step). Each "
                    "scaler.unscale_() "
                    "then divides the part of the gradient it already unscaled by the scale again, so step 1's "
                    "gradient is "
                    "{ratio:.1e} times the right one, silently, and the scale adapts after every micro-batch instead "
                    "of once "
                    "per step. Call scaler.unscale_() (if you need it) and scaler.update() once per step.",
                    "scaler.update() runs after every micro-batch ({updates} times for {steps} steps). Each "
                    "scaler.unscale_() "
                    "then divides the part of the gradient it already unscaled by the scale again, so step 1's "
                    "gradient is "
                    "{ratio:.1e} times the right one, silently, and the scale adapts after every micro-batch instead "
                    "of once "
                    "per step. Call scaler.unscale_() (if you need it) and scaler.update() once per step.",
                    steps,
                ).format(
                    updates=calls.count("update"), steps=steps, ratio=(first.gradient.norm() / full.norm()).item()
                ),
            )
        )
    elif "step" in calls and calls.count("update") < steps:
        findings.append(
            Finding(
                "update-missing",
                ngettext(
                    "scaler.update() ran {updates} times for {steps} optimizer step: call it once per step, right "
                    "after "
                    "scaler.step(optimizer).",
                    "scaler.update() ran {updates} times for {steps} optimizer steps: call it once per step, right "
                    "after "
                    "scaler.step(optimizer).",
                    steps,
                ).format(updates=calls.count("update"), steps=steps),
            )
        )
    return findings


class AmpLoop(LoopExercise):
    lesson, name = 8, "amp_loop"
    problem = Problem(samples=36, micro_batch_size=4, accum_steps=3)
    parameters = ("model", "optimizer", "scaler", "loader", "loss_fn", "accum_steps")
    amp = True
    stub = """\
def accumulate(model, optimizer, scaler, loader, loss_fn, accum_steps):
    # The loop of lesson 3 in float16 autocast; the GradScaler `scaler` is not used yet.
    for step, (x, y) in enumerate(loader):
        with torch.autocast(x.device.type, dtype=torch.float16):  # on the device x is on
            loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()


exercises.amp_loop.check(accumulate)
"""
    solution_code = """\
def accumulate(model, optimizer, scaler, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        with torch.autocast(x.device.type, dtype=torch.float16):  # on the device x is on
            loss = loss_fn(model(x), y) / accum_steps
        scaler.scale(loss).backward()  # every micro-batch: scaled, so small float16 gradients survive
        if (step + 1) % accum_steps == 0:  # once per step:
            scaler.step(optimizer)  # unscale, check for inf/NaN, step
            scaler.update()  # adapt the scale
            optimizer.zero_grad()


exercises.amp_loop.check(accumulate)
"""
    hint_text = N_(
        "Scale every micro-batch's loss: scaler.scale(loss).backward(). Everything else the scaler does "
        "belongs to the optimizer step, once per cycle: scaler.step(optimizer), then scaler.update(), then "
        "optimizer.zero_grad()."
    )

    def reference(self) -> dict:
        return {"amp": "fp16"}

    def findings(self, fp: Fingerprint) -> list[Finding]:
        scaler = scaler_findings(fp)
        rec = fp.recording
        if rec.error is not None:
            return scaler
        outside = [
            number
            for number, (dtype, j) in enumerate(zip(rec.autocast, rec.forwards, strict=True), 1)
            if dtype is None and j != NO_GRAD
        ]  # an evaluation under no_grad may run in any precision
        if outside:
            scaler.append(
                Finding(
                    "no-autocast",
                    ngettext(
                        "Model call {first} ran outside torch.autocast: in float32 or float64 the GradScaler has "
                        "nothing to "
                        "protect, and the step is not mixed precision. Run each micro-batch's forward pass and loss "
                        "inside "
                        "with torch.autocast(x.device.type, dtype=torch.float16): (autocast on the device the tensors "
                        "are "
                        "on).",
                        "{count} of the {calls} model calls ran outside torch.autocast (the first: call {first}): in "
                        "float32 "
                        "or float64 the GradScaler has nothing to protect, and the step is not mixed precision. Run "
                        "each "
                        "micro-batch's forward pass and loss inside with torch.autocast(x.device.type, "
                        "dtype=torch.float16): (autocast on the device the tensors are on).",
                        len(outside),
                    ).format(count=len(outside), calls=len(rec.autocast), first=outside[0]),
                )
            )
        explained = bool(
            {"loss-not-scaled", "optimizer-step-direct", "update-per-micro-batch"} & {f.name for f in scaler}
        )
        if not explained:
            found = rescaled(fp)
            if found is not None:
                reading, ratio = found
                scale = rec.scaler.get_scale()
                if abs(ratio * scale - 1) <= 1e-6:
                    scaler.append(
                        Finding(
                            "scale-not-backpropagated",
                            _(
                                "Every micro-batch counts 1/{scale:g} of its share at step {step}: backward() ran on "
                                "the loss "
                                "itself, not on the scaled loss, and scaler.step() then divides the gradient by the "
                                "scale "
                                "({scale:g}). Call backward() on what scaler.scale(loss) returns: "
                                "scaler.scale(loss).backward()."
                            ).format(scale=scale, step=reading.number),
                        )
                    )
                else:
                    scaler.append(
                        Finding(
                            "gradient-rescaled",
                            _(
                                "At step {step} every micro-batch counts {ratio:.3g} times its share, all alike: the "
                                "loss "
                                "weights are right, but the whole gradient was made smaller between the cycle's last "
                                "backward() and the step: clipping does that ({cause}). This task does not clip: leave "
                                "the "
                                "gradient as backward() made it."
                            ).format(
                                step=reading.number,
                                ratio=ratio,
                                cause=_(
                                    "while still scaled, before scaler.unscale_(), it cuts the gradient {scale:g} "
                                    "times too far"
                                ).format(scale=scale)
                                if while_scaled(ratio, scale)
                                else _("after scaler.unscale_(), to a norm the task did not ask for"),
                            ),
                        )
                    )
                explained = True
        return scaler + loop_findings(fp, contributions=not explained, weights=not explained)


class ClipAfterUnscale(LoopExercise):
    lesson, name = 8, "clip_after_unscale"
    problem = Problem(samples=36, micro_batch_size=4, accum_steps=3)
    # between this problem's cycle norms (0.80, 0.74, 0.65): clipping acts at steps 1 and 2 and leaves step 3 alone, so
    # both a missing clip and one that scales every gradient to max_norm show on this problem
    max_norm = 0.7
    parameters = ("model", "optimizer", "scaler", "max_norm")
    answer = ("optimizer_step",)
    amp = True
    stub = """\
def optimizer_step(model, optimizer, scaler, max_norm):
    # Runs once per cycle, after the cycle's last scaler.scale(loss).backward(). Clip to max_norm, then step.
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


exercises.clip_after_unscale.check(optimizer_step)
"""
    solution_code = """\
def optimizer_step(model, optimizer, scaler, max_norm):
    scaler.unscale_(optimizer)  # the true gradient, once per step
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clip the true gradient
    scaler.step(optimizer)  # knows the gradient is unscaled already
    scaler.update()
    optimizer.zero_grad()


exercises.clip_after_unscale.check(optimizer_step)
"""
    hint_text = N_(
        "Until scaler.unscale_(optimizer) runs, every gradient is multiplied by the scale. Unscale first, "
        "then clip, then scaler.step(optimizer) and scaler.update()."
    )

    def variant(self) -> ClipAfterUnscale:
        other = super().variant()
        other.max_norm = 0.55  # below both cycles' norms there (0.575, 0.571): a clip at 0.7 written in does not pass
        return other

    def setting(self) -> str:
        return _("max_norm = {max_norm:g}, accum_steps = {accum_steps}").format(
            max_norm=self.max_norm, accum_steps=self.problem.accum_steps
        )

    def run(self, optimizer_step, recording: Recording) -> None:
        """The right AMP accumulation loop, calling the learner's optimizer_step at the end of every cycle."""
        k = self.problem.accum_steps
        for step, (x, y) in enumerate(recording.loader):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(recording.model(x), y) / k
            recording.scaler.scale(loss).backward()
            if (step + 1) % k == 0:
                call_with(optimizer_step, self.arguments(recording))

    def arguments(self, recording: Recording) -> dict:
        return dict(
            model=recording.model, optimizer=recording.optimizer, scaler=recording.scaler, max_norm=self.max_norm
        )

    def reference(self) -> dict:
        return {"amp": "fp16", "clip_grad_norm": self.max_norm}

    @staticmethod
    def clip_tolerance(full: torch.Tensor) -> float:
        """How far a right clip may be from clip(): clip_grad_norm_ adds 1e-6 to the norm it divides by, in the units
        it clips in, so clipping the scaled gradient at max_norm x scale (valid) differs by up to 1e-6 / |g| of it."""
        return EXACT + 2e-6 / full.norm().item()

    def weight_tolerance(self) -> float:
        """That clip difference, at most 2e-6 / 0.5 of a step of norm max_norm (the cycles' norms are 0.57 or more
        in both problems), for each of the steps, at the learning rate."""
        steps = len(self.problem.loader()) // self.problem.accum_steps
        return EXACT + steps * self.problem.lr * self.max_norm * 2e-6 / 0.5

    def findings(self, fp: Fingerprint) -> list[Finding]:
        scaler = scaler_findings(fp)
        if fp.recording.error is not None or scaler:
            return scaler
        findings = loop_findings(fp, weights=False)
        if findings:
            return findings
        scale = fp.recording.scaler.get_scale()
        for reading, cycle in zip(fp.readings, fp.reference.cycles, strict=True):
            full = fp.full_batch_gradient(cycle)
            clipped = clip(full, self.max_norm)
            norm = reading.gradient.norm().item()
            if (reading.gradient - clipped).abs().max().item() <= self.clip_tolerance(full):
                continue
            if abs(norm - self.max_norm / scale) <= 1e-6 * self.max_norm / scale:
                return [
                    Finding(
                        "clipped-scaled",
                        _(
                            "The gradient was clipped while still scaled: before scaler.unscale_() it is {scale:g} "
                            "times too "
                            "large, so clip_grad_norm_ cut it to norm {max_norm:g}, and the step then unscaled it to "
                            "norm "
                            "{norm:.2e}, {scale:g} times too small. Call scaler.unscale_(optimizer) before clipping."
                        ).format(scale=scale, max_norm=self.max_norm, norm=norm),
                    )
                ]
            if full.norm().item() < self.max_norm and abs(norm - self.max_norm) <= 1e-6 * self.max_norm:
                return [
                    Finding(
                        "clipped-up",
                        _(
                            "At step {step} the accumulated gradient has norm {full:.3g}, already below max_norm = "
                            "{max_norm:g}: clipping leaves such a gradient as it is, but the optimizer saw it scaled "
                            "up to "
                            "norm {norm:.3g}. Scale a gradient only when it is longer than max_norm: "
                            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) does that by itself."
                        ).format(step=reading.number, full=full.norm().item(), max_norm=self.max_norm, norm=norm),
                    )
                ]
            if abs(norm - full.norm().item()) <= 1e-6 * norm:
                return [
                    Finding(
                        "not-clipped",
                        _(
                            "The gradient reaching step {step} has norm {norm:.3g}: it was not clipped to max_norm = "
                            "{max_norm:g} before the step. Between scaler.unscale_(optimizer) and "
                            "scaler.step(optimizer), "
                            "call torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)."
                        ).format(step=reading.number, norm=norm, max_norm=self.max_norm),
                    )
                ]
            return [
                Finding(
                    "clipped-wrong",
                    _(
                        "At step {step} the optimizer sees a gradient of norm {norm:.6g}; the accumulated gradient "
                        "clipped to "
                        "max_norm = {max_norm:g} has norm {expected:.6g}. Clip the unscaled gradient: "
                        "scaler.unscale_(optimizer), then torch.nn.utils.clip_grad_norm_(model.parameters(), "
                        "max_norm)."
                    ).format(step=reading.number, norm=norm, max_norm=self.max_norm, expected=clipped.norm().item()),
                )
            ]
        return []

    def confirmation(self, fp: Fingerprint, weight_gap: float) -> str:
        return _(
            "At each of the {steps} steps the optimizer saw the unscaled gradient clipped to norm {max_norm:g} "
            "(largest difference from the reference {gradient_gap:.1e}). Trained for real at learning rate "
            '{lr:g}, your weights match accumlib.train(amp="fp16", clip_grad_norm={max_norm:g})\'s (largest '
            "difference {weight_gap:.1e})."
        ).format(
            steps=len(fp.readings),
            max_norm=self.max_norm,
            lr=self.problem.lr,
            weight_gap=weight_gap,
            gradient_gap=max(
                (r.gradient - clip(fp.full_batch_gradient(c), self.max_norm)).abs().max().item()
                for r, c in zip(fp.readings, fp.reference.cycles, strict=True)
            ),
        )


amp_loop = AmpLoop()
clip_after_unscale = ClipAfterUnscale()
