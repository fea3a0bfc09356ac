"""Predict, then run (lesson 6): how much more arithmetic does an accumulated step do? None: the extra time is the
per-call cost of more, smaller operations. The learner writes a number down first; the check counts floating-point
operations and operator calls (exact counts, the same on every machine) and compares.

(Lesson 2's surprise, that Adam largely cancels a missing division, is the quiz's predict-then-run question.)
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ... import devices
from ...i18n import N_, _
from ...loop import train
from .. import data, models
from . import contained
from .core import Prediction


class OperatorCalls(TorchDispatchMode):
    """Counts the tensor operations (ATen operator calls) run while it is active."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class TimeCost(Prediction):
    lesson, name = 6, "time_cost"
    answer = ("arithmetic_ratio",)
    effective_batch = 64
    accum_steps = 16
    stub = """\
# One optimizer step on 64 samples: as one batch of 64, or as 16 micro-batches of 4 (accum_steps = 16).
# Predict: how many times the arithmetic (floating-point operations) does the accumulated step do?
arithmetic_ratio = None
exercises.time_cost.check(arithmetic_ratio)
"""
    solution_code = """\
arithmetic_ratio = 1  # the same samples go through the same layers: the same arithmetic, in smaller pieces
exercises.time_cost.check(arithmetic_ratio)
"""
    hint_text = N_(
        "Each sample goes through the same layers whichever micro-batch it is in. What grows with "
        "accum_steps is the number of separate operations, each with its own fixed cost."
    )

    def count(self, micro_batch_size: int, accum_steps: int, device=None) -> tuple[int, int]:
        """(floating-point operations, operator calls) of one optimizer step on the effective batch (`count`)."""
        return count(self.effective_batch, micro_batch_size, accum_steps, device)

    def measure(self) -> tuple[float, str]:
        return measured_ratio(self.effective_batch, self.accum_steps)


def count(effective_batch: int, micro_batch_size: int, accum_steps: int, device=None) -> tuple[int, int]:
    """(floating-point operations, operator calls) of one optimizer step of models.cnn() on `effective_batch`
    digits, on `device` (default: the lesson's, `accumlib.devices.pick()`): the operators a step calls depend on the
    device."""
    device = devices.pick() if device is None else torch.device(device)
    X, y = (t.to(device) for t in data.digits(effective_batch))
    model = models.cnn().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    calls = OperatorCalls()
    with FlopCounterMode(display=False) as flops, calls:
        train(
            model,
            (X, y),
            optimizer,
            micro_batch_size=micro_batch_size,
            accum_steps=accum_steps,
            shuffle=False,
            measure_memory=False,
            device=device,
        )
    return flops.get_total_flops(), calls.calls


@contained.kernel_side  # measured in the kernel, on its device, when a check's child process asks
def measured_ratio(effective_batch: int, accum_steps: int) -> tuple[float, str]:
    """The arithmetic of one step of `effective_batch` samples as accum_steps micro-batches, over that of one batch,
    and what the counts show (in the course language)."""
    one_flops, one_calls = count(effective_batch, effective_batch, 1)
    micro = effective_batch // accum_steps
    many_flops, many_calls = count(effective_batch, micro, accum_steps)
    ratio = many_flops / one_flops
    return ratio, _(
        "One optimizer step as {accum_steps} micro-batches of {micro} does {ratio:.2f} times the "
        "arithmetic of one batch of {batch} ({operations:,} floating-point operations against "
        "{one_operations:,}), but makes {calls:.3g} times as many operator calls ({many_calls:,} "
        "against {one_calls:,}). The extra time of accumulation comes from the fixed cost of each "
        "call, not from arithmetic."
    ).format(
        accum_steps=accum_steps,
        micro=micro,
        ratio=ratio,
        batch=effective_batch,
        operations=many_flops,
        one_operations=one_flops,
        calls=many_calls / one_calls,
        many_calls=many_calls,
        one_calls=one_calls,
    )


time_cost = TimeCost()
