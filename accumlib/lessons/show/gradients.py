"""Lesson 2, gradients add up: an accumulated gradient against the full-batch gradient, `gradient_gap` with and
without the division, what forgetting the division does to SGD and to Adam, and the loss to log; for lesson 0, one
cycle of the seed's loop with its zeroing or its division changed (`one_cycle`)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from ..._validate import positive_int
from ...i18n import _
from ._format import print_table, rounding_or_gap

ROUNDING = 1e-12  # relative to the largest gradient entry: a difference this small is float rounding, not a bug


@dataclass(frozen=True)
class GradientComparison:
    """An accumulated gradient against the full-batch gradient, over every parameter's entries."""

    largest_difference: float  # max |accumulated - full batch| over all entries
    largest_entry: float  # max |full batch| over all entries
    ratio: float  # the multiple of the full-batch gradient closest to the accumulated one (least squares)
    proportional: bool  # whether the accumulated gradient is that multiple of the full-batch one (up to rounding)

    @property
    def equal(self) -> bool:
        return self.largest_difference <= ROUNDING * self.largest_entry


def _compared(accumulated: Sequence[torch.Tensor], full_batch: Sequence[torch.Tensor]) -> GradientComparison:
    """An accumulated gradient against the full-batch gradient (one tensor per parameter, same order)."""
    if len(accumulated) != len(full_batch) or any(
        a.shape != f.shape for a, f in zip(accumulated, full_batch, strict=True)
    ):
        raise ValueError(
            _(
                "accumulated and full_batch must hold one gradient per parameter with the same shapes; got "
                "{accumulated} and {full_batch}"
            ).format(accumulated=[tuple(a.shape) for a in accumulated], full_batch=[tuple(f.shape) for f in full_batch])
        )
    a = torch.cat([g.detach().flatten().double() for g in accumulated])
    f = torch.cat([g.detach().flatten().double() for g in full_batch])
    if not f.abs().max() > 0:
        raise ValueError(_("full_batch: the full-batch gradient is zero everywhere; nothing to compare it with"))
    largest_difference, largest_entry = (a - f).abs().max().item(), f.abs().max().item()
    ratio = (a @ f / (f @ f)).item()
    proportional = (a - ratio * f).abs().max().item() <= ROUNDING * max(largest_entry, abs(ratio) * largest_entry)
    return GradientComparison(largest_difference, largest_entry, ratio, proportional)


def compare(accumulated: Sequence[torch.Tensor], full_batch: Sequence[torch.Tensor]) -> GradientComparison:
    """Compare an accumulated gradient with the full-batch gradient (one tensor per parameter, same order) and say
    what it is: equal up to rounding, a multiple of the full-batch gradient, or something else."""
    result = _compared(accumulated, full_batch)
    largest_difference, largest_entry, ratio = result.largest_difference, result.largest_entry, result.ratio
    if result.equal:
        # the bound it passed, not the difference: a rounding difference's digits depend on the CPU and threads
        print(
            _(
                "The accumulated gradient equals the full-batch gradient: no entry differs by more than {gap:.1e} "
                "(float rounding), where the largest entry is {largest:.4f}."
            ).format(gap=ROUNDING * largest_entry, largest=largest_entry)
        )
    elif result.proportional:
        print(
            _(
                "Every entry of the accumulated gradient is {ratio:.3f} times the full-batch entry: the largest "
                "difference is {gap:.4f}, where the largest entry is {largest:.4f}."
            ).format(ratio=ratio, gap=largest_difference, largest=largest_entry)
        )
    else:
        print(
            _(
                "The accumulated gradient differs from the full-batch gradient by up to {gap:.4f} (the largest entry "
                "is {largest:.4f}), and it is not a multiple of it."
            ).format(gap=largest_difference, largest=largest_entry)
        )
    return result


def one_cycle(
    model: torch.nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    accum_steps: int,
    *,
    divide: bool = True,
    zero_every_micro_batch: bool = False,
    loss_fn=None,
) -> GradientComparison:
    """Lesson 0: one cycle of the seed's loop on a float64 copy of `model` (on the CPU; the model is left untouched):
    (X, y) split into accum_steps equal micro-batches, each loss divided by accum_steps (not with divide=False) and
    backpropagated, `zero_grad()` once before the first (before every one with zero_every_micro_batch=True). Prints
    in one sentence what `.grad` then holds against the gradient of the whole (X, y) at once: that gradient, a
    multiple of it, the last micro-batch's gradient alone, or something else. Returns the comparison (`compare`'s).

    float64, so that "equal" means equal up to float64 rounding whatever the model's own dtype and device.
    """
    accum_steps = positive_int("accum_steps", accum_steps)
    if len(X) != len(y) or len(X) % accum_steps:
        raise ValueError(
            _(
                "X and y must hold the same number of samples, a multiple of accum_steps={accum_steps}; got "
                "{samples_X} and {samples_y}"
            ).format(accum_steps=accum_steps, samples_X=len(X), samples_y=len(y))
        )
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    model = copy.deepcopy(model).to("cpu", torch.float64)
    X, y = X.to("cpu", torch.float64), y.to("cpu")
    params = [p for p in model.parameters() if p.requires_grad]
    full_batch = torch.autograd.grad(loss_fn(model(X), y), params)
    model.zero_grad()
    for x_micro, y_micro in zip(X.chunk(accum_steps), y.chunk(accum_steps), strict=True):  # the seed's loop, one cycle
        if zero_every_micro_batch:
            model.zero_grad()
        loss = loss_fn(model(x_micro), y_micro)
        (loss / accum_steps if divide else loss).backward()
    accumulated = [p.grad for p in params]
    result = _compared(accumulated, full_batch)
    bound = ROUNDING * result.largest_entry  # printed instead of a rounding difference (its digits vary by CPU)
    micro = len(X) // accum_steps

    def last_alone() -> bool:  # whether .grad is what backward() of the last micro-batch alone gives
        last = torch.autograd.grad(loss_fn(model(X[-micro:]), y[-micro:]) / (accum_steps if divide else 1), params)
        return max((a - b).abs().max().item() for a, b in zip(accumulated, last, strict=True)) <= bound

    if result.equal:
        print(
            _(
                "{count} backward() calls added up in .grad: the full-batch gradient, up to float rounding ({gap:.1e})."
            ).format(count=accum_steps, gap=bound)
        )
    elif result.proportional:
        print(_(".grad is {ratio:.3f} times the full-batch gradient.").format(ratio=result.ratio))
    elif last_alone():
        print(
            _(
                ".grad is the last micro-batch's gradient alone (up to {gap:.1e}): the other {lost} were wiped out."
            ).format(gap=bound, lost=accum_steps - 1)
        )
    else:
        print(
            _(
                ".grad misses the full-batch gradient by up to {miss:.4f} (largest entry {largest:.4f}), and it is "
                "not a multiple of it."
            ).format(miss=result.largest_difference, largest=result.largest_entry)
        )
    return result


def gap_table(gaps: Mapping[int, Mapping[str, float]], full_batch: Sequence[torch.Tensor]) -> bool:
    """`accumlib.gradient_gap` at several accum_steps, with the division (normalize="steps") and without it
    (normalize="none"): gaps is accum_steps -> {"steps": gap, "none": gap}; full_batch is the full-batch gradient
    (one tensor per parameter), whose largest |entry| the gaps are measured against. Prints a table and what it
    shows; returns whether every gap without the division is (accum_steps - 1) times that entry, as for an
    accumulated gradient accum_steps times too large."""
    if not gaps or any(set(g) != {"steps", "none"} for g in gaps.values()):
        raise ValueError(_("gaps must map each accum_steps to {'steps': gap, 'none': gap} (gradient_gap's normalize)"))
    largest_entry = max((g.detach().abs().max().item() for g in full_batch), default=0.0)
    if not largest_entry > 0:
        raise ValueError(
            _("full_batch: the full-batch gradient is zero everywhere (or empty): nothing to measure the gaps against")
        )
    bound = ROUNDING * largest_entry  # what float rounding explains; the gaps below it print as "< bound"
    rows = [
        [k, rounding_or_gap(g["steps"], bound), f"{g['none']:.4f}", f"{g['none'] / largest_entry:.3f}"]
        for k, g in gaps.items()
    ]
    print_table(
        ["accum_steps", _("gap, loss / accum_steps"), _("gap, no division"), _("gap without division / largest entry")],
        rows,
    )
    rounding = all(g["steps"] <= bound for g in gaps.values())
    k_times = all(abs(g["none"] / largest_entry - (k - 1)) <= 1e-9 * k for k, g in gaps.items())
    if rounding:
        print(_("With the division, every gap is float rounding (at most {gap:.1e}).").format(gap=bound))
    else:
        print(
            _("With the division, some gaps are larger than float rounding (up to {gap:.1e}).").format(
                gap=max(g["steps"] for g in gaps.values())
            )
        )
    if k_times:
        print(
            _(
                "Without it, each gap is accum_steps - 1 times the largest full-batch entry: exactly what an "
                "accumulated gradient accum_steps times the full-batch gradient gives."
            )
        )
    else:
        print(_("Without it, the gaps are not all accum_steps - 1 times the largest full-batch entry."))
    return k_times


def sgd_and_adam(result: Mapping[str, float]) -> dict[str, float]:
    """What forgetting the division did with SGD and with Adam (`quiz.experiments.no_division_sgd_adam()`): how far
    the weights ended from the run that divides, against how far that run moved them, and, for SGD, against dividing
    with an accum_steps times larger learning rate. Prints a table and the findings; returns each optimizer's
    difference as a share of how far the weights moved."""
    needed = {"steps", "accum_steps", "sgd", "sgd_moved", "adam", "adam_moved", "sgd_larger_lr"}
    if not needed <= set(result):
        raise ValueError(
            _("result must be quiz.experiments.no_division_sgd_adam()'s dict; it lacks {missing}").format(
                missing=sorted(needed - set(result))
            )
        )
    share = {name: result[name] / result[f"{name}_moved"] for name in ("sgd", "adam")}
    print_table(
        [
            _("optimizer"),
            _("weights moved, dividing"),
            _("difference, forgetting the division"),
            _("difference / moved"),
        ],
        [
            [label, f"{result[f'{name}_moved']:.1e}", f"{result[name]:.1e}", f"{share[name]:.1%}"]
            for name, label in (("sgd", "SGD"), ("adam", "Adam"))
        ],
    )
    numbers = dict(
        accum_steps=result["accum_steps"], gap=result["sgd_larger_lr"], steps=result["steps"], share=share["adam"]
    )
    if result["sgd_larger_lr"] <= ROUNDING:
        print(
            _(
                "SGD: forgetting the division gives the same weights as dividing with a {accum_steps} times larger "
                "learning rate (largest difference {gap:.1e}, float rounding)."
            ).format(**numbers)
        )
    else:
        print(
            _(
                "SGD: forgetting the division does not give the same weights as dividing with a {accum_steps} times "
                "larger learning rate (largest difference {gap:.1e})."
            ).format(**numbers)
        )
    if share["adam"] < 0.05:
        print(
            _(
                "Adam: after {steps} steps the weights differ by {share:.1%} of how far they moved: the factor of "
                "{accum_steps} largely cancels."
            ).format(**numbers)
        )
    else:
        print(
            _(
                "Adam: after {steps} steps the weights differ by {share:.1%} of how far they moved: the factor of "
                "{accum_steps} does not cancel here."
            ).format(**numbers)
        )
    return share


def logged_losses(log, histories: dict[tuple[int, int], object], *, accum_steps: int) -> float:
    """What a loop logs when it logs the divided loss, against the true loss.

    log: `pitfalls.classic_train`'s log of a run with `accum_steps`; histories: (micro_batch_size, accum_steps) ->
    `accumlib.train`'s history, all from the same seed. Prints the first cycle's micro-batch losses as logged
    (divided) and true, their mean, and the first step's loss that accumlib.train recorded for each split.
    Returns the first cycle's true mean loss.
    """
    print_table(
        [_("micro-batch"), _("logged: loss / accum_steps"), _("true loss")],
        [
            [str(i + 1), f"{scaled:.4f}", f"{true:.4f}"]
            for i, (scaled, true) in enumerate(
                zip(log.scaled_losses[:accum_steps], log.true_losses[:accum_steps], strict=True)
            )
        ],
    )
    mean = math.fsum(log.true_losses[:accum_steps]) / accum_steps
    print(
        _("The true loss of optimizer step 1 is the mean of its micro-batches' losses: {mean:.4f}.").format(mean=mean)
    )
    for (micro_batch_size, steps), history in histories.items():
        print(
            _(
                "accumlib.train, micro_batch_size={micro_batch_size}, accum_steps={accum_steps}: step 1's loss "
                "{loss:.4f}"
            ).format(micro_batch_size=micro_batch_size, accum_steps=steps, loss=history[0].loss)
        )
    return mean
