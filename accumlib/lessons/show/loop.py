"""Lesson 3, the loop: a hand-written loop against `accumlib.train`, the loop with a line in the wrong place, which
micro-batches a step condition steps after, and the source of accumlib's own cycle."""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Callable, Mapping, Sequence

import torch

from ...i18n import N_, _, ngettext
from ...loop import History, parameter_gap
from ..pitfalls import ClassicStep
from ._format import FLOAT64_ROUNDING as ROUNDING, rounding_or_gap, table

# pitfalls.classic_train's switches for a misplaced line ("" for none), as the table names them
MISTAKES = {"": N_("the six-line loop"), "zero_every_micro_batch": N_("zero_grad() before every backward()"),
            "step_every_micro_batch": N_("step() after every micro-batch"), "divide": N_("no division")}


def _say_gap(gap: float, exact: str, rounding: str, different: str) -> None:
    """Print which of three catalogue messages (marked N_) a weight difference calls for: none at all, float64
    rounding (at most ROUNDING) or a different computation. A different computation gets the difference as {gap};
    rounding gets the bound it passed, since a rounding difference's digits depend on the CPU and the threads."""
    print(_(exact) if gap == 0 else _(rounding).format(gap=ROUNDING) if gap <= ROUNDING else
          _(different).format(gap=gap))


def one_cycle(cycle_model: torch.nn.Module, full_model: torch.nn.Module) -> float:
    """A model after one `accumulate_and_step` cycle of micro-batches against the same model after one step on the
    whole batch at once: prints whether they end with the same weights; returns the largest difference."""
    gap = parameter_gap(cycle_model, full_model)
    _say_gap(gap, N_("One cycle of micro-batches and one step on the whole batch end with exactly the same weights, "
                     "bit for bit."),
             N_("One cycle of micro-batches and one step on the whole batch end with the same weights: they differ "
                "by at most {gap:.1e} (float64 rounding)."),
             N_("One cycle of micro-batches and one step on the whole batch end with different weights: they "
                "differ by up to {gap:.2e}."))
    return gap


def returned(result: tuple) -> str:
    """Print what `accumulate_and_step` returned (a CycleResult, or any NamedTuple) as its repr with every float to
    5 significant digits, and return that text. A float64's 17 digits end in ones that depend on the CPU's kernels
    (AVX-512, AVX2 or neither) and the thread count: printed in full, the lesson would show one machine's digits."""
    if not hasattr(result, "_fields"):
        raise TypeError(f"result must be what accumulate_and_step returned (a CycleResult), got {type(result).__name__}")
    fields = ", ".join(f"{name}={value:.5g}" if isinstance(value, float) else f"{name}={value!r}"
                       for name, value in zip(result._fields, result))
    text = f"{type(result).__name__}({fields})"
    print(_("accumulate_and_step returned (floats to 5 significant digits):"))
    print(text)
    return text


def same_weights(hand_written: torch.nn.Module, library: torch.nn.Module, history: History) -> float:
    """A hand-written loop's model against the same run with `accumlib.train` (its model and History): the largest
    weight difference, and what the history recorded. Returns that difference."""
    if not len(history):
        raise ValueError("history holds no optimizer step")
    gap = parameter_gap(hand_written, library)
    _say_gap(gap, N_("The hand-written loop and accumlib.train end with exactly the same weights, bit for bit."),
             N_("The hand-written loop and accumlib.train end with the same weights: they differ by at most {gap:.1e} "
                "(float64 rounding)."),
             N_("The hand-written loop and accumlib.train end with different weights: they differ by up to "
                "{gap:.2e}."))
    layouts = sorted({(record.micro_batches, record.samples) for record in history})
    if len(layouts) == 1:
        print(ngettext("accumlib.train recorded {steps} optimizer step of {micro_batches} micro-batches and {samples} "
                       "samples; the loss went from {first:.3f} to {last:.3f}.",
                       "accumlib.train recorded {steps} optimizer steps, each of {micro_batches} micro-batches and "
                       "{samples} samples; the loss went from {first:.3f} to {last:.3f}.", len(history)).format(
                           steps=len(history), micro_batches=layouts[0][0], samples=layouts[0][1],
                           first=history[0].loss, last=history[-1].loss))
    else:
        print(ngettext("accumlib.train recorded {steps} optimizer step; the loss went from {first:.3f} to {last:.3f}.",
                       "accumlib.train recorded {steps} optimizer steps; the loss went from {first:.3f} to "
                       "{last:.3f}.", len(history)).format(steps=len(history), first=history[0].loss,
                                                           last=history[-1].loss))
    return gap


def misplaced(runs: Mapping[str, tuple[torch.nn.Module, Sequence[ClassicStep]]], reference: torch.nn.Module,
              accum_steps: int) -> dict[str, float]:
    """Runs of `pitfalls.classic_train` with one mistake each, against a correct run's model (`reference`).

    runs: the switch that was on ("" for none, "zero_every_micro_batch", "step_every_micro_batch", "divide" for
    divide=False) -> (the trained model, the ClassicStep records its on_step received). Prints per run the optimizer
    steps, how many micro-batches each step's gradient held, and the largest weight difference from the reference;
    then what each mistake did. Returns run -> weight difference."""
    unknown = sorted(set(runs) - set(MISTAKES))
    if unknown:
        raise ValueError(f"runs: unknown mistakes {unknown}; name each run by its classic_train switch, one of "
                         f"{sorted(MISTAKES)} ('' for none)")
    gaps, rows = {}, []
    for name, (model, steps) in runs.items():
        if not steps:
            raise ValueError(f"runs[{name!r}]: no optimizer step was recorded; pass on_step=steps.append")
        gaps[name] = parameter_gap(model, reference)
        held = sorted({step.micro_batches for step in steps})
        rows.append([_(MISTAKES[name]), len(steps), ", ".join(map(str, held)),
                     f"{0:.1e}" if gaps[name] == 0 else rounding_or_gap(gaps[name], ROUNDING)])
    print(table([_("loop"), _("optimizer steps"), _("micro-batches in a step's gradient"),
                 _("weight difference from accumlib.train")], rows))
    for name, (model, steps) in runs.items():
        held = max(step.micro_batches for step in steps)
        if gaps[name] == 0:
            print(_("{loop}: exactly the weights of accumlib.train.").format(loop=_(MISTAKES[name])))
        elif gaps[name] <= ROUNDING:
            print(_("{loop}: the weights of accumlib.train, up to rounding (at most {gap:.1e}).").format(
                loop=_(MISTAKES[name]), gap=ROUNDING))
        elif held < accum_steps:
            print(ngettext("{loop}: every step's gradient holds {held} micro-batch, not {accum_steps}: {steps} steps, "
                           "weights off by {gap:.2f}.",
                           "{loop}: every step's gradient holds at most {held} micro-batches, not {accum_steps}: "
                           "{steps} steps, weights off by {gap:.2f}.", held).format(
                               loop=_(MISTAKES[name]), held=held, accum_steps=accum_steps, steps=len(steps),
                               gap=gaps[name]))
        else:
            print(_("{loop}: every step holds its {accum_steps} micro-batches, yet the weights are off by "
                    "{gap:.2f}.").format(loop=_(MISTAKES[name]), accum_steps=accum_steps, gap=gaps[name]))
    return gaps


def step_schedule(steps_at: Mapping[str, Sequence[int]], micro_batches: int, accum_steps: int) -> dict[str, list[int]]:
    """Which micro-batches a step condition steps after, and what each step holds.

    steps_at: the condition's code -> the values of `step` (micro-batches counted from 0) at which it is true;
    micro_batches: how many micro-batches the epoch has. With the gradients zeroed right after every step, a step
    holds the micro-batches since the one before. Prints a table (micro-batches counted from 1, as a person counts)
    and, per condition, whether its steps hold accum_steps micro-batches and what is not stepped in this epoch
    (zeroed only after a step, those micro-batches join the next epoch's first step; only after the last epoch are
    they never applied). Returns
    condition -> micro-batches per step."""
    held_by = {}
    rows = []
    for condition, steps in steps_at.items():
        steps = list(steps)
        if any(not 0 <= s < micro_batches for s in steps) or steps != sorted(set(steps)):
            raise ValueError(f"steps_at[{condition!r}] must list increasing step values from 0 to {micro_batches - 1}, "
                             f"got {steps}")
        held = [now - before for before, now in zip([-1, *steps], steps)]
        left = micro_batches - 1 - steps[-1] if steps else micro_batches
        held_by[condition] = held
        rows.append([condition, ", ".join(str(s + 1) for s in steps), ", ".join(map(str, held)), left])
    print(table([_("condition"), _("steps after micro-batch"), _("micro-batches per step"), _("not stepped in this epoch")], rows))
    for condition, held in held_by.items():
        left = micro_batches - sum(held)
        if held and all(h == accum_steps for h in held) and not left:
            print(_("{condition}: every step holds {accum_steps} micro-batches, and none is left over.").format(
                condition=condition, accum_steps=accum_steps))
            continue
        if held and held[0] != accum_steps:
            print(ngettext("{condition}: the first step comes after {first} micro-batch, not {accum_steps}.",
                           "{condition}: the first step comes after {first} micro-batches, not {accum_steps}.",
                           held[0]).format(condition=condition, first=held[0], accum_steps=accum_steps))
        if left:
            print(ngettext("{condition}: the last micro-batch gets no step in this epoch: it joins the next epoch's "
                           "first step (lesson 4); only after the last epoch is it never applied.",
                           "{condition}: the last {left} micro-batches get no step in this epoch: they join the next "
                           "epoch's first step (lesson 4); only after the last epoch are they never applied.",
                           left).format(condition=condition, left=left))
    return held_by


def source(function: Callable) -> str:
    """Print a function's code without its docstring (decorators included) and return it."""
    original = inspect.unwrap(function)
    if not inspect.isfunction(original):
        raise TypeError(f"function must be a Python function (def ...), got {function!r}")
    code = textwrap.dedent(inspect.getsource(original))
    definition = ast.parse(code).body[0]
    lines = code.splitlines()
    first = definition.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        del lines[first.lineno - 1:first.end_lineno]
    code = "\n".join(lines)
    print(_("{name}, from {file} ({count} lines without its docstring):").format(
        name=f"{original.__module__}.{original.__qualname__}", file=inspect.getsourcefile(original).rsplit("/", 1)[-1],
        count=len(lines)))
    print()
    print(code)
    return code
