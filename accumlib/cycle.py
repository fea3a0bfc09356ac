"""One optimizer step from a cycle of micro-batches: `accumulate_and_step`, and the checks of what it is given.

Zero once, weight each micro-batch loss by its share of the cycle, backward() each (PyTorch adds into .grad), step
once. The scheduler, clipping and the AMP scaler run once per step; under DistributedDataParallel or FSDP2 the
gradients are synchronised once (`accumlib.sharded`). Nothing reads a tensor's value on the host inside a cycle
but once, after its last backward(): on a GPU every such read makes the host wait until the device has caught up.
`accumlib.loop.train` drives it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import numbers
import _signal
import signal
import threading
import warnings
import weakref
from collections.abc import Sized
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.modules.batchnorm import _NormBase
from torch.optim.lr_scheduler import OneCycleLR, ReduceLROnPlateau
from torch.utils._pytree import tree_leaves

from ._validate import Shown, boolean, function, one_of, positive_number
from .i18n import _
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


def _check_cycle(model, optimizer, micro_batches, loss_weights) -> None:
    """accumulate_and_step's model, optimizer and data, checked before anything changes (loss weights given as
    tensors are read from the device once, together; nothing else is)."""
    _check_model(model)
    params = _check_optimizer(model, optimizer)  # some of the model's trainable parameters, without a closure
    for name, value in (("micro_batches", micro_batches), ("loss_weights", loss_weights)):
        if not isinstance(value, Sized) or isinstance(value, (str, dict, torch.Tensor)):
            raise TypeError(_("{name} must be a list (one item per micro-batch), got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__))
    if not micro_batches:
        raise ValueError(_("micro_batches is empty: a cycle needs at least one micro-batch"))
    if len(micro_batches) != len(loss_weights):
        raise ValueError(_("loss_weights has {weights} values but micro_batches has {micro} micro-batches: give one "
                           "weight per micro-batch").format(weights=len(loss_weights), micro=len(micro_batches)))
    _check_weights(loss_weights, min((p.dtype for p in params if p.is_floating_point()),
                                     key=lambda dtype: torch.finfo(dtype).max, default=torch.float64))
    _check_micro_batches(model, micro_batches)


def _check_weights(loss_weights, dtype: torch.dtype = torch.float64) -> None:
    """One finite number >= 0 per micro-batch: a Python number, a NumPy scalar or a 0-d real tensor, at most the
    largest finite value of `dtype` (the optimizer's parameters': past it the weighted loss is no number of that
    dtype). The tensors are read together, in one host read, before anything changes."""
    largest, tensors, values = torch.finfo(dtype).max, [], []
    for i, weight in enumerate(loss_weights):
        if isinstance(weight, torch.Tensor) and weight.dim() == 0 and not (weight.is_complex() or
                                                                          weight.dtype == torch.bool):
            tensors.append((i, weight))
        elif not isinstance(weight, numbers.Real) or isinstance(weight, bool) or not 0 <= weight < math.inf:
            raise ValueError(_("loss_weights[{i}] is {value!r}: loss_weights must hold finite numbers >= 0 (or 0-d "
                               "real tensors), one per micro-batch").format(i=i, value=Shown(weight)))
        else:
            values.append((i, weight, weight))
    if tensors:
        read = torch.stack([w.detach().to("cpu", torch.float64) for _i, w in tensors]).tolist()  # the one read
        for (i, weight), value in zip(tensors, read, strict=True):
            if not 0 <= value < math.inf:
                raise ValueError(_("loss_weights[{i}] is {value!r}: loss_weights must hold finite numbers >= 0 (or "
                                   "0-d real tensors), one per micro-batch").format(i=i, value=weight))
            values.append((i, weight, value))
    for i, weight, value in values:  # a weight past the dtype's range: refused by name, not an error inside
        if value > largest:
            raise ValueError(_("loss_weights[{i}] is {value!r}, more than the largest {dtype} ({largest:g}), the "
                               "dtype of the optimizer's parameters: the weighted loss would be no {dtype} number; "
                               "valid: finite numbers from 0 to {largest:g}").format(
                                   i=i, value=Shown(weight), dtype=str(dtype).removeprefix("torch."),
                                   largest=largest))


def _check_micro_batches(model: torch.nn.Module, micro_batches) -> None:
    """Each micro-batch of a list or tuple (a lazy sequence is fetched by the cycle itself): no tensor in it empty
    along its first dimension, every tensor on a device of the model's parameters."""
    if not isinstance(micro_batches, (list, tuple)):
        return
    devices = {p.device for p in model.parameters()}
    for i, batch in enumerate(micro_batches):
        for tensor in (t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)):
            if tensor.dim() and not len(tensor):
                raise ValueError(_("micro_batches[{i}] holds a tensor of shape {shape}, without samples: an empty "
                                   "micro-batch has no mean loss (NaN); leave it out of the cycle").format(
                                       i=i, shape=tuple(tensor.shape)))
            if tensor.device not in devices:
                raise ValueError(_("micro_batches[{i}] holds a tensor on {device} but the model is on {model}: move "
                                   "the micro-batches to the model's device first (x.to(device))").format(
                                       i=i, device=tensor.device, model=", ".join(sorted(map(str, devices)))))


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


def _told(error: BaseException | None, failed: list[int]) -> str:
    """Under DDP, once every process knows that the processes `failed` have (an all-reduced flag): what each of them
    raised ("process 1: ValueError: ..."), gathered on every process (one all_gather_object)."""
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    return "; ".join(_("process {rank}: {error}").format(rank=rank, error=messages[rank]) for rank in failed)


def _agree(error: BaseException | None, device: torch.device) -> None:
    """Under DDP, before a backward that all-reduces (which a failed process would never reach): one all-reduce of
    a failure flag per process. A process that failed (`error`) tells the others and returns (its caller raises
    its own error); the others raise, saying which process failed and why."""
    flags = torch.zeros(dist.get_world_size(), device=device)
    flags[dist.get_rank()] = error is not None
    dist.all_reduce(flags)
    failed = [rank for rank, flag in enumerate(flags.tolist()) if flag]
    if failed:
        why = _told(error, failed)
        if error is None:
            raise RuntimeError(_("{why}: it failed in this cycle, in a micro-batch's forward pass or loss_fn; this "
                                 "process stops with it, before the step: its weights, optimizer and .grad are as "
                                 "they were").format(why=why))


class _Told:
    """`_cycle`'s block under DDP: an error raised in it before `agree()` (a micro-batch, the forward pass, loss_fn)
    is told to every process (`_agree`) before it propagates; agree() is that all-reduce when nothing failed."""

    __slots__ = ("device", "pending")

    def __init__(self, device: torch.device):
        self.device, self.pending = device, True

    def __enter__(self) -> _Told:
        return self

    def agree(self) -> None:
        self.pending = False  # an error from here on (another process's, raised by _agree) is not told again
        _agree(None, self.device)

    def __exit__(self, kind, error, traceback) -> None:
        if self.pending and isinstance(error, Exception):
            _agree(error, self.device)  # the others raise, saying why; this process raises its own error


class _Unit:
    """One step's block of `_Step` (see there): SIGINT held from __enter__; an error after `result` is set (the
    optimizer has stepped) carries it as `cycle_result`, and inside `until_recorded` waits for the record."""

    __slots__ = ("step", "result")

    def __init__(self, step: _Step):
        self.step, self.result = step, None

    def __enter__(self) -> _Unit:
        step = self.step
        step.install()  # unless a run installed it (and nobody replaced it since): until the unit is released
        step.held = True
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        step, swallowed = self.step, False
        if error is not None and self.result is not None:  # the step was applied: whoever catches this records it
            error.cycle_result = self.result
            if step.depth:
                step.error, swallowed = error, True  # raised once the step's record is made
        if not step.depth:
            step.release()
        return swallowed


class _Recorded:
    """`_Step.until_recorded`'s block: on leaving it the held SIGINT, or an error after the step, is raised."""

    __slots__ = ("step",)

    def __init__(self, step: _Step):
        self.step = step

    def __enter__(self) -> None:
        self.step.depth += 1

    def __exit__(self, kind, error, traceback) -> None:
        step = self.step
        step.depth -= 1
        waiting, step.error = step.error, None
        if not step.depth:
            step.release()
        if waiting is not None:
            raise waiting


class _Running:
    """`_Step.run`'s block: the holding handler installed once for all the block's steps (main thread only)."""

    __slots__ = ("step",)

    def __init__(self, step: _Step):
        self.step = step

    def __enter__(self) -> None:
        step = self.step
        step.install()
        step.runs += 1

    def __exit__(self, kind, error, traceback) -> None:
        step = self.step
        step.runs -= 1
        if not step.runs:
            step.uninstall()


_MAIN_THREAD = threading.main_thread().ident  # only the main thread receives signals


class _Step(threading.local):
    """The optimizer step, the scaler's and scheduler's steps and (in `train`) the step's record, as one unit.

    A SIGINT (Ctrl-C) that arrives inside waits and is delivered once the unit closes, so a step is never torn and
    never left without its record (main thread only: only it receives signals). An error raised inside after the
    optimizer step (a scheduler's) carries the step's result as `cycle_result`; inside `until_recorded` it is
    raised after the record too. One per thread: a dashboard's training thread has its own.

    The holding handler (`handler`) is installed by the first unit and given back when the unit closes; inside a
    `run()` block (train's whole run) it stays installed between the steps, where a SIGINT is passed straight on to
    the handler it displaced, so that a step costs no handler swaps.
    """

    def __init__(self):
        self.depth = 0  # open `until_recorded` blocks of this thread
        self.runs = 0  # open `run` blocks of this thread
        self.held = False  # inside a unit: a SIGINT waits for its end
        self.previous = None  # the SIGINT handler that `handler` displaced, while it is installed
        self.pending = None  # (signal number, frame) of a SIGINT that arrived meanwhile
        self.error = None  # an error raised after the optimizer step, waiting for the step's record
        self.handler = self.hold  # the one bound method installed (its identity tells whether it still is)
        self.recorded = _Recorded(self)  # `until_recorded`'s block, reused: its state is `depth`

    def unit(self) -> _Unit:
        """The step's block: a context manager whose `result` the block sets once the optimizer has stepped."""
        return _Unit(self)

    def until_recorded(self) -> _Recorded:
        """`train`: the unit lasts until this block (the cycle and its record) ends."""
        return self.recorded

    def run(self) -> _Running:
        """`train`: the holding handler stays installed for the whole block, between its units too."""
        return _Running(self)

    def install(self) -> None:
        """The holding handler in place of the current one, unless it is already installed (main thread only)."""
        if threading.get_ident() != _MAIN_THREAD:
            return
        previous = _signal.getsignal(signal.SIGINT)  # the C function: no enum conversion
        if previous is self.handler:
            return
        if previous is not None:  # None: a handler installed outside Python; left alone
            _signal.signal(signal.SIGINT, self.handler)
            self.previous = previous

    def uninstall(self) -> None:
        previous = self.previous  # kept until the handler is given back: a SIGINT meanwhile still reaches it
        if previous is not None and _signal.getsignal(signal.SIGINT) is self.handler:  # not replaced meanwhile
            _signal.signal(signal.SIGINT, previous)
        self.previous = None

    def hold(self, signum, frame) -> None:
        if self.held:
            self.pending = (signum, frame)
        else:  # between the steps of a run: at once, as the displaced handler would
            _deliver(self.previous, signum, frame)

    def release(self) -> None:
        self.held = False
        previous = self.previous
        if not self.runs:
            self.uninstall()
        pending, self.pending = self.pending, None
        if pending is not None:
            _deliver(previous, *pending)


def _deliver(handler, signum, frame) -> None:
    """What `handler` (a SIGINT handler as signal.getsignal gives it) does with a SIGINT."""
    if callable(handler):
        handler(signum, frame)  # Python's default handler raises KeyboardInterrupt here, after the unit
    elif handler == signal.SIG_DFL:
        raise KeyboardInterrupt


STEP = _Step()


def _forward(model: torch.nn.Module, loss_fn: Callable, x, y) -> torch.Tensor:
    """One micro-batch's forward pass and its loss (inputs that are not one tensor unpacked)."""
    loss = loss_fn(model(*x.args, **x.kwargs) if isinstance(x, Inputs) else model(x), y)
    if type(loss) is torch.Tensor and loss.requires_grad and not loss.dim():  # a plain scalar with a gradient
        return loss
    return _scalar_loss(loss)  # any other: checked there (a tensor subclass passes as well)


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


class _BuffersKept:
    """Context manager: a copy of the buffers the forward pass changes; restore() puts them back, as does an error.

    Copied: the running statistics of a norm layer that updates them (BatchNorm in training mode), and any buffer
    a cycle was seen to change before (by its version counter). Any other buffer (a causal mask, a positional
    table) is not copied, only its version noted: one that changes during a block that is put back cannot be, and a
    warning names it (it is copied from then on).
    """

    def __init__(self, model: torch.nn.Module):
        self.saved, self.watched, self.model = [], [], model
        modules = [model]
        for module in modules:  # the list grows as it is walked: model.buffers() without building names, 3x faster
            if module._buffers:  # most modules have none
                updates = isinstance(module, _NormBase) and module.training and module.track_running_stats
                for buffer in module._buffers.values():
                    if buffer is None:
                        continue
                    if updates or _CHANGED.get(id(buffer), _dead)() is buffer:
                        self.saved.append((buffer, buffer.clone()))
                    else:
                        self.watched.append((buffer, buffer._version))
            if module._modules:  # a leaf has none
                modules += [child for child in module._modules.values() if child is not None]

    def __enter__(self) -> _BuffersKept:
        return self

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in self.saved:
                buffer.copy_(saved)
        changed = [buffer for buffer, version in self.watched if buffer._version != version]
        for buffer in changed:
            _CHANGED[id(buffer)] = weakref.ref(buffer, functools.partial(_forget, id(buffer)))
        if changed:
            names = [name for name, b in self.model.named_buffers() if any(b is c for c in changed)]
            warnings.warn(_("the forward pass changed the buffer(s) {names}, which were not copied before this "
                            "cycle, so they could not be put back; from the next cycle on they are").format(
                                names=", ".join(names)), RuntimeWarning, stacklevel=3)

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and not self.done:
            self.restore()

    done = False  # True once a step has used what the block built: nothing is put back then


def _dead():
    return None


def _forget(key: int, ref: weakref.ref) -> None:
    """A buffer of _CHANGED is being freed: its entry goes with it (before its id can name another buffer)."""
    if _CHANGED.get(key) is ref:
        del _CHANGED[key]


_CHANGED: dict[int, weakref.ref] = {}  # buffers seen to change in a forward pass although no norm layer's statistics


class _Kept(_BuffersKept):
    """`_BuffersKept`, and the .grad of the optimizer's parameters set aside (None during the block): restore()
    gives back the .grad found, stepped() frees the block's with the optimizer's own zero_grad(set_to_none=True)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]):
        super().__init__(model)
        self.optimizer, self.params = optimizer, params
        # the .grad found, where there is one (after a step there is none: nothing to set aside, nothing to set)
        self.grads = [(p, grad) for p in params if (grad := p.grad) is not None]
        for p, _grad in self.grads:
            p.grad = None  # once per cycle: from here on, every backward() adds into .grad

    def restore(self) -> None:
        super().restore()
        for p in self.params:
            p.grad = None  # what the block's backward() made
        for p, grad in self.grads:
            p.grad = grad  # what the call found

    def stepped(self) -> None:
        self.done = True
        # the step's zeroing, once: the optimizer's own (a sharded or fused optimizer's override runs too)
        self.optimizer.zero_grad(set_to_none=True)


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(_("model must be a torch.nn.Module, got {value!r} of type {type}").format(
            value=model, type=type(model).__name__))


def _check_optimizer_type(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(_("optimizer must be a torch.optim.Optimizer, got {value!r} of type {type}").format(
            value=optimizer, type=type(optimizer).__name__))
    closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:  # LBFGS
        raise ValueError(_("optimizer is a {type}, whose step() needs a closure that computes the loss again; an "
                           "accumulated step has none: use an optimizer whose step() takes no closure, such as SGD, "
                           "Adam or AdamW").format(type=type(optimizer).__name__))


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
