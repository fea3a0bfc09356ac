"""One optimizer step from a cycle of micro-batches: `accumulate_and_step`, and the checks of what it is given.

Zero once, weight each micro-batch loss by its share of the cycle, backward() each (PyTorch adds into .grad), step
once. The scheduler, clipping and the AMP scaler run once per step; under DistributedDataParallel the gradients are
all-reduced once (`no_sync()` on the other micro-batches). Nothing reads a tensor's value on the host inside a cycle
but once, after its last backward(): on a GPU every such read makes the host wait until the device has caught up.
`accumlib.loop.train` drives it.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Sized
from typing import Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import OneCycleLR, ReduceLROnPlateau

from ._validate import boolean, checked_by, function, one_of, positive_number
from .i18n import _


_NOTHING = contextlib.nullcontext()  # a context that does nothing (reusable)


class NonFiniteError(FloatingPointError):
    """A loss or gradient was NaN or infinite and `on_nonfinite="raise"` was asked for."""


class CycleResult(NamedTuple):
    """What one `accumulate_and_step` did, read from the device in one transfer."""

    loss: float  # sum over micro-batches of loss_weights[i] * loss_i (under DDP: its mean over the processes)
    grad_norm: float | None  # L2 norm of the accumulated gradient, before clipping (None: check_gradients=False)
    lr: float  # learning rate of the optimizer's first parameter group when the step was taken
    skipped: bool  # True when the loss or the gradient norm was NaN/inf: no step, the model left as it was


def _check_cycle(model, optimizer, micro_batches, loss_weights, loss_fn, clip_grad_norm, scaler, autocast_dtype,
                 scheduler, ddp_no_sync, on_nonfinite, check_gradients) -> None:
    """accumulate_and_step's arguments, checked before anything changes (nothing is read from the device)."""
    _check_model(model)
    _check_optimizer_type(optimizer)
    for name, value in (("micro_batches", micro_batches), ("loss_weights", loss_weights)):
        if not isinstance(value, Sized) or isinstance(value, (str, dict, torch.Tensor)):
            raise TypeError(_("{name} must be a list (one item per micro-batch), got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__))
    if not micro_batches:
        raise ValueError(_("micro_batches is empty: a cycle needs at least one micro-batch"))
    if len(micro_batches) != len(loss_weights):
        raise ValueError(_("loss_weights has {weights} values but micro_batches has {micro} micro-batches: give one "
                           "weight per micro-batch").format(weights=len(loss_weights), micro=len(micro_batches)))
    for weight in loss_weights:
        number = isinstance(weight, numbers.Real) and not isinstance(weight, bool)
        if not (number and 0 <= weight < math.inf or isinstance(weight, torch.Tensor) and weight.dim() == 0):
            raise ValueError(_("loss_weights must hold finite numbers >= 0 (or 0-d tensors), one per micro-batch; got "
                               "{value!r}").format(value=weight))
    function("loss_fn", loss_fn)
    if clip_grad_norm is not None:
        positive_number("clip_grad_norm", clip_grad_norm)
    _check_scaler_type(scaler)
    if autocast_dtype is not None and not isinstance(autocast_dtype, torch.dtype):
        raise TypeError(_("autocast_dtype must be a torch.dtype such as torch.bfloat16, or None; got {value!r}").format(
            value=autocast_dtype))
    _check_scheduler(scheduler, optimizer, 0)
    boolean("ddp_no_sync", ddp_no_sync)
    one_of("on_nonfinite", on_nonfinite, ("skip", "raise"))
    boolean("check_gradients", check_gradients)


@checked_by(_check_cycle)  # every argument, before anything changes
def accumulate_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], loss_weights: Sequence[float], *,
                        loss_fn: Callable = torch.nn.functional.cross_entropy, clip_grad_norm: float | None = None,
                        scaler: torch.amp.GradScaler | None = None, autocast_dtype: torch.dtype | None = None,
                        scheduler=None, ddp_no_sync: bool = True, on_nonfinite: str = "skip",
                        check_gradients: bool = True) -> CycleResult:
    """One optimizer step from a cycle of micro-batches: zero once, weight each loss, backward each, step once.

    micro_batches: (x, y) pairs on the model's device (a list, or anything with len() that fetches on iteration).
    loss_weights: one number per micro-batch, what its loss is multiplied by before backward(); for k micro-batches
    of a mean-reduced loss that is each one's share of the cycle's samples (1/k when they are equal).
    loss_fn(model(x), y) must return a scalar tensor. clip_grad_norm: clip the accumulated gradient to this L2 norm.
    scaler: a GradScaler (fp16). autocast_dtype: run the forward passes under torch.autocast with this dtype.
    scheduler: stepped once after the optimizer; a ReduceLROnPlateau gets this cycle's loss.
    ddp_no_sync: with a DistributedDataParallel model, all-reduce the gradients only on the last micro-batch.
    on_nonfinite: a NaN/inf loss or gradient norm skips the step ("skip": no step, buffers such as BatchNorm's
    running statistics put back as they were) or raises NonFiniteError ("raise"); with a scaler, only a non-finite
    loss raises, as a gradient overflow is the scaler's routine (it skips that step and lowers its scale).
    check_gradients: read the gradient's L2 norm every cycle, so that a NaN/inf gradient under a finite loss (a
    sqrt or log at 0 in backward) skips or raises too; False leaves the norm out unless clipping or a scaler needs
    it (one reduction per parameter tensor less; grad_norm is then None, and such a gradient reaches the weights).
    The norm and clipping cover exactly the optimizer's parameters. If a micro-batch raises, nothing is stepped and
    the buffers are put back. The host reads the device once: the loss and the norm together. Every argument is
    checked first (types, one finite weight >= 0 per micro-batch); `train`, which checks them itself before its
    first step, calls the unchecked function, `accumulate_and_step.__wrapped__`.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]  # clipped and measured: these only
    ddp = isinstance(model, DistributedDataParallel)
    autocast = torch.autocast(params[0].device.type, autocast_dtype) if autocast_dtype else _NOTHING
    optimizer.zero_grad(set_to_none=True)  # once per cycle: from here on, every backward() adds into .grad
    with _BuffersKept(model) as buffers:  # BatchNorm's running statistics, put back if the cycle fails or is skipped
        total = None  # the cycle's loss so far, summed on the device: no host read per micro-batch
        for i, (x, y) in enumerate(micro_batches):
            # DDP all-reduces the gradients after every backward() whose forward ran outside no_sync(): once per cycle
            sync = model.no_sync() if ddp and ddp_no_sync and i < len(loss_weights) - 1 else _NOTHING
            with sync, autocast:
                loss = _scalar_loss(loss_fn(model(x), y))  # checked without reading its value
            weighted = loss * loss_weights[i]  # this micro-batch's part of the cycle's loss (0 for padding)
            (scaler.scale(weighted) if scaler else weighted).backward()  # adds into .grad (scaled: no fp16 underflow)
            total = weighted.detach() if total is None else total + weighted.detach()  # one 0-d tensor, any k
        if scaler:
            scaler.unscale_(optimizer)  # the true gradients, once per cycle, before clipping and the norm
        # the gradient's norm, for the finite check; read even with check_gradients=False when clipping computes it
        # anyway, or with a scaler (a step it skips for an overflow must be recorded as skipped)
        with_norm = check_gradients or clip_grad_norm is not None or scaler is not None
        loss, grad_norm = _read_loss_and_norm(total, params, clip_grad_norm, with_norm, ddp)  # the one host read
    # the finite check, alike on every process (grad_norm is None: not read, the loss alone is checked)
    skipped = not (math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)))
    lr = float(optimizer.param_groups[0]["lr"])
    if skipped:
        buffers.restore()  # no step, the buffers put back: the model exactly as it was before the cycle
    elif scaler:
        scaler.step(optimizer)  # the one optimizer step of the cycle, through the scaler
    else:
        optimizer.step()  # the one optimizer step of the cycle
    if scaler:
        scaler.update()  # a lower scale after an overflow (a skipped step), a higher one after many good steps
    if skipped:
        if on_nonfinite == "raise" and not (scaler and math.isfinite(loss)):  # an overflow is the scaler's routine
            raise NonFiniteError(_("non-finite loss ({loss}) or gradient norm ({grad_norm}); the model was left as "
                                   "it was").format(loss=loss, grad_norm=grad_norm))
    elif isinstance(scheduler, ReduceLROnPlateau):
        scheduler.step(loss)  # its metric: this cycle's loss (its patience counts optimizer steps)
    elif scheduler is not None:
        scheduler.step()  # once per optimizer step, after it
    return CycleResult(loss, grad_norm, lr, skipped)


def _scalar_loss(loss) -> torch.Tensor:
    """`loss` if it is a 0-d tensor with a gradient; a clear error otherwise (no value read from the device)."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(_("loss_fn must return a scalar tensor, got {value!r} of type {type}: return the tensor itself "
                          "(not loss.item() or float(loss))").format(value=loss, type=type(loss).__name__))
    if loss.dim() != 0:
        raise ValueError(_("loss_fn must return a scalar, got a tensor of shape {shape}: reduce it (reduction='mean' "
                           "or 'sum')").format(shape=tuple(loss.shape)))
    if not loss.requires_grad:
        raise ValueError(_("loss_fn returned a tensor without a gradient (requires_grad=False): compute it from the "
                           "model's output, without .detach() or torch.no_grad()"))
    return loss


def _read_loss_and_norm(total: torch.Tensor, params: list[torch.Tensor], clip_grad_norm: float | None,
                        with_norm: bool, ddp: bool) -> tuple[float, float | None]:
    """The cycle's loss (`total`, the sum of its weighted losses) and its gradients' L2 norm (None unless
    with_norm), read from the device at once.

    Clips the gradients first when clip_grad_norm is given (the norm returned is the one before clipping). Under DDP
    the loss is averaged over the processes, as DDP averages their gradients. The norms' tensors are freed on
    return: the optimizer step then holds what memory.training_step, the step memory.measure_step measures, holds.
    """
    if clip_grad_norm is not None:  # clipping: scale the accumulated gradient down to norm <= clip_grad_norm
        norms = [torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)]  # their total norm, before clipping
    elif with_norm:
        grads = [p.grad for p in params if p.grad is not None]  # no .grad: the loss does not depend on it
        norms = torch._foreach_norm(grads) if grads else ()  # each gradient's L2 norm, in one call
    else:
        norms = ()  # the loss alone
    try:
        values = torch.stack([total, *norms])  # the loss, then the norms: one tensor, one transfer
    except RuntimeError:  # parameters on several devices (a model split over GPUs): the norms go to the loss's device
        values = torch.stack([total, *(norm.to(total.device) for norm in norms)])
    if ddp:
        dist.all_reduce(values[:1])
        values[:1] /= dist.get_world_size()
    loss, *norms = values.tolist()
    return loss, math.hypot(*norms) if with_norm else None


class _BuffersKept:
    """Context manager: a copy of the model's buffers; restore() puts them back, and so does an exception."""

    def __init__(self, model: torch.nn.Module):
        modules, buffers = [model], []
        for module in modules:  # the list grows as it is walked: model.buffers() without building names, 3x faster
            if module is not None:
                if module._buffers:  # most modules have none
                    buffers += module._buffers.values()
                if module._modules:  # a leaf has none
                    modules += module._modules.values()
        self.buffers = [b for b in buffers if b is not None]
        self.saved = [b.clone() for b in self.buffers]

    def __enter__(self) -> _BuffersKept:
        return self

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in zip(self.buffers, self.saved):
                buffer.copy_(saved)

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            self.restore()


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(_("model must be a torch.nn.Module, got {value!r} of type {type}").format(
            value=model, type=type(model).__name__))


def _check_optimizer_type(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(_("optimizer must be a torch.optim.Optimizer, got {value!r} of type {type}").format(
            value=optimizer, type=type(optimizer).__name__))


def _check_scaler_type(scaler) -> None:
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(_("scaler must be a torch.amp.GradScaler, got {value!r} of type {type}").format(
            value=scaler, type=type(scaler).__name__))


def _check_optimizer(model: torch.nn.Module, optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters, once it is known to hold some of the model's trainable ones."""
    _check_optimizer_type(optimizer)
    model_params = list(model.parameters())
    if not model_params:
        raise ValueError(_("model has no parameters: there is nothing to train"))
    trainable = {id(p) for p in model_params if p.requires_grad}
    if not trainable:
        raise ValueError(_("every parameter of model is frozen (requires_grad=False): there is nothing to train; "
                           "unfreeze the ones to train with p.requires_grad_(True)"))
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(id(p) in trainable for p in held):
        raise ValueError(_("optimizer holds none of the model's trainable parameters: build it from "
                           "model.parameters() (or the trainable ones you want to train)"))
    return held


def _check_scheduler(scheduler, optimizer: torch.optim.Optimizer, steps: int) -> None:
    """A scheduler must step `optimizer`, and a OneCycleLR must last for the `steps` optimizer steps of the run."""
    if scheduler is None:
        return
    if not callable(getattr(scheduler, "step", None)) or not hasattr(scheduler, "optimizer"):
        raise TypeError(_("scheduler must be a learning-rate scheduler (torch.optim.lr_scheduler) built on the "
                          "optimizer, got {value!r} of type {type}").format(value=scheduler,
                                                                            type=type(scheduler).__name__))
    if scheduler.optimizer is not optimizer:
        raise ValueError(_("scheduler was built on another optimizer: it would change that optimizer's learning "
                           "rate, not this one's; build it on the optimizer you pass to train"))
    if isinstance(scheduler, OneCycleLR) and scheduler.last_epoch + steps > scheduler.total_steps:
        raise ValueError(_("scheduler: this OneCycleLR has {left} of its total_steps={total} left, but this run "
                           "takes {steps} optimizer steps; build it with total_steps={steps}").format(
                               left=scheduler.total_steps - scheduler.last_epoch, total=scheduler.total_steps,
                               steps=steps))
