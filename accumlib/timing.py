"""Time per effective batch of a configuration: warm-up steps, then the median over repeated steps."""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from ._validate import positive_int
from .loop import train


@dataclass(frozen=True)
class TimingReport:
    micro_batch_size: int
    accum_steps: int
    seconds_per_step: float  # median wall seconds of one optimizer step (one effective batch)
    step_seconds: tuple[float, ...]  # every timed step, seconds

    @property
    def effective_batch(self) -> int:
        return self.micro_batch_size * self.accum_steps

    @property
    def samples_per_second(self) -> float:
        return self.effective_batch / self.seconds_per_step


def time_config(model: torch.nn.Module, data, *, micro_batch_size: int, accum_steps: int,
                optimizer_fn: Callable = lambda params: torch.optim.SGD(params, lr=0.01),
                loss_fn: Callable | None = None, warmup: int = 2, repeats: int = 7, device=None) -> TimingReport:
    """Time optimizer steps of (micro_batch_size, accum_steps) on a copy of `model` (left untouched).

    data: (X, y) with at least micro_batch_size * accum_steps samples; each step uses that many of them.
    Returns the median over `repeats` steps after `warmup` untimed ones.
    """
    micro_batch_size = positive_int("micro_batch_size", micro_batch_size)
    accum_steps = positive_int("accum_steps", accum_steps)
    warmup, repeats = positive_int("warmup", warmup), positive_int("repeats", repeats)
    X, y = data
    effective = micro_batch_size * accum_steps
    if effective > len(X):
        raise ValueError(f"micro_batch_size * accum_steps = {effective} exceeds the {len(X)} samples of data")
    model = copy.deepcopy(model)
    history = train(model, (X[:effective], y[:effective]), optimizer_fn(model.parameters()),
                    micro_batch_size=micro_batch_size, accum_steps=accum_steps, epochs=warmup + repeats,
                    loss_fn=loss_fn, device=device, measure_memory=False)
    seconds = tuple(r.seconds for r in history.records[warmup:])
    return TimingReport(micro_batch_size, accum_steps, statistics.median(seconds), seconds)
