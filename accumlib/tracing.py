"""Where a step is measured, leaving the model as it was: on a fake copy (FakeTensorMode: nothing computed; a step
that reads a value falls back to a real copy on the CPU), on a real copy, or, for an FSDP2 model, on the model
itself, put back after; a DistributedDataParallel model as its module and DDP's gradient buckets."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import traceback
import warnings
from typing import Callable

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeCopyMode,
    FakeTensorMode,
)

from . import cycle, sharded
from .i18n import _
from .measured_step import ALLOCATOR, FAKE, TRACKER, MemoryReport, _clone_optimizer, _measure, _on
from .options import CycleOptions
from .tracker import _no_collection


def _measure_cycle(
    model,
    optimizer,
    batches,
    loss_weights,
    options: CycleOptions,
    micro_batch_size: int,
    fake: bool,
    device: torch.device,
    explain: Callable = contextlib.nullcontext,
) -> MemoryReport:
    """The memory of the cycle of `batches` with `loss_weights` and `options` (checked) on a copy of the model and
    of the optimizer, on `device` (fake: under FakeTensorMode where the model is; a step that reads a value is then
    measured for real on the CPU, with a warning). explain(): a context that words a failure of the model.
    A DistributedDataParallel model: what one process needs, traced without collectives (`_one_process`)."""
    module, buckets = _one_process(model)
    report = _measure_copy(module, optimizer, batches, loss_weights, options, micro_batch_size, fake, device, explain)
    if not buckets:
        return report
    return dataclasses.replace(report, peak=report.peak + buckets, gradients=report.gradients + buckets)


def _one_process(model: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """What one process of a DistributedDataParallel model (torch.compile's wrapper of one too) is measured as: its
    module, traced without DDP (whose communication hooks all-reduce, which a trace on copies cannot), and the
    bytes DDP itself holds from its construction on, its gradient buckets: a flat copy of every trainable
    parameter's gradient (none with gradient_as_bucket_view=True, whose .grad are views of them), counted as
    gradients at the peak. Any other model: itself, 0 bytes."""
    if not sharded.is_ddp(model):
        return model, 0
    ddp = sharded._unwrapped(model)
    trainable = [p for p in ddp.module.parameters() if p.requires_grad]
    return ddp.module, 0 if ddp.gradient_as_bucket_view else sum(p.numel() * p.element_size() for p in trainable)


def _measure_copy(
    model,
    optimizer,
    batches,
    loss_weights,
    options: CycleOptions,
    micro_batch_size: int,
    fake: bool,
    device: torch.device,
    explain: Callable,
) -> MemoryReport:
    """`_measure_cycle` of a model that is no DistributedDataParallel."""
    home = next(model.parameters()).device
    if sharded.is_fsdp(model):  # a copy is refused by FSDP, and a trace cannot run its collectives
        return _measured_sharded(model, optimizer, batches, loss_weights, options, micro_batch_size, fake, explain)
    with torch.random.fork_rng(devices=[]):  # dropout in the copy must not move the caller's random state
        if fake:
            try:
                return _fake_measure(
                    model, batches, loss_weights, optimizer, device, options, micro_batch_size, explain
                )
            except _Untraceable as untraceable:
                if home.type == "meta":
                    raise ValueError(
                        _(
                            "this training step cannot be traced without values: {line} reads a "
                            "tensor's value ({what}), and a model on the meta device has none to "
                            "measure with: build it on the CPU to measure a real step"
                        ).format(line=untraceable.line, what=untraceable.what)
                    ) from untraceable.error
                warnings.warn(
                    _(
                        "this training step cannot be traced without values: {line} reads a tensor's "
                        "value ({what}); it was measured with a real step on the CPU instead (exact for "
                        "this micro-batch; code that branches on values may need more on "
                        "others)"
                    ).format(line=untraceable.line, what=untraceable.what),
                    RuntimeWarning,
                    stacklevel=3,
                )
                device = torch.device("cpu")
        # copies: a slice would count its whole dataset otherwise
        batches = _on(batches, lambda t: t.to(device, copy=True))
        copied = copy.deepcopy(model).to(device)
        return _real_measure(
            model, copied, optimizer, batches, loss_weights, options, micro_batch_size, explain, device
        )


def _measured_sharded(
    model,
    optimizer,
    batches,
    loss_weights,
    options: CycleOptions,
    micro_batch_size: int,
    fake: bool,
    explain: Callable,
) -> MemoryReport:
    """The memory one process holds in a step of an FSDP2 (fully_shard) model: its shards of the parameters,
    gradients and optimizer state, the parameters and gradients each unit gathers, the micro-batches' activations.

    FSDP2 refuses to be copied, and its all-gathers and reduce-scatters cannot run under FakeTensorMode: so the step
    is a real one, on the model itself, under the CPU tracker (every process must measure at once: the step's
    collectives run), with a new optimizer of the same type and settings; afterwards this process's shards, the
    buffers and the .grad are put back as they were, and the random state (fake=True: said in a warning).
    The peak is the busiest process's, the same on every process (so that a budget refuses on all or none: shards
    of uneven sizes make processes' peaks differ, and a busy CPU can move a process's peak from run to run by up to a
    unit's gradient); what this process needed less is counted in `other`. The collectives run on copies
    (`_collective`): the backend's thread frees none of the counted storages."""
    if fake:
        warnings.warn(
            _(
                "model is sharded with fully_shard (FSDP2): its step cannot be traced without values (a "
                "trace runs no all-gather or reduce-scatter), so it was measured with a real step on every "
                "process, then undone"
            ),
            RuntimeWarning,
            stacklevel=4,
        )
    params, buffers = list(model.parameters()), list(model.buffers())
    shards = [sharded.local(p).detach().clone() for p in params]
    kept = [b.detach().clone() for b in buffers]
    grads = [p.grad for p in params]
    device = sharded.local(params[0]).device
    batches = _on(batches, lambda t: t.to(device, copy=True))
    try:
        with (
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            _no_collection(collect_first=True),
        ):
            for p in params:
                p.grad = None
            report = _real_measure(
                model, model, optimizer, batches, loss_weights, options, micro_batch_size, explain, device
            )
        busiest = torch.tensor([report.peak], dtype=torch.float64, device=device)
        torch.distributed.all_reduce(busiest, torch.distributed.ReduceOp.MAX)  # the same answer on every process
        more = int(busiest.item()) - report.peak
        return dataclasses.replace(report, peak=report.peak + more, other=report.other + more)
    finally:
        with torch.no_grad():
            for p, shard in zip(params, shards, strict=True):
                sharded.local(p).copy_(shard)
            for b, value in zip(buffers, kept, strict=True):
                b.copy_(value)
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad


class _Untraceable(Exception):
    """A step that FakeTensorMode cannot run: it reads a tensor's value. `line`: where, in the user's code (the
    model's forward pass, loss_fn) or else in the optimizer's step."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error, self.what = error, type(error).__name__
        frames = traceback.extract_tb(error.__traceback__)
        mine = [f for f in frames if not _library_file(f.filename)]
        optimizer = [f for f in frames if f"{os.sep}optim{os.sep}" in f.filename]
        if mine:
            self.line = _("the model or loss_fn ({file}, line {number}: {code})").format(
                file=mine[-1].filename, number=mine[-1].lineno, code=mine[-1].line
            )
        elif optimizer:
            self.line = _("the optimizer's step ({file}, line {number}: {code})").format(
                file=optimizer[-1].filename, number=optimizer[-1].lineno, code=optimizer[-1].line
            )
        else:
            self.line = _("a line of the step")


def _library_file(filename: str) -> bool:
    """A file of torch's or accumlib's (not the user's model)."""
    return any(filename.startswith(os.path.dirname(m.__file__) + os.sep) for m in (torch, cycle))


_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)


def _real_measure(
    model, target, optimizer, batches, loss_weights, options, micro_batch_size, explain, device
) -> MemoryReport:
    """`_measure` of a real step of `target` (a copy of `model`, or FSDP2's model itself) with a copy of `optimizer`
    on `device`: the caching allocator's peak on CUDA, the CPU tracker's elsewhere."""
    cuda = device if device.type == "cuda" else None
    return _measure(
        target,
        _clone_optimizer(optimizer, model, target),
        batches,
        loss_weights,
        ALLOCATOR if cuda else TRACKER,
        torch.cuda.get_device_name(device) if cuda else "cpu",
        options,
        micro_batch_size,
        explain,
        cuda=cuda,
    )


def _fake_measure(model, batches, loss_weights, optimizer, device, options, micro_batch_size, explain) -> MemoryReport:
    """_measure_cycle under FakeTensorMode; _Untraceable when the forward pass reads a tensor's value."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with FakeCopyMode(mode):
        copied = copy.deepcopy(model)
    _fake_on(copied, device, mode)  # where the step will run: train traces a model before it moves it there
    batches = _on(batches, mode.from_tensor)
    try:
        with mode:  # where the step runs (a fake 'cuda' one too); new storages of the micro-batch's size
            batches = _on(batches, functools.partial(_fake_made_on, device=device))
            return _measure(
                copied,
                _clone_optimizer(optimizer, model, copied),
                batches,
                loss_weights,
                FAKE,
                f"{'cuda' if device.type == 'cuda' else 'cpu'} (fake)",
                options,
                micro_batch_size,
                explain,
            )
    except _DATA_DEPENDENT as error:  # not worded by explain()
        raise _Untraceable(error) from None
    except ValueError as error:
        if isinstance(error.__cause__, _DATA_DEPENDENT):
            raise _Untraceable(error.__cause__) from None
        raise


def _fake_made_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor like `t` (shape, dtype, layout) in a storage of its own on `device`, as t.to(device).clone()
    would be: a fake tensor has no values to move, and a CPU build of torch cannot .to('cuda') even a fake one."""
    return torch.empty_like(t, device=device)


def _fake_on(model: torch.nn.Module, device: torch.device, mode: FakeTensorMode) -> None:
    """Put the fake copy's parameters (their .grad too) and buffers on `device`, as model.to(device) would
    (`_fake_made_on`). A parameter shared by two modules stays one parameter."""
    on = functools.partial(_fake_made_on, device=device)
    made: dict[int, torch.Tensor] = {}
    with mode:
        for module in model.modules():
            for kind in (module._parameters, module._buffers):
                for name, t in kind.items():
                    if t is None or t.device == device:
                        continue
                    if id(t) not in made:
                        if isinstance(t, torch.nn.Parameter):
                            made[id(t)] = torch.nn.Parameter(on(t), t.requires_grad)
                            if t.grad is not None:
                                made[id(t)].grad = on(t.grad)
                        else:
                            made[id(t)] = on(t)
                    kind[name] = made[id(t)]
