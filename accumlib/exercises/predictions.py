"""Predict, then run: the learner writes a number down first; the check measures it and compares.

Lesson 2: without the division, SGD's first step is accum_steps times as long; how long is Adam's? (It barely
changes: Adam divides each gradient by its own running size.) Lesson 6: how much more arithmetic does an accumulated
step do? (None: the extra time is the per-call cost of more, smaller operations.) Both measurements are exact
counts or float64 ratios, the same on every machine.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from .. import data, models
from ..i18n import N_, _
from ..loop import train
from ..pitfalls import classic_train
from .core import Prediction


class AdamPrediction(Prediction):
    lesson, name = 2, "predict_adam"
    answer = ("adam_ratio",)
    accum_steps = 4
    micro_batch_size = 16
    stub = '''\
# Without the division, SGD's first step moves the weights accum_steps = 4 times as far.
# Predict: how many times as far does Adam's first step move them? Write a number, then run the cell.
adam_ratio = None
exercises.predict_adam.check(adam_ratio)
'''
    solution_code = '''\
adam_ratio = 1  # Adam divides each gradient by its own running size: a constant factor cancels
exercises.predict_adam.check(adam_ratio)
'''
    hint_text = N_("Adam's step is the gradient's running average divided by the square root of its squares' running "
                   "average. What happens to that ratio when every gradient is 4 times as large?")

    def first_step(self, optimizer_class, lr: float, divide: bool) -> float:
        """Length (L2 norm, over all weights) of the first optimizer step on one cycle of 4 micro-batches of 16."""
        X, y = data.digits(self.accum_steps * self.micro_batch_size, flat=True, dtype=torch.float64)
        model = models.mlp(dtype=torch.float64)
        before = torch.cat([p.detach().flatten() for p in model.parameters()])
        classic_train(model, (X, y), optimizer_class(model.parameters(), lr=lr), micro_batch_size=self.micro_batch_size,
                      accum_steps=self.accum_steps, divide=divide)
        return (torch.cat([p.detach().flatten() for p in model.parameters()]) - before).norm().item()

    def measure(self) -> tuple[float, str]:
        sgd, adam = ((self.first_step(opt, lr, False) / self.first_step(opt, lr, True))
                     for opt, lr in ((torch.optim.SGD, 0.1), (torch.optim.Adam, 1e-3)))
        return adam, _("Without the division, Adam's first step moves the weights {adam:.4f} times as far and SGD's "
                       "{sgd:.4f} times: Adam divides each gradient by its own running size, so a constant factor "
                       "cancels (only its tiny epsilon term notices it).").format(adam=adam, sgd=sgd)


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
    stub = '''\
# One optimizer step on 64 samples: as one batch of 64, or as 16 micro-batches of 4 (accum_steps = 16).
# Predict: how many times the arithmetic (floating-point operations) does the accumulated step do?
arithmetic_ratio = None
exercises.time_cost.check(arithmetic_ratio)
'''
    solution_code = '''\
arithmetic_ratio = 1  # the same samples go through the same layers: the same arithmetic, in smaller pieces
exercises.time_cost.check(arithmetic_ratio)
'''
    hint_text = N_("Each sample goes through the same layers whichever micro-batch it is in. What grows with "
                   "accum_steps is the number of separate operations, each with its own fixed cost.")

    def count(self, micro_batch_size: int, accum_steps: int) -> tuple[int, int]:
        """(floating-point operations, operator calls) of one optimizer step of models.cnn() on digits."""
        X, y = data.digits(self.effective_batch)
        model = models.cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        calls = OperatorCalls()
        with FlopCounterMode(display=False) as flops, calls:
            train(model, (X, y), optimizer, micro_batch_size=micro_batch_size, accum_steps=accum_steps,
                  shuffle=False, measure_memory=False, device="cpu")
        return flops.get_total_flops(), calls.calls

    def measure(self) -> tuple[float, str]:
        (one_flops, one_calls) = self.count(self.effective_batch, 1)
        micro = self.effective_batch // self.accum_steps
        (many_flops, many_calls) = self.count(micro, self.accum_steps)
        ratio = many_flops / one_flops
        return ratio, _("One optimizer step as {accum_steps} micro-batches of {micro} does {ratio:.2f} times the "
                        "arithmetic of one batch of {batch} ({operations:,} floating-point operations against "
                        "{one_operations:,}), but makes {calls:.3g} times as many operator calls ({many_calls:,} "
                        "against {one_calls:,}). The extra time of accumulation comes from the fixed cost of each "
                        "call, not from arithmetic.").format(
                            accum_steps=self.accum_steps, micro=micro, ratio=ratio, batch=self.effective_batch,
                            operations=many_flops, one_operations=one_flops, calls=many_calls / one_calls,
                            many_calls=many_calls, one_calls=one_calls)


predict_adam = AdamPrediction()
time_cost = TimeCost()
