"""One optimizer step from a cycle of micro-batches: `accumulate_and_step` and its result (`CycleResult`), run
with the options of `options` (`CycleOptions`). What it is given is checked in `cycle_checks`; what it changes
before the step is put back by `restore`; Ctrl-C waits for the step in `interrupts`; under DDP a failure is told to
every process in `failures`.

Zero once, weight each micro-batch loss by its share of the cycle, backward() each (PyTorch adds into .grad), step
once. The scheduler, clipping and the AMP scaler run once per step; under DistributedDataParallel or FSDP2 the
gradients are synchronised once (`accumlib.sharded`). Nothing reads a tensor's value on the host inside a cycle
but once, after its last backward(): on a GPU every such read makes the host wait until the device has caught up.
`accumlib.loop.train` drives it.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Collection, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.optim.lr_scheduler import ReduceLROnPlateau

from . import devices
from ._validate import not_optimizer
from .cycle_checks import _check_cycle
from .failures import _Told
from .i18n import _
from .interrupts import STEP
from .losses import _own_loss, _scalar_loss
from .options import CycleOptions
from .restore import _Kept
from .sharded import cycle_sync


_NOTHING = contextlib.nullcontext()  # a context that does nothing (reusable)


class NonFiniteError(FloatingPointError):
    """A loss or gradient was NaN or infinite and `on_nonfinite="raise"` was asked for."""


@dataclass(frozen=True)
class CycleResult:
    """What one `accumulate_and_step` did, read from the device in one transfer (a record, as `StepRecord` is)."""

    loss: float  # sum over micro-batches of loss_weights[i] * loss_i (under DDP: its mean over the processes)
    grad_norm: float | None  # L2 norm of the accumulated gradient, before clipping (None: check_gradients=False)
    lr: float  # learning rate of the optimizer's first parameter group when the step was taken
    skipped: bool  # True when the loss or the gradient norm was NaN/inf: no step, the model left as it was
    empty: bool = False  # True when every loss weight was 0 (nothing to learn): no step, nothing run or changed


class Inputs(NamedTuple):
    """A micro-batch's model inputs that are not one tensor: the cycle calls model(*args, **kwargs)."""

    args: tuple
    kwargs: dict


def accumulate_and_step(
    model: torch.nn.Module,
    micro_batches: Collection[tuple[torch.Tensor | Inputs, Any]],
    optimizer: torch.optim.Optimizer,
    loss_weights: Sequence[float | torch.Tensor],
    *,
    options: CycleOptions | None = None,
    **cycle_options,
) -> CycleResult:
    """One optimizer step from a cycle of micro-batches: zero once, weight each loss, backward each, step once.

    Args:
        model: the model, on the device of the micro-batches.
        micro_batches: (x, y) pairs on the model's device (a list, or anything with len() that fetches on
            iteration); x is a tensor (model(x)) or `Inputs(args, kwargs)` (model(*args, **kwargs)); y is what
            loss_fn takes (a dict batch's labels, say).
        optimizer: holds some of the model's trainable parameters (no closure: not LBFGS); after the data, as in
            `train(model, data, optimizer)` (an optimizer given first, 0.x's order, is refused by name).
        loss_weights: one number >= 0 per micro-batch, what its loss is multiplied by before backward(): for k
            micro-batches of a mean loss, each one's share of the cycle's samples (1/k when they are equal). A
            weight 0 (a number, not a tensor) is not run, so its loss (NaN for a mean over no tokens) cannot reach
            the cycle's; when every weight is 0 nothing is run or changed and the result says `empty` (under DDP a
            process still runs its last micro-batch, its backward seeded with 0, for the all-reduce in it).
        options: how the cycle runs, a `CycleOptions` (its fields and their defaults: see there), or its fields
            as keywords (**cycle_options), not both.

    Returns:
        A `CycleResult`: the cycle's loss, the gradient norm, the learning rate, whether the step was skipped.

    After a step the weights and the optimizer are stepped and every `.grad` is None (the optimizer's own
    zero_grad(set_to_none=True), once per step). After a skipped cycle, NonFiniteError or any error before the step
    (a micro-batch or loss_fn raising, Ctrl-C), the weights, the optimizer, the buffers the forward pass changes
    (BatchNorm's running statistics) and the optimizer's parameters' .grad are exactly as found. A trainable
    parameter the optimizer does not hold is not the cycle's: backward() adds into its .grad as PyTorch does.
    Ctrl-C waits while the step and the scheduler's step are made, so a step is never torn; an error of the
    scheduler after the step is raised with the step applied, its result as the error's `cycle_result`. The host
    reads the device once: the loss and the norm together. Every argument is checked before anything changes.
    """
    order = "model, micro_batches, optimizer, loss_weights"
    not_optimizer("accumulate_and_step", order, "micro_batches", micro_batches)  # 0.x's order, refused by name
    _check_cycle(model, optimizer, micro_batches, loss_weights)
    options = CycleOptions.of(options, cycle_options, "accumulate_and_step")
    if options.amp:  # bf16 refused on a GPU without it: where the optimizer's parameters are
        _check_amp(options.amp, next(p for group in optimizer.param_groups for p in group["params"]).device)
    options.check_scheduler(optimizer)
    return _cycle(model, optimizer, micro_batches, loss_weights, options)


def _amp_dtype(amp, device_type: str) -> torch.dtype | None:
    """The autocast dtype `amp` (a checked `CycleOptions.amp`) asks for on a device of `device_type`; None: none."""
    if amp is False:
        return None
    if amp is True:
        return torch.float16 if device_type == "cuda" else torch.bfloat16
    return torch.float16 if amp == "fp16" else torch.bfloat16


def _check_amp(amp, device: torch.device) -> torch.dtype | None:
    """`_amp_dtype` on `device`, refused before anything runs for bf16 on a CUDA GPU without native bf16 kernels
    (a T4: `devices.supports_bf16`), which would only emulate it, slowly."""
    dtype = _amp_dtype(amp, device.type)
    if dtype is torch.bfloat16 and device.type == "cuda" and not devices.supports_bf16(device):
        raise ValueError(
            _(
                "amp={value!r} but the GPU {device} has no native bfloat16 (it would only emulate it, "
                "slowly); valid here: amp='fp16', which trains with a GradScaler, or amp=False"
            ).format(value=amp, device=str(device))
        )
    return dtype


def _cycle(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches,
    loss_weights: Sequence[float],
    options: CycleOptions,
) -> CycleResult:
    """The recipe, its arguments checked (`options` built; what train and the measurements run): set the .grad
    aside (zero once), backward() each weighted loss, read the loss and the norm once, step once, or skip the step
    and put everything back."""
    params = [p for group in optimizer.param_groups for p in group["params"]]  # clipped and measured: these only
    sync = cycle_sync(model, options.ddp_no_sync)  # DDP or FSDP2: gradients synced in the last backward() (None: alone)
    runs = _runs(loss_weights, sync)  # which micro-batches run, which one's backward() synchronises
    if runs.last is None:  # nothing to learn: no step, nothing changed
        return CycleResult(math.nan, None, float(optimizer.param_groups[0]["lr"]), False, True)
    loss_fn = _own_loss if options.loss_fn is None else options.loss_fn
    if options.amp is False:
        autocast = _NOTHING
    else:  # the device's type read only here: every read makes a torch.device
        device_type = params[0].device.type
        autocast = torch.autocast(device_type, _amp_dtype(options.amp, device_type))
    plain = sync is None and autocast is _NOTHING  # no context to enter around a forward pass
    # kept: the optimizer's .grad set aside (None from here), buffers copied; told: under DDP, a failure on this
    # process before its all-reducing backward is told to the others, which stop too
    with _Kept(model, optimizer, params) as kept, _NOTHING if sync is None else _Told(params[0].device) as told:
        total = None  # the cycle's loss so far, summed on the device: no host read per micro-batch
        for i, (x, y) in enumerate(micro_batches):
            if runs.nothing[i] and i != runs.last and not runs.every:
                continue  # fetched, not run
            if sync is not None and (runs.every or total is None):  # a forward pass that may communicate
                told.agree()  # DDP's first of a cycle (buffers, buckets), FSDP2's every one (all-gathers)
                told.pending = True
            if plain:
                loss = _forward(model, loss_fn, x, y)  # the forward pass and the loss; no name keeps the output alive
            else:  # DDP's no_sync() or FSDP2's gradient sync off, but for the last micro-batch run (sharded.py)
                with sync.micro_batch(i, runs.synced + 1) if sync else _NOTHING, autocast:
                    loss = _forward(model, loss_fn, x, y)
            root, seed, total = _weighted(loss, loss_weights[i], total, options.scaler, runs.nothing[i])
            if sync is not None and (runs.every or i == runs.last):
                told.agree()  # every process has come this far (none failed): the all-reduce in backward() can run
            root.backward(None if seed == 1 else torch.full_like(total, seed))  # adds seed * root's gradient to .grad
            if sync is not None:
                told.pending = True  # until the next agree()
        if sync is not None:
            told.pending = False  # past the micro-batches: an error from here on is every process's own
        loss = root = None  # the last micro-batch's loss and graph: not kept through the step (total is)
        loss, grad_norm = _read(optimizer, params, total, options, sync)  # unscaled, clipped: the one host read
        # the finite check, alike on every process (grad_norm is None: not read, the loss alone is checked)
        skipped = not (math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)))
        lr = float(optimizer.param_groups[0]["lr"])
        if skipped:
            kept.restore()  # no step: .grad and the buffers as they were, the model exactly as the call found it
            if options.scaler:
                options.scaler.update()  # a lower scale after an overflow
        else:
            result = _step(optimizer, options, kept, CycleResult(loss, grad_norm, lr, False))
    if not skipped:
        return result
    if options.on_nonfinite == "raise" and not (options.scaler and math.isfinite(loss)):  # an overflow: routine
        raise NonFiniteError(
            _(
                "non-finite loss ({loss}) or gradient norm ({grad_norm}): no step was taken; the "
                "weights, buffers, optimizer and the optimizer's .grad are as they were before the "
                "cycle"
            ).format(loss=loss, grad_norm=grad_norm)
        )
    return CycleResult(loss, grad_norm, lr, True)


class _Runs(NamedTuple):
    """Which micro-batches of a cycle run (`_runs`)."""

    nothing: list[bool]  # weight 0 (a number): adds nothing, so not run unless DDP needs its backward
    every: bool  # under DDP, every micro-batch runs (each backward all-reduces, or FSDP2's forwards all-gather)
    last: int | None  # the last micro-batch with a weight (its backward all-reduces under no_sync()); None: none
    synced: int  # the micro-batch whose backward synchronises the gradients


def _runs(loss_weights: Sequence[float], sync) -> _Runs:
    """A micro-batch of weight 0 (no loss terms, no rows, DDP's padding) adds nothing: it is not run, so that its
    loss (NaN, a mean over nothing) cannot reach the cycle's. Under DDP every process runs at least its last
    micro-batch (the all-reduce is in its backward), and without no_sync() every one, a weight-0 one seeded with 0."""
    nothing = [not isinstance(w, torch.Tensor) and w == 0 for w in loss_weights]
    last = len(nothing) - 1
    while last >= 0 and nothing[last]:
        last -= 1
    if last < 0:  # nothing to learn here; but the others' all-reduce needs this process's last one
        last = None if sync is None else len(nothing) - 1
    every = sync is not None and (not sync.no_sync or sync.fsdp)
    return _Runs(nothing, every, last, len(nothing) - 1 if every else last)


def _weighted(loss: torch.Tensor, weight, total: torch.Tensor | None, scaler, nothing: bool):
    """(the tensor to backward() from, the seed of its gradient, the cycle's loss so far with this micro-batch's
    `weight` * `loss` added): what backward((loss * weight)) would give, bit for bit."""
    if nothing:  # run for DDP only: its backward adds 0 (and all-reduces), its loss is not the cycle's
        return loss, 0, torch.zeros_like(loss.detach()) if total is None else total
    if scaler is None and not isinstance(weight, torch.Tensor):
        # backward() from the loss itself, its gradient seeded with the weight: what (loss * weight) would give, bit
        # for bit, without the multiply and its node in the graph
        value = loss.detach()  # the loss without its graph: for the cycle's loss so far
        if total is None:
            total = value if weight == 1 else value * weight
        else:  # the cycle's loss so far plus value * weight, in one op
            total = torch.add(total, value, alpha=weight)
        return loss, weight, total  # the seed is made a tensor only in backward(), freed with it
    # backward() from the weighted loss: scaled (no fp16 underflow), or a weight on the device
    if total is None:
        root = loss * weight
    elif isinstance(weight, torch.Tensor):  # multiplied on the device (no host read)
        root = total + loss * weight
    else:  # the cycle's loss so far plus loss * weight, in one op
        root = torch.add(total, loss, alpha=weight)
    total = root.detach()  # without its graph: only this micro-batch's term is backpropagated
    return (scaler.scale(root) if scaler else root), 1, total


def _read(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor], total: torch.Tensor, options: CycleOptions, sync
) -> tuple[float, float | None]:
    """The cycle's loss (`total`, the sum of its weighted losses) and its gradients' L2 norm (None unless read),
    read from the device at once: the one host read of the cycle. A scaler's gradients are unscaled first, and
    clipped when clip_grad_norm is given (the norm returned is the one before clipping).

    The norm is read with check_gradients, and without it when clipping computes it anyway, or with a scaler (a
    step it skips for an overflow must be recorded as skipped). Under DDP and FSDP2 (`sync`) the loss is averaged
    over the processes, as they average their gradients; under FSDP2 the norm is over every process's shards. The
    norms' tensors are freed on return, before the optimizer step.
    """
    scaler, clip_grad_norm = options.scaler, options.clip_grad_norm
    if scaler:
        scaler.unscale_(optimizer)  # the true gradients, once per cycle, before clipping and the norm
    with_norm = options.check_gradients or clip_grad_norm is not None or scaler is not None
    if sync is not None and sync.fsdp:  # each process holds a shard of each gradient: one all-reduce for both
        total, norms = sync.loss_and_norm(total, params, clip_grad_norm, with_norm)
    elif clip_grad_norm is not None:  # clipping: scale the accumulated gradient down to norm <= clip_grad_norm
        norms = [torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)]  # their total norm, before clipping
    elif with_norm:
        grads = [grad for p in params if (grad := p.grad) is not None]  # no .grad: the loss does not depend on it
        norms = torch._foreach_norm(grads) if grads else ()  # each gradient's L2 norm, in one call
    else:
        norms = ()  # the loss alone
    if not norms and sync is None:  # the loss alone, on one process: read as it is (a stack costs more than the read)
        values = total.view(1)
    else:
        try:
            values = torch.stack([total, *norms])  # the loss, then the norms: one tensor, one transfer
        except RuntimeError:  # parameters on several devices (a model split over GPUs): the norms go to the loss's
            values = torch.stack([total, *(norm.to(total.device) for norm in norms)])
    if sync is not None and not sync.fsdp:  # DDP: every process holds the same, all-reduced, gradient
        dist.all_reduce(values[:1])
        values[:1] /= dist.get_world_size()
    if isinstance(values, FakeTensor):  # traced (memory.measure_step): no values; the cycle goes on as if finite
        return 0.0, 0.0 if with_norm else None
    loss, *norms = values.tolist()
    return loss, math.hypot(*norms) if with_norm else None


def _step(optimizer: torch.optim.Optimizer, options: CycleOptions, kept: _Kept, result: CycleResult) -> CycleResult:
    """The one optimizer step of the cycle, the scaler's and the scheduler's, as one unit that Ctrl-C waits for
    (and, in train, the step's record: `interrupts`); an error after the optimizer step carries `result`."""
    scaler, scheduler = options.scaler, options.scheduler
    with STEP.unit() as step:
        scaler.step(optimizer) if scaler else optimizer.step()  # the one optimizer step of the cycle
        step.result = result  # from here an error comes after the record
        kept.stepped()  # the gradients used: freed, so the next cycle holds no second copy
        if scaler:
            scaler.update()  # a higher scale after many good steps
        if scheduler is None:
            pass
        elif isinstance(scheduler, ReduceLROnPlateau):
            scheduler.step(result.loss)  # its metric: this cycle's loss (its patience counts optimizer steps)
        else:
            scheduler.step()  # once per optimizer step, after it
    return step.result


def _forward(model: torch.nn.Module, loss_fn: Callable, x, y) -> torch.Tensor:
    """One micro-batch's forward pass and its loss (inputs that are not one tensor unpacked)."""
    loss = loss_fn(model(*x.args, **x.kwargs) if isinstance(x, Inputs) else model(x), y)
    if type(loss) is torch.Tensor and loss.requires_grad and not loss.dim():  # a plain scalar with a gradient
        return loss
    return _scalar_loss(loss)  # any other: checked there (a tensor subclass passes as well)
