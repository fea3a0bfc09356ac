"""train's arguments, checked before anything changes (`_check_train`: each refusal names the parameter, the value
and what is valid), and what the run needs of them, resolved (`_Run`): the device (`_device`), where the cycles
come from (`source`), the cycle's options checked once (`options.CycleOptions`), the checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import torch

from . import checkpoint as checkpoints, devices, sharded
from ._validate import boolean, function, integer, non_negative_int, one_of, positive_int
from .batches import _Producer
from .cycle import _check_amp
from .cycle_checks import _check_model, _check_optimizer
from .i18n import _
from .loss_weights import _of_batch
from .options import CycleOptions
from .records import History, StepRecord
from .source import _source


class _Run(NamedTuple):
    """train's arguments once `_check_train` has checked them: what the run needs, resolved."""

    history: History  # the run's history (its notes already hold what the checks noticed)
    source: _Producer  # where the cycles come from: (X, y), a Dataset or a loader, asked alike
    device: torch.device
    params: list  # the optimizer's parameters
    options: CycleOptions  # the cycle's options, for every step
    accum_steps: int
    world: int  # processes (1 without DDP)
    ddp: bool  # DDP or FSDP2: several processes, the counts all-reduced
    normalize: str
    reduction: str  # "mean" or "sum": what the loss is over its micro-batch
    count: Callable | None
    epochs: int | None  # None: as many as max_steps takes
    max_steps: int | None
    resume_from_step: int
    max_skipped_steps: int
    on_step: Callable | None
    measure_memory: bool
    memory_budget: int | None
    checkpoint: object  # `checkpoints.Checkpoint`, or `checkpoints.NONE`


def _check_train(
    model,
    data,
    optimizer,
    options: CycleOptions | None,
    cycle_options: dict,
    *,
    accum_steps,
    micro_batch_size,
    epochs,
    max_steps,
    normalize,
    loss_reduction,
    count,
    device,
    seed,
    shuffle,
    on_step,
    max_skipped_steps,
    resume_from_step,
    measure_memory,
    memory_budget,
    checkpoint,
    checkpoint_every,
) -> _Run:
    """Every argument of `train`, checked before anything changes (each refusal names the parameter, the value and
    what is valid); the cycle's options are checked once, as one `CycleOptions`, which every step then uses."""
    _check_model(model)
    accum_steps = positive_int("accum_steps", accum_steps)
    if micro_batch_size is not None:
        micro_batch_size = positive_int("micro_batch_size", micro_batch_size)
    if epochs is not None:
        epochs = positive_int("epochs", epochs)
    if max_steps is not None:
        max_steps = positive_int("max_steps", max_steps)
    max_skipped_steps = positive_int("max_skipped_steps", max_skipped_steps)
    resume_from_step = non_negative_int("resume_from_step", resume_from_step)
    path, checkpoint_every = checkpoints.check(checkpoint, checkpoint_every, resume_from_step)
    world, rank = sharded.world_and_rank(model)  # DDP or FSDP2, compiled or not: the data shared out by rank
    ddp = sharded.is_ddp(model) or sharded.is_fsdp(model)  # the counts all-reduced, the data shared out
    device = _device(device)
    seed = integer("seed", seed, -(2**63), 2**64)  # a Python int before the source draws its order from it
    history = History()
    source = _source(data, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, history.notes)
    params = _check_optimizer(model, optimizer)
    options = CycleOptions.of(options, cycle_options, "train")  # the cycle's options, checked once for the run
    one_of("normalize", normalize, ("samples", "steps", "count"))
    count = function("count", count, optional=True)
    if (normalize == "count") != (count is not None):
        raise ValueError(
            _(
                "count= (a function giving a micro-batch's number of loss terms) goes with "
                "normalize='count', and only with it; got normalize={normalize!r}, count={count!r}"
            ).format(normalize=normalize, count=count)
        )
    count = None if count is None else _of_batch(count)
    if loss_reduction is not None:
        one_of("loss_reduction", loss_reduction, ("mean", "sum"))
        if normalize == "steps":
            raise ValueError(
                _(
                    "loss_reduction={value!r} goes with normalize='samples' or 'count'; normalize='steps' "
                    "divides every loss by accum_steps, whatever its reduction"
                ).format(value=loss_reduction)
            )
    elif normalize == "count" and options.loss_fn is not None:  # never guessed: a wrong guess trains other weights too
        raise ValueError(
            _(
                "loss_reduction is missing: with normalize='count' and your own loss_fn, say what loss_fn "
                "returns over a micro-batch's counted items: loss_reduction='mean' (their mean, as "
                "PyTorch's losses by default and a Hugging Face model's .loss give it) or "
                "loss_reduction='sum' (their sum, as reduction='sum' gives it)"
            )
        )
    reduction = loss_reduction or "mean"  # the model's own loss is a mean (a Hugging Face model's: over its tokens)
    boolean("shuffle", shuffle)
    boolean("measure_memory", measure_memory)
    on_step = function("on_step", on_step, optional=True)
    if memory_budget is not None:
        memory_budget = positive_int("memory_budget", memory_budget)
    if _check_amp(options.amp, device) is torch.float16 and options.scaler is None:  # bf16 refused on a T4
        options = dataclasses.replace(options, scaler=torch.amp.GradScaler(device.type))  # fp16 needs one: a new one
    if options.amp is False and options.scaler is not None:  # a disabled scaler (GradScaler(enabled=use_amp)) is none
        raise ValueError(_("scaler was given but amp=False: pass amp='fp16' to use a GradScaler"))
    epochs = epochs if epochs is not None or max_steps is not None else 1  # None: as many as max_steps takes
    source.check_epochs(epochs)
    steps = source.steps(epochs)  # the run's optimizer steps, when they are known before it starts
    steps = max_steps if steps is None else steps if max_steps is None else min(steps, max_steps)
    checkpoint = (
        checkpoints.NONE
        if path is None
        else checkpoints.Checkpoint(
            path,
            checkpoint_every,
            model,
            optimizer,
            options.scheduler,
            options.scaler,
            StepRecord,
            device,
            dict(  # what fixes the cycles, their order and their weights
                accum_steps=accum_steps,
                micro_batch_size=micro_batch_size,
                seed=seed,
                shuffle=shuffle,
                processes=world,
                normalize=normalize,
                loss_reduction=reduction,
            ),
            rank,
        )
    )
    checkpoint.read(steps)  # the file, if it exists: compared with this run, refused before anything changes
    resume_from_step = resume_from_step or checkpoint.step
    if steps is not None and resume_from_step >= steps and not checkpoint.finished:
        raise ValueError(
            _(
                "resume_from_step={value} leaves nothing to train: this run takes {steps} optimizer steps; "
                "valid: 0 to {last}"
            ).format(value=resume_from_step, steps=steps, last=steps - 1)
        )
    options.check_scheduler(optimizer, None if steps is None else max(steps - resume_from_step, 0))
    return _Run(
        history,
        source,
        device,
        params,
        options,
        accum_steps,
        world,
        ddp,
        normalize,
        reduction,
        count,
        epochs,
        max_steps,
        resume_from_step,
        max_skipped_steps,
        on_step,
        measure_memory,
        memory_budget,
        checkpoint,
    )


def _device(device) -> torch.device:
    """The device to train on (default: `devices.pick()`, the lessons' choice: ACCUMLIB_DEVICE if set, else CUDA if
    available, else the CPU), refused unless it can hold the model."""
    if device is None:
        return devices.pick()
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            _("device must be a torch.device or a string such as 'cpu' or 'cuda', got {value!r} of type {type}").format(
                value=device, type=type(device).__name__
            )
        )
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            _("device={value!r} is not a device: use 'cpu', 'cuda' or 'cuda:0'").format(value=device)
        ) from error
    if device.type == "meta":
        raise ValueError(
            _(
                "device='meta' holds shapes but no values: moving the model there would wipe its "
                "weights; use 'cpu' or 'cuda'"
            )
        )
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(
            _("device={value!r} is not available on this machine: use 'cpu'").format(value=str(device))
        ) from error
    return device
