"""The last-cycle rule: what each micro-batch's loss is multiplied by (`_loss_weights`), so that a cycle's
gradient is that of one batch of the whole cycle, a short last cycle included; and, with normalize="count", the
cycle's loss terms (`_cycle_terms`, from the user's `count`)."""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Mapping
from typing import Callable

import torch
import torch.distributed as dist

from ._validate import as_real
from .failures import _told
from .i18n import _
from .batches import _Cycle


def _loss_weights(
    normalize: str,
    reduction: str,
    sizes: list[int],
    cycle_samples: int,
    accum_steps: int,
    world: int,
    terms: list[float] | None = None,
    total_terms: float | None = None,
) -> list[float]:
    """What each micro-batch's loss is multiplied by before backward(); 0 (not run) for a micro-batch without rows
    (DDP's padding, a 0-row batch) or, with counts, without loss terms. The cycle has some (`_empty`)."""
    if normalize == "steps":  # the classic loss / accum_steps: every micro-batch alike, even in a short last cycle
        shares = [1 / (accum_steps * world) if size else 0.0 for size in sizes]
    elif normalize == "samples":  # a mean: the micro-batch's share of the cycle's samples; a sum: 1 per sample
        shares = [(size if reduction == "mean" else 1.0 if size else 0.0) / cycle_samples for size in sizes]
    else:  # "count": a mean over its terms, the micro-batch's share of the cycle's terms; a sum: 1 per term
        shares = [
            (n if reduction == "mean" else 1.0) / total_terms if size and n else 0.0
            for size, n in zip(sizes, terms, strict=True)
        ]
    # DDP averages the gradients of its `world` processes; times `world`, that mean becomes the sum of every
    # process's shares, which add up to the whole cycle (on one process world is 1)
    return [world * share for share in shares]


def _cycle_terms(cycle: _Cycle, count: Callable, device: torch.device, ddp: bool, step: int):
    """(each micro-batch's loss terms, 0 for padding; the cycle's total over all processes), with one host read
    (and under DDP one all-reduce). Refuses a count that is not a non-negative number, naming its step and epoch,
    before the cycle changes anything; a cycle without loss terms (total 0) is not stepped (`_train`). Under DDP a
    count that raises on one process (or a micro-batch that cannot be fetched) stops every process here: the
    all-reduce carries a failure flag per process, and each raises (the failed one its own error)."""
    try:
        counts = [_count_value(count(batch)) for batch in cycle.raw()]  # count(target): see `_of_batch`
        error = None
    except Exception as caught:  # under DDP the others learn of it in the all-reduce and stop too
        if not ddp:
            raise
        counts, error = [], caught
    where = counts[0].device if counts else device
    local = torch.stack([c.to(where) for c in counts]) if counts else torch.zeros(0, dtype=torch.float64)
    summary = torch.stack([local.sum(), (~(local >= 0) | local.isinf()).sum().double()])  # terms, bad counts
    if ddp:
        flags = torch.zeros(dist.get_world_size(), dtype=torch.float64)  # which processes failed
        flags[dist.get_rank()] = error is not None
        summary = torch.cat([summary.to(device), flags.to(device)])
        dist.all_reduce(summary)  # the cycle's terms (and bad counts, failures) over all processes: one all-reduce
    values = torch.cat([local.to(summary.device), summary]).tolist()  # the one host read
    values, (total, bad, *failed) = values[: len(local)], values[len(local) :]
    if any(failed):
        why = _told(error, [rank for rank, flag in enumerate(failed) if flag])
        if error is not None:
            raise error
        raise RuntimeError(
            _(
                "{why}: count failed there for step {step} (epoch {epoch}); this process stops with "
                "it, before this step changes anything"
            ).format(why=why, step=step + 1, epoch=cycle.epoch)
        )
    for value in values:
        if not 0 <= value < math.inf:
            raise ValueError(
                _(
                    "count must give a finite, non-negative number of loss terms; it gave {value} for a "
                    "micro-batch of step {step} (epoch {epoch})"
                ).format(value=value, step=step + 1, epoch=cycle.epoch)
            )
    if bad:
        raise ValueError(
            _(
                "count gave a negative or non-finite number of loss terms on another process, for step "
                "{step} (epoch {epoch})"
            ).format(step=step + 1, epoch=cycle.epoch)
        )
    if total == math.inf:  # finite counts whose sum float64 cannot hold: every weight would be 0, the cycle "empty"
        raise ValueError(
            _(
                "count's loss terms for step {step} (epoch {epoch}) add up to more than the largest float64 "
                "({largest:g}), over all processes: the micro-batches' weights (each count over the total) would "
                "all be 0; valid: counts whose sum is finite"
            ).format(step=step + 1, epoch=cycle.epoch, largest=torch.finfo(torch.float64).max)
        )
    # raw() is the real micro-batches (0-row batches of a loader included), in order, before any padding
    return values + [0.0] * (len(cycle.sizes) - len(values)), total


def _target(batch):
    """A micro-batch's target, what loss_fn and count get: y of an (x, y) or (inputs, y) batch, a dict batch itself."""
    return batch if isinstance(batch, Mapping) else batch[1]


def _count_target(count: Callable, batch):
    return count(_target(batch))


def _count_pair(count: Callable, batch):
    """The old form, count(x, y), for an (x, y) or (inputs, y) batch only: a dict batch has no pair to give it."""
    if isinstance(batch, Mapping):
        raise TypeError(
            _(
                "count takes two arguments, count(x, y), the old form for (x, y) batches, but the data gives dict "
                "batches: count gets the batch itself, count(batch), as loss_fn gets it; got {count!r}"
            ).format(count=count)
        )
    return count(*batch)


def _of_batch(count: Callable) -> Callable:
    """count as the cycle calls it, on a micro-batch as the data gives it: count(target), the one rule it shares with
    loss_fn(output, target). The old form, count(x, y) for an (x, y) batch, is recognised by its two parameters
    and still called so, with a DeprecationWarning."""
    try:
        signature = inspect.signature(count)
        signature.bind(None, None)
    except (TypeError, ValueError):  # takes no two arguments, or cannot be inspected (a builtin): the one rule
        return functools.partial(_count_target, count)
    try:
        signature.bind(None)
    except TypeError:  # two parameters, both needed: count(x, y)
        warnings.warn(
            _(
                "count(x, y) is deprecated: count gets the micro-batch's target, as loss_fn does: count(y) "
                "for an (x, y) or (inputs, y) batch, count(batch) for a dict batch"
            ),
            DeprecationWarning,
            stacklevel=4,
        )
        return functools.partial(_count_pair, count)
    return functools.partial(_count_target, count)


def _count_value(value) -> torch.Tensor:
    """count(...) as a 0-d float64 tensor where it was computed (an int, a float, a NumPy number or a 0-d tensor),
    unread."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not (value.is_complex() or value.dtype == torch.bool):
        return value.to(torch.float64)
    number = as_real(value) if not isinstance(value, torch.Tensor) else None  # a NumPy number as Python takes it
    if number is not None:
        return torch.tensor(number, dtype=torch.float64)
    raise TypeError(
        _(
            "count must return the number of loss terms of a micro-batch (a number or a 0-d tensor), got "
            "{value!r} of type {type}"
        ).format(value=value, type=type(value).__name__)
    )
