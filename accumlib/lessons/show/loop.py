"""Lesson 3, the loop: a hand-written loop against `accumlib.train`, the loop with a line in the wrong place, and which
micro-batches a step condition steps after; for lesson 0, the two places to zero the gradients (`zeroing_places`)."""

from __future__ import annotations

import copy
import itertools
from typing import Mapping, Sequence

import torch

from ...i18n import N_, _, ngettext
from ...gaps import parameter_gap
from ...records import History
from ..pitfalls import ClassicStep, classic_train
from ._format import FLOAT64_ROUNDING as ROUNDING, print_table, rounding_or_gap

# pitfalls.classic_train's switches for a misplaced line ("" for none), as the table names them
MISTAKES = {
    "": N_("the six-line loop"),
    "zero_every_micro_batch": N_("zero_grad() before every backward()"),
    "step_every_micro_batch": N_("step() after every micro-batch"),
    "divide": N_("no division"),
}


def _say_gap(gap: float, exact: str, rounding: str, different: str) -> None:
    """Print which of three catalogue messages (marked N_) a weight difference calls for: none at all, float64
    rounding (at most ROUNDING) or a different computation. A different computation gets the difference as {gap};
    rounding gets the bound it passed, since a rounding difference's digits depend on the CPU and the threads."""
    print(
        _(exact) if gap == 0 else _(rounding).format(gap=ROUNDING) if gap <= ROUNDING else _(different).format(gap=gap)
    )


def same_weights(hand_written: torch.nn.Module, library: torch.nn.Module, history: History) -> float:
    """A hand-written loop's model against the same run with `accumlib.train` (its model and History): the largest
    weight difference, and what the history recorded. Returns that difference."""
    if not len(history):
        raise ValueError(_("history holds no optimizer step"))
    gap = parameter_gap(hand_written, library)
    _say_gap(
        gap,
        N_("The hand-written loop and accumlib.train end with exactly the same weights, bit for bit."),
        N_(
            "The hand-written loop and accumlib.train end with the same weights: they differ by at most {gap:.1e} "
            "(float64 rounding)."
        ),
        N_("The hand-written loop and accumlib.train end with different weights: they differ by up to {gap:.2e}."),
    )
    layouts = sorted({(record.micro_batches, record.samples) for record in history})
    if len(layouts) == 1:
        print(
            ngettext(
                "accumlib.train recorded {steps} optimizer step of {micro_batches} micro-batches and {samples} "
                "samples; the loss went from {first:.3f} to {last:.3f}.",
                "accumlib.train recorded {steps} optimizer steps, each of {micro_batches} micro-batches and "
                "{samples} samples; the loss went from {first:.3f} to {last:.3f}.",
                len(history),
            ).format(
                steps=len(history),
                micro_batches=layouts[0][0],
                samples=layouts[0][1],
                first=history[0].loss,
                last=history[-1].loss,
            )
        )
    else:
        print(
            ngettext(
                "accumlib.train recorded {steps} optimizer step; the loss went from {first:.3f} to {last:.3f}.",
                "accumlib.train recorded {steps} optimizer steps; the loss went from {first:.3f} to {last:.3f}.",
                len(history),
            ).format(steps=len(history), first=history[0].loss, last=history[-1].loss)
        )
    return gap


def misplaced(
    runs: Mapping[str, tuple[torch.nn.Module, Sequence[ClassicStep]]], reference: torch.nn.Module, accum_steps: int
) -> dict[str, float]:
    """Runs of `pitfalls.classic_train` with one mistake each, against a correct run's model (`reference`).

    runs: the switch that was on ("" for none, "zero_every_micro_batch", "step_every_micro_batch", "divide" for
    divide=False) -> (the trained model, the ClassicStep records its on_step received). Prints per run the optimizer
    steps, how many micro-batches each step's gradient held, and the largest weight difference from the reference;
    then what each mistake did. Returns run -> weight difference."""
    unknown = sorted(set(runs) - set(MISTAKES))
    if unknown:
        raise ValueError(
            _(
                "runs: unknown mistakes {unknown}; name each run by its classic_train switch, one of {valid} ('' for "
                "none)"
            ).format(unknown=unknown, valid=sorted(MISTAKES))
        )
    gaps, rows = {}, []
    for name, (model, steps) in runs.items():
        if not steps:
            raise ValueError(
                _("runs[{name!r}]: no optimizer step was recorded; pass on_step=steps.append").format(name=name)
            )
        gaps[name] = parameter_gap(model, reference)
        held = sorted({step.micro_batches for step in steps})
        rows.append(
            [
                _(MISTAKES[name]),
                len(steps),
                ", ".join(map(str, held)),
                f"{0:.1e}" if gaps[name] == 0 else rounding_or_gap(gaps[name], ROUNDING),
            ]
        )
    print_table(
        [
            _("loop"),
            _("optimizer steps"),
            _("micro-batches in a step's gradient"),
            _("weight difference from accumlib.train"),
        ],
        rows,
    )
    for name, (_model, steps) in runs.items():
        held = max(step.micro_batches for step in steps)
        if gaps[name] == 0:
            continue  # exactly the same weights: its row (0.0e+00) says so, a line would repeat it
        if gaps[name] <= ROUNDING:
            print(
                _("{loop}: the weights of accumlib.train, up to rounding (at most {gap:.1e}).").format(
                    loop=_(MISTAKES[name]), gap=ROUNDING
                )
            )
        elif held < accum_steps:
            print(
                ngettext(
                    "{loop}: every step's gradient holds {held} micro-batch, not {accum_steps}: {steps} steps, "
                    "weights off by {gap:.2f}.",
                    "{loop}: every step's gradient holds at most {held} micro-batches, not {accum_steps}: "
                    "{steps} steps, weights off by {gap:.2f}.",
                    held,
                ).format(loop=_(MISTAKES[name]), held=held, accum_steps=accum_steps, steps=len(steps), gap=gaps[name])
            )
        else:
            print(
                _(
                    "{loop}: every step holds its {accum_steps} micro-batches, yet the weights are off by {gap:.2f}."
                ).format(loop=_(MISTAKES[name]), accum_steps=accum_steps, gap=gaps[name])
            )
    return gaps


def step_schedule(steps_at: Mapping[str, Sequence[int]], micro_batches: int, accum_steps: int) -> dict[str, list[int]]:
    """Which micro-batches a step condition steps after, and what each step holds.

    steps_at: the condition's code -> the values of `step` (micro-batches counted from 0) at which it is true;
    micro_batches: how many micro-batches the epoch has. With the gradients zeroed right after every step, a step
    holds the micro-batches since the one before. Prints a table (micro-batches counted from 1, as a person counts)
    and, per condition that goes wrong (the table alone shows a right one), a first step that does not hold
    accum_steps micro-batches and what is not stepped in this epoch
    (zeroed only after a step, those micro-batches join the next epoch's first step; only after the last epoch are
    they never applied). Returns
    condition -> micro-batches per step."""
    held_by = {}
    rows = []
    for condition, steps in steps_at.items():
        steps = list(steps)
        if any(not 0 <= s < micro_batches for s in steps) or steps != sorted(set(steps)):
            raise ValueError(
                _("steps_at[{condition!r}] must list increasing step values from 0 to {last}, got {steps}").format(
                    condition=condition, last=micro_batches - 1, steps=steps
                )
            )
        held = [now - before for before, now in itertools.pairwise([-1, *steps])]
        left = micro_batches - 1 - steps[-1] if steps else micro_batches
        held_by[condition] = held
        rows.append([condition, ", ".join(str(s + 1) for s in steps), ", ".join(map(str, held)), left])
    print_table(
        [_("condition"), _("steps after micro-batch"), _("micro-batches per step"), _("not stepped in this epoch")],
        rows,
    )
    for condition, held in held_by.items():
        left = micro_batches - sum(held)
        if held and held[0] != accum_steps:
            print(
                ngettext(
                    "{condition}: the first step comes after {first} micro-batch, not {accum_steps}.",
                    "{condition}: the first step comes after {first} micro-batches, not {accum_steps}.",
                    held[0],
                ).format(condition=condition, first=held[0], accum_steps=accum_steps)
            )
        if left:
            print(
                ngettext(
                    "{condition}: the last micro-batch gets no step in this epoch: it joins the next epoch's "
                    "first step (lesson 4); only after the last epoch is it never applied.",
                    "{condition}: the last {left} micro-batches get no step in this epoch: they join the next "
                    "epoch's first step (lesson 4); only after the last epoch are they never applied.",
                    left,
                ).format(condition=condition, left=left)
            )
    return held_by


def zeroing_places(model: torch.nn.Module, data, *, micro_batch_size: int, accum_steps: int, lr: float = 0.1) -> float:
    """The seed zeroes the gradients at the start of each cycle (`if step % accum_steps == 0`, before the
    backward()), lesson 0's loop right after each step: one epoch of `pitfalls.classic_train` each way, with SGD at
    `lr`, on two float64 copies of `model` on the CPU (the model is left untouched), where the same operations give
    the same bits (a GPU's kernels may add in another order from run to run). Prints whether they end with the same
    weights; returns the largest weight difference."""
    X, y = data
    data = (X.to("cpu", torch.float64), y.to("cpu"))
    trained, steps = [], []
    for at_start in (False, True):
        copied = copy.deepcopy(model).to("cpu", torch.float64)
        log = classic_train(
            copied,
            data,
            torch.optim.SGD(copied.parameters(), lr=lr),
            micro_batch_size=micro_batch_size,
            accum_steps=accum_steps,
            zero_at_cycle_start=at_start,
        )
        trained.append(copied)
        steps.append(log.steps)
    gap = parameter_gap(*trained)
    values = dict(steps=steps[0], gap=gap)
    if steps[0] != steps[1] or gap > 0:
        print(
            _(
                "Zeroing after each step and zeroing at the start of each cycle do not train alike here: {steps} "
                "and {other} optimizer steps, weights up to {gap:.2e} apart."
            ).format(other=steps[1], **values)
        )
    else:
        print(
            _("After the step or at the cycle's start: the same weights after {steps} steps, bit for bit.").format(
                **values
            )
        )
    return gap
