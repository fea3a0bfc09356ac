"""The gradient-accumulation loop: `train`, the driver around `accumlib.cycle.accumulate_and_step` (one optimizer
step from a cycle of micro-batches): the data pipeline, sample order, loss weights, records; and the checks
`gradient_gap` and `parameter_gap`.

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
import functools
import inspect
import itertools
import math
import time
import warnings
from collections.abc import Iterator as _Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, NamedTuple

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, default_collate

from . import checkpoint as checkpoints, devices, memory, sharded
from .cycle import (STEP, CycleOptions, Inputs, NonFiniteError, _BuffersKept, _check_model, _check_optimizer,
                    _cycle, _scalar_loss, _told)
from ._validate import Shown, as_real, boolean, function, integer, non_negative_int, one_of, positive_int
from .i18n import _, ngettext


class StopTraining(Exception):
    """Raise from an `on_step` callback to end training; `train` returns the history so far."""


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step did. Losses are unscaled means over the cycle (independent of accum_steps)."""

    step: int  # optimizer steps so far, 1-based (a resumed run goes on from the stopped run's count)
    epoch: int  # 0-based
    samples_seen: int  # samples processed so far, all processes together
    micro_batches: int  # micro-batches in this cycle (fewer in a last, incomplete cycle)
    samples: int  # samples in this cycle, all processes together
    # the loss the step's gradient belongs to: the mean per sample over the cycle (per loss term with
    # normalize="count"); with normalize="steps" the sum of micro-batch losses / accum_steps, which equals the mean
    # per sample on a full cycle of equal micro-batches and is too small on a short last cycle, as its gradient is
    loss: float
    lr: float  # learning rate of the first parameter group when the step was taken
    # L2 norm of the accumulated gradient of the optimizer's parameters, before clipping; None when it was not read
    # (check_gradients=False, without clipping or a GradScaler)
    grad_norm: float | None
    seconds: float  # wall time of the cycle, seconds
    peak_memory_bytes: int | None  # peak bytes during the cycle (CUDA allocator / CPU live tensors)
    skipped: bool = False  # True when a NaN/inf loss or gradient made this step leave the model untouched
    # True when the cycle had nothing to learn from: no samples (0-row batches), or no loss terms with
    # normalize="count". No step: the model, optimizer, scheduler and scaler untouched; loss NaN, grad_norm None
    empty: bool = False

    @property
    def samples_per_second(self) -> float:
        """Throughput of this step: samples / wall seconds."""
        return self.samples / self.seconds


@dataclass
class History:
    """One `StepRecord` per optimizer step, plus why training ended early (if it did) and what train noticed.

    When training fails (an exception from your loss, callback or scheduler, NonFiniteError, OutOfMemory), the
    exception carries the history so far as its `history` attribute.
    """

    records: list[StepRecord] = field(default_factory=list)
    stopped: str | None = None  # "StopTraining" or "KeyboardInterrupt" when training ended early
    # what the run did that you may not have meant, in words (an effective batch larger than the data, say)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self.records)

    def columns(self) -> dict[str, list]:
        """The records as plain columns, one list per field (and samples_per_second), ready for plotting."""
        names = [*StepRecord.__dataclass_fields__, "samples_per_second"]
        return {name: [getattr(r, name) for r in self.records] for name in names}

    def deterministic(self) -> list[dict]:
        """The records without wall seconds: identical across runs with the same arguments on the CPU."""
        return [{k: v for k, v in asdict(r).items() if k != "seconds"} for r in self.records]


def train(model: torch.nn.Module, data, optimizer: torch.optim.Optimizer, *, accum_steps: int,
          micro_batch_size: int | None = None, epochs: int | None = None, max_steps: int | None = None,
          loss_fn: Callable | None = None, normalize: str = "samples", loss_reduction: str | None = None,
          count: Callable | None = None, scheduler=None, clip_grad_norm: float | None = None, amp=False,
          scaler: torch.amp.GradScaler | None = None, device=None, seed: int = 0, shuffle: bool = True,
          on_step: Callable[[StepRecord], None] | None = None, on_nonfinite: str = "skip",
          max_skipped_steps: int = 50, resume_from_step: int = 0, measure_memory: bool = False,
          memory_budget: int | None = None, ddp_no_sync: bool = True, check_gradients: bool = True,
          checkpoint=None, checkpoint_every: int | None = None) -> History:
    """Train with gradient accumulation; return one record per optimizer step.

    data, one of:
    - (X, y) tensors, or a map-style Dataset (with len()) whose samples are (x, y) pairs or dicts, split into
      micro-batches of `micro_batch_size` samples (per process) in an order drawn from `seed` (`shuffle`);
    - a DataLoader or any other iterable of batches, with or without len() (an IterableDataset's items are taken as
      batches): each batch is one micro-batch, so micro_batch_size is omitted; the order is the loader's. A cycle's
      batches are fetched before its first forward and held where the loader put them (the host, usually) until
      the step, each moved to the device only when its turn comes: host memory for `accum_steps` batches, and in
      return the last, short cycle is exact without len() (its weights need its sizes, or counts, before its first
      backward). Under DDP each process's loader is its own (a DistributedSampler, say; train calls its
      set_epoch(epoch) every epoch), and each cycle costs one small all-reduce of the processes' batch counts;
      through it a process whose batch is refused, whose loader fails or that has no batch stops every process at
      that cycle, each saying why, none left waiting.
    A batch is (x, y) -> model(x); (inputs, y) with a tuple of inputs -> model(*inputs), with a dict ->
    model(**inputs); or a dict -> model(**batch). The callbacks follow one rule, for every batch shape: they get the
    micro-batch's target, loss_fn(output, target) and count(target), where the target is y of an (x, y) or
    (inputs, y) batch (however its inputs nest) and the batch itself when it is a dict (its labels are inside);
    loss_fn's is on `device`, count's as the data gave it. Tensors inside, nested, are moved to `device`. Without
    loss_fn, the model's own loss (an output with a `.loss` attribute or a "loss" key, as a Hugging Face model given
    labels returns) is the micro-batch's loss, else cross_entropy(output, y).
    accum_steps: micro-batches per optimizer step. Effective batch = samples per micro-batch * accum_steps *
    processes. One that is larger than the data (X, y or a Dataset), or than an epoch of a loader, gives one short
    step per epoch: accepted, and said in `history.notes`. Each cycle is one `accumulate_and_step`.
    epochs: passes over the data (default 1, or as many as max_steps needs); max_steps: stop after this many
    optimizer steps in all (a resumed run's included); an iterator (a generator, say) can be read only once.
    normalize: "samples" weights each micro-batch by its samples over the cycle's (exact, also for the last
    incomplete cycle); "steps" is the classic loss / accum_steps; "count" weights by loss terms, `count(target)` per
    micro-batch over the cycle's total (the old count(x, y) of an (x, y) batch still works, with a
    DeprecationWarning). loss_reduction says what the loss is over its micro-batch, never guessed from values:
    "mean" (weight: its samples or terms over the cycle's) or "sum" (weight: 1 over the cycle's samples or terms).
    With normalize="count" and your own loss_fn it is required (a wrong guess trains other weights, silently);
    otherwise the default is "mean" (the model's own loss is a mean: a Hugging Face model's is, over its non-ignored
    tokens). Counts are computed a cycle at a time, as the cycle
    comes: a run starts at once, and each cycle costs one host read of its counts (and one all-reduce under DDP)
    before its first forward; a count that is negative or not finite is refused before that cycle changes anything.
    A micro-batch without loss terms (count 0: labels all -100) or without rows (a filtering collate_fn's) adds
    nothing and is not run, so its NaN mean loss cannot spoil its cycle: the cycle is the step on its other
    micro-batches. A cycle with nothing to learn (no loss terms or no samples in all, on every process) is not
    stepped: its record says `empty` (loss NaN), the model, optimizer, scheduler and scaler are left alone, and the
    run goes on.
    scheduler: stepped once per optimizer step taken (not on a skipped one; ReduceLROnPlateau with that step's
    loss); it must be built on `optimizer`, and a OneCycleLR must have total_steps for every step of this run
    (a loader without len() needs max_steps for that).
    clip_grad_norm: clip the accumulated gradient to this L2 norm. The norm (recorded as grad_norm) and clipping
    cover exactly the optimizer's parameters; gradients of trainable parameters the optimizer does not hold are
    left as PyTorch leaves them: they add up from step to step, never zeroed, clipped or counted.
    amp: False, True (fp16 on CUDA, bf16 on CPU), "fp16" (with a GradScaler: `scaler`, or a new one) or "bf16"
    (no scaler; refused on a CUDA GPU without native bf16, such as a T4: `accumlib.devices.supports_bf16`). A
    disabled scaler, GradScaler(enabled=False) (PyTorch's recipe: enabled=use_amp), is no scaler: accepted without
    amp, refused with fp16.
    on_nonfinite: "skip" (a step whose loss or gradient is NaN/inf leaves the model as it was, BatchNorm buffers
    included) or "raise" (NonFiniteError; with a scaler, only for a non-finite loss). max_skipped_steps: that many
    skipped steps in a row (under a scaler too: a scale that keeps falling) raise NonFiniteError, naming the count
    and the scale: such a run is no longer training.
    resume_from_step: go on from a stopped run that took this many steps (its history[-1].step), with the same data,
    micro_batch_size, accum_steps, seed, shuffle and processes: the cycles it took are passed over (for (X, y) or a
    Dataset without fetching a sample; a loader's batches are fetched and dropped), so the run goes on with the
    samples the uninterrupted run would have seen. Keep and restore yourself the model, the optimizer, the
    scheduler and the scaler (their state_dict()); for your own DataLoader also its order: build it again the same
    way (a seeded generator= or sampler), as train can only read it again.
    checkpoint: a file path; train writes it every `checkpoint_every` optimizer steps (None: only at the end) and
    when the run ends (done, max_steps, StopTraining, Ctrl-C), atomically, and goes on from it when it exists: the
    weights and records of the uninterrupted run, bit for bit (see docs/checkpoints.md and accumlib.checkpoint).
    train puts the model in training mode (model.train()) when it finds it in eval mode, at the start and before
    each step (an on_step that evaluates may leave it in eval mode); a model already in training mode is left as
    it is, so a submodule you put in eval mode (frozen BatchNorm) stays so. Every module's mode found is put back
    at the end.
    check_gradients (on by default) reads the gradient norm every step, so a NaN/inf gradient under a finite loss is
    caught too; False leaves that norm out unless clipping or a scaler needs it (grad_norm is then None, and such a
    gradient reaches the weights): one reduction per parameter tensor less per step, which the benchmark measures.
    measure_memory (off by default) records each cycle's peak bytes: on CUDA the allocator's peak over every cycle
    (torch.cuda.max_memory_allocated) less what was allocated before it and the cycle does not hold (the data, other
    models, cuBLAS's workspace; the weights, gradients and optimizer state count), as `memory.step_peak` measures; on
    the CPU the live-tensor tracker on one cycle per distinct micro-batch layout (usually two: full and last), as
    those bytes depend only on shapes, so it costs about one traced cycle per layout, not one per step. A step that
    makes the optimizer's state (Adam's first, SGD with momentum's) is traced again on copies, as a later step, and
    its layout records the heavier of the two, as `memory.measure_step` reports it (one process only).
    device: where the model and every batch go; None (the default) is `accumlib.devices.pick()`, the choice the
    lessons make: the ACCUMLIB_DEVICE environment variable if set ("cpu", "cuda", "cuda:1", "mps"; one this machine
    lacks is refused by name), else the first CUDA GPU if there is one, else the CPU.
    memory_budget (bytes) simulates a smaller card: `memory.OutOfMemory`, naming the budget and the measured peak,
    is raised before any weight changes. The step is traced as `memory.check_fits` traces it (FakeTensorMode, on
    copies of the model and optimizer, nothing computed, on `device`: before the model moves there, so a refused
    run leaves it where it was): for (X, y) tensors or a Dataset of tensor pairs once, before the run; for a loader
    (or a Dataset of dicts) each cycle's batches as they are, before that cycle changes anything, once per layout
    of batch shapes (a loader that pads each batch to its own length has many: each costs a traced cycle). The
    micro-batches it traces are fetched under their own random state, so a Dataset that augments randomly trains as
    without the budget, bit for bit. Under DDP each process traces what it needs itself, without collectives: the
    module, plus DDP's gradient buckets; with a loader or a Dataset of dicts the processes agree on each cycle's
    verdict in one small all-reduce per cycle, so a process whose own batches do not fit stops them all.
    on_step(record) runs after each step; raising StopTraining there (or Ctrl-C anywhere) ends training cleanly.
    Every argument is checked before anything changes (what only a cycle shows, a loader's batches and the counts,
    as each cycle comes, before that cycle changes anything); any other exception carries the records so far as
    `history`.
    """
    run = _check_train(model, data, optimizer, accum_steps=accum_steps, micro_batch_size=micro_batch_size,
                       epochs=epochs, max_steps=max_steps, loss_fn=loss_fn, normalize=normalize,
                       loss_reduction=loss_reduction, count=count, scheduler=scheduler, clip_grad_norm=clip_grad_norm,
                       amp=amp, scaler=scaler, device=device, seed=seed, shuffle=shuffle, on_step=on_step,
                       on_nonfinite=on_nonfinite, max_skipped_steps=max_skipped_steps,
                       resume_from_step=resume_from_step, measure_memory=measure_memory, memory_budget=memory_budget,
                       ddp_no_sync=ddp_no_sync, check_gradients=check_gradients, checkpoint=checkpoint,
                       checkpoint_every=checkpoint_every)
    return _train(model, optimizer, run)


class _Run(NamedTuple):
    """train's arguments once `_check_train` has checked them: what the run needs, resolved."""

    history: History  # the run's history (its notes already hold what the checks noticed)
    source: object  # where the cycles come from: `_Indexed` or `_Loader`
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


def _check_train(model, data, optimizer, *, accum_steps, micro_batch_size, epochs, max_steps, loss_fn, normalize,
                 loss_reduction, count, scheduler, clip_grad_norm, amp, scaler, device, seed, shuffle, on_step,
                 on_nonfinite, max_skipped_steps, resume_from_step, measure_memory, memory_budget, ddp_no_sync,
                 check_gradients, checkpoint, checkpoint_every) -> _Run:
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
    seed = integer("seed", seed, -2 ** 63, 2 ** 64)  # a Python int before the source draws its order from it
    history = History()
    source = _source(data, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, history.notes)
    params = _check_optimizer(model, optimizer)
    one_of("normalize", normalize, ("samples", "steps", "count"))
    count = function("count", count, optional=True)
    if (normalize == "count") != (count is not None):
        raise ValueError(_("count= (a function giving a micro-batch's number of loss terms) goes with "
                           "normalize='count', and only with it; got normalize={normalize!r}, count={count!r}").format(
                               normalize=normalize, count=count))
    count = None if count is None else _of_batch(count)
    if loss_reduction is not None:
        one_of("loss_reduction", loss_reduction, ("mean", "sum"))
        if normalize == "steps":
            raise ValueError(_("loss_reduction={value!r} goes with normalize='samples' or 'count'; normalize='steps' "
                               "divides every loss by accum_steps, whatever its reduction").format(
                                   value=loss_reduction))
    elif normalize == "count" and loss_fn is not None:  # never guessed: a wrong guess trains other weights too
        raise ValueError(_("loss_reduction is missing: with normalize='count' and your own loss_fn, say what loss_fn "
                           "returns over a micro-batch's counted items: loss_reduction='mean' (their mean, as "
                           "PyTorch's losses by default and a Hugging Face model's .loss give it) or "
                           "loss_reduction='sum' (their sum, as reduction='sum' gives it)"))
    reduction = loss_reduction or "mean"  # the model's own loss is a mean (a Hugging Face model's: over its tokens)
    boolean("shuffle", shuffle)
    boolean("measure_memory", measure_memory)
    on_step = function("on_step", on_step, optional=True)
    if memory_budget is not None:
        memory_budget = positive_int("memory_budget", memory_budget)
    amp_dtype = _amp(amp, device)
    if amp_dtype is torch.float16 and isinstance(scaler, torch.amp.GradScaler) and not scaler.is_enabled():
        raise ValueError(_("scaler is disabled (GradScaler(enabled=False)) but amp={value!r} trains in fp16, which "
                           "needs one: pass an enabled GradScaler, or none (train makes one)").format(value=amp))
    if amp_dtype is torch.float16 and scaler is None:
        scaler = torch.amp.GradScaler(device.type)  # fp16 needs one: a new one, unless given
    options = CycleOptions(  # the cycle's options, checked here once; without loss_fn, the model's own loss
        loss_fn=_own_loss if loss_fn is None else loss_fn, clip_grad_norm=clip_grad_norm, scaler=scaler,
        autocast_dtype=amp_dtype, scheduler=scheduler, ddp_no_sync=ddp_no_sync, on_nonfinite=on_nonfinite,
        check_gradients=check_gradients)
    if amp is False and options.scaler is not None:  # a disabled scaler (GradScaler(enabled=use_amp)) is none
        raise ValueError(_("scaler was given but amp=False: pass amp='fp16' to use a GradScaler"))
    epochs = epochs if epochs is not None or max_steps is not None else 1  # None: as many as max_steps takes
    source.check_epochs(epochs)
    steps = source.steps(epochs)  # the run's optimizer steps, when they are known before it starts
    steps = max_steps if steps is None else steps if max_steps is None else min(steps, max_steps)
    checkpoint = checkpoints.NONE if path is None else checkpoints.Checkpoint(
        path, checkpoint_every, model, optimizer, options.scheduler, options.scaler, StepRecord, device, dict(
            accum_steps=accum_steps, micro_batch_size=micro_batch_size, seed=seed, shuffle=shuffle, processes=world),
        rank)
    checkpoint.read(steps)  # the file, if it exists: compared with this run, refused before anything changes
    resume_from_step = resume_from_step or checkpoint.step
    if steps is not None and resume_from_step >= steps and not checkpoint.finished:
        raise ValueError(_("resume_from_step={value} leaves nothing to train: this run takes {steps} optimizer steps; "
                           "valid: 0 to {last}").format(value=resume_from_step, steps=steps, last=steps - 1))
    options.check_scheduler(optimizer, None if steps is None else max(steps - resume_from_step, 0))
    return _Run(history, source, device, params, options, accum_steps, world, ddp, normalize, reduction, count,
                epochs, max_steps, resume_from_step, max_skipped_steps, on_step, measure_memory, memory_budget,
                checkpoint)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, run: _Run) -> History:
    """train's run, its arguments checked (`run`): one `_cycle` per optimizer step, with the run's options."""
    history, source, device, options, accum_steps = run.history, run.source, run.device, run.options, run.accum_steps
    example = source.example() if run.memory_budget is not None and isinstance(source, _Indexed) else None
    if example is not None:  # (X, y) tensors: one step of full micro-batches, measured before the run
        memory.check_fits(model, optimizer, *example, options=options, accum_steps=accum_steps,
                          budget_bytes=run.memory_budget, device=device)  # traced on the run's device, not moved
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
            cycles = run.checkpoint.cycles(source.cycles(run.epochs), isinstance(source, _Loader))  # random states back
            for step, cycle in enumerate(itertools.islice(cycles, run.max_steps)):  # none past max_steps
                seen += cycle.samples
                if step < run.resume_from_step:
                    continue  # a step the stopped run took: its samples are counted, nothing is trained
                if not model.training:
                    model.train()  # dropout on, BatchNorm's statistics updated: the mode training needs
                began = time.perf_counter()
                terms, total = _cycle_terms(cycle, run.count, device, run.ddp, step) if run.count else (None, 1)
                if not (cycle.samples and total):  # nothing to learn, on every process (the totals are theirs)
                    record = StepRecord(step + 1, cycle.epoch, seen, len(cycle.sizes) - cycle.sizes.count(0),
                                        cycle.samples, math.nan, float(optimizer.param_groups[0]["lr"]), None,
                                        time.perf_counter() - began, None, empty=True)
                    history.records.append(record)  # not stepped: model, optimizer, scheduler and scaler untouched
                    if run.on_step is not None:
                        run.on_step(record)
                    continue
                if run.count:
                    weights = _loss_weights(run.normalize, run.reduction, cycle.sizes, cycle.samples, accum_steps,
                                            run.world, terms, total)
                elif (cycle.sizes, cycle.samples) != shape:  # the weights depend on the sizes only: computed again
                    shape = cycle.sizes, cycle.samples  # when they change (the last cycle, a loader's batches)
                    weights = _loss_weights(run.normalize, run.reduction, cycle.sizes, cycle.samples, accum_steps,
                                            run.world)
                if each_cycle and (run.ddp or cycle.layout not in fitted):  # DDP: every cycle, the verdicts agreed
                    _check_fits(model, optimizer, cycle, weights, options, run.memory_budget, step,
                                isinstance(source, _Loader), fitted, run.ddp, device)
                # the CPU's peak depends on the shapes and on whether the optimizer holds state yet (Adam's first step
                # creates it): one traced cycle per such layout
                layout = (cycle.layout, bool(optimizer.state)) if run.measure_memory else None
                measure = run.measure_memory and (device.type == "cuda" or layout not in peaks)
                started = time.perf_counter()
                with STEP.until_recorded():  # Ctrl-C, or a scheduler's error, waits from the step to its record
                    if measure:
                        with memory.step_peak(device, run.params, optimizer) as peak:
                            result = _cycle(model, optimizer, cycle.micro_batches, weights, options)
                        peaks[layout] = peak.bytes
                    else:
                        result = _cycle(model, optimizer, cycle.micro_batches, weights, options)  # checked: once
                    record = StepRecord(step + 1, cycle.epoch, seen, len(cycle.sizes) - cycle.sizes.count(0),
                                        cycle.samples, result.loss, result.lr, result.grad_norm,
                                        time.perf_counter() - started,
                                        peaks.get(layout) if run.measure_memory else None, result.skipped,
                                        result.empty)
                    history.records.append(record)
                if measure and device.type != "cuda" and not layout[1] and optimizer.state and not run.ddp:
                    # this step made the optimizer's state: the layout's peak is the heavier of this step and a later
                    # one, as measure_step reports it (the same cycle, traced on copies, after the step's record)
                    peaks[layout] = peaks[cycle.layout, True] = max(peak.bytes, _later_peak(
                        model, optimizer, cycle, weights, options))
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
        raise ValueError(_("resume_from_step={value} is past the end of the run: data gives {steps} optimizer "
                           "steps").format(value=run.resume_from_step, steps=step + 1))
    run.checkpoint.ended(history)  # done, max_steps, StopTraining or Ctrl-C: the file holds the last step
    return history


def _real(cycle: _Cycle, weights: list[float]) -> tuple[list, list[float]]:
    """The cycle's real micro-batches as the cycle takes them (not moved: a trace moves its copies), without DDP's
    padding, and their loss weights. Fetched again for a trace: a Dataset that draws random numbers does not move
    the run's random state."""
    with checkpoints.random_states_kept():
        batches = [_as_pair(batch) for batch in cycle.raw()]  # a loader's 0-row batches too, in order
    # strict=False: raw() stops before the padding micro-batches (size 0) that end cycle.sizes under DDP
    return ([batch for batch, size in zip(batches, cycle.sizes, strict=False) if size],
            [weight for weight, size in zip(weights, cycle.sizes, strict=True) if size])


def _later_peak(model, optimizer, cycle: _Cycle, weights: list[float], options: CycleOptions) -> int:
    """The peak bytes of `cycle` as `memory.measure_step` reports a step: the heavier of a run's first step and a
    later one (the optimizer's state alive through the passes, its step count far along), traced under
    FakeTensorMode on copies of the model and of the optimizer (its settings, not its state)."""
    return memory.measured_cycle_peak(model, optimizer, *_real(cycle, weights), options)


def _check_fits(model, optimizer, cycle: _Cycle, weights: list[float], options: CycleOptions, budget: int,
                step: int, loader: bool, fitted: set, ddp: bool, device: torch.device) -> None:
    """memory_budget: memory.OutOfMemory unless this cycle, its micro-batches as they are, fits `budget` bytes,
    traced as memory.check_fits traces a step (each layout once: the same shapes peak at the same bytes, `fitted`
    holds those that fit); before the cycle changes anything. Under DDP every process comes here every cycle and
    the verdicts are agreed in one small all-reduce: a process whose own cycle does not fit (its layout is its own)
    stops every process, each saying which rank and why, none left waiting in the cycle's collectives."""
    refused = None
    if cycle.layout not in fitted:
        n = len(cycle.sizes) - cycle.sizes.count(0)
        what = ngettext("the cycle of step {step} (epoch {epoch}, {n} batch, {samples} samples)",
                        "the cycle of step {step} (epoch {epoch}, {n} batches, {samples} samples)", n).format(
                            step=step + 1, epoch=cycle.epoch, n=n, samples=sum(cycle.sizes))
        advice = (_("give the loader a smaller batch_size and train with more accum_steps") if loader else
                  _("use a smaller micro_batch_size and more accum_steps"))
        try:
            memory.check_cycle_fits(model, optimizer, *_real(cycle, weights), options=options, budget_bytes=budget,
                                    what=what, advice=advice)
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
    raise ValueError(ngettext(
        "the cycle of the process of rank {ranks} does not fit memory_budget={budget} for step {step} (epoch "
        "{epoch}): {reasons}. This process (rank {rank}) stops with it, before this step changes anything",
        "the cycles of the processes of ranks {ranks} do not fit memory_budget={budget} for step {step} (epoch "
        "{epoch}): {reasons}. This process (rank {rank}) stops with them, before this step changes anything",
        len(failures)).format(ranks=", ".join(map(str, failures)), budget=budget, step=step + 1, epoch=cycle.epoch,
                              rank=rank, reasons=why))


def _skipped_message(skips: int, scaler) -> str:
    """NonFiniteError's words for `skips` skipped steps in a row (one host read of the scale, at the error only)."""
    if scaler is None:
        return _("{count} optimizer steps in a row were skipped for a NaN or infinite loss or gradient "
                 "(max_skipped_steps={count}): the model has not changed since; check the data, the loss and the "
                 "learning rate").format(count=skips)
    return _("{count} optimizer steps in a row were skipped for a NaN or infinite loss or gradient "
             "(max_skipped_steps={count}); the GradScaler's scale is now {scale:g}: no scale makes these gradients "
             "finite in fp16; check the loss and the learning rate, or train in bf16 or float32").format(
                 count=skips, scale=scaler.get_scale())


class _ModesKept:
    """Put back every module's training/eval mode as found, whatever happens in the block. A class, not a generator:
    a generator's exit sets the error's __traceback__, which a frozen dataclass exception refuses."""

    def __init__(self, model: torch.nn.Module):
        self.modes = [(module, module.training) for module in model.modules()]

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exception) -> None:
        for module, training in self.modes:
            module.training = training


def _own_loss(output, target):
    """The loss without loss_fn: cross_entropy(output, target) for a tensor output (logits), else the model's own
    (a `.loss` attribute or a "loss" key)."""
    if isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor):
        return torch.nn.functional.cross_entropy(output, target)
    mapping = isinstance(output, Mapping)
    loss = output.get("loss") if mapping else getattr(output, "loss", None)
    if type(loss) is torch.Tensor and loss.requires_grad and not loss.dim():  # a plain scalar with a gradient
        return loss
    if loss is not None:  # a tensor subclass (FakeTensor in a trace, DTensor) passes as a plain tensor does
        _refuse_model_loss(loss, "output['loss']" if mapping else "output.loss")
        return loss
    raise TypeError(_("the model returned {type} without a loss (no .loss attribute or 'loss' key) and no loss_fn "
                      "was given: put the labels in the batch so that the model computes its loss, or give "
                      "loss_fn(output, target)").format(type=type(output).__name__))


def _refuse_model_loss(loss, where: str) -> None:
    """The model's own loss (`where`: its output's .loss or 'loss' key; no loss_fn was given), refused naming it
    unless it is a floating-point 0-d tensor with a gradient (no value read from the device)."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(_("the model's own loss ({where}; no loss_fn was given) must be a scalar tensor, got "
                          "{value!r} of type {type}: let the model return the tensor itself (not loss.item() or "
                          "float(loss)), or give loss_fn(output, target)").format(
                              where=where, value=Shown(loss), type=type(loss).__name__))
    if loss.dim() != 0:
        raise ValueError(_("the model's own loss ({where}; no loss_fn was given) must be a scalar, got a tensor of "
                           "shape {shape}: reduce it in the model (a mean or a sum), or give loss_fn(output, target) "
                           "that does").format(where=where, shape=tuple(loss.shape)))
    if not loss.is_floating_point():
        raise TypeError(_("the model's own loss ({where}; no loss_fn was given) is a tensor of {dtype}, which has no "
                          "gradient: a loss is a floating-point scalar computed from the model's outputs").format(
                              where=where, dtype=loss.dtype))
    if not loss.requires_grad:
        raise ValueError(_("the model's own loss ({where}; no loss_fn was given) has no gradient "
                           "(requires_grad=False): the model computed it outside its parameters' graph (under "
                           "torch.no_grad() or with .detach()), or every parameter is frozen (requires_grad=False: "
                           "an on_step that freezes the model does this)").format(where=where))


def _loss_weights(normalize: str, reduction: str, sizes: list[int], cycle_samples: int, accum_steps: int, world: int,
                  terms: list[float] | None = None, total_terms: float | None = None) -> list[float]:
    """What each micro-batch's loss is multiplied by before backward(); 0 (not run) for a micro-batch without rows
    (DDP's padding, a 0-row batch) or, with counts, without loss terms. The cycle has some (`_empty`)."""
    if normalize == "steps":  # the classic loss / accum_steps: every micro-batch alike, even in a short last cycle
        shares = [1 / (accum_steps * world) if size else 0.0 for size in sizes]
    elif normalize == "samples":  # a mean: the micro-batch's share of the cycle's samples; a sum: 1 per sample
        shares = [(size if reduction == "mean" else 1.0 if size else 0.0) / cycle_samples for size in sizes]
    else:  # "count": a mean over its terms, the micro-batch's share of the cycle's terms; a sum: 1 per term
        shares = [(n if reduction == "mean" else 1.0) / total_terms if size and n else 0.0
                  for size, n in zip(sizes, terms, strict=True)]
    # DDP averages the gradients of its `world` processes; times `world`, that mean becomes the sum of every
    # process's shares, which add up to the whole cycle (on one process world is 1)
    return [world * share for share in shares]


class _Cycle(NamedTuple):
    """One optimizer step's data, as the loop gets it from a source."""

    epoch: int
    micro_batches: object  # what accumulate_and_step iterates: (inputs, target) pairs on the device, with len()
    sizes: list[int]  # this process's samples per micro-batch (0: a padding micro-batch, weight 0)
    samples: int  # the cycle's samples, all processes together
    layout: tuple  # the micro-batches' shapes: cycles of one layout have the same peak bytes
    raw: Callable  # raw() gives the cycle's real micro-batches as the data gives them (what count is called on)


def _source(data, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes):
    """Where the cycles come from: (X, y) tensors or a Dataset split by micro_batch_size, or a loader's batches."""
    indexed = isinstance(data, tuple) or isinstance(data, list) and bool(data) and all(
        isinstance(item, torch.Tensor) for item in data)  # a list of tensors is (X, y); any other list, batches
    indexed = indexed or isinstance(data, Dataset) and not isinstance(data, IterableDataset)
    if indexed:
        samples = _Samples(data)
        if micro_batch_size is None:
            raise TypeError(_("micro_batch_size is missing: data given as (X, y) tensors or a Dataset is split into "
                              "micro-batches of micro_batch_size samples; give it, or pass a DataLoader whose "
                              "batches are the micro-batches"))
        return _Indexed(samples, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes)
    if isinstance(data, (Mapping, str, bytes, torch.Tensor)) or not hasattr(data, "__iter__"):
        _refuse_dict(data, "data")
        raise TypeError(_("data must be (X, y) tensors, a Dataset, or a DataLoader (any iterable of batches), got "
                          "{type}").format(type=type(data).__name__))
    if micro_batch_size is not None:
        raise ValueError(_("micro_batch_size={value} was given with data of type {type}, whose batches are the "
                           "micro-batches: omit micro_batch_size (the loader's batch size is the micro-batch's; for "
                           "a stream of samples, pass DataLoader(data, batch_size={value})), or give (X, y) tensors "
                           "or a map-style Dataset").format(value=micro_batch_size, type=type(data).__name__))
    return _Loader(data, accum_steps, world, rank, device, notes)


class _Samples:
    """Indexable view of `data`: a tuple (X, y) of tensors or a Dataset of (x, y) pairs or dicts."""

    def __init__(self, data):
        if isinstance(data, (tuple, list)):
            if len(data) != 2:
                raise TypeError(_("data must be a Dataset or a tuple (X, y) of two tensors, got a {type} of {n} "
                                  "items").format(type=type(data).__name__, n=len(data)))
            for name, tensor in zip(("data[0] (X)", "data[1] (y)"), data, strict=True):
                _refuse_dict(tensor, name)
                if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                    raise TypeError(_("data must be a tuple (X, y) of two tensors with one row per sample; {name} "
                                      "is {value!r}").format(name=name, value=tensor))
            X, y = data
            if len(X) != len(y):
                raise ValueError(_("data: X has {x} samples but y has {y}; they must have the same length").format(
                    x=len(X), y=len(y)))
            _refuse_meta(data)
            self.n, self.dataset = len(X), None
            self.device = X.device if X.device == y.device else None
            self.fetch = lambda idx: (X[idx], y[idx])
        elif isinstance(data, Dataset) and hasattr(data, "__len__"):
            self.n, self.dataset, self.device = len(data), data, None  # the device is known only once fetched
            if self.n:
                with checkpoints.random_states_kept():  # a Dataset that augments draws nothing the run would draw
                    _check_batch(data[0], _("data[0] (a sample)"), sample=True)
            self.fetch = lambda idx: default_collate([data[i] for i in idx])
        else:
            raise TypeError(_("data must be a torch Dataset with a length or a tuple (X, y) of tensors, got "
                              "{type}").format(type=type(data).__name__))
        if self.n == 0:
            raise ValueError(_("data is empty: it must hold at least one sample"))

    def indices(self, order: torch.Tensor):
        """`order` as fetch() takes it: a list for a Dataset, a tensor on the data's device for (X, y)."""
        if self.dataset is not None:
            return order.tolist()
        return order.to(self.device) if self.device is not None else order


def _refuse_dict(value, name: str) -> None:
    if isinstance(value, Mapping):
        raise TypeError(_("{name} is a dict (keys {keys}): a dict of whole tensors as data is not supported; give "
                          "a DataLoader (or any iterable) of dict batches, or a Dataset of dict samples with "
                          "micro_batch_size").format(name=name, keys=", ".join(repr(k) for k in list(value)[:5])))


def _tensors(value):
    """The tensors inside a batch, nested in tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _refuse_meta(batch) -> None:
    if any(t.device.type == "meta" for t in _tensors(batch)):
        raise ValueError(_("data holds tensors on the meta device (shapes without values): there is nothing to train "
                           "on; load the data on 'cpu' or 'cuda'"))


def _check_batch(batch, name: str, sample: bool = False) -> int | None:
    """A micro-batch's (or, `sample`, a Dataset sample's) form, refused naming `name` unless it is (x, y) or a dict;
    returns a micro-batch's samples (the first dimension of y, or of its first tensor that has one)."""
    pair = isinstance(batch, (tuple, list)) and len(batch) == 2
    if not (pair or isinstance(batch, Mapping)):
        raise TypeError(_("{name} must be (x, y), (inputs, y) with a tuple or dict of inputs, or a dict of model "
                          "inputs, got {value!r} of type {type}").format(name=name, value=Shown(batch),
                                                                        type=type(batch).__name__))
    _refuse_meta(batch)
    if sample:
        return None
    first = batch[1] if pair and isinstance(batch[1], torch.Tensor) and batch[1].dim() else next(
        (t for t in _tensors(batch) if t.dim()), None)
    if first is None:
        raise TypeError(_("{name} holds no tensor with a batch dimension: its samples cannot be counted").format(
            name=name))
    return len(first)


def _to(value, device: torch.device):
    """`value` with every tensor inside (nested in tuples, lists and dicts) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {key: _to(item, device) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        items = [_to(item, device) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple too
    return value


def _as_pair(batch):
    """A micro-batch as accumulate_and_step takes it, (model input, loss_fn target): tensor x as it is, other inputs
    as cycle.Inputs (the model is called with them unpacked); a dict batch is both the inputs and the target."""
    if type(batch) is tuple and len(batch) == 2 and isinstance(batch[0], torch.Tensor):
        return batch  # (x, y) with a tensor x, as (X, y) data gives it: as it is
    if isinstance(batch, Mapping):
        return Inputs((), batch), batch
    x, y = batch
    if isinstance(x, Mapping):
        return Inputs((), x), y
    if isinstance(x, (tuple, list)):
        return Inputs(tuple(x), {}), y
    return x, y


class _Indexed:
    """Cycles of (X, y) tensors or a Dataset: micro-batches of micro_batch_size samples in an order from `seed`."""

    def __init__(self, samples, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes):
        if micro_batch_size > samples.n:
            raise ValueError(_("micro_batch_size={value} is larger than the dataset ({n} samples); valid range: 1 to "
                               "{n}").format(value=micro_batch_size, n=samples.n))
        self.samples, self.micro, self.device = samples, micro_batch_size, device
        self.move = samples.device != device  # (X, y) elsewhere, or a Dataset (its device is known once fetched)
        self.pairs = samples.dataset is None and not self.move  # (X, y) on the device: (x, y) pairs as fetched
        self.plan = functools.partial(_Plan, samples, micro_batch_size, accum_steps, world, rank, seed, shuffle)
        self.effective = micro_batch_size * accum_steps * world
        if self.effective > samples.n:
            notes.append(_("the effective batch (micro_batch_size {micro} x accum_steps {k} x {world} processes = "
                           "{effective} samples) is larger than the data ({n} samples): every epoch is one step of "
                           "{n} samples").format(micro=micro_batch_size, k=accum_steps, world=world,
                                                  effective=self.effective, n=samples.n))

    def check_epochs(self, epochs) -> None:
        pass  # (X, y) and a Dataset can be read again and again

    def steps(self, epochs: int | None) -> int | None:
        return None if epochs is None else epochs * math.ceil(self.samples.n / self.effective)

    def example(self):
        """A full micro-batch (x, y), for memory_budget's check before the run; None unless both are tensors.
        Fetched under its own random state: a Dataset that augments randomly draws for the run as without it."""
        with checkpoints.random_states_kept():
            x, y = self.samples.fetch(list(range(self.micro)))
        return (x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else None

    def cycles(self, epochs: int | None):
        for epoch, cycle_samples, indices, sizes in self.plan(epochs):
            raw = functools.partial(_real_batches, self.samples.fetch, indices, sizes)  # built only when called
            yield _Cycle(epoch, _MicroBatches(self, indices), sizes, cycle_samples, tuple(sizes),
                         raw)


def _real_batches(fetch: Callable, indices: list, sizes: list[int]):
    """A cycle's real micro-batches (padding left out), fetched as they are iterated."""
    return map(fetch, [idx for idx, size in zip(indices, sizes, strict=True) if size])


class _Plan:
    """Every cycle of a run, in order: (epoch, samples in the cycle over all processes, this process's micro-batch
    indices, their sizes). Iterating again gives the same cycles: the sample order is drawn from `seed` each time.

    Each cycle takes the next micro_batch_size * accum_steps * world samples of the epoch's order (fewer at the
    end); each process takes a contiguous shard (as torch.tensor_split shares them out) and splits it into
    micro-batches. A process with fewer micro-batches than another gets padding micro-batches (one real sample,
    size 0, so loss weight 0): run only where DDP needs a backward (without no_sync(), every micro-batch's; with it,
    the last one of a process that has no other). epochs=None:
    without end.
    """

    def __init__(self, samples: _Samples, micro_batch_size: int, accum_steps: int, world: int, rank: int, seed: int,
                 shuffle: bool, epochs: int | None):
        self.samples, self.micro, self.accum_steps, self.epochs = samples, micro_batch_size, accum_steps, epochs
        self.world, self.rank, self.seed, self.shuffle = world, rank, seed, shuffle

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        n, m = self.samples.n, self.micro
        for epoch in range(self.epochs) if self.epochs is not None else itertools.count():
            order = self.samples.indices(torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n))
            if self.world == 1:  # one process: the epoch split into micro-batches once, a cycle is a slice of them
                micro = [order[i:i + m] for i in range(0, n, m)]
                sizes = [min(m, n - i) for i in range(0, n, m)]
                for first in range(0, len(micro), self.accum_steps):
                    cycle_sizes = sizes[first:first + self.accum_steps]
                    yield epoch, sum(cycle_sizes), micro[first:first + self.accum_steps], cycle_sizes
                continue
            pad = order[:1]
            effective = m * self.accum_steps * self.world
            for start in range(0, n, effective):
                cycle_samples = min(effective, n - start)
                share, extra = divmod(cycle_samples, self.world)
                first = start + self.rank * share + min(self.rank, extra)
                end = first + share + (self.rank < extra)
                indices = [order[i:min(i + m, end)] for i in range(first, end, m)]
                sizes = [min(m, end - i) for i in range(first, end, m)]
                padding = math.ceil((share + (extra > 0)) / m) - len(indices)  # the busiest process's count
                yield epoch, cycle_samples, indices + [pad] * padding, sizes + [0] * padding


class _MicroBatches:
    """A cycle's micro-batches, fetched (and moved to the device) one at a time as the loop reaches them."""

    __slots__ = ("source", "indices")

    def __init__(self, source: _Indexed, indices: list):
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        source = self.source
        if source.pairs:
            return map(source.samples.fetch, self.indices)
        return (_as_pair(_to(batch, source.device) if source.move else batch)
                for batch in map(source.samples.fetch, self.indices))


class _Loader:
    """Cycles of a loader's batches, `accum_steps` at a time, held until their step (see `train`)."""

    def __init__(self, data, accum_steps, world, rank, device, notes):
        self.data, self.accum_steps, self.world, self.rank, self.device, self.notes = (
            data, accum_steps, world, rank, device, notes)
        self.once = isinstance(data, _Iterator)  # a generator, say: read once
        try:
            self.length = len(data)
        except TypeError:  # no len(): a stream, or a DataLoader over an IterableDataset
            self.length = None
        if world > 1:  # the run's steps are the busiest process's (the others pad): alike on every process, so
            # none refuses alone what depends on them (resume_from_step, a OneCycleLR); one all-reduce, before the run
            lengths = torch.tensor([self.length or 0, self.length is None], dtype=torch.float64, device=device)
            dist.all_reduce(lengths, op=dist.ReduceOp.MAX)
            longest, unknown = lengths.tolist()
            self.length = None if unknown else int(longest)
        if self.length == 0 and world == 1:  # under DDP the first cycle's all-reduce says it, to every process
            raise ValueError(_("data gave no batch in epoch {epoch}: it is empty").format(epoch=0))
        # a list's batches, each checked before the run (one in a step that resume_from_step passes over too); under
        # DDP the refusal waits for the first cycle's all-reduce, which stops every process with it
        self.refused = None
        if isinstance(data, list):
            try:
                for i, batch in enumerate(data):
                    _check_batch(batch, _("data[{i}] (batch {i} of the list)").format(i=i))
            except (TypeError, ValueError) as error:
                if world == 1:
                    raise
                self.refused = error

    def check_epochs(self, epochs) -> None:
        if self.once and epochs is not None and epochs > 1:
            raise ValueError(_("epochs={value}: data is an iterator of type {type}, which can be read only once; give "
                               "epochs=1, or data that can be read again (a DataLoader, a list)").format(
                                   value=epochs, type=type(self.data).__name__))

    def steps(self, epochs: int | None) -> int | None:
        if self.length is None or epochs is None or self.length == 0:  # 0: under DDP, the first cycle says it
            return None
        return epochs * math.ceil(self.length / self.accum_steps)

    def _busiest(self, batches: int, samples: int, failed: bool = False,
                 empty: bool = False) -> tuple[int, int, list[int], list[int]]:
        """(the most batches any process holds in this cycle, the cycle's samples over all processes, the ranks of
        the processes that failed fetching or checking their batches, the ranks of those that never had a batch),
        from one all-reduce (one host read) of every process's counts: a process that stops, stops every process,
        none waits for it."""
        world = self.world
        counts = torch.zeros(1 + 3 * world, dtype=torch.float64, device=self.device)
        counts[0], counts[1 + self.rank] = samples, batches
        counts[1 + world + self.rank], counts[1 + 2 * world + self.rank] = float(failed), float(empty)
        dist.all_reduce(counts)
        total, *per_process = counts.tolist()
        failures, empties = per_process[world:2 * world], per_process[2 * world:]
        return (int(max(per_process[:world])), int(total), [rank for rank, f in enumerate(failures) if f],
                [rank for rank, e in enumerate(empties) if e])

    def cycles(self, epochs: int | None):
        pad = None  # one of this process's batches, for a padding micro-batch (weight 0: see _Plan)
        made = 0  # cycles given so far, all epochs
        for epoch in range(epochs) if epochs is not None else itertools.count():
            if self.once and epoch:
                return
            sampler = getattr(self.data, "sampler", None)
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)  # a DistributedSampler's new order for this epoch
            batches, cycle = iter(self.data), 0
            while True:
                try:
                    if self.refused is not None:  # a list's bad batch: every process stops at the first cycle
                        raise self.refused
                    held = list(itertools.islice(batches, self.accum_steps))  # this cycle's batches, until its step
                    sizes = [_check_batch(b, _("data's batch {i} of epoch {epoch}").format(
                        i=cycle * self.accum_steps + i, epoch=epoch)) for i, b in enumerate(held)]
                except Exception as error:  # under DDP the other processes learn of it in the counts' all-reduce
                    if self.world > 1:  # and stop too, with its words, instead of waiting for this one
                        self._busiest(0, 0, failed=True)
                        _told(error, [self.rank])
                    raise
                pad = held[-1] if held else pad
                if self.world == 1:
                    busiest, samples, failures, empties = len(held), sum(sizes), [], []
                else:
                    busiest, samples, failures, empties = self._busiest(len(held), sum(sizes), empty=pad is None)
                if failures:
                    why = _told(None, failures)
                    raise ValueError(ngettext(
                        "the process of rank {ranks} failed fetching or checking its batches for step {step} (epoch "
                        "{epoch}): {reasons}. This process (rank {rank}) stops with it, before this step changes "
                        "anything",
                        "the processes of ranks {ranks} failed fetching or checking their batches for step {step} "
                        "(epoch {epoch}): {reasons}. This process (rank {rank}) stops with them, before this step "
                        "changes anything", len(failures)).format(
                            ranks=", ".join(map(str, failures)), step=made + 1, epoch=epoch, rank=self.rank,
                            reasons=why))
                if busiest == 0:  # the epoch has ended on every process
                    if cycle == 0:
                        raise ValueError(_("data gave no batch in epoch {epoch}: it is empty").format(epoch=epoch))
                    break
                if empties:  # every process stops: the one without a batch says so, the others which it is
                    raise ValueError(_("data gave this process (rank {rank}) no batch while another process has "
                                       "some: give every process a share of the data (a DistributedSampler)").format(
                                           rank=self.rank) if pad is None else ngettext(
                        "data gave the process of rank {ranks} no batch while this one (rank {rank}) has some: give "
                        "every process a share of the data (a DistributedSampler)",
                        "data gave the processes of ranks {ranks} no batch while this one (rank {rank}) has some: "
                        "give every process a share of the data (a DistributedSampler)", len(empties)).format(
                            ranks=", ".join(map(str, empties)), rank=self.rank))
                padding = busiest - len(held)
                if epoch == 0 and cycle == 0 and busiest < self.accum_steps:
                    self.notes.append(_("accum_steps={k} is more than the {n} batches of an epoch of data: every "
                                        "epoch is one step of {n} micro-batches").format(k=self.accum_steps, n=busiest))
                moved = _Moved(held + [pad] * padding, self.device)
                layout = tuple(tuple(tuple(t.shape) for t in _tensors(b)) for b in held)
                yield _Cycle(epoch, moved, sizes + [0] * padding, samples, layout, functools.partial(iter, held))
                made += 1
                if busiest < self.accum_steps:  # the loader has ended, on every process
                    break
                cycle += 1


class _Moved:
    """A held cycle's batches, each moved to the device as the loop reaches it."""

    def __init__(self, batches: list, device: torch.device):
        self.batches, self.device = batches, device

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            yield _as_pair(_to(batch, self.device))


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
    values, (total, bad, *failed) = values[:len(local)], values[len(local):]
    if any(failed):
        why = _told(error, [rank for rank, flag in enumerate(failed) if flag])
        if error is not None:
            raise error
        raise RuntimeError(_("{why}: count failed there for step {step} (epoch {epoch}); this process stops with "
                             "it, before this step changes anything").format(why=why, step=step + 1,
                                                                             epoch=cycle.epoch))
    for value in values:
        if not 0 <= value < math.inf:
            raise ValueError(_("count must give a finite, non-negative number of loss terms; it gave {value} for a "
                               "micro-batch of step {step} (epoch {epoch})").format(
                                   value=value, step=step + 1, epoch=cycle.epoch))
    if bad:
        raise ValueError(_("count gave a negative or non-finite number of loss terms on another process, for step "
                           "{step} (epoch {epoch})").format(step=step + 1, epoch=cycle.epoch))
    # raw() is the real micro-batches (0-row batches of a loader included), in order, before any padding
    return values + [0.0] * (len(cycle.sizes) - len(values)), total


def _target(batch):
    """A micro-batch's target, what loss_fn and count get: y of an (x, y) or (inputs, y) batch, a dict batch itself."""
    return batch if isinstance(batch, Mapping) else batch[1]


def _count_target(count: Callable, batch):
    return count(_target(batch))


def _count_pair(count: Callable, batch):
    return count(batch) if isinstance(batch, Mapping) else count(*batch)


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
        warnings.warn(_("count(x, y) is deprecated: count gets the micro-batch's target, as loss_fn does: count(y) "
                        "for an (x, y) or (inputs, y) batch, count(batch) for a dict batch"), DeprecationWarning,
                      stacklevel=4)
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
    raise TypeError(_("count must return the number of loss terms of a micro-batch (a number or a 0-d tensor), got "
                      "{value!r} of type {type}").format(value=value, type=type(value).__name__))


def _device(device) -> torch.device:
    """The device to train on (default: `devices.pick()`, the lessons' choice: ACCUMLIB_DEVICE if set, else CUDA if
    available, else the CPU), refused unless it can hold the model."""
    if device is None:
        return devices.pick()
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(_("device must be a torch.device or a string such as 'cpu' or 'cuda', got {value!r} of type "
                          "{type}").format(value=device, type=type(device).__name__))
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(_("device={value!r} is not a device: use 'cpu', 'cuda' or 'cuda:0'").format(
            value=device)) from error
    if device.type == "meta":
        raise ValueError(_("device='meta' holds shapes but no values: moving the model there would wipe its "
                           "weights; use 'cpu' or 'cuda'"))
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(_("device={value!r} is not available on this machine: use 'cpu'").format(
            value=str(device))) from error
    return device


def _amp(amp, device: torch.device) -> torch.dtype | None:
    """The autocast dtype `amp` asks for (None: no autocast). True means fp16 on CUDA, bf16 on CPU. bf16 on a CUDA GPU
    without native bf16 kernels (a T4: `devices.supports_bf16`) is refused, before anything runs."""
    one_of("amp", amp, (False, True, "fp16", "bf16"))
    if amp is False:
        return None
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp) or (
        torch.float16 if device.type == "cuda" else torch.bfloat16)
    if dtype is torch.bfloat16 and device.type == "cuda" and not devices.supports_bf16(device):
        raise ValueError(_("amp={value!r} but the GPU {device} has no native bfloat16 (it would only emulate it, "
                           "slowly); valid here: amp='fp16', which trains with a GradScaler, or amp=False").format(
                               value=amp, device=str(device)))
    return dtype


def _state(name: str, value) -> dict:
    if isinstance(value, torch.nn.Module):
        return value.state_dict()
    if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
        return value
    raise TypeError(_("{name} must be a torch.nn.Module or a state dict of tensors, got {type}").format(
        name=name, type=type(value).__name__))


def _max_abs_difference(pairs) -> float:
    """max |a - b| over pairs of same-shaped tensors (in float64, on the CPU); NaN if any difference is NaN."""
    gaps = [(a.detach().to("cpu", torch.float64) - b.detach().to("cpu", torch.float64)).abs().max()
            for a, b in pairs if a.numel()]
    return torch.stack(gaps).max().item() if gaps else 0.0  # torch's max keeps a NaN (Python's max may drop it)


def parameter_gap(model, reference) -> float:
    """Max |difference| over every parameter and buffer of two models (or state dicts) of the same layout.

    NaN when a difference is NaN (a NaN weight is never hidden).
    """
    a, b = _state("model", model), _state("reference", reference)
    if a.keys() != b.keys():
        raise ValueError(_("model and reference differ in layout: {keys}").format(keys=sorted(a.keys() ^ b.keys())[:5]))
    for key in a:
        if a[key].shape != b[key].shape:
            raise ValueError(_("model and reference differ in layout: {key} has shape {a} in model and {b} in "
                               "reference").format(key=key, a=tuple(a[key].shape), b=tuple(b[key].shape)))
    return _max_abs_difference((a[key], b[key]) for key in a)


def gradient_gap(model: torch.nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor, accum_steps: int,
                 normalize: str = "samples") -> float:
    """Max |accumulated gradient - full-batch gradient| over all parameters, for (x, y) split into `accum_steps`
    micro-batches.

    The micro-batches are as equal as possible (torch.tensor_split: sizes differ by at most one). loss_fn must
    return the mean loss over its batch. normalize: "samples" (each micro-batch's share of the samples), "steps"
    (1 / accum_steps) or "none" (no division: the accumulated gradient is accum_steps times too large). The model's
    parameters, buffers (BatchNorm statistics), `.grad` and the RNG are left as they were, also on an error.
    """
    _check_model(model)
    loss_fn = function("loss_fn", loss_fn)
    for name, tensor in (("x", x), ("y", y)):
        _refuse_dict(tensor, name)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            raise TypeError(_("{name} must be a tensor with one row per sample, got {value!r}").format(
                name=name, value=tensor))
    if len(x) != len(y):
        raise ValueError(_("x has {x} samples but y has {y}; they must have the same length").format(x=len(x),
                                                                                                     y=len(y)))
    accum_steps = positive_int("accum_steps", accum_steps)
    one_of("normalize", normalize, ("samples", "steps", "none"))
    if accum_steps > len(x):
        raise ValueError(_("accum_steps={value} is larger than the batch ({n} samples); valid range: 1 to {n}").format(
            value=accum_steps, n=len(x)))
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(_("model has no trainable parameters (requires_grad=True): there is no gradient to compare"))
    x, y = x.to(params[0].device), y.to(params[0].device)  # where the model is, as train moves its micro-batches

    def gradient(xs, ys, share):
        loss = _scalar_loss(loss_fn(model(xs), ys)) * share
        return torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)

    with _BuffersKept(model) as buffers, torch.random.fork_rng(devices=[]):
        full = gradient(x, y, 1.0)
        accumulated = [torch.zeros_like(p) for p in params]
        for xs, ys in zip(torch.tensor_split(x, accum_steps), torch.tensor_split(y, accum_steps), strict=True):
            share = {"samples": len(xs) / len(x), "steps": 1 / accum_steps, "none": 1.0}[normalize]
            torch._foreach_add_(accumulated, gradient(xs, ys, share))
        buffers.restore()
    return _max_abs_difference(zip(accumulated, full, strict=True))
