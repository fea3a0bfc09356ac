"""The gradient-accumulation loop: `train`, the driver around `accumlib.cycle.accumulate_and_step` (one optimizer
step from a cycle of micro-batches). Its rooms: `source` (where each cycle's micro-batches come from),
`loss_weights` (each micro-batch's share, the last cycle's rule), `records` (what it returns), `interrupts` (Ctrl-C
held while a step is made) and `restore` (the modes put back at the end).

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
import time
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from . import checkpoint as checkpoints, devices, memory, sharded
from ._validate import boolean, function, integer, non_negative_int, one_of, positive_int
from .cycle import CycleOptions, NonFiniteError, _cycle
from .cycle_checks import _check_model, _check_optimizer
from .failures import _told
from .i18n import _, ngettext
from .interrupts import STEP
from .loss_weights import _cycle_terms, _loss_weights, _of_batch
from .losses import _own_loss
from .records import History, StepRecord, StopTraining
from .restore import _ModesKept
from .source import _Cycle, _Indexed, _Loader, _as_pair, _source


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
