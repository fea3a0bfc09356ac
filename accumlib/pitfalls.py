"""The classic hand-written accumulation loop, with the bugs that real training code shipped as switches.

`classic_train` sees the same micro-batches in the same order as `accumlib.train` with the same seed, so a
lesson can measure each bug against the full-batch run and against accumlib's loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ._validate import one_of, positive_int

LAST_CYCLE = ("drop", "leak", "divide-by-steps")


@dataclass
class ClassicLog:
    """What the classic loop did: per micro-batch the logged (scaled) loss; per optimizer step the lr used."""

    scaled_losses: list[float] = field(default_factory=list)  # loss / accum_steps, as many scripts log it
    true_losses: list[float] = field(default_factory=list)  # the same micro-batch's loss, unscaled
    step_lrs: list[float] = field(default_factory=list)  # learning rate of each optimizer step
    steps: int = 0


def classic_train(model: torch.nn.Module, data, optimizer: torch.optim.Optimizer, *, micro_batch_size: int,
                  accum_steps: int, epochs: int = 1, seed: int = 0, last_cycle: str = "drop",
                  scheduler=None, scheduler_per_micro_batch: bool = False, clip_grad_norm: float | None = None,
                  clip_per_micro_batch: bool = False, scaler: torch.amp.GradScaler | None = None,
                  unscale_per_micro_batch: bool = False, loss_fn: Callable | None = None) -> ClassicLog:
    """The six-line recipe (loss / accum_steps, step when (i + 1) % accum_steps == 0), with optional bugs.

    last_cycle: what happens to micro-batches after the last full cycle of an epoch:
      "drop" (zero_grad at the next epoch's start throws them away), "leak" (no zeroing at the epoch start:
      they are added into the next epoch's first step), "divide-by-steps" (stepped, but still divided by
      accum_steps, so under-weighted).
    scheduler_per_micro_batch / clip_per_micro_batch / unscale_per_micro_batch: the once-per-step work done
    per micro-batch instead (the last raises, as torch.amp.GradScaler forbids two unscale_ calls per step).
    """
    micro_batch_size, accum_steps = positive_int("micro_batch_size", micro_batch_size), positive_int("accum_steps", accum_steps)
    one_of("last_cycle", last_cycle, LAST_CYCLE)
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    X, y = data
    params = list(model.parameters())
    log = ClassicLog()
    generator = torch.Generator().manual_seed(seed)  # the same sample order as accumlib.train(seed=seed)
    for _ in range(epochs):
        batches = torch.split(torch.randperm(len(X), generator=generator), micro_batch_size)
        if last_cycle != "leak":
            optimizer.zero_grad()
        for i, idx in enumerate(batches):
            with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
                loss = loss_fn(model(X[idx]), y[idx])
            scaled = loss / accum_steps
            (scaler.scale(scaled) if scaler else scaled).backward()
            log.scaled_losses.append(scaled.item())
            log.true_losses.append(loss.item())
            if scaler and unscale_per_micro_batch:
                scaler.unscale_(optimizer)
            if clip_grad_norm and clip_per_micro_batch:
                torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
            if scheduler is not None and scheduler_per_micro_batch:
                scheduler.step()
            last_of_epoch = last_cycle == "divide-by-steps" and i == len(batches) - 1
            if (i + 1) % accum_steps == 0 or last_of_epoch:
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
                optimizer.zero_grad()
                log.steps += 1
    return log
