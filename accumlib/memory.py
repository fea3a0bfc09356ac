"""Peak memory of a training step, by category, in bytes: on CUDA from the allocator, on the CPU from live tensors.

`measure_step` measures one of `train`'s steps on a copy of the model; `check_fits` and `check_cycle_fits` refuse a
step over a budget before anything changes (train's `memory_budget`); `fit_batch` plans the micro-batch for a card.
The rooms below them: `tracker` (the CPU's live-tensor count, the categories, `step_peak`), `measured_step` (one
tracked step and its `MemoryReport`), `tracing` (on what copy: fake, real, or an FSDP2 model itself) and `budget`
(`OutOfMemory`, what a budget means on CUDA, `cuda_budget`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import _validate
from .budget import OutOfMemory, cuda_budget
from .i18n import _
from .measured_step import MemoryReport, _leaves, explained_failure
from .options import CycleOptions
from .tracing import _measure_cycle
from .tracker import CATEGORIES, step_peak

__all__ = [
    "measure_step",
    "MemoryReport",
    "CATEGORIES",
    "check_fits",
    "check_cycle_fits",
    "measured_cycle_peak",
    "fit_batch",
    "FitPlan",
    "MAX_TARGET_BATCH",
    "batch_of",
    "resolve_device",
    "OutOfMemory",
    "cuda_budget",
    "step_peak",
]


def resolve_device(model: torch.nn.Module, device: str | torch.device | None) -> torch.device:
    """The device to measure on: `device` ("cpu", "cuda" or a torch.device) or where the model's weights are."""
    if device is None:
        return next(model.parameters()).device
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            _("device must be None, 'cpu', 'cuda' or a torch.device, got {value!r} of type {type}").format(
                value=device, type=type(device).__name__
            )
        )
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(
            _("device must be None, 'cpu', 'cuda' or a torch.device, got {value!r}").format(value=device)
        ) from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(
            _("device must be 'cpu' or 'cuda' (the devices accumlib measures on), got {value!r}").format(value=device)
        )
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            _("device={value!r} but CUDA is not available here: use 'cpu' or fake=True").format(value=device)
        )
    return resolved


def _check_step_inputs(model, x, y, optimizer, accum_steps) -> int:
    """Validate the arguments every step measurement shares (loss_fn: when its `CycleOptions` is built, with
    train's message); return accum_steps."""
    _validate.trainable_parameters("model", model)
    _validate.samples("x", x, "y", y)
    _validate.optimizer_or_none("optimizer", optimizer)
    return _validate.positive_int("accum_steps", accum_steps)


def measure_step(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable | None = None,
    accum_steps: int = 1,
    fake: bool = False,
    device: str | torch.device | None = None,
    options: CycleOptions | None = None,
    **cycle_options,
) -> MemoryReport:
    """Measure the memory of one of `train`'s steps on a copy of `model`: one `accumulate_and_step` of accum_steps
    passes of (x, y), each weighted 1/accum_steps; its peak is the one `train(..., measure_memory=True)` records for
    that step, byte for byte on the CPU.

    Args:
        model: the model measured (a copy; it, its gradients, the optimizer and the global random state are left
            exactly as they were).
        x, y: one micro-batch (tensors, same length), moved to the model's device (or `device`).
        optimizer: its type and settings are copied, for the parameters it holds (every trainable one if it holds
            none of this model's); default SGD, which keeps no state. Not a closure optimizer (LBFGS).
        loss_fn: loss_fn(model(x), y) -> scalar tensor; default, as in `train`: the model's own loss, else
            cross-entropy.
        accum_steps: passes per step.
        fake: run under FakeTensorMode: the CPU tracker's bytes, nothing computed; it also measures a model on the
            meta device. A forward pass that reads a value (`if t.sum() > 0`, `.item()`) cannot be traced: a real
            model is then measured with the CPU tracker (a warning names the line), one on the meta device refused.
        device: "cpu" or "cuda" (default: where the model is). On CUDA the peak is the allocator's over what was
            allocated before the call, with its rounding and the libraries' workspaces (cuBLAS, cuDNN), not the CUDA
            context (a few hundred MiB), which a real card's budget must leave room for; a warm-up step runs first.
        options: how the cycle runs, a `CycleOptions` (a run's objects, its scaler and scheduler, left out), or
            its fields as keywords (**cycle_options: those a measurement runs, all but the scaler and the
            scheduler), not both, as `train` takes them; `amp="bf16"` measures the step of `train(amp="bf16")`.

    Returns:
        A `MemoryReport`: bytes by category and the peak, of the heavier of the run's first step (in which the
        optimizer creates its state) and a later one (the state kept from before).
    """
    accum_steps = _check_step_inputs(model, x, y, optimizer, accum_steps)
    fake = _validate.boolean("fake", fake)
    options = _step_options("measure_step", loss_fn, options, cycle_options)
    home = next(model.parameters()).device
    if home.type == "meta" and not fake:
        raise ValueError(_("model is on the meta device (weights without data): only fake=True can measure it"))
    if fake and device is not None and resolve_device(model, device).type != home.type:
        raise ValueError(
            _(
                "device={value!r} with fake=True: a fake measurement runs where the model is "
                "({home}); move the model there first, or leave device=None"
            ).format(value=device, home=home)
        )
    device = home if fake else resolve_device(model, device)
    return _measure_cycle(
        model,
        optimizer,
        [(x, y)] * accum_steps,
        [1 / accum_steps] * accum_steps,
        options,
        len(x),
        fake,
        device,
        functools.partial(explained_failure, x, y),
    )


# the cycle's options measure_step takes as keywords: every CycleOptions field but loss_fn (its own parameter) and
# a run's objects (the scaler, the scheduler)
_MEASURED_OPTIONS = tuple(
    f.name for f in dataclasses.fields(CycleOptions) if f.name != "loss_fn" and not f.metadata["run_state"]
)


def _step_options(where: str, loss_fn, options, cycle_options: dict) -> CycleOptions:
    """A measurement's `CycleOptions` (checked there): `options`, less a run's objects (`CycleOptions.measured`), or
    loss_fn (None: train's default, the model's own loss, else cross-entropy) and the keywords of _MEASURED_OPTIONS;
    not both, as `train` takes them."""
    unknown = sorted(set(cycle_options) - set(_MEASURED_OPTIONS))
    if unknown:
        raise TypeError(
            _("{where} got {names}: the options of the cycle it takes are {valid}").format(
                where=where, names=", ".join(unknown), valid=", ".join(sorted(_MEASURED_OPTIONS))
            )
        )
    keywords = cycle_options if loss_fn is None else {**cycle_options, "loss_fn": loss_fn}
    return CycleOptions.of(options, keywords, where).measured()  # options or keywords, as train takes them


def batch_of(example_batch: tuple[torch.Tensor, torch.Tensor], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` samples made by repeating `example_batch`, (x, y) as `fit_batch` takes it (shapes are all that matter
    for memory)."""
    x, y = _validate.pair("example_batch", example_batch)
    size = _validate.positive_int("size", size)
    reps = -(-size // len(x))
    return x.repeat(reps, *[1] * (x.dim() - 1))[:size], y.repeat(reps, *[1] * (y.dim() - 1))[:size]


def _step_peak(
    model, optimizer, x, y, options: CycleOptions, accum_steps: int, device: torch.device | None = None
) -> MemoryReport:
    """The fake-mode report of a step of accum_steps passes of (x, y), measured with min(accum_steps, 2) passes.

    Exact, not an estimate: from the second pass on every pass starts from the same live tensors (weights, the
    whole .grad, optimizer state, the micro-batch, the loss summed so far), so passes 3..accum_steps peak exactly as
    pass 2 does.
    """
    passes = min(accum_steps, 2)
    report = _measure_cycle(
        model,
        optimizer,
        [(x, y)] * passes,
        [1 / passes] * passes,
        options.measured(),
        len(x),
        True,
        device or next(model.parameters()).device,
        functools.partial(explained_failure, x, y),
    )
    return dataclasses.replace(report, accum_steps=accum_steps)


@_validate.new_order
@_validate.renamed
def check_fits(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    accum_steps: int,
    memory_budget: int,
    loss_fn: Callable | None = None,
    options: CycleOptions | None = None,
    device: str | torch.device | None = None,
    **cycle_options,
) -> MemoryReport:
    """Raise OutOfMemory when one step of accum_steps micro-batches (x, y) needs more than `memory_budget`, traced
    under FakeTensorMode (see `_step_peak`) with `train`'s cycle.

    Args:
        model, x, y, optimizer, loss_fn, options: as for `measure_step` (train passes the options it runs its
            cycles with).
        accum_steps: passes per step.
        memory_budget: the bytes a step may take.
        device: where the step will run (default: where the model is); a fake copy is traced there (on CUDA each
            block as the allocator rounds it) and the model does not move, so a refusal leaves it where it was.

    Returns:
        The `MemoryReport` of that step.
    """
    accum_steps = _check_step_inputs(model, x, y, optimizer, accum_steps)
    memory_budget = _validate.positive_int("memory_budget", memory_budget)
    options = _step_options("check_fits", loss_fn, options, cycle_options)
    report = _step_peak(model, optimizer, x, y, options, accum_steps, None if device is None else torch.device(device))
    if report.peak > memory_budget:
        raise OutOfMemory(report.peak, memory_budget, _("a micro-batch of {n} samples").format(n=len(x)))
    return report


def measured_cycle_peak(
    model: torch.nn.Module,
    batches: Sequence,
    optimizer: torch.optim.Optimizer,
    loss_weights: Sequence[float],
    options: CycleOptions,
) -> int:
    """The peak bytes of the cycle of `batches` with `loss_weights`, as `measure_step` measures a step (the heavier
    of a run's first step and a later one), under FakeTensorMode on copies of the model and optimizer; the
    arguments in `accumulate_and_step`'s order."""
    order = "model, batches, optimizer, loss_weights, options"
    _validate.not_optimizer("measured_cycle_peak", order, "batches", batches)
    return _traced_cycle(model, optimizer, batches, loss_weights, options).peak


def _traced_cycle(model, optimizer, batches, loss_weights, options: CycleOptions) -> MemoryReport:
    """The report of the cycle of `batches` (any shapes), traced under FakeTensorMode where the model is."""
    sizes = [len(leaves[0]) for leaves in map(_leaves, batches) if leaves and leaves[0].dim()]
    return _measure_cycle(
        model,
        optimizer,
        list(batches),
        list(loss_weights),
        options.measured(),
        max(sizes, default=0),
        True,
        next(model.parameters()).device,
    )


@_validate.renamed
def check_cycle_fits(
    model: torch.nn.Module,
    batches: Sequence,
    optimizer: torch.optim.Optimizer,
    loss_weights: Sequence[float],
    *,
    options: CycleOptions,
    memory_budget: int,
    what: str,
    advice: str,
) -> MemoryReport:
    """Raise OutOfMemory (needing `what`, with `advice`) when the cycle of `batches` ((x, y) pairs as
    `cycle.accumulate_and_step` takes them, any shapes, in its order) with `loss_weights` needs more than
    `memory_budget`.

    Traced as `check_fits` traces a step (FakeTensorMode, on copies of the model and optimizer, where the model
    is), every micro-batch as it is: `train` checks a loader's cycles with it, one per layout of batch shapes.
    """
    order = "model, batches, optimizer, loss_weights, *, options, memory_budget, what, advice"
    _validate.not_optimizer("check_cycle_fits", order, "batches", batches)
    report = _traced_cycle(model, optimizer, batches, loss_weights, options)
    if report.peak > memory_budget:
        raise OutOfMemory(report.peak, memory_budget, what, advice=advice)
    return report


@dataclass(frozen=True)
class FitPlan:
    """How to train with an effective batch of `target_batch` samples per step on a card of `memory_budget`.

    The plan fits exactly when `train(..., micro_batch_size=plan.micro_batch_size, accum_steps=plan.accum_steps,
    memory_budget=plan.memory_budget)` accepts it: both measure the step of accum_steps passes under FakeTensorMode.
    """

    target_batch: int  # the effective batch asked for: micro_batch_size * accum_steps samples per step
    memory_budget: int  # the card: bytes available to one training step
    micro_batch_size: int  # samples per pass: the largest divisor of target_batch whose step fits the budget
    accum_steps: int  # passes per optimizer step: target_batch // micro_batch_size
    peak_bytes: int  # peak of one step of accum_steps passes of micro_batch_size (<= memory_budget)
    largest_fitting: int  # the largest micro-batch (samples, <= target_batch) that fits, dividing target_batch or not
    next_micro_batch_size: int | None  # the next larger divisor of target_batch (None when micro_batch_size is it)
    next_peak_bytes: int | None  # its step's peak, with target_batch // it passes (> memory_budget)


MAX_TARGET_BATCH = 10**9  # samples: fit_batch lists the divisors of target_batch by trial division


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@_validate.renamed
def fit_batch(
    model: torch.nn.Module,
    example_batch: tuple[torch.Tensor, torch.Tensor],
    target_batch: int,
    memory_budget: int,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable | None = None,
) -> FitPlan:
    """Plan (micro_batch_size, accum_steps) for an effective batch of exactly `target_batch` under `memory_budget`.

    The micro-batch is the largest divisor d of target_batch whose step -- target_batch // d passes of d samples
    and one optimizer step, as `train` runs it -- peaks at most at memory_budget. With accumulation the whole
    gradient stays alive through the cycle, so each candidate is measured with its own accum_steps.
    example_batch: (x, y) with at least one sample (its first sample stands for every sample: only shapes matter;
    nothing of the size of a candidate batch is allocated). target_batch: 1 to 10**9 samples. optimizer and
    loss_fn as for `measure_step`. Measured under FakeTensorMode: nothing is computed, the model is untouched.
    Raises OutOfMemory when even one sample per pass does not fit (for a model with BatchNorm, which refuses one
    sample per channel in training, the smallest divisor of target_batch above 1).
    """
    x, y = _validate.pair("example_batch", example_batch)
    _check_step_inputs(model, x, y, optimizer, 1)
    options = _step_options("fit_batch", loss_fn, None, {})
    target_batch = _validate.positive_int("target_batch", target_batch)
    if target_batch > MAX_TARGET_BATCH:
        raise ValueError(
            _("target_batch must be between 1 and {most:,} samples, got {value:,}").format(
                most=MAX_TARGET_BATCH, value=target_batch
            )
        )
    memory_budget = _validate.positive_int("memory_budget", memory_budget)

    def peak(size: int) -> int:  # a step of `size` samples per pass, with the passes an effective batch needs
        views = x[:1].expand(size, *x.shape[1:]), y[:1].expand(size, *y.shape[1:])  # no memory: fake copies below
        return _step_peak(model, optimizer, *views, options, -(-target_batch // size)).peak

    candidates = _divisors(target_batch)
    peaks = {target_batch: peak(target_batch)}
    if peaks[target_batch] <= memory_budget:
        return FitPlan(target_batch, memory_budget, target_batch, 1, peaks[target_batch], target_batch, None, None)
    try:
        peaks[1] = peak(1)
    except ValueError:  # BatchNorm in training refuses one value per channel: its smallest micro-batch is 2 or more
        if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise
        candidates = [d for d in candidates if d > 1]
    smallest = candidates[0]
    if smallest not in peaks:
        peaks[smallest] = peak(smallest)
    if peaks[smallest] > memory_budget:
        what = (
            _("even one sample per pass")
            if smallest == 1
            else _(
                "even {size} samples per pass, the smallest micro-batch that divides target_batch={target} and that "
                "BatchNorm accepts in training"
            ).format(size=smallest, target=target_batch)
        )
        raise OutOfMemory(
            peaks[smallest],
            memory_budget,
            what,
            advice=_("a larger card, a smaller model or an optimizer with less state is needed"),
        )
    # Below target_batch every candidate accumulates (>= 2 passes) and its peak grows with the micro-batch:
    # bisect for the largest divisor that fits; the one after it (at worst target_batch itself) does not.
    low, high = 0, len(candidates) - 2  # indices; candidates[low] fits, candidates[high + 1] does not
    while low < high:
        mid = (low + high + 1) // 2
        peaks[candidates[mid]] = peak(candidates[mid])
        low, high = (mid, high) if peaks[candidates[mid]] <= memory_budget else (low, mid - 1)
    micro, following = candidates[low], candidates[low + 1]
    if following not in peaks:
        peaks[following] = peak(following)
    fitting, too_big = micro, following  # the largest micro-batch that fits lies in [micro, following)
    while too_big - fitting > 1:
        mid = (fitting + too_big) // 2
        fitting, too_big = (mid, too_big) if peak(mid) <= memory_budget else (fitting, mid)
    return FitPlan(
        target_batch, memory_budget, micro, target_batch // micro, peaks[micro], fitting, following, peaks[following]
    )
