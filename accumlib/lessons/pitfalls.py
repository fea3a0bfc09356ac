"""The classic hand-written accumulation loop, with the bugs that real training code shipped as switches.

`classic_train` sees the same micro-batches in the same order as `accumlib.train` with the same seed, so a
lesson (or a dashboard) can measure each bug against the full-batch run and against accumlib's loop, and the
exercises' checkers can be tested against the very loops whose mistakes they diagnose.

With a scaler, each micro-batch's forward pass runs under fp16 autocast on the data's device. What the
mixed-precision switches do, measured with torch 2.13 (fp16 autocast, `torch.amp.GradScaler("cpu")`):
  - `unscale_per_micro_batch`: PyTorch raises RuntimeError at the second micro-batch ("unscale_() has already
    been called on this optimizer since the last update()").
  - `update_per_micro_batch`: PyTorch raises AssertionError at the first micro-batch ("No inf checks were recorded
    prior to update."): update() needs an inf check from unscale_() or step() first.
  - both together (the "fix" the first error message invites: update() after every unscale_()) runs silently:
    each unscale_() divides the gradient already unscaled by the scale again, so a step's gradient shrinks to about
    (last micro-batch's share) / scale (1e-5 of the right one at the default scale 65536), and the scale adapts
    once per micro-batch instead of once per step.
  - `step_every_micro_batch` with a scaler (step and update per micro-batch) runs silently: accum_steps steps per
    cycle, as without a scaler.
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass, field
from typing import Callable

import torch

from .._validate import one_of, positive_int, positive_number
from ..i18n import _

LAST_CYCLE = ("drop", "leak", "divide-by-steps")  # what classic scripts do with the last, incomplete cycle: all wrong
LAST_CYCLE_CHOICES = (*LAST_CYCLE, "weighted")  # "weighted": exact, as accumlib.train does it


@dataclass(frozen=True)
class ClassicStep:
    """One optimizer step of `classic_train`, as `on_step` sees it."""

    step: int  # optimizer steps so far, 1-based
    epoch: int  # 0-based
    samples_seen: int  # samples forwarded so far (micro-batches whose gradient was thrown away included)
    micro_batches: int  # micro-batches whose gradient this step applied (those since .grad was last zeroed)
    samples: int  # samples in those micro-batches
    loss: float  # true (unscaled) mean loss per sample over those micro-batches


@dataclass
class ClassicLog:
    """What the classic loop did: per micro-batch the logged (scaled) loss; per optimizer step the lr used."""

    scaled_losses: list[float] = field(default_factory=list)  # the loss times its weight, as many scripts log it
    true_losses: list[float] = field(default_factory=list)  # the same micro-batch's loss, unscaled
    step_lrs: list[float] = field(default_factory=list)  # learning rate of each optimizer step
    steps: int = 0


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(
            _("{name} must be True or False, got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__
            )
        )
    return value


def loss_weights(sizes: list[int], accum_steps: int, last_cycle: str, divide: bool) -> list[float]:
    """The factor each micro-batch's mean loss is multiplied by before backward(), for one epoch.

    sizes: samples per micro-batch, in order. Classic: 1 / accum_steps (1 without the division); "weighted":
    the micro-batch's samples over its cycle's samples, so every cycle, the last incomplete one included, gets the
    gradient of one batch made of the whole cycle.
    """
    if not divide:
        return [1.0] * len(sizes)
    if last_cycle != "weighted":
        return [1 / accum_steps] * len(sizes)
    weights = []
    for first in range(0, len(sizes), accum_steps):
        cycle = sizes[first : first + accum_steps]
        weights += [size / sum(cycle) for size in cycle]
    return weights


def classic_train(
    model: torch.nn.Module,
    data,
    optimizer: torch.optim.Optimizer,
    *,
    micro_batch_size: int,
    accum_steps: int,
    epochs: int = 1,
    seed: int = 0,
    last_cycle: str = "drop",
    divide: bool = True,
    zero_every_micro_batch: bool = False,
    step_every_micro_batch: bool = False,
    zero_at_cycle_start: bool = False,
    scheduler=None,
    scheduler_per_micro_batch: bool = False,
    clip_grad_norm: float | None = None,
    clip_per_micro_batch: bool = False,
    scaler: torch.amp.GradScaler | None = None,
    unscale_per_micro_batch: bool = False,
    update_per_micro_batch: bool = False,
    loss_fn: Callable | None = None,
    on_step: Callable[[ClassicStep], None] | None = None,
) -> ClassicLog:
    """The six-line recipe (loss / accum_steps, step when (i + 1) % accum_steps == 0), with optional bugs.

    data: (X, y) tensors. With every switch at its default and last_cycle="weighted" it trains exactly like
    `accumlib.train` (same seed, same micro-batches, same weights to float rounding).
    last_cycle: what happens to micro-batches after the last full cycle of an epoch:
      "drop" (zero_grad at the next epoch's start throws them away), "leak" (no zeroing at the epoch start:
      they are added into the next epoch's first step), "divide-by-steps" (stepped, but still divided by
      accum_steps, so under-weighted), "weighted" (stepped, each micro-batch weighted by its samples over the
      cycle's samples: exact).
    divide=False: the loss is not divided (each step's gradient accum_steps times too large).
    zero_every_micro_batch: zero_grad() before every backward (only the cycle's last micro-batch reaches the step).
    step_every_micro_batch: the optimizer (and scaler) step after every micro-batch.
    zero_at_cycle_start: zero_grad() at the start of each cycle (the seed's `if i % accum_steps == 0`, before the
    backward()) instead of after each step: not a bug, the same training (nothing touches .grad in between).
    scheduler_per_micro_batch / clip_per_micro_batch / unscale_per_micro_batch / update_per_micro_batch: the
    once-per-step work done after every micro-batch's backward instead (or, for update, as well); see the module
    docstring for which of the scaler mistakes PyTorch catches.
    on_step(step) runs after each optimizer step (and its zeroing); an exception it raises propagates.
    """
    micro_batch_size = positive_int("micro_batch_size", micro_batch_size)
    accum_steps = positive_int("accum_steps", accum_steps)
    epochs = positive_int("epochs", epochs)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            _("{name} must be an integer, got {value!r} of type {type}").format(
                name="seed", value=seed, type=type(seed).__name__
            )
        )
    one_of("last_cycle", last_cycle, LAST_CYCLE_CHOICES)
    switches = dict(
        divide=divide,
        zero_every_micro_batch=zero_every_micro_batch,
        zero_at_cycle_start=zero_at_cycle_start,
        step_every_micro_batch=step_every_micro_batch,
        scheduler_per_micro_batch=scheduler_per_micro_batch,
        clip_per_micro_batch=clip_per_micro_batch,
        unscale_per_micro_batch=unscale_per_micro_batch,
        update_per_micro_batch=update_per_micro_batch,
    )
    for name, value in switches.items():
        _flag(name, value)
    if zero_at_cycle_start and last_cycle == "leak":
        raise ValueError(
            _(
                "zero_at_cycle_start=True zeroes the gradients at the start of every cycle, the next epoch's first one "
                "too, so nothing can leak into it: use it with last_cycle 'drop', 'divide-by-steps' or 'weighted', not "
                "'leak'"
            )
        )
    if clip_grad_norm is not None:
        clip_grad_norm = positive_number("clip_grad_norm", clip_grad_norm)
    if scaler is None and (unscale_per_micro_batch or update_per_micro_batch):
        raise ValueError(_("unscale_per_micro_batch and update_per_micro_batch need scaler= (a torch.amp.GradScaler)"))
    if on_step is not None and not callable(on_step):
        raise TypeError(
            _("on_step must be a function taking one ClassicStep, or None; got {on_step!r}").format(on_step=on_step)
        )
    if not (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and all(isinstance(t, torch.Tensor) for t in data)
        and len(data[0]) == len(data[1]) > 0
    ):
        raise TypeError(_("data must be a tuple (X, y) of two tensors with the same number of samples (at least one)"))
    X, y = data
    if micro_batch_size > len(X):
        raise ValueError(
            _(
                "micro_batch_size={micro_batch_size} is larger than the dataset ({samples} samples); valid range: 1 to "
                "{samples}"
            ).format(micro_batch_size=micro_batch_size, samples=len(X))
        )
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    params = list(model.parameters())
    log = ClassicLog()
    generator = torch.Generator().manual_seed(seed)  # the same sample order as accumlib.train(seed=seed)
    samples_seen = 0
    pending = [0.0, 0, 0]  # loss x samples, samples, micro-batches since .grad was last zeroed

    def zero_grad():
        optimizer.zero_grad()
        pending[:] = [0.0, 0, 0]

    for epoch in range(epochs):
        batches = torch.split(torch.randperm(len(X), generator=generator), micro_batch_size)
        weights = loss_weights([len(idx) for idx in batches], accum_steps, last_cycle, divide)
        if last_cycle != "leak":
            zero_grad()
        for i, (idx, weight) in enumerate(zip(batches, weights, strict=True)):
            if zero_every_micro_batch or (zero_at_cycle_start and i % accum_steps == 0):
                zero_grad()
            # fp16 autocast where the data is (the scaler's device: "cuda" on a GPU, "cpu" here)
            with torch.autocast(X.device.type, dtype=torch.float16) if scaler else contextlib.nullcontext():
                loss = loss_fn(model(X[idx]), y[idx])
            scaled = loss * weight
            (scaler.scale(scaled) if scaler else scaled).backward()
            log.scaled_losses.append(scaled.item())
            log.true_losses.append(loss.item())
            samples_seen += len(idx)
            pending[0] += log.true_losses[-1] * len(idx)
            pending[1] += len(idx)
            pending[2] += 1
            if unscale_per_micro_batch:
                scaler.unscale_(optimizer)
            if clip_grad_norm and clip_per_micro_batch:
                torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
            if update_per_micro_batch:
                scaler.update()
            if scheduler is not None and scheduler_per_micro_batch:
                scheduler.step()
            tail_stepped = last_cycle in ("divide-by-steps", "weighted") and i == len(batches) - 1
            if step_every_micro_batch or (i + 1) % accum_steps == 0 or tail_stepped:
                if scaler and not unscale_per_micro_batch:
                    scaler.unscale_(optimizer)
                if clip_grad_norm and not clip_per_micro_batch:
                    torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
                log.step_lrs.append(optimizer.param_groups[0]["lr"])
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                if scheduler is not None and not scheduler_per_micro_batch:
                    scheduler.step()
                step = ClassicStep(log.steps + 1, epoch, samples_seen, pending[2], pending[1], pending[0] / pending[1])
                if not zero_at_cycle_start:
                    zero_grad()
                log.steps += 1
                if on_step is not None:
                    on_step(step)
    return log
