"""The gradient-accumulation loop: `train`, the driver around `accumlib.cycle.accumulate_and_step` (one optimizer
step from a cycle of micro-batches). Its rooms: `run_checks` (train's arguments, checked before anything changes),
`source` and `loader` (where each cycle's micro-batches come from), `loss_weights` (each micro-batch's share, the
last cycle's rule), `records` (what it returns), `interrupts` (Ctrl-C held while a step is made) and `restore` (the
modes put back at the end).

One optimizer step per cycle of `accum_steps` micro-batches. Each micro-batch loss is weighted by its share of the
cycle (its samples, or its loss terms, over the cycle's total), so a cycle's gradient equals the gradient of one
batch of the whole cycle -- the last, incomplete cycle included. The scheduler, clipping, the AMP scaler and zeroing
run once per optimizer step. Under DistributedDataParallel the gradients are all-reduced once per step (`no_sync()`
on the other micro-batches). Nothing reads a tensor's value on the host inside a cycle but once, after its last
backward() (and, with normalize="count", once before its first forward: the cycle's counts): on a GPU every such
read makes the host wait until the device has caught up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
from collections.abc import Iterable
from typing import Callable

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from . import memory
from .batches import _Cycle, _Producer
from .cycle import NonFiniteError, _cycle
from .failures import _told
from .i18n import _, ngettext
from .interrupts import STEP
from .loss_weights import _cycle_terms, _loss_weights
from .options import CycleOptions
from .records import History, StepRecord, StopTraining
from .restore import _ModesKept
from .run_checks import _Run, _check_train


def train(
    model: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor] | Dataset | Iterable,
    optimizer: torch.optim.Optimizer,
    *,
    accum_steps: int,
    micro_batch_size: int | None = None,
    epochs: int | None = None,
    max_steps: int | None = None,
    normalize: str = "samples",
    loss_reduction: str | None = None,
    count: Callable | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
    shuffle: bool = True,
    on_step: Callable[[StepRecord], None] | None = None,
    max_skipped_steps: int = 50,
    resume_from_step: int = 0,
    measure_memory: bool = False,
    memory_budget: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    options: CycleOptions | None = None,
    **cycle_options,
) -> History:
    """Train with gradient accumulation: one `accumulate_and_step` per cycle of `accum_steps` micro-batches.

    Args:
        model: the model; put in training mode when found in eval mode (at the start and before each step: an
            on_step that evaluates may leave it so); every module's mode found is put back at the end.
        data: (X, y) tensors, or a map-style Dataset (with len()) of (x, y) pairs or dicts, split into micro-batches
            of `micro_batch_size` samples per process in an order drawn from `seed` (`shuffle`); or a DataLoader or
            any iterable of batches (an IterableDataset's items are batches), each batch one micro-batch, in the
            loader's order. A cycle's batches are fetched before its first forward and held where the loader put
            them until the step (host memory for accum_steps batches), so the last, short cycle is exact without
            len(). Under DDP each process's loader is its own (a DistributedSampler, whose set_epoch(epoch) train
            calls); one small all-reduce per cycle of the batch counts stops every process, each saying why, when
            one's batch is refused, its loader fails or it has none. A batch is (x, y) -> model(x), (inputs, y)
            with a tuple or dict of inputs -> model(*inputs) or model(**inputs), or a dict -> model(**batch); its
            target, what loss_fn and count get, is y, or the dict batch itself. Tensors inside are moved to device.
        optimizer: holds some of the model's trainable parameters (no closure: not LBFGS).
        accum_steps: micro-batches per optimizer step. Effective batch = samples per micro-batch * accum_steps *
            processes; one larger than the data gives one short step per epoch, said in `history.notes`.
        micro_batch_size: samples per micro-batch, for (X, y) or a Dataset only (a loader's batches are its own).
        epochs: passes over the data (default 1, or as many as max_steps needs; an iterator is read once).
        max_steps: stop after this many optimizer steps in all (a resumed run's included).
        normalize: "samples" (default: each micro-batch weighted by its share of the cycle's samples, exact also
            for the last incomplete cycle), "steps" (the classic loss / accum_steps) or "count" (by loss terms:
            `count(target)` per micro-batch over the cycle's total, one host read and under DDP one all-reduce per
            cycle; a count negative or not finite is refused before its cycle changes anything).
        loss_reduction: what the loss is over its micro-batch, never guessed: "mean" (default) or "sum"; required
            with normalize="count" and your own loss_fn. A micro-batch without loss terms or rows is not run; a
            cycle with nothing to learn is not stepped: its record says `empty`, the run goes on.
        count: count(target) -> the micro-batch's loss terms, with normalize="count" only (count(x, y) still
            works, with a DeprecationWarning).
        device: where the model and every batch go; None: `accumlib.devices.pick()` (ACCUMLIB_DEVICE if set, else
            the first CUDA GPU, else the CPU).
        seed, shuffle: the sample order of (X, y) or a Dataset.
        on_step: on_step(record) after each step; raising StopTraining there (or Ctrl-C anywhere) ends the run
            cleanly, with the history so far.
        max_skipped_steps: that many skipped steps in a row (under a scaler too: a scale that keeps falling) raise
            NonFiniteError naming the count and the scale: such a run is no longer training.
        resume_from_step: go on from a stopped run that took this many steps, with the same data, micro_batch_size,
            accum_steps, seed, shuffle and processes: its cycles are passed over (for (X, y) or a Dataset without
            fetching a sample). Restore the model, optimizer, scheduler and scaler yourself, and your DataLoader's
            order (a seeded generator= or sampler).
        measure_memory: record each cycle's peak bytes (CUDA: the allocator's peak less what the cycle does not
            hold, as `memory.step_peak` measures; CPU: one traced cycle per micro-batch layout, and one more on the
            step that makes the optimizer's state, as `memory.measure_step` reports it).
        memory_budget: bytes, a smaller card simulated: `memory.OutOfMemory`, naming the budget and the measured
            peak, before any weight changes; traced as `memory.check_fits` traces a step (for (X, y) once, for a
            loader each layout of batch shapes as it comes, under its own random state, so the run's draws are
            unchanged); under DDP the processes agree on each cycle's verdict.
        checkpoint: a file path, written atomically every `checkpoint_every` steps (None: only at the end) and when
            the run ends; a run goes on from it when it exists, bit for bit (docs/checkpoints.md).
        options: how every cycle runs, a `CycleOptions` (its fields and their defaults: see there), or its fields
            as keywords (**cycle_options), not both. In train, amp="fp16" without a scaler makes a GradScaler, and
            a scaler without amp is refused.

    Returns:
        A `History`: one `StepRecord` per optimizer step, why the run ended early (`stopped`) and `notes`.

    Every argument is checked before anything changes (a loader's batches and the counts as each cycle comes,
    before that cycle changes anything); any other exception carries the records so far as `history`.
    """
    run = _check_train(
        model,
        data,
        optimizer,
        options,
        cycle_options,
        accum_steps=accum_steps,
        micro_batch_size=micro_batch_size,
        epochs=epochs,
        max_steps=max_steps,
        normalize=normalize,
        loss_reduction=loss_reduction,
        count=count,
        device=device,
        seed=seed,
        shuffle=shuffle,
        on_step=on_step,
        max_skipped_steps=max_skipped_steps,
        resume_from_step=resume_from_step,
        measure_memory=measure_memory,
        memory_budget=memory_budget,
        checkpoint=checkpoint,
        checkpoint_every=checkpoint_every,
    )
    return _train(model, optimizer, run)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, run: _Run) -> History:
    """train's run, its arguments checked (`run`): one `_cycle` per optimizer step, with the run's options."""
    history, source, device, options, accum_steps = run.history, run.source, run.device, run.options, run.accum_steps
    example = source.example() if run.memory_budget is not None else None
    if example is not None:  # (X, y) tensors: one step of full micro-batches, measured before the run
        memory.check_fits(
            model,
            *example,
            optimizer=optimizer,
            options=options,
            accum_steps=accum_steps,
            memory_budget=run.memory_budget,
            device=device,
        )  # traced on the run's device, not moved
    each_cycle = run.memory_budget is not None and example is None  # a loader's or dicts: as each cycle comes
    model.to(device)
    run.checkpoint.restore(history)  # the file's states and records, if the run goes on from one
    if run.checkpoint.finished:
        return history  # the file holds every step of this run
    seen = 0  # samples so far
    skips = sum(1 for _ in itertools.takewhile(lambda r: r.skipped, reversed(history.records)))  # in a row
    peaks: dict[tuple, int] = {}  # CPU: peak bytes per micro-batch layout
    shape = weights = None  # the last cycle's (sizes, samples) and its loss weights
    fitted: set[tuple] = set()  # a loader's cycle layouts measured under memory_budget
    step = -1
    try:
        # STEP.run(): Ctrl-C's holding handler installed once for the run, not swapped at every step
        with memory.cuda_budget(device, run.memory_budget), _ModesKept(model), STEP.run():
            cycles = run.checkpoint.cycles(source, run.epochs)  # the source's, its random states put back
            for step, cycle in enumerate(itertools.islice(cycles, run.max_steps)):  # none past max_steps
                seen += cycle.samples
                if step < run.resume_from_step:
                    continue  # a step the stopped run took: its samples are counted, nothing is trained
                if not model.training:
                    model.train()  # dropout on, BatchNorm's statistics updated: the mode training needs
                began = time.perf_counter()
                terms, total = _cycle_terms(cycle, run.count, device, run.ddp, step) if run.count else (None, 1)
                if not (cycle.samples and total):  # nothing to learn, on every process (the totals are theirs)
                    record = StepRecord(
                        step + 1,
                        cycle.epoch,
                        seen,
                        len(cycle.sizes) - cycle.sizes.count(0),
                        cycle.samples,
                        math.nan,
                        float(optimizer.param_groups[0]["lr"]),
                        None,
                        time.perf_counter() - began,
                        None,
                        empty=True,
                    )
                    history.records.append(record)  # not stepped: model, optimizer, scheduler and scaler untouched
                    if run.on_step is not None:
                        run.on_step(record)
                    continue
                if run.count:
                    weights = _loss_weights(
                        run.normalize, run.reduction, cycle.sizes, cycle.samples, accum_steps, run.world, terms, total
                    )
                elif (cycle.sizes, cycle.samples) != shape:  # the weights depend on the sizes only: computed again
                    shape = cycle.sizes, cycle.samples  # when they change (the last cycle, a loader's batches)
                    weights = _loss_weights(
                        run.normalize, run.reduction, cycle.sizes, cycle.samples, accum_steps, run.world
                    )
                if each_cycle and (run.ddp or cycle.layout not in fitted):  # DDP: every cycle, the verdicts agreed
                    _check_fits(
                        model,
                        optimizer,
                        cycle,
                        weights,
                        options,
                        run.memory_budget,
                        step,
                        source,
                        fitted,
                        run.ddp,
                        device,
                    )
                # the CPU's peak depends on the shapes and on whether the optimizer holds state yet (Adam's first step
                # creates it): one traced cycle per such layout
                layout = (cycle.layout, bool(optimizer.state)) if run.measure_memory else None
                measure = run.measure_memory and (device.type == "cuda" or layout not in peaks)
                started = time.perf_counter()
                with STEP.until_recorded():  # Ctrl-C, or a scheduler's error, waits from the step to its record
                    if measure:
                        with memory.step_peak(model, optimizer, device) as peak:
                            result = _cycle(model, optimizer, cycle.micro_batches, weights, options)
                        peaks[layout] = peak.bytes
                    else:
                        result = _cycle(model, optimizer, cycle.micro_batches, weights, options)  # checked: once
                    record = StepRecord(
                        step + 1,
                        cycle.epoch,
                        seen,
                        len(cycle.sizes) - cycle.sizes.count(0),
                        cycle.samples,
                        result.loss,
                        result.lr,
                        result.grad_norm,
                        time.perf_counter() - started,
                        peaks.get(layout) if run.measure_memory else None,
                        result.skipped,
                        result.empty,
                    )
                    history.records.append(record)
                if measure and device.type != "cuda" and not layout[1] and optimizer.state and not run.ddp:
                    # this step made the optimizer's state: the layout's peak is the heavier of this step and a later
                    # one, as measure_step reports it (the same cycle, traced on copies, after the step's record)
                    peaks[layout] = peaks[cycle.layout, True] = max(
                        peak.bytes, _later_peak(model, optimizer, cycle, weights, options)
                    )
                    record = history.records[-1] = dataclasses.replace(record, peak_memory_bytes=peaks[layout])
                if run.on_step is not None:
                    run.on_step(record)
                run.checkpoint.stepped(history)  # every checkpoint_every steps
                skips = skips + 1 if result.skipped else 0
                if skips == run.max_skipped_steps:  # a run whose every step is skipped is no longer training
                    raise NonFiniteError(_skipped_message(skips, options.scaler))
    except StopTraining:
        history.stopped = "StopTraining"
    except KeyboardInterrupt:
        history.stopped = "KeyboardInterrupt"
    except Exception as error:
        # nothing is lost: the records so far travel with the exception; one that takes no attribute (a read-only
        # history, a frozen dataclass) is raised as it is
        with contextlib.suppress(AttributeError, TypeError):
            error.history = history
        raise
    finally:
        if any(p.grad is not None for p in run.params):  # after a step the cycle has zeroed them already
            optimizer.zero_grad(set_to_none=True)  # a half-accumulated gradient is never applied later
    if history.stopped is None and step < run.resume_from_step:  # the data ended before the stopped run's steps
        raise ValueError(
            _("resume_from_step={value} is past the end of the run: data gives {steps} optimizer steps").format(
                value=run.resume_from_step, steps=step + 1
            )
        )
    run.checkpoint.ended(history)  # done, max_steps, StopTraining or Ctrl-C: the file holds the last step
    return history


def _later_peak(model, optimizer, cycle: _Cycle, weights: list[float], options: CycleOptions) -> int:
    """The peak bytes of `cycle` as `memory.measure_step` reports a step: the heavier of a run's first step and a
    later one (the optimizer's state alive through the passes, its step count far along), traced under
    FakeTensorMode on copies of the model and of the optimizer (its settings, not its state)."""
    batches, weights = cycle.real(weights)
    return memory.measured_cycle_peak(model, batches, optimizer, weights, options)


def _check_fits(
    model,
    optimizer,
    cycle: _Cycle,
    weights: list[float],
    options: CycleOptions,
    budget: int,
    step: int,
    source: _Producer,
    fitted: set,
    ddp: bool,
    device: torch.device,
) -> None:
    """memory_budget: memory.OutOfMemory unless this cycle, its micro-batches as they are, fits `budget` bytes,
    traced as memory.check_fits traces a step (each layout once: the same shapes peak at the same bytes, `fitted`
    holds those that fit); before the cycle changes anything. Under DDP every process comes here every cycle and
    the verdicts are agreed in one small all-reduce: a process whose own cycle does not fit (its layout is its own)
    stops every process, each saying which rank and why, none left waiting in the cycle's collectives."""
    refused = None
    if cycle.layout not in fitted:
        n = len(cycle.sizes) - cycle.sizes.count(0)
        what = ngettext(
            "the cycle of step {step} (epoch {epoch}, {n} batch, {samples} samples)",
            "the cycle of step {step} (epoch {epoch}, {n} batches, {samples} samples)",
            n,
        ).format(step=step + 1, epoch=cycle.epoch, n=n, samples=sum(cycle.sizes))
        advice = source.advice()  # how to make this data's micro-batches smaller
        try:
            batches, kept = cycle.real(weights)
            memory.check_cycle_fits(
                model, batches, optimizer, kept, options=options, memory_budget=budget, what=what, advice=advice
            )
            fitted.add(cycle.layout)
        except Exception as error:  # under DDP the others learn of it below
            if not ddp:
                raise
            refused = error
    if not ddp:
        return
    world, rank = dist.get_world_size(), dist.get_rank()
    flags = torch.zeros(world, dtype=torch.float64, device=device)
    flags[rank] = float(refused is not None)
    dist.all_reduce(flags)
    failures = [r for r, flag in enumerate(flags.tolist()) if flag]
    if not failures:
        return
    why = _told(refused, failures)
    if refused is not None:
        raise refused
    raise ValueError(
        ngettext(
            "the cycle of the process of rank {ranks} does not fit memory_budget={budget} for step {step} (epoch "
            "{epoch}): {reasons}. This process (rank {rank}) stops with it, before this step changes anything",
            "the cycles of the processes of ranks {ranks} do not fit memory_budget={budget} for step {step} (epoch "
            "{epoch}): {reasons}. This process (rank {rank}) stops with them, before this step changes anything",
            len(failures),
        ).format(
            ranks=", ".join(map(str, failures)), budget=budget, step=step + 1, epoch=cycle.epoch, rank=rank, reasons=why
        )
    )


def _skipped_message(skips: int, scaler) -> str:
    """NonFiniteError's words for `skips` skipped steps in a row (one host read of the scale, at the error only)."""
    if scaler is None:
        return _(
            "{count} optimizer steps in a row were skipped for a NaN or infinite loss or gradient "
            "(max_skipped_steps={count}): the model has not changed since; check the data, the loss and the "
            "learning rate"
        ).format(count=skips)
    return _(
        "{count} optimizer steps in a row were skipped for a NaN or infinite loss or gradient "
        "(max_skipped_steps={count}); the GradScaler's scale is now {scale:g}: no scale makes these gradients "
        "finite in fp16; check the loss and the learning rate, or train in bf16 or float32"
    ).format(count=skips, scale=scaler.get_scale())
