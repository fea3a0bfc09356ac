"""What accumulation costs in time, measured and taken apart.

`time_config` times whole optimizer steps of `train` (the median after warm-up steps). `decompose_time` says what
that time is made of: it times every forward/backward pass of train's cycle (`accumulate_and_step`) at the sizes that
split one effective batch into 1, 2, 4, ... passes, and fits

    seconds of one pass = overhead_seconds + seconds_per_sample * micro_batch_size

by ordinary least squares on the median pass time of each size (on the CPU, seconds of CPU time of the one thread
that computes, which other programs on a shared machine do not inflate). The intercept is what a pass costs
whatever its size: Python, PyTorch's dispatch of every operation, allocating each result, one call per layer. The
slope is the arithmetic each sample brings. A step of accum_steps passes of m samples then costs
accum_steps * (overhead + per-sample * m) + the optimizer step; m * accum_steps is the effective batch, so every
split does the same arithmetic and accumulating adds (accum_steps - 1) fixed costs of a pass.

How this maps to a GPU (not measured here: our machines have no GPU). There the fixed cost of a pass is the same
Python and dispatch work on the CPU plus one kernel launch per operation, and the per-sample cost is arithmetic on
the card. While a micro-batch is too small to keep the card busy, the GPU waits for the CPU and a pass costs about
the same whatever its size (all fixed cost: the straight line does not hold there); once the micro-batch fills the
card, time grows with the samples and the fixed cost is a small share of a pass, as it is here for a larger model
or a larger micro-batch. Accumulation is for effective batches that do not fit the card; with micro-batches that
fill it, what accumulating adds is a fixed cost per pass beside the same arithmetic, not accum_steps times the
time. To measure a card: `decompose_time(..., device="cuda")` (wall time, synchronised before each reading, which
adds a little to each pass; not run on our CPUs).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

from . import _validate, cycle, memory, phases
from .i18n import _
from .loop import train
from .measured_step import explained_failure
from .options import CycleOptions

THREAD_CPU = "CPU time of the computing thread (time.thread_time)"
WALL = "wall time (time.perf_counter)"


@dataclass(frozen=True)
class TimingReport:
    micro_batch_size: int
    accum_steps: int
    seconds_per_step: float  # median wall seconds of one optimizer step (one effective batch)
    step_seconds: tuple[float, ...]  # every timed step, seconds

    @property
    def effective_batch(self) -> int:
        return self.micro_batch_size * self.accum_steps


def _default_optimizer(params) -> torch.optim.Optimizer:
    """SGD with lr=0.01 (the default of `time_config` and `decompose_time`)."""
    return torch.optim.SGD(params, lr=0.01)


def _timing_device(model: torch.nn.Module, device) -> torch.device:
    """Where to time: `device` ("cpu", "cuda") or the model's; a model on the meta device has nothing to run."""
    device = memory.resolve_device(model, device)
    if next(model.parameters()).is_meta:
        raise ValueError(
            _("model is on the meta device (weights without data): nothing can be timed; build it on the CPU or a GPU")
        )
    return device


def _copy_with_optimizer(model, optimizer_fn) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A copy of `model` and optimizer_fn(its parameters), checked to be an Optimizer."""
    optimizer_fn = _validate.optimizer_fn("optimizer_fn", optimizer_fn, lr=0.01)
    model = copy.deepcopy(model)
    return model, _validate.made_optimizer("optimizer_fn", optimizer_fn(model.parameters()))


def time_config(
    model: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    *,
    micro_batch_size: int,
    accum_steps: int,
    optimizer_fn: Callable = _default_optimizer,
    loss_fn: Callable | None = None,
    warmup: int = 2,
    repeats: int = 7,
    device: str | torch.device | None = None,
) -> TimingReport:
    """Time optimizer steps of `train` at (micro_batch_size, accum_steps) on a copy of `model` (left untouched).

    data: (X, y) with at least micro_batch_size * accum_steps samples; each step uses that many of them.
    optimizer_fn(parameters) -> optimizer (default SGD, lr=0.01). Returns the median over `repeats` steps
    (seconds) after `warmup` untimed ones (0 or more).
    """
    _validate.trainable_parameters("model", model)
    micro_batch_size = _validate.positive_int("micro_batch_size", micro_batch_size)
    accum_steps = _validate.positive_int("accum_steps", accum_steps)
    warmup, repeats = _validate.non_negative_int("warmup", warmup), _validate.positive_int("repeats", repeats)
    X, y = _validate.pair("data", data)
    _validate.function("loss_fn", loss_fn, optional=True)  # CycleOptions' check, before anything runs
    effective = micro_batch_size * accum_steps
    if effective > len(X):
        raise ValueError(
            _("micro_batch_size * accum_steps = {effective} exceeds the {n} samples of data").format(
                effective=effective, n=len(X)
            )
        )
    device = _timing_device(model, device)
    model, optimizer = _copy_with_optimizer(model, optimizer_fn)
    history = train(
        model,
        (X[:effective], y[:effective]),
        optimizer,
        micro_batch_size=micro_batch_size,
        accum_steps=accum_steps,
        epochs=warmup + repeats,
        loss_fn=loss_fn,
        device=device,
        measure_memory=False,
    )
    seconds = tuple(r.seconds for r in history.records[warmup:])
    return TimingReport(micro_batch_size, accum_steps, statistics.median(seconds), seconds)


@dataclass(frozen=True)
class PassTiming:
    """The forward/backward passes of one micro-batch size, and the straight line's value there."""

    micro_batch_size: int  # samples per pass
    seconds: float  # median wall seconds of one forward and backward pass
    fitted_seconds: float  # overhead_seconds + seconds_per_sample * micro_batch_size, the fit's value
    all_seconds: tuple[float, ...]  # every timed pass, seconds

    @property
    def residual(self) -> float:
        """Measured median minus the fit, seconds."""
        return self.seconds - self.fitted_seconds


@dataclass(frozen=True)
class StepTiming:
    """One effective batch as accum_steps passes of micro_batch_size samples: measured and predicted."""

    accum_steps: int
    micro_batch_size: int
    seconds: float  # median wall seconds of the whole step: zeroing, accum_steps passes, optimizer step
    predicted_seconds: float  # accum_steps * (overhead + per-sample * micro_batch_size) + optimizer_seconds
    overhead_seconds: float  # of the prediction: accum_steps * the fixed cost of one pass
    compute_seconds: float  # of the prediction: seconds_per_sample * effective batch (the same for every split)
    all_seconds: tuple[float, ...]  # every timed step, seconds


@dataclass(frozen=True)
class TimeDecomposition:
    """Time of a forward/backward pass = fixed overhead + per-sample compute, fitted, and what it predicts."""

    device: str
    clock: str  # THREAD_CPU or WALL: what the seconds are
    threads: int  # CPU threads torch computed with
    effective_batch: int  # samples per optimizer step, the same for every split
    overhead_seconds: float  # fixed seconds per pass (the fit's intercept)
    seconds_per_sample: float  # seconds each sample adds to a pass (the fit's slope)
    optimizer_seconds: float  # median seconds of the cycle outside its passes (.grad set aside, norm, read, step)
    passes: tuple[PassTiming, ...]  # one per micro-batch size, smallest first: the fitted points
    steps: tuple[StepTiming, ...]  # one per accum_steps, as asked

    def pass_seconds(self, micro_batch_size: int) -> float:
        """The fit's seconds for one pass of micro_batch_size samples."""
        return self.overhead_seconds + self.seconds_per_sample * micro_batch_size

    def overhead_share(self, micro_batch_size: int) -> float:
        """Fraction (0..1) of one pass of micro_batch_size samples that is the fixed overhead, by the fit."""
        return self.overhead_seconds / self.pass_seconds(micro_batch_size)


def _least_squares(sizes: list[int], seconds: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the ordinary least-squares line through the points (size, seconds)."""
    mean_size, mean_seconds = statistics.fmean(sizes), statistics.fmean(seconds)
    spread = sum((s - mean_size) ** 2 for s in sizes)
    slope = sum((s - mean_size) * (t - mean_seconds) for s, t in zip(sizes, seconds, strict=True)) / spread
    return mean_seconds - slope * mean_size, slope


def decompose_time(
    model: torch.nn.Module,
    data: tuple[torch.Tensor, torch.Tensor],
    *,
    effective_batch: int = 64,
    accum_steps: tuple[int, ...] = (1, 2, 4, 8, 16),
    optimizer_fn: Callable = _default_optimizer,
    loss_fn: Callable | None = None,
    repeats: int = 7,
    warmup: int = 1,
    threads: int | None = 1,
    device: str | torch.device | None = None,
) -> TimeDecomposition:
    """Time one effective batch split into each accum_steps, pass by pass, and fit pass time = overhead + per-sample.

    data: (X, y) with at least effective_batch samples; every step trains on X[:effective_batch] split into
    accum_steps micro-batches of effective_batch // accum_steps (each must divide effective_batch; two or more
    distinct micro-batch sizes are needed for the fit). The loop is the hand-written recipe as `train` runs it
    (`accumulate_and_step`, each pass weighted 1/accum_steps) on a copy of `model` (left untouched, as is the global
    random state); optimizer_fn and loss_fn as for `time_config`. Rounds of one step per split, in alternating order
    (ABBA...) so that drift of the machine hits every split alike: `warmup` untimed rounds, then `repeats` timed ones.
    threads: CPU threads torch computes with during the measurement (restored afterwards); None keeps the current
    setting. The clock: with one thread on the CPU (the default), the CPU time of the thread that computes
    (`time.thread_time`), which other programs on a shared machine cannot inflate (on an idle machine it equals
    wall time); with more threads, or on CUDA (synchronised before each reading), wall time.
    Every figure is a median of such seconds; see the module docstring for what the fit means on a GPU.
    Returns a TimeDecomposition.
    """
    _validate.trainable_parameters("model", model)
    effective_batch = _validate.positive_int("effective_batch", effective_batch)
    if isinstance(accum_steps, (str, bytes)) or not hasattr(accum_steps, "__iter__"):
        raise TypeError(
            _("accum_steps must be a sequence of positive integers such as (1, 2, 4), got {value!r}").format(
                value=accum_steps
            )
        )
    splits = [_validate.positive_int("accum_steps", k) for k in accum_steps]
    for k in splits:
        if effective_batch % k:
            raise ValueError(
                _("accum_steps must divide effective_batch={effective_batch} into equal micro-batches, got {k}").format(
                    effective_batch=effective_batch, k=k
                )
            )
    if len(set(splits)) != len(splits) or len(splits) < 2:
        raise ValueError(
            _(
                "accum_steps must hold two or more different values (one line needs two points), each "
                "once, got {value!r}"
            ).format(value=accum_steps)
        )
    warmup, repeats = _validate.non_negative_int("warmup", warmup), _validate.positive_int("repeats", repeats)
    threads = torch.get_num_threads() if threads is None else _validate.positive_int("threads", threads)
    X, y = _validate.pair("data", data)
    if len(X) < effective_batch:
        raise ValueError(
            _("data has {n} samples but effective_batch={effective_batch} needs at least that many").format(
                n=len(X), effective_batch=effective_batch
            )
        )
    _validate.function("loss_fn", loss_fn, optional=True)  # CycleOptions' check, before anything runs
    device = _timing_device(model, device)
    model, optimizer = _copy_with_optimizer(model, optimizer_fn)
    model.to(device)
    X, y = X[:effective_batch].to(device), y[:effective_batch].to(device)
    batches = {k: list(zip(X.split(effective_batch // k), y.split(effective_batch // k), strict=True)) for k in splits}
    clock = THREAD_CPU if device.type == "cpu" and threads == 1 else WALL
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]), explained_failure(X, y):  # dropout: the caller's RNG stays
            passes, steps, optimizer_seconds = _timed_rounds(
                model, optimizer, batches, loss_fn, warmup, repeats, device, clock
            )
    finally:
        torch.set_num_threads(threads_before)
    sizes = sorted(passes)
    medians = [statistics.median(passes[m]) for m in sizes]
    overhead, per_sample = _least_squares(sizes, medians)
    step_cost = statistics.median(optimizer_seconds)
    return TimeDecomposition(
        device=str(device),
        clock=clock,
        threads=threads,
        effective_batch=effective_batch,
        overhead_seconds=overhead,
        seconds_per_sample=per_sample,
        optimizer_seconds=step_cost,
        passes=tuple(
            PassTiming(m, t, overhead + per_sample * m, tuple(passes[m])) for m, t in zip(sizes, medians, strict=True)
        ),
        steps=tuple(
            StepTiming(
                k,
                effective_batch // k,
                statistics.median(steps[k]),
                k * (overhead + per_sample * (effective_batch // k)) + step_cost,
                k * overhead,
                per_sample * effective_batch,
                tuple(steps[k]),
            )
            for k in splits
        ),
    )


def _timed_rounds(model, optimizer, batches: dict[int, list], loss_fn, warmup: int, repeats: int, device, clock: str):
    """Run the rounds of `decompose_time`; return (pass seconds by micro-batch size, step seconds by
    accum_steps, seconds of the cycle's work outside the passes: setting .grad aside, the gradient norm, the one
    host read and optimizer.step), timed rounds only."""
    splits = list(batches)
    options = CycleOptions(loss_fn=loss_fn)  # the cycle's defaults, as train's
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock_now = time.thread_time if clock == THREAD_CPU else time.perf_counter
    passes: dict[int, list[float]] = {len(batches[k][0][0]): [] for k in splits}
    steps: dict[int, list[float]] = {k: [] for k in splits}
    optimizer_seconds: list[float] = []
    for round_ in range(warmup + repeats):
        for k in splits if round_ % 2 == 0 else splits[::-1]:
            marks: list[tuple[str, float]] = []

            def mark(phase: str, marks=marks) -> None:  # the clock as each part of the cycle begins
                sync()
                marks.append((phase, clock_now()))

            mark("start")
            with phases.marked(model, optimizer, mark):
                cycle._cycle(model, optimizer, batches[k], [1 / k] * k, options)  # train's cycle
            mark("end")
            if round_ < warmup:
                continue
            times = dict(marks)  # "start" and "end" once; "read" (a backward's end) the last one's
            # a pass (forward and backward) ends where the next begins, the last one where the gradients are read
            starts = [t for phase, t in marks if phase == "forward"] + [times["read"]]
            passes[len(batches[k][0][0])] += [b - a for a, b in zip(starts, starts[1:], strict=False)]
            zeroing = starts[0] - times["start"]  # .grad set aside, buffers copied: before the first forward
            optimizer_seconds.append(times["end"] - times["read"] + zeroing)  # the norm, the read, the step
            steps[k].append(times["end"] - times["start"])
    return passes, steps, optimizer_seconds


class HostReads(TorchFunctionMode):
    """Counts the reads of a tensor's value on the host (`item`, `tolist`, `float()`, `bool()`, `int()`, use as an
    index) made inside the block: on a GPU each one makes the host wait until the device has caught up.

        with HostReads() as reads:
            accumlib.train(...)
        reads.count   # accumlib reads the device once per optimizer step
    """

    READS = frozenset({"item", "tolist", "__float__", "__bool__", "__int__", "__index__"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.READS
        return func(*args, **(kwargs or {}))
