"""Exercise of lesson 7: the remedy the lesson measured best, the largest micro-batch that fits, as a rule.

With BatchNorm, the larger the micro-batch, the less noisy the statistics it normalises with (lesson 7 measures it
with the running-statistic updates held equal). The learner writes `choose_split(fits, effective_batch)`: the
largest micro-batch that divides the effective batch and fits the card, and the accum_steps for the rest. The
checker asks it for several cards and effective batches (a fixed answer fits one of them at most), measures every
peak as `accumlib.train(memory_budget=...)` does (FakeTensorMode: byte-exact, the same on every machine), and stops
an answer that runs too long (the time limit of every exercise, core.Exercise) or calls `fits` too often (a
core.Budget; fits' own measurement is not counted against the learner's time).
"""

from __future__ import annotations

import functools
import numbers

import torch

from ... import devices, memory
from ...batchnorm import micro_batch_deviation, total
from ...i18n import N_, _
from .. import data, models
from . import contained
from .core import (
    Budget,
    Exercise,
    Finding,
    Shown,
    Verdict,
    learner_code,
    right,
    whole_number,
    wrong,
)
from .fingerprint import call_with, error_finding
from .loops import not_a_function

CALL_LIMIT = 1000  # calls to fits() per problem: trying every size once needs at most effective_batch (<= 96)


@contained.kernel_side  # measured in the kernel, on its device, when a check's child process asks
def step_peak(micro_batch_size: int, accumulated: bool, device=None) -> int:
    """Peak bytes of one training step of models.cnn(norm="batch") with SGD on digits, in micro-batches of this size
    (accumulated: accum_steps = 2, whose peak every accum_steps >= 2 shares; else one batch), on `device` (default:
    the lesson's, `accumlib.devices.pick()`)."""
    return _measured_peak(micro_batch_size, accumulated, devices.pick() if device is None else torch.device(device))


@functools.lru_cache(maxsize=None)
def _measured_peak(micro_batch_size: int, accumulated: bool, device: torch.device) -> int:
    X, y = data.digits()  # measure_step moves the micro-batch to the model's device
    model = models.cnn(norm="batch").to(device)
    return memory.measure_step(
        model,
        *memory.batch_of((X, y), micro_batch_size),
        accum_steps=2 if accumulated else 1,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        fake=True,
    ).peak


class _Card:
    """fits(m) for one card and effective batch."""

    def __init__(self, budget: int, effective_batch: int):
        self.budget, self.effective_batch = budget, effective_batch

    def peak(self, m: int) -> int:
        return step_peak(m, m < self.effective_batch)

    def __call__(self, micro_batch_size) -> bool:
        with learner_code():  # the value's own methods (comparisons, __int__) are the learner's code
            size = (
                int(micro_batch_size)
                if isinstance(micro_batch_size, numbers.Integral)
                and not isinstance(micro_batch_size, bool)
                and 1 <= micro_batch_size <= self.effective_batch
                else None
            )
        if size is None:
            raise ValueError(
                _(
                    "fits() takes a micro-batch size, a whole number from 1 to {most} (the effective "
                    "batch); it got {value!r}"
                ).format(most=self.effective_batch, value=Shown(micro_batch_size))
            )
        return self.peak(size) <= self.budget

    def best(self) -> int:
        return max(
            m
            for m in range(1, self.effective_batch + 1)
            if self.effective_batch % m == 0 and self.peak(m) <= self.budget
        )


@contained.kernel_side  # measured in the kernel, on its device, when a check's child process asks
def deviations(batch: int, *sizes: int) -> tuple[float, ...]:
    """How far micro-batches of each size stray from the whole batch's BatchNorm statistics (batchnorm.total of
    micro_batch_deviation), measured on `batch` digits with models.cnn(norm="batch") on the lesson's device."""
    X, _y = data.digits(batch)
    net = models.cnn(norm="batch").to(devices.pick())  # micro_batch_deviation moves X to the model's device
    return tuple(total(micro_batch_deviation(net, X, size)) for size in sizes)


def _bytes(size: int) -> str:
    return f"{size:,}"


class BatchNormSplit(Exercise):
    lesson, name, answer = 7, "batchnorm_split", ("choose_split",)
    problems = ((2**19, 64), (2**20, 96), (2**19, 60), (2**21, 48))  # (card bytes, effective batch)
    stub = """\
def choose_split(fits, effective_batch):
    # fits(m) is True when a training step of the BatchNorm CNN on micro-batches of m digits fits the card.
    # Return (micro_batch_size, accum_steps) with micro_batch_size * accum_steps == effective_batch.
    return 1, effective_batch  # micro-batches of 1 always fit


exercises.batchnorm_split.check(choose_split)
"""
    solution_code = """\
def choose_split(fits, effective_batch):
    for m in range(effective_batch, 0, -1):  # the largest micro-batch first
        if effective_batch % m == 0 and fits(m):
            return m, effective_batch // m


exercises.batchnorm_split.check(choose_split)
"""
    hint_text = N_(
        "Try the sizes from the effective batch downwards and return the first one that divides it and "
        "fits; accum_steps is then effective_batch // micro_batch_size."
    )

    def judge(self, choose_split) -> Verdict:
        if not callable(choose_split):
            return not_a_function("choose_split")
        for budget, effective_batch in self.problems:
            card = _Card(budget, effective_batch)
            fits = Budget(
                card,
                CALL_LIMIT,
                lambda calls, batch=effective_batch, budget=budget: Finding(
                    "endless-search",
                    _(
                        "For an effective batch of {batch} on a card of {card} bytes, choose_split called "
                        "fits() {calls:,} times without returning, more often than there are sizes to try "
                        "({most}): it goes round in circles. Does every loop end? Try each size at most "
                        "once."
                    ).format(batch=batch, card=_bytes(budget), calls=calls, most=batch),
                ),
            )
            try:
                answer = call_with(choose_split, {"fits": fits, "effective_batch": effective_batch})
            except Exception as error:  # the learner's code
                return wrong([error_finding(error)])
            finding = self.problem_with(answer, card)
            if finding:
                return wrong([finding])
        budget, effective_batch = self.problems[0]
        return right(
            _(
                "On every card, choose_split picked the largest micro-batch that divides the effective batch "
                "and fits (for {batch} on {card} bytes: {split}). With BatchNorm that is the least noisy split "
                "the card allows."
            ).format(
                batch=effective_batch,
                card=_bytes(budget),
                split=f"{_Card(budget, effective_batch).best()} × "
                f"{effective_batch // _Card(budget, effective_batch).best()}",
            )
        )

    def problem_with(self, answer, card: _Card) -> Finding | None:
        """What is wrong with choose_split's answer for this card, or None."""
        batch, budget = card.effective_batch, card.budget
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            return Finding(
                "not-a-pair",
                _(
                    "choose_split returned {value!r}; it must return two whole numbers: "
                    "(micro_batch_size, accum_steps)."
                ).format(value=Shown(answer)),
            )
        m, k = (whole_number(v) for v in answer)
        if m is None or k is None or m < 1 or k < 1:
            return Finding(
                "not-a-pair",
                _(
                    "choose_split returned {value!r}; it must return two whole numbers of at "
                    "least 1: (micro_batch_size, accum_steps)."
                ).format(value=Shown(tuple(answer))),
            )
        if m * k != batch:
            return Finding(
                "wrong-product",
                _(
                    "For an effective batch of {batch}, choose_split returned micro_batch_size={m} and "
                    "accum_steps={k}: "
                    "{product} samples per optimizer step, not {batch}. accum_steps must be effective_batch // "
                    "micro_batch_size, with a micro_batch_size that divides the effective batch."
                ).format(batch=batch, m=m, k=k, product=m * k),
            )
        peak = card.peak(m)
        if peak > budget:
            return Finding(
                "does-not-fit",
                _(
                    "For an effective batch of {batch}, micro-batches of {m} need {peak} bytes, more than the card's "
                    "{card}: accumlib.train(..., memory_budget={card_raw}) would refuse them. Return a size for which "
                    "fits() is True."
                ).format(batch=batch, m=m, peak=_bytes(peak), card=_bytes(budget), card_raw=budget),
            )
        best = card.best()
        if m < best:
            yours, largest = deviations(batch, m, best)
            return Finding(
                "smaller-than-needed",
                _(
                    "For an effective batch of {batch} on a card of {card} bytes, micro-batches of {m} fit, but so do "
                    "micro-batches of {best}, which divide {batch} too. BatchNorm normalises with the statistics of "
                    "each "
                    "micro-batch: measured on {batch} digits, micro-batches of {m} stray {yours:.3f} from the whole "
                    "batch's statistics, micro-batches of {best} {largest:.3f}. Return the largest size that divides "
                    "the "
                    "effective batch and fits."
                ).format(batch=batch, card=_bytes(budget), m=m, best=best, yours=yours, largest=largest),
            )
        return None


batchnorm_split = BatchNormSplit()
