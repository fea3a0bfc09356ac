"""One optimizer step from a cycle of micro-batches: `accumulate_and_step`, its options (`CycleOptions`) and its
result (`CycleResult`). What it is given is checked in `cycle_checks`; what it changes before the step is put back
by `restore`; Ctrl-C waits for the step in `interrupts`; under DDP a failure is told to every process in `failures`.

Zero once, weight each micro-batch loss by its share of the cycle, backward() each (PyTorch adds into .grad), step
once. The scheduler, clipping and the AMP scaler run once per step; under DistributedDataParallel or FSDP2 the
gradients are synchronised once (`accumlib.sharded`). Nothing reads a tensor's value on the host inside a cycle
but once, after its last backward(): on a GPU every such read makes the host wait until the device has caught up.
`accumlib.loop.train` drives it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.optim.lr_scheduler import OneCycleLR, ReduceLROnPlateau

from ._validate import boolean, function, one_of, positive_number
from .cycle_checks import _check_cycle
from .failures import _Told
from .i18n import _
from .interrupts import STEP
from .losses import _scalar_loss
from .restore import _Kept
from .sharded import cycle_sync


_NOTHING = contextlib.nullcontext()  # a context that does nothing (reusable)


class NonFiniteError(FloatingPointError):
    """A loss or gradient was NaN or infinite and `on_nonfinite="raise"` was asked for."""


class CycleResult(NamedTuple):
    """What one `accumulate_and_step` did, read from the device in one transfer."""

    loss: float  # sum over micro-batches of loss_weights[i] * loss_i (under DDP: its mean over the processes)
    grad_norm: float | None  # L2 norm of the accumulated gradient, before clipping (None: check_gradients=False)
    lr: float  # learning rate of the optimizer's first parameter group when the step was taken
    skipped: bool  # True when the loss or the gradient norm was NaN/inf: no step, the model left as it was
    empty: bool = False  # True when every loss weight was 0 (nothing to learn): no step, nothing run or changed


@dataclass(frozen=True)
class CycleOptions:
    """How `accumulate_and_step` runs its cycles, checked once, when built: each refusal names the option, the
    value and what is valid. `accumulate_and_step` builds one from its keywords; `train` one for the whole run,
    before anything changes; `memory.measure_step` one for the step it measures.

    The fields are accumulate_and_step's keywords, with its defaults (see there).
    """

    loss_fn: Callable = torch.nn.functional.cross_entropy
    clip_grad_norm: float | None = None
    scaler: torch.amp.GradScaler | None = None
    autocast_dtype: torch.dtype | None = None
    scheduler: object = None
    ddp_no_sync: bool = True
    on_nonfinite: str = "skip"
    check_gradients: bool = True

    def __post_init__(self) -> None:
        function("loss_fn", self.loss_fn)
        if self.clip_grad_norm is not None:
            object.__setattr__(self, "clip_grad_norm", positive_number("clip_grad_norm", self.clip_grad_norm))
        if self.scaler is not None and not isinstance(self.scaler, torch.amp.GradScaler):
            raise TypeError(_("scaler must be a torch.amp.GradScaler, got {value!r} of type {type}").format(
                value=self.scaler, type=type(self.scaler).__name__))
        if self.scaler is not None and not self.scaler.is_enabled():  # GradScaler(enabled=use_amp), use_amp False
            object.__setattr__(self, "scaler", None)  # a disabled scaler is no scaler: it scales and skips nothing
        if self.autocast_dtype is not None and not isinstance(self.autocast_dtype, torch.dtype):
            raise TypeError(_("autocast_dtype must be a torch.dtype such as torch.bfloat16, or None; got "
                              "{value!r}").format(value=self.autocast_dtype))
        scheduler = self.scheduler
        if scheduler is not None and (not callable(getattr(scheduler, "step", None)) or
                                      not hasattr(scheduler, "optimizer")):
            raise TypeError(_("scheduler must be a learning-rate scheduler (torch.optim.lr_scheduler) built on the "
                              "optimizer, got {value!r} of type {type}").format(value=scheduler,
                                                                                type=type(scheduler).__name__))
        boolean("ddp_no_sync", self.ddp_no_sync)
        one_of("on_nonfinite", self.on_nonfinite, ("skip", "raise"))
        boolean("check_gradients", self.check_gradients)

    def check_scheduler(self, optimizer: torch.optim.Optimizer, steps: int | None = 0) -> None:
        """The scheduler must step `optimizer`, and a OneCycleLR must last for the `steps` optimizer steps of the
        run (None: a run whose steps are not known before it starts, which a OneCycleLR cannot last)."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        if scheduler.optimizer is not optimizer:
            raise ValueError(_("scheduler was built on another optimizer: it would change that optimizer's learning "
                               "rate, not this one's; build it on the optimizer you pass to train"))
        if steps is None and isinstance(scheduler, OneCycleLR):
            raise ValueError(_("scheduler: a OneCycleLR must last for every optimizer step of the run, and this "
                               "run's steps are not known before it starts (data has no len()); give max_steps (and "
                               "build the OneCycleLR with total_steps=max_steps)"))
        if isinstance(scheduler, OneCycleLR) and scheduler.last_epoch + steps > scheduler.total_steps:
            raise ValueError(_("scheduler: this OneCycleLR has {left} of its total_steps={total} left, but this run "
                               "takes {steps} optimizer steps; build it with total_steps={steps}").format(
                                   left=scheduler.total_steps - scheduler.last_epoch, total=scheduler.total_steps,
                                   steps=steps))

    def measured(self) -> CycleOptions:
        """These options as a measurement of the cycle runs them on copies of the model and optimizer: without the
        scheduler (built on the real optimizer, it would step it) and the scaler (its scale would change; what it
        adds is a few scalars), with autocast (its lower-precision activations are what an amp step holds)."""
        return dataclasses.replace(self, scaler=None, scheduler=None)


class Inputs(NamedTuple):
    """A micro-batch's model inputs that are not one tensor: the cycle calls model(*args, **kwargs)."""

    args: tuple
    kwargs: dict


def accumulate_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]], loss_weights: Sequence[float], *,
                        loss_fn: Callable = torch.nn.functional.cross_entropy, clip_grad_norm: float | None = None,
                        scaler: torch.amp.GradScaler | None = None, autocast_dtype: torch.dtype | None = None,
                        scheduler=None, ddp_no_sync: bool = True, on_nonfinite: str = "skip",
                        check_gradients: bool = True) -> CycleResult:
    """One optimizer step from a cycle of micro-batches: zero once, weight each loss, backward each, step once.

    micro_batches: (x, y) pairs on the model's device (a list, or anything with len() that fetches on iteration); x
    is a tensor (model(x)) or `Inputs(args, kwargs)` for a model called as model(*args, **kwargs).
    loss_weights: one number per micro-batch, what its loss is multiplied by before backward(); for k micro-batches
    of a mean-reduced loss that is each one's share of the cycle's samples (1/k when they are equal). A micro-batch
    of weight 0 (a number, not a tensor) adds nothing and is not run, so its loss (NaN for a mean over no tokens)
    cannot reach the cycle's; when every weight is 0 nothing is run or changed and the result says `empty` (under
    DDP a process still runs its last micro-batch, its backward seeded with 0, for the all-reduce in it: exact when
    the loss's gradient over no tokens is 0, as cross_entropy's is; a NaN there skips the step on every process).
    loss_fn(model(x), y) must return a scalar tensor. clip_grad_norm: clip the accumulated gradient to this L2 norm.
    scaler: a GradScaler (fp16); a disabled one (GradScaler(enabled=False)) is no scaler. autocast_dtype: run the
    forward passes under torch.autocast with this dtype.
    scheduler: stepped once after the optimizer; a ReduceLROnPlateau gets this cycle's loss.
    ddp_no_sync: with a DistributedDataParallel or FSDP2 (fully_shard) model, compiled or not, synchronise the
    gradients only in the last micro-batch's backward (DDP's no_sync(), FSDP2's set_requires_gradient_sync).
    on_nonfinite: a NaN/inf loss or gradient norm skips the step ("skip") or raises NonFiniteError ("raise"); with a
    scaler, only a non-finite loss raises, as a gradient overflow is the scaler's routine (it skips that step and
    lowers its scale).
    check_gradients: read the gradient's L2 norm every cycle, so that a NaN/inf gradient under a finite loss (a
    sqrt or log at 0 in backward) skips or raises too; False leaves the norm out unless clipping or a scaler needs
    it (one reduction per parameter tensor less; grad_norm is then None, and such a gradient reaches the weights).
    The norm and clipping cover exactly the optimizer's parameters.
    What it leaves: after a step, the weights and the optimizer stepped and the gradients zeroed by the optimizer's
    own zero_grad(set_to_none=True), called once per step (every `.grad` None: read grad_norm from the result).
    After a skipped cycle, NonFiniteError or any error before the step (a micro-batch or loss_fn raising, Ctrl-C),
    the weights, the optimizer, the buffers the forward pass changes (BatchNorm's running statistics) and the
    optimizer's parameters' .grad are exactly as the call found them. A trainable parameter the optimizer does not
    hold is not the cycle's: backward() adds into its .grad as PyTorch does, in every case (freeze it to leave it
    alone).
    Ctrl-C (SIGINT) waits while the step and the scheduler's step are made, so a step is never torn; an error of the
    scheduler after the step is raised with the step applied, its result as the error's `cycle_result`. The host
    reads the device once: the loss and the norm together. Every argument is checked first (types, one finite
    weight >= 0 per micro-batch, the micro-batches of a list on the model's device and not empty; the keywords as
    one `CycleOptions`); `train`, which checks its own once before its first step, runs `_cycle` with its options.
    """
    _check_cycle(model, optimizer, micro_batches, loss_weights)
    options = CycleOptions(loss_fn, clip_grad_norm, scaler, autocast_dtype, scheduler, ddp_no_sync, on_nonfinite,
                           check_gradients)
    options.check_scheduler(optimizer)
    return _cycle(model, optimizer, micro_batches, loss_weights, options)


def _cycle(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches, loss_weights: Sequence[float],
           options: CycleOptions) -> CycleResult:
    """`accumulate_and_step` once its arguments are checked (`options` built): what train and the measurements run."""
    loss_fn, clip_grad_norm, scaler, autocast_dtype = (options.loss_fn, options.clip_grad_norm, options.scaler,
                                                       options.autocast_dtype)
    scheduler, ddp_no_sync, on_nonfinite, check_gradients = (options.scheduler, options.ddp_no_sync,
                                                             options.on_nonfinite, options.check_gradients)
    params = [p for group in optimizer.param_groups for p in group["params"]]  # clipped and measured: these only
    sync = cycle_sync(model, ddp_no_sync)  # DDP or FSDP2: gradients synchronised in the last backward() (None: alone)
    ddp = sync is not None  # several processes: each takes part in every collective
    no_sync = ddp and ddp_no_sync
    autocast = torch.autocast(params[0].device.type, autocast_dtype) if autocast_dtype else _NOTHING
    plain = sync is None and autocast is _NOTHING  # no context to enter around a forward pass
    watchers = _WATCHERS.__dict__.get("stack")  # this thread's: memory's tracker, timing's clock; or none
    watch = watchers[-1] if watchers else None  # None: nothing measures, no phase is marked
    # a micro-batch of weight 0 (no loss terms, no rows, DDP's padding) adds nothing: it is not run, so that its loss
    # (NaN, a mean over nothing) cannot reach the cycle's; under DDP every process runs at least its last micro-batch
    # (the all-reduce is in its backward), and without no_sync() every micro-batch, a weight-0 one seeded with 0
    nothing = [not isinstance(w, torch.Tensor) and w == 0 for w in loss_weights]
    # each backward all-reduces, or (FSDP2) each forward all-gathers the parameters: every process runs every one
    every = ddp and (not no_sync or sync.fsdp)
    last = max((i for i, zero in enumerate(nothing) if not zero), default=None)  # under no_sync(), the backward
    if last is None:  # that all-reduces: this process's last
        if not ddp:  # nothing to learn: no step, nothing changed
            return CycleResult(math.nan, None, float(optimizer.param_groups[0]["lr"]), False, True)
        last = len(nothing) - 1
    synced = len(nothing) - 1 if every else last  # the micro-batch whose backward synchronises the gradients
    if watch:
        watch("start", model)
    # kept: the optimizer's .grad set aside (None from here), buffers copied; told: under DDP, a failure on this
    # process before its all-reducing backward is told to the others, which stop too
    with _Kept(model, optimizer, params) as kept, _Told(params[0].device) if ddp else _NOTHING as told:
        total = None  # the cycle's loss so far, summed on the device: no host read per micro-batch
        for i, (x, y) in enumerate(micro_batches):
            if nothing[i] and i != last and not every:
                continue  # fetched, not run
            if watch:
                watch("forward")
            if plain:
                loss = _forward(model, loss_fn, x, y)  # the forward pass and the loss; no name keeps the output alive
            else:  # DDP's no_sync() or FSDP2's gradient sync off, but for the last micro-batch run (sharded.py)
                with sync.micro_batch(i, synced + 1) if sync else _NOTHING, autocast:
                    loss = _forward(model, loss_fn, x, y)
            weight = loss_weights[i]  # this micro-batch's share of the cycle's loss
            if nothing[i]:  # run for DDP only: its backward adds 0 (and all-reduces), its loss is not the cycle's
                root, seed = loss, 0
                total = torch.zeros_like(loss.detach()) if total is None else total
            elif scaler is None and not isinstance(weight, torch.Tensor):
                # backward() from the loss itself, its gradient seeded with the weight: what (loss * weight) would
                # give, bit for bit, without the multiply and its node in the graph
                root, value = loss, loss.detach()  # the loss without its graph: for the cycle's loss so far
                if total is None:
                    total = value if weight == 1 else value * weight
                else:  # the cycle's loss so far plus value * weight, in one op
                    total = torch.add(total, value, alpha=weight)
                seed = weight  # backward()'s gradient of the loss: made a tensor only there, freed with it
            else:  # backward() from the weighted loss: scaled (no fp16 underflow), or a weight on the device
                if total is None:
                    root = loss * weight
                elif isinstance(weight, torch.Tensor):  # multiplied on the device (no host read)
                    root = total + loss * weight
                else:  # the cycle's loss so far plus loss * weight, in one op
                    root = torch.add(total, loss, alpha=weight)
                total, seed = root.detach(), 1  # without its graph: only this micro-batch's term is backpropagated
                if scaler:
                    root = scaler.scale(root)
            if watch:
                watch("backward")
            if ddp and (every or i == last):
                told.agree()  # every process has come this far (none failed): the all-reduce in backward() can run
            root.backward(None if seed == 1 else torch.full_like(total, seed))  # adds seed * root's gradient into .grad
            if ddp:
                told.pending = True  # until the next agree()
        if ddp:
            told.pending = False  # past the micro-batches: an error from here on is every process's own
        loss = root = value = None  # the last micro-batch's loss and graph: not kept through the step (total is)
        if watch:
            watch("read")
        if scaler:
            scaler.unscale_(optimizer)  # the true gradients, once per cycle, before clipping and the norm
        # the gradient's norm, for the finite check; read even with check_gradients=False when clipping computes it
        # anyway, or with a scaler (a step it skips for an overflow must be recorded as skipped)
        with_norm = check_gradients or clip_grad_norm is not None or scaler is not None
        loss, grad_norm = _read_loss_and_norm(total, params, clip_grad_norm, with_norm, sync)  # the one host read
        # the finite check, alike on every process (grad_norm is None: not read, the loss alone is checked)
        skipped = not (math.isfinite(loss) and (grad_norm is None or math.isfinite(grad_norm)))
        lr = float(optimizer.param_groups[0]["lr"])
        if skipped:
            kept.restore()  # no step: .grad and the buffers as they were, the model exactly as the call found it
            if scaler:
                scaler.update()  # a lower scale after an overflow
        else:
            if watch:
                watch("step")
            with STEP.unit() as step:  # Ctrl-C waits from here until the step (and, in train, its record) is made
                scaler.step(optimizer) if scaler else optimizer.step()  # the one optimizer step of the cycle
                step.result = CycleResult(loss, grad_norm, lr, False)  # from here an error comes after the record
                kept.stepped()  # the gradients used: freed, so the next cycle holds no second copy
                if scaler:
                    scaler.update()  # a higher scale after many good steps
                if isinstance(scheduler, ReduceLROnPlateau):
                    scheduler.step(loss)  # its metric: this cycle's loss (its patience counts optimizer steps)
                elif scheduler is not None:
                    scheduler.step()  # once per optimizer step, after it
    if watch:
        watch("end")
    if not skipped:
        return step.result
    if on_nonfinite == "raise" and not (scaler and math.isfinite(loss)):  # an overflow is the scaler's routine
        raise NonFiniteError(_("non-finite loss ({loss}) or gradient norm ({grad_norm}): no step was taken; the "
                               "weights, buffers, optimizer and the optimizer's .grad are as they were before the "
                               "cycle").format(loss=loss, grad_norm=grad_norm))
    return CycleResult(loss, grad_norm, lr, True)


_WATCHERS = threading.local()  # .stack: what measures this thread's cycles (innermost last): watch(phase, model=None)


@contextlib.contextmanager
def watched(watch: Callable):
    """Context manager: the cycles this thread runs inside call watch(phase) as each part begins: "start" (with
    the model), "forward" and "backward" once per micro-batch, "read" (the norm and the one host read), "step",
    "end". `memory` names the tensors each part creates with it and `timing` reads the clock."""
    stack = _WATCHERS.__dict__.setdefault("stack", [])
    stack.append(watch)
    try:
        yield
    finally:
        stack.remove(watch)


def _forward(model: torch.nn.Module, loss_fn: Callable, x, y) -> torch.Tensor:
    """One micro-batch's forward pass and its loss (inputs that are not one tensor unpacked)."""
    loss = loss_fn(model(*x.args, **x.kwargs) if isinstance(x, Inputs) else model(x), y)
    if type(loss) is torch.Tensor and loss.requires_grad and not loss.dim():  # a plain scalar with a gradient
        return loss
    return _scalar_loss(loss)  # any other: checked there (a tensor subclass passes as well)


def _read_loss_and_norm(total: torch.Tensor, params: list[torch.Tensor], clip_grad_norm: float | None,
                        with_norm: bool, sync) -> tuple[float, float | None]:
    """The cycle's loss (`total`, the sum of its weighted losses) and its gradients' L2 norm (None unless
    with_norm), read from the device at once.

    Clips the gradients first when clip_grad_norm is given (the norm returned is the one before clipping). Under DDP
    and FSDP2 (`sync`) the loss is averaged over the processes, as they average their gradients; under FSDP2 the
    norm is over every process's shards. The norms' tensors are freed on return, before the optimizer step.
    """
    if sync is not None and sync.fsdp:  # each process holds a shard of each gradient: one all-reduce for both
        total, norms = sync.loss_and_norm(total, params, clip_grad_norm, with_norm)
    elif clip_grad_norm is not None:  # clipping: scale the accumulated gradient down to norm <= clip_grad_norm
        norms = [torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)]  # their total norm, before clipping
    elif with_norm:
        grads = [grad for p in params if (grad := p.grad) is not None]  # no .grad: the loss does not depend on it
        norms = torch._foreach_norm(grads) if grads else ()  # each gradient's L2 norm, in one call
    else:
        norms = ()  # the loss alone
    try:
        values = torch.stack([total, *norms])  # the loss, then the norms: one tensor, one transfer
    except RuntimeError:  # parameters on several devices (a model split over GPUs): the norms go to the loss's device
        values = torch.stack([total, *(norm.to(total.device) for norm in norms)])
    if sync is not None and not sync.fsdp:  # DDP: every process holds the same, all-reduced, gradient
        dist.all_reduce(values[:1])
        values[:1] /= dist.get_world_size()
    if isinstance(values, FakeTensor):  # traced (memory.measure_step): no values; the cycle goes on as if finite
        return 0.0, 0.0 if with_norm else None
    loss, *norms = values.tolist()
    return loss, math.hypot(*norms) if with_norm else None
