"""The gradient-accumulation loop: `train`, the driver around `accumlib.cycle.accumulate_and_step` (one optimizer
step from a cycle of micro-batches): sample order, loss weights, records; and the checks `gradient_gap` and
`parameter_gap`.

One optimizer step per cycle of `accum_steps` micro-batches. Each micro-batch loss is weighted by its share of the
cycle (its samples, or its loss terms, over the cycle's total), so a cycle's gradient equals the gradient of one
batch of the whole cycle -- the last, incomplete cycle included. The scheduler, clipping, the AMP scaler and zeroing
run once per optimizer step. Under DistributedDataParallel the gradients are all-reduced once per step (`no_sync()`
on the other micro-batches). Nothing reads a tensor's value on the host inside a cycle but once, after its last
backward(): on a GPU every such read makes the host wait until the device has caught up.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, default_collate

from . import memory
from .cycle import (_BuffersKept, _check_model, _check_optimizer, _check_scaler_type, _check_scheduler, _scalar_loss,
                    accumulate_and_step)
from ._validate import boolean, function, integer, one_of, positive_int, positive_number
from .i18n import _


class StopTraining(Exception):
    """Raise from an `on_step` callback to end training; `train` returns the history so far."""


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step did. Losses are unscaled means over the cycle (independent of accum_steps)."""

    step: int  # optimizer steps so far, 1-based
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

    @property
    def samples_per_second(self) -> float:
        """Throughput of this step: samples / wall seconds."""
        return self.samples / self.seconds


@dataclass
class History:
    """One `StepRecord` per optimizer step, plus why training ended early (if it did).

    When training fails (an exception from your loss, callback or scheduler, NonFiniteError, OutOfMemory), the
    exception carries the history so far as its `history` attribute.
    """

    records: list[StepRecord] = field(default_factory=list)
    stopped: str | None = None  # "StopTraining" or "KeyboardInterrupt" when training ended early

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


def train(model: torch.nn.Module, data, optimizer: torch.optim.Optimizer, *, micro_batch_size: int,
          accum_steps: int, epochs: int = 1, loss_fn: Callable | None = None, normalize: str = "samples",
          count: Callable | None = None, scheduler=None, clip_grad_norm: float | None = None, amp=False,
          scaler: torch.amp.GradScaler | None = None, device=None, seed: int = 0, shuffle: bool = True,
          on_step: Callable[[StepRecord], None] | None = None, on_nonfinite: str = "skip",
          measure_memory: bool = False, memory_budget: int | None = None, ddp_no_sync: bool = True,
          check_gradients: bool = True) -> History:
    """Train with gradient accumulation; return one record per optimizer step.

    data: a tuple (X, y) of tensors, or a Dataset whose samples are (x, y) pairs (dict samples are refused).
    micro_batch_size: samples per forward/backward pass (per process). accum_steps: micro-batches per optimizer
    step. Effective batch = micro_batch_size * accum_steps * processes. Each cycle is one `accumulate_and_step`.
    normalize: "samples" weights each micro-batch loss by its samples over the cycle's samples (exact, also for
    the last incomplete cycle); "steps" is the classic loss / accum_steps; "count" divides a sum-reduced loss by
    the cycle's total of `count(x, y)` loss terms (tokens, say): every cycle's terms are counted before the first
    step (count gets each micro-batch as fetched; one host read, one all-reduce under DDP), so a cycle without loss
    terms is refused before any weight changes, and no step waits for a count.
    scheduler: stepped once per optimizer step taken (not on a skipped one; ReduceLROnPlateau with that step's
    loss); it must be built on `optimizer`, and a OneCycleLR must have total_steps for every step of this run.
    clip_grad_norm: clip the accumulated gradient to this L2 norm. The norm (recorded as grad_norm) and clipping
    cover exactly the optimizer's parameters; gradients of trainable parameters the optimizer does not hold are
    left as PyTorch leaves them: they add up from step to step, never zeroed, clipped or counted.
    amp: False, True (fp16 on CUDA, bf16 on CPU), "fp16" (with a GradScaler: `scaler`, or a new one) or "bf16".
    seed fixes the sample order. on_nonfinite: "skip" (a step whose loss or gradient is NaN/inf leaves the model as
    it was, BatchNorm buffers included) or "raise" (NonFiniteError; with a scaler, only for a non-finite loss).
    check_gradients (on by default) reads the gradient norm every step, so a NaN/inf gradient under a finite loss is
    caught too; False leaves that norm out unless clipping or a scaler needs it (grad_norm is then None, and such a
    gradient reaches the weights): one reduction per parameter tensor less per step, which the benchmark measures.
    measure_memory (off by default) records each cycle's peak bytes: on CUDA the allocator's peak of every cycle; on
    the CPU the live-tensor tracker on one cycle per distinct micro-batch layout (usually two: full and last), as
    those bytes depend only on shapes, so it costs about one traced cycle per layout, not one per step.
    memory_budget (bytes) simulates a smaller card: `memory.OutOfMemory` is raised before any weight changes.
    on_step(record) runs after each step; raising StopTraining there (or Ctrl-C anywhere) ends training cleanly.
    Every argument is checked before anything changes; any other exception carries the records so far as `history`.
    """
    _check_model(model)
    samples = _Samples(data)
    micro_batch_size = positive_int("micro_batch_size", micro_batch_size)
    accum_steps = positive_int("accum_steps", accum_steps)
    epochs = positive_int("epochs", epochs)
    if micro_batch_size > samples.n:
        raise ValueError(_("micro_batch_size={value} is larger than the dataset ({n} samples); valid range: 1 to "
                           "{n}").format(value=micro_batch_size, n=samples.n))
    params = _check_optimizer(model, optimizer)
    loss_fn = function("loss_fn", loss_fn, optional=True) or torch.nn.functional.cross_entropy
    one_of("normalize", normalize, ("samples", "steps", "count"))
    count = function("count", count, optional=True)
    if (normalize == "count") != (count is not None):
        raise ValueError(_("count= (a function giving a micro-batch's number of loss terms) goes with "
                           "normalize='count', and only with it; got normalize={normalize!r}, count={count!r}").format(
                               normalize=normalize, count=count))
    if clip_grad_norm is not None:
        clip_grad_norm = positive_number("clip_grad_norm", clip_grad_norm)
    seed = integer("seed", seed, -2 ** 63, 2 ** 64)
    for name, value in (("shuffle", shuffle), ("measure_memory", measure_memory), ("ddp_no_sync", ddp_no_sync),
                        ("check_gradients", check_gradients)):
        boolean(name, value)
    on_step = function("on_step", on_step, optional=True)
    one_of("on_nonfinite", on_nonfinite, ("skip", "raise"))
    if memory_budget is not None:
        memory_budget = positive_int("memory_budget", memory_budget)
    device = _device(device)
    amp_dtype, scaler = _amp(amp, scaler, device)
    ddp = isinstance(model, DistributedDataParallel)
    world, rank = (dist.get_world_size(), dist.get_rank()) if ddp else (1, 0)
    steps_per_epoch = math.ceil(samples.n / (micro_batch_size * accum_steps * world))
    _check_scheduler(scheduler, optimizer, epochs * steps_per_epoch)
    plan = _Plan(samples, micro_batch_size, accum_steps, world, rank, seed, shuffle, epochs)
    terms = _loss_terms(plan, count, device, ddp) if normalize == "count" else None
    if memory_budget is not None:
        x, y = samples.fetch(list(range(micro_batch_size)))
        memory.check_fits(model, optimizer, x, y, loss_fn=loss_fn, accum_steps=accum_steps,
                          budget_bytes=memory_budget)
    model.to(device)
    history = History()
    seen = 0
    peaks: dict[tuple, int] = {}  # CPU: peak bytes per micro-batch layout
    try:
        with memory.cuda_budget(device, memory_budget):
            for step, (epoch, cycle_samples, indices, sizes) in enumerate(plan):
                weights = _loss_weights(normalize, sizes, cycle_samples, accum_steps, world,
                                        terms[step] if terms else None)
                layout = tuple(sizes)
                measure = measure_memory and (device.type == "cuda" or layout not in peaks)
                started = time.perf_counter()
                with memory.step_peak(device, params, optimizer) if measure else contextlib.nullcontext() as peak:
                    result = accumulate_and_step.__wrapped__(  # every argument was checked above, once
                        model, optimizer, _MicroBatches(samples, indices, device), weights, loss_fn=loss_fn,
                        clip_grad_norm=clip_grad_norm, scaler=scaler, autocast_dtype=amp_dtype, scheduler=scheduler,
                        ddp_no_sync=ddp_no_sync, on_nonfinite=on_nonfinite, check_gradients=check_gradients)
                if measure:
                    peaks[layout] = peak.bytes
                seen += cycle_samples
                record = StepRecord(step + 1, epoch, seen, len(sizes) - sizes.count(0), cycle_samples,
                                    result.loss, result.lr, result.grad_norm, time.perf_counter() - started,
                                    peaks.get(layout) if measure_memory else None, result.skipped)
                history.records.append(record)
                if on_step is not None:
                    on_step(record)
    except StopTraining:
        history.stopped = "StopTraining"
    except KeyboardInterrupt:
        history.stopped = "KeyboardInterrupt"
    except Exception as error:
        error.history = history  # nothing is lost: the records so far travel with the exception
        raise
    finally:
        optimizer.zero_grad(set_to_none=True)  # a half-accumulated gradient is never applied later
    return history


def _loss_weights(normalize: str, sizes: list[int], cycle_samples: int, accum_steps: int, world: int,
                  cycle_terms: float | None) -> list[float]:
    """What each micro-batch's loss is multiplied by before backward(); 0 for a padding micro-batch (size 0)."""
    if normalize == "samples":  # a mean-reduced loss: the micro-batch's share of the cycle's samples
        shares = [size / cycle_samples for size in sizes]
    elif normalize == "steps":  # the classic loss / accum_steps: every micro-batch alike, even in a short last cycle
        shares = [1 / (accum_steps * world) if size else 0.0 for size in sizes]
    else:  # "count", a sum-reduced loss: one share per loss term of the cycle
        shares = [1 / cycle_terms if size else 0.0 for size in sizes]
    # DDP averages the gradients of its `world` processes; times `world`, that mean becomes the sum of every
    # process's shares, which add up to the whole cycle (on one process world is 1)
    return [world * share for share in shares]


class _Samples:
    """Indexable view of `data`: a tuple (X, y) of tensors or a Dataset of (x, y) pairs."""

    def __init__(self, data):
        if isinstance(data, (tuple, list)):
            if len(data) != 2:
                raise TypeError(_("data must be a Dataset or a tuple (X, y) of two tensors, got a {type} of {n} "
                                  "items").format(type=type(data).__name__, n=len(data)))
            for name, tensor in zip(("data[0] (X)", "data[1] (y)"), data):
                _refuse_dict(tensor, name)
                if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                    raise TypeError(_("data must be a tuple (X, y) of two tensors with one row per sample; {name} "
                                      "is {value!r}").format(name=name, value=tensor))
            X, y = data
            if len(X) != len(y):
                raise ValueError(_("data: X has {x} samples but y has {y}; they must have the same length").format(
                    x=len(X), y=len(y)))
            self.n, self.dataset = len(X), None
            self.device = X.device if X.device == y.device else None
            self.fetch = lambda idx: (X[idx], y[idx])
        elif isinstance(data, Dataset) and hasattr(data, "__len__"):
            self.n, self.dataset, self.device = len(data), data, None  # the device is known only once fetched
            if self.n:
                _check_sample(data[0])
            self.fetch = lambda idx: default_collate([data[i] for i in idx])
        else:
            _refuse_dict(data, "data")
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
    if isinstance(value, dict):
        raise TypeError(_("{name} is a dict (keys {keys}): train passes (x, y) pairs to model(x) and "
                          "loss_fn(output, y), and dict batches such as {{'input_ids': ..., 'labels': ...}} are not "
                          "supported; give (inputs, targets) instead, e.g. (batch['input_ids'], "
                          "batch['labels'])").format(name=name, keys=", ".join(repr(k) for k in list(value)[:5])))


def _check_sample(sample) -> None:
    """A Dataset's sample must be an (x, y) pair with no dict in it."""
    _refuse_dict(sample, "data[0] (a sample)")
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise TypeError(_("data's samples must be (x, y) pairs, got {value!r}").format(value=sample))
    _refuse_dict(sample[0], "data[0][0] (the input x of a sample)")


class _Plan:
    """Every cycle of a run, in order: (epoch, samples in the cycle over all processes, this process's micro-batch
    indices, their sizes). Iterating again gives the same cycles: the sample order is drawn from `seed` each time.

    Each cycle takes the next micro_batch_size * accum_steps * world samples of the epoch's order (fewer at the
    end); each process takes a contiguous shard (as torch.tensor_split shares them out) and splits it into
    micro-batches. A process with fewer micro-batches than another gets padding micro-batches (one real sample,
    size 0, so loss weight 0): DDP needs every process to run the same number of backward passes.
    """

    def __init__(self, samples: _Samples, micro_batch_size: int, accum_steps: int, world: int, rank: int, seed: int,
                 shuffle: bool, epochs: int):
        self.samples, self.micro, self.accum_steps, self.epochs = samples, micro_batch_size, accum_steps, epochs
        self.world, self.rank, self.seed, self.shuffle = world, rank, seed, shuffle

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        n, m = self.samples.n, self.micro
        for epoch in range(self.epochs):
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

    def __init__(self, samples: _Samples, indices: list, device: torch.device):
        self.samples, self.indices, self.device = samples, indices, device
        self.move = samples.device != device

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        for idx in self.indices:
            x, y = self.samples.fetch(idx)
            yield (x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)) if self.move else (x, y)


def _loss_terms(plan: _Plan, count: Callable, device: torch.device, ddp: bool) -> list[float]:
    """Every cycle's loss terms over all processes, counted before the first step, with one host read of the counts
    (and, under DDP, one all-reduce of the cycles' totals). Refuses a count that is not a non-negative number, and
    a cycle without loss terms (its loss could not be normalised), naming its step and epoch."""
    chunks, pending, owner, epochs = [], [], [], []
    for step, (epoch, _samples, indices, sizes) in enumerate(plan):
        epochs.append(epoch)
        for idx, size in zip(indices, sizes):
            if size:  # a padding micro-batch has no loss terms
                pending.append(_count_value(count(*plan.samples.fetch(idx)), device))
                owner.append(step)
        if len(pending) >= 4096:  # a long run's counts, stacked as they come: memory stays small
            chunks.append(torch.stack(pending))
            pending = []
    chunks += [torch.stack(pending)] if pending else []
    counts = torch.cat(chunks).tolist() if chunks else []  # the one host read of the counts
    totals = [0.0] * len(epochs)
    for step, value in zip(owner, counts):
        if not 0 <= value < math.inf:
            raise ValueError(_("count must give a finite, non-negative number of loss terms; it gave {value} for a "
                               "micro-batch of step {step} (epoch {epoch})").format(
                                   value=value, step=step + 1, epoch=epochs[step]))
        totals[step] += value
    if ddp:  # the cycles' totals over all processes
        summed = torch.tensor(totals, dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        totals = summed.tolist()
    for step, total in enumerate(totals):
        if total == 0:
            raise ValueError(_("count gives 0 loss terms for the whole of step {step} (epoch {epoch}): a sum-reduced "
                               "loss cannot be normalised by 0; check count, or drop the samples without loss "
                               "terms").format(step=step + 1, epoch=epochs[step]))
    return totals


def _count_value(value, device: torch.device) -> torch.Tensor:
    """count(x, y) as a 0-d float64 tensor on `device` (an int, a float or a 0-d tensor), without reading it."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not (value.is_complex() or value.dtype == torch.bool):
        return value.to(device, torch.float64)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float64, device=device)
    raise TypeError(_("count must return the number of loss terms of a micro-batch (a number or a 0-d tensor), got "
                      "{value!r} of type {type}").format(value=value, type=type(value).__name__))


def _device(device) -> torch.device:
    """The device to train on (default: CUDA if available, else the CPU), refused unless it can hold the model."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
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


def _amp(amp, scaler, device: torch.device):
    """Return (autocast dtype or None, GradScaler or None). True means fp16 on CUDA, bf16 on CPU."""
    one_of("amp", amp, (False, True, "fp16", "bf16"))
    _check_scaler_type(scaler)
    if amp is False:
        if scaler is not None:
            raise ValueError(_("scaler was given but amp=False: pass amp='fp16' to use a GradScaler"))
        return None, None
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp) or (
        torch.float16 if device.type == "cuda" else torch.bfloat16)
    if dtype is torch.float16 and scaler is None:
        scaler = torch.amp.GradScaler(device.type)
    return dtype, scaler


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
        for xs, ys in zip(torch.tensor_split(x, accum_steps), torch.tensor_split(y, accum_steps)):
            share = {"samples": len(xs) / len(x), "steps": 1 / accum_steps, "none": 1.0}[normalize]
            torch._foreach_add_(accumulated, gradient(xs, ys, share))
        buffers.restore()
    return _max_abs_difference(zip(accumulated, full))
