"""Peak memory of a training step, by category, in bytes: on CUDA from the allocator, on the CPU from live tensors.

On the CPU, `LiveTensorBytes` (a TorchDispatchMode) counts the bytes of every tensor storage alive while a step
runs: byte-exact and identical from run to run, unlike process RSS. Under FakeTensorMode the same count comes
without computing anything (`measure_step(..., fake=True)`), fast enough for "does this fit?" questions.

Every storage alive at the moment of the peak is put in one category (`CATEGORIES`, defined one line each in
`MemoryReport` and by `category_definitions()`), so the categories add up to the peak. A storage is named by the
part of the step that created it (forward pass, backward pass, optimizer step) and then by what it turns out to
be (saved for backward, a parameter's gradient, optimizer state); tensors that existed before the step (weights,
the micro-batch, `.grad`, optimizer state) keep their own names.

On CUDA (issue 20) a storage counts what the caching allocator gives it: its bytes rounded up to the allocator's
512-byte block (`allocation_bytes`), in the live-tensor count and so in the FakeTensorMode trace of a model on CUDA,
which is what `check_fits` (train's `memory_budget`) compares with the budget before anything changes. A simulated
card of B bytes on CUDA is thus B bytes of the step's tensors as the allocator allocates them: the peak of
`torch.cuda.max_memory_allocated` over a step, less what was allocated before it. Not counted against B, because a
real card pays them whatever the batch: the CUDA context (a few hundred MiB of driver and kernel images, outside the
allocator), cuBLAS's workspace (allocated once per stream, through the allocator; `cuda_budget` takes it before it
looks at what is reserved), the caching allocator's segments (reserved but unallocated: 2 MiB for blocks up to 1 MiB,
20 MiB or a 2 MiB multiple for larger ones), and the workspaces cuDNN takes for a convolution inside the step. A real
card of N bytes honours a budget B when N >= B + context + workspaces + one partly used segment of each pool; the
hard cap `cuda_budget` sets follows that rule, and only for budgets of at least `CUDA_CAP_MINIMUM` (below it the
allocator's own granularity, not the simulated card, would decide). The 512-byte rounding is exact for blocks up to
1 MiB (the small pool splits its segments at 512 bytes); a larger tensor may be given a cached block up to 1 MiB
larger than its rounded size, which no trace predicts. On the CPU bytes are counted as they are: the CPU's numbers
(and the lessons' stored outputs) do not change. Only `benchmarks/gpu_check.py` on a GPU confirms the CUDA rules.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import gc
import inspect
import os
import traceback
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeCopyMode,
                                          FakeTensorMode)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import _validate, cycle, sharded
from .i18n import N_, _

TRACKER = "live tensor storages (TorchDispatchMode)"
FAKE = "live tensor storages under FakeTensorMode (nothing computed)"
ALLOCATOR = "CUDA caching allocator (max_memory_allocated)"
CUDA_BLOCK = 512  # bytes: the CUDA caching allocator rounds every block up to a multiple of this (at least one)
CUDA_SMALL_SEGMENT, CUDA_LARGE_SEGMENT = 2 * 2**20, 20 * 2**20  # what it reserves from the driver at a time
CUDA_CAP_MINIMUM = CUDA_LARGE_SEGMENT  # the smallest budget cuda_budget caps the allocator at (see cuda_budget)


def allocation_bytes(nbytes: int, device: torch.device) -> int:
    """The bytes a storage of `nbytes` takes on `device`: on CUDA the caching allocator's block (rounded up to a
    multiple of CUDA_BLOCK; an empty storage takes none), elsewhere `nbytes`."""
    if device.type != "cuda" or nbytes == 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


class OutOfMemory(torch.OutOfMemoryError):
    """A step needs more bytes than the (simulated) card has. needed_bytes, available_bytes: bytes."""

    def __init__(self, needed_bytes: int, available_bytes: int, what: str | None = None, *,
                 advice: str | None = None):
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes
        advice = advice if advice is not None else _("use a smaller micro_batch_size and more accum_steps")
        super().__init__(_("out of memory: {what} needs {needed:,} bytes ({needed_mib:.2f} MiB) but the budget is "
                           "{available:,} bytes ({available_mib:.2f} MiB); {advice}").format(
            what=what if what is not None else _("this micro-batch"), needed=needed_bytes,
            needed_mib=needed_bytes / 2**20, available=available_bytes,
            available_mib=available_bytes / 2**20, advice=advice))


# What each category holds (one line each); the order is that of the stacked bars: first what the model fixes,
# then what one micro-batch brings.
CATEGORY_DEFINITIONS = {
    "parameters": N_("the model's weights and buffers (BatchNorm's running statistics, a registered mask); fixed "
                     "by the model"),
    "gradients": N_("the .grad of every trainable parameter, summed over the micro-batches of the step; fixed by "
                    "the model (during a step's first backward pass only the part built so far)"),
    "incoming gradients": N_("a parameter's gradient from the current micro-batch, computed by backward() and not "
                             "yet added into .grad: from the second micro-batch of a step on, at most the size of "
                             "the model (with one micro-batch per step it becomes .grad itself)"),
    "optimizer state": N_("what the optimizer keeps between steps (Adam: two moments per parameter and a step "
                          "count; plain SGD: nothing); fixed by the model"),
    "optimizer temporaries": N_("tensors optimizer.step() creates and frees while it updates the weights; "
                                "fixed by the model"),
    "inputs": N_("the micro-batch itself (x and y); proportional to the micro-batch"),
    "activations": N_("intermediate results of the forward pass saved for backward() (the input batch and the "
                      "weights are counted under their own names); proportional to the micro-batch"),
    "activation gradients": N_("gradients with respect to the activations, which backward() computes layer by "
                               "layer on its way to the parameters; proportional to the micro-batch"),
    "other": N_("everything else alive at the peak: results of the forward pass that backward() does not need "
                "(the loss, the logits while they live), with accumulation the step's loss summed so far, the copy "
                "of BatchNorm's running statistics that a skipped step puts back; on CUDA also the allocator's "
                "rounding and workspaces"),
}
CATEGORIES = tuple(CATEGORY_DEFINITIONS)

# The category of a storage created during each phase of a step, until it turns out to be something more specific.
_CREATED_IN = {"forward": "other", "backward": "activation gradients", "step": "optimizer temporaries"}


def category_definitions() -> dict[str, str]:
    """Category -> its one-line definition, in the current language (see `MemoryReport`)."""
    return {name: _(definition) for name, definition in CATEGORY_DEFINITIONS.items()}


class _Storage:
    """One live storage: its bytes, what it holds (one of CATEGORIES), and whether that name is final."""

    __slots__ = ("nbytes", "category", "final")

    def __init__(self, nbytes: int, category: str, final: bool):
        self.nbytes, self.category, self.final = nbytes, category, final


class LiveTensorBytes(TorchDispatchMode):
    """Counts bytes of live tensor storages: those adopted with `track` and every one created under the mode.

    `current` and `peak` are in bytes (on CUDA, `allocation_bytes`: the allocator's 512-byte blocks, real or fake
    tensors alike). A storage is counted once however many views share it, and stops
    counting when it is freed (a weakref finalizer on the storage). Storages carry a category: adopted ones the
    category given to `track` (final); created ones that of the current `phase` ("forward", "backward" or
    "step", see `_CREATED_IN`) until `tag` names what they hold. `peak_categories()` splits the peak by what was
    alive at that moment, so the categories add up to it; `peak_phase` is the phase the peak came in.
    """

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self.phase: str | None = None
        self.peak_phase: str | None = None
        self._live: dict[int, _Storage] = {}
        self._at_peak: list[_Storage] = []
        self._finalizers: list[weakref.finalize] = []

    def track(self, tensors: Iterable[torch.Tensor], category: str = "other") -> None:
        """Count these (already existing) tensors' storages from now on, under `category` (final)."""
        for t in tensors:
            self._track(t, category, final=True)

    def tag(self, tensors: Iterable[torch.Tensor], category: str, final: bool = False) -> None:
        """Name what these live storages hold, unless they were adopted with `track` under a name of their own
        (final=True: this name stays, as if adopted with it)."""
        for t in tensors:
            record = self._live.get(id(sharded.local(t).untyped_storage()))
            if record is not None and not record.final:
                record.category, record.final = category, final

    def peak_categories(self) -> dict[str, int]:
        """Bytes by category of the storages alive at the peak; they add up to `peak`."""
        totals = dict.fromkeys(CATEGORIES, 0)
        for record in self._at_peak:
            totals[record.category] += record.nbytes
        return totals

    def _track(self, t: torch.Tensor, category: str, final: bool) -> None:
        storage = sharded.local(t).untyped_storage()  # an FSDP2 DTensor: the shard this process holds
        key = id(storage)
        if key in self._live:
            return
        record = self._live[key] = _Storage(allocation_bytes(storage.nbytes(), t.device), category, final)
        self.current += record.nbytes
        if self.current > self.peak:
            self.peak, self.peak_phase = self.current, self.phase
            self._at_peak = list(self._live.values())  # the records themselves: later tags still apply
        self._finalizers.append(weakref.finalize(storage, self._free, key))

    def _free(self, key: int) -> None:
        record = self._live.pop(key, None)
        if record is not None:
            self.current -= record.nbytes

    def resized(self, t: torch.Tensor) -> None:
        """`t`'s storage was given other bytes in place (FSDP2's unsharded parameters, `sharded.storage_resizes`):
        counted from now on with its new size (0 bytes: freed), as parameters."""
        storage = t.untyped_storage()
        record = self._live.get(id(storage))
        if record is None:
            self._track(t, "parameters", final=True)
            return
        nbytes = allocation_bytes(storage.nbytes(), t.device) if storage.nbytes() else 0
        self.current += nbytes - record.nbytes
        # a new record: one alive at the peak keeps the bytes it had then
        self._live[id(storage)] = _Storage(nbytes, record.category, record.final)
        if self.current > self.peak:
            self.peak, self.peak_phase = self.current, self.phase
            self._at_peak = list(self._live.values())

    def __enter__(self):
        self._resizes = sharded.storage_resizes(self.resized)
        self._resizes.__enter__()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _collective(func, args, kwargs) if func.namespace == "c10d" else func(*args, **kwargs)
        category = _CREATED_IN.get(self.phase, "other")
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t, category, final=False)
        return out

    def __exit__(self, *exc):
        for f in self._finalizers:
            f.detach()
        self._resizes.__exit__(*exc)
        return super().__exit__(*exc)


def _collective(func, args, kwargs):
    """Run a collective (an op of the c10d namespace: FSDP2's all-gathers and reduce-scatters) on copies of its
    tensors, the counted ones held by this thread alone: wait for it, write what it left in the copies back into
    the caller's tensors, and return its result with the caller's tensors in place of the copies.

    A backend such as gloo keeps the tensors of a collective in its own thread and drops them there, at a moment of
    its own: a counted storage freed by that thread would end its count at a moment that moves from run to run (and
    with it the peak, by up to a collective's buffer). With copies the backend holds only uncounted ones; each
    counted storage is freed where this thread drops it, as it is on CUDA, where the caching allocator frees a block
    on its stream's order. The copies are made inside the mode's dispatch and so are not counted, as the step itself
    does not make them; the collective's values are the same."""
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id of the caller's tensor: (it, its copy)

    def copy_of(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in copies:
            copies[id(t)] = (t, t.clone())
        return copies[id(t)][1]

    out = func(*tree_map(copy_of, args), **tree_map(copy_of, kwargs))
    for leaf in tree_leaves(out):
        if hasattr(leaf, "wait"):  # a c10d Work: the copies are written once it is done
            leaf.wait()
    with torch.no_grad():
        for original, copy in copies.values():
            original.copy_(copy)
    back = {id(copy): original for original, copy in copies.values()}
    return tree_map(lambda leaf: back.get(id(leaf), leaf) if isinstance(leaf, torch.Tensor) else leaf, out)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _persistent_tensors(params, optimizer) -> list[torch.Tensor]:
    grads = [p.grad for p in params if p.grad is not None]
    return list(params) + grads + optimizer_state_tensors(optimizer)


class _Peak:
    bytes: int | None = None


@contextlib.contextmanager
def step_peak(device: torch.device, params, optimizer):
    """Context manager: `.bytes` is the peak bytes of the block (parameters, gradients and state included; on the
    CPU the model's other parameters and its buffers too, adopted as each `accumulate_and_step` in the block starts;
    on CUDA the allocator's peak over what the block did not hold, so those few buffers are left out there)."""
    result = _Peak()
    if device.type == "cuda":  # the allocator's peak of the block, less what was allocated before it and is not the
        # step's (the data, other models, cuBLAS's workspace, taken first), as check_fits traces it
        _take_workspaces(device)
        torch.cuda.synchronize(device)
        held = {id(t.untyped_storage()): allocation_bytes(t.untyped_storage().nbytes(), device)
                for t in _persistent_tensors(params, optimizer)}
        before = torch.cuda.memory_allocated(device) - sum(held.values())
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result.bytes = torch.cuda.max_memory_allocated(device) - before
    else:
        tracker = LiveTensorBytes()
        tracker.track(_persistent_tensors(params, optimizer))

        def watch(phase: str, model=None) -> None:
            if phase == "start":  # what the model holds besides the optimizer's parameters, as measure_step counts it
                tracker.track(_model_tensors(model), "parameters")

        with tracker, cycle.watched(watch), _no_collection():
            yield result
        result.bytes = tracker.peak


@contextlib.contextmanager
def _no_collection():
    """Context manager: Python's garbage collector collects first and then not until the block ends, so that no
    storage of before (held in a reference cycle) is freed inside it at a moment of the collector's: a block's CPU
    peak is the same from run to run."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter (frozen ones too) and buffer of the model: what it holds on the card whatever the batch."""
    return [*model.parameters(), *model.buffers()]


@dataclass(frozen=True)
class MemoryReport:
    """Bytes of one training step (accum_steps forward/backward passes of one micro-batch, one optimizer step).

    Each category is the bytes of the storages of that kind alive at the moment of the peak, so they add up to
    `peak` (`categories()`). A storage counts once, under one name: one that existed before the step keeps its own
    (a weight saved for backward stays a parameter), a new one gets the name of what it turns out to hold.
    The categories, one line each (`CATEGORY_DEFINITIONS`; attribute names with "_" for " "):
    """

    device: str
    method: str
    micro_batch_size: int  # samples per forward/backward pass
    accum_steps: int  # forward/backward passes in the step
    peak: int  # bytes, the highest total alive at any moment of the step
    peak_phase: str | None  # "forward", "backward" or "step": the part of the step the peak came in
    parameters: int  # bytes
    gradients: int  # bytes
    incoming_gradients: int  # bytes
    optimizer_state: int  # bytes
    optimizer_temporaries: int  # bytes
    inputs: int  # bytes
    activations: int  # bytes
    activation_gradients: int  # bytes
    other: int  # bytes

    def categories(self) -> dict[str, int]:
        """Bytes by category (the keys of `CATEGORIES`, in that order), as alive at the peak: they add up to it."""
        return {name: getattr(self, name.replace(" ", "_")) for name in CATEGORIES}


MemoryReport.__doc__ = MemoryReport.__doc__.rstrip(" ") + "".join(f"    {name}: {definition}.\n"
                                                                  for name, definition in CATEGORY_DEFINITIONS.items())


def _clone_optimizer(optimizer: torch.optim.Optimizer | None, original: torch.nn.Module,
                     copied: torch.nn.Module) -> torch.optim.Optimizer:
    """An optimizer of the same type and settings for `copied`, holding the copies of the parameters of `original`
    that `optimizer` holds, group by group with each group's settings (a head being fine-tuned keeps state for the
    head alone); all trainable parameters, with the first group's settings, when it holds none of them (an
    optimizer built for another instance of the model); SGD (no state) when it is None.

    Rebuilt from what its constructor takes (its signature), not from `optimizer.defaults`, which may hold settings
    the constructor does not take (AdamW's 'decoupled_weight_decay')."""
    trainable = [p for p in copied.parameters() if p.requires_grad]
    if optimizer is None:
        return torch.optim.SGD(trainable, lr=0.1)
    copies = {id(o): c for o, c in zip(original.parameters(), copied.parameters(), strict=True)}
    groups = [{**{k: v for k, v in group.items() if k != "params"},
               "params": [copies[id(p)] for p in group["params"] if id(p) in copies and copies[id(p)].requires_grad]}
              for group in optimizer.param_groups]
    groups = [group for group in groups if group["params"]] or [{**groups[0], "params": trainable}]
    accepted = inspect.signature(type(optimizer).__init__).parameters
    anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    settings = {k: v for k, v in optimizer.defaults.items() if anything or k in accepted}
    return type(optimizer)(groups, **settings)


class _Fetched:
    """A copy of each micro-batch of `batches` ((x, y) pairs, x a tensor or `cycle.Inputs`), made as the cycle
    reaches it, the way `train` fetches its micro-batches (the previous one alive until the next is made), named
    "inputs". A tensor that appears twice in a micro-batch (a dict batch is the model's inputs and loss_fn's target)
    is copied once."""

    def __init__(self, batches: Sequence, tracker: LiveTensorBytes):
        self.batches, self.tracker = batches, tracker

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            copied = _copied(batch, lambda t: t.clone())
            self.tracker.tag(_leaves(copied), "inputs", final=True)  # the micro-batch, also once saved for backward
            yield copied


def _copied(batch, copy_of: Callable):
    """`batch` with each tensor inside (nested) replaced by copy_of(tensor), a tensor found twice copied once."""
    copies: dict[int, torch.Tensor] = {}

    def one(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in copies:
            copies[id(t)] = copy_of(t)
        return copies[id(t)]
    return tree_map(one, batch)


def _leaves(batch) -> list[torch.Tensor]:
    return [t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)]


def _named_cycle(model, optimizer, batches, loss_weights, tracker: LiveTensorBytes,
                 options: cycle.CycleOptions) -> None:
    """One cycle of `batches` with `loss_weights` (train's cycle: `cycle._cycle`, with `options`) under `tracker`,
    naming what each new storage holds as the step goes."""
    hooks, model_ = [], model
    for p in model.parameters():
        if p.requires_grad:
            hooks.append(p.register_hook(lambda g: tracker.tag([g], "incoming gradients")))
            hooks.append(p.register_post_accumulate_grad_hook(lambda p: tracker.tag([p.grad], "gradients")))

    def watch(phase: str, model=None) -> None:
        if phase == "start":
            tracker.track(_model_tensors(model), "parameters")
        elif phase in ("forward", "read"):  # FSDP2's gradients (no hook sees them): its shards, its unsharded ones
            tracker.tag(sharded.held_gradients(model_), "gradients")
        tracker.phase = phase
        if phase == "end":
            tracker.tag(optimizer_state_tensors(optimizer), "optimizer state")

    try:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: tracker.tag([t], "activations") or t, lambda t: t), \
                cycle.watched(watch):
            cycle._cycle(model, optimizer, _Fetched(batches, tracker), loss_weights, options)
    finally:
        for hook in hooks:
            hook.remove()


def resolve_device(model: torch.nn.Module, device) -> torch.device:
    """The device to measure on: `device` ("cpu", "cuda" or a torch.device) or where the model's weights are."""
    if device is None:
        return next(model.parameters()).device
    if not isinstance(device, (str, torch.device)):
        raise TypeError(_("device must be None, 'cpu', 'cuda' or a torch.device, got {value!r} of type "
                          "{type}").format(value=device, type=type(device).__name__))
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(_("device must be None, 'cpu', 'cuda' or a torch.device, got {value!r}").format(
            value=device)) from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(_("device must be 'cpu' or 'cuda' (the devices accumlib measures on), got {value!r}").format(
            value=device))
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(_("device={value!r} but CUDA is not available here: use 'cpu' or fake=True").format(
            value=device))
    return resolved


def _check_step_inputs(model, x, y, optimizer, accum_steps) -> int:
    """Validate the arguments every step measurement shares (loss_fn: when its `cycle.CycleOptions` is built, with
    train's message); return accum_steps."""
    _validate.trainable_parameters("model", model)
    _validate.samples("x", x, "y", y)
    _validate.optimizer_or_none("optimizer", optimizer)
    return _validate.positive_int("accum_steps", accum_steps)


def measure_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, optimizer=None,
                 loss_fn: Callable | None = None, accum_steps: int = 1, fake: bool = False,
                 device=None, **cycle_options) -> MemoryReport:
    """Measure the memory of one step on a copy of `model`; returns a MemoryReport (bytes by category, the peak).

    The step is `train`'s own: one `accumulate_and_step` of accum_steps passes of (x, y), each weighted
    1/accum_steps (cycle_options: the `CycleOptions` fields a measurement runs, all but loss_fn and a run's
    objects, the scaler and the scheduler), so its peak is the one `train(..., measure_memory=True)` records for
    that step, byte for byte on the CPU (`amp="bf16"`: the step of `train(amp="bf16")`).
    x, y: one micro-batch (tensors, same length), moved to the model's device (or `device`). optimizer: its type
    and settings are copied, for the parameters it holds (for every trainable one if it holds none of this
    model's); default SGD, which keeps no state. Any optimizer torch ships but the closure ones (LBFGS) is taken.
    loss_fn(model(x), y) -> scalar tensor (default: cross-entropy).
    The peak is that of the heavier of the run's first step (in which the optimizer creates its state) and a
    later one (the state kept from before); the categories are those of that step. On CUDA a warm-up step runs first.
    fake=True runs under FakeTensorMode: the same bytes as the CPU tracker, nothing computed; it also measures a
    model built on the meta device (weights without data). A forward pass that reads a tensor's value (`if
    t.sum() > 0`, `.item()`) cannot be traced: a real model is then measured with the CPU tracker (exact for this
    micro-batch; a warning names the model's line), one on the meta device is refused naming it. device: "cpu" or
    "cuda" (default: where the model is); on CUDA the peak is the allocator's, over what was allocated before the
    call: it counts the allocator's rounding of each block and the workspaces the step's libraries take (cuBLAS,
    cuDNN), not the CUDA context itself (a few hundred MiB outside the allocator), which a real card's budget must
    leave room for (not run on our CPUs).
    The model, its gradients, the optimizer and the global random state are left exactly as they were.
    """
    accum_steps = _check_step_inputs(model, x, y, optimizer, accum_steps)
    fake = _validate.boolean("fake", fake)
    options = _step_options(loss_fn, cycle_options)
    home = next(model.parameters()).device
    if home.type == "meta" and not fake:
        raise ValueError(_("model is on the meta device (weights without data): only fake=True can measure it"))
    if fake and device is not None and resolve_device(model, device).type != home.type:
        raise ValueError(_("device={value!r} with fake=True: a fake measurement runs where the model is "
                           "({home}); move the model there first, or leave device=None").format(value=device,
                                                                                              home=home))
    device = home if fake else resolve_device(model, device)
    return _measure_cycle(model, optimizer, [(x, y)] * accum_steps, [1 / accum_steps] * accum_steps, options,
                          len(x), fake, device, functools.partial(explained_failure, x, y))


# the cycle's options measure_step takes as keywords: every CycleOptions field but loss_fn (its own parameter) and
# a run's objects (the scaler, the scheduler)
_MEASURED_OPTIONS = tuple(f.name for f in dataclasses.fields(cycle.CycleOptions)
                          if f.name != "loss_fn" and not f.metadata["run_state"])


def _step_options(loss_fn, cycle_options: dict) -> cycle.CycleOptions:
    """A measurement's `cycle.CycleOptions` (checked there): loss_fn (default cross-entropy) and the keywords of
    _MEASURED_OPTIONS."""
    unknown = sorted(set(cycle_options) - set(_MEASURED_OPTIONS))
    if unknown:
        raise TypeError(_("measure_step got {names}: the options of the cycle it takes are {valid}").format(
            names=", ".join(unknown), valid=", ".join(sorted(_MEASURED_OPTIONS))))
    return cycle.CycleOptions(loss_fn=torch.nn.functional.cross_entropy if loss_fn is None else loss_fn,
                              **cycle_options)


def _measure_cycle(model, optimizer, batches, loss_weights, options: cycle.CycleOptions, micro_batch_size: int,
                   fake: bool, device: torch.device, explain: Callable = contextlib.nullcontext) -> MemoryReport:
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


def _measure_copy(model, optimizer, batches, loss_weights, options: cycle.CycleOptions, micro_batch_size: int,
                  fake: bool, device: torch.device, explain: Callable) -> MemoryReport:
    """`_measure_cycle` of a model that is no DistributedDataParallel."""
    home = next(model.parameters()).device
    if sharded.is_fsdp(model):  # a copy is refused by FSDP, and a trace cannot run its collectives
        return _measured_sharded(model, optimizer, batches, loss_weights, options, micro_batch_size, fake, explain)
    with torch.random.fork_rng(devices=[]):  # dropout in the copy must not move the caller's random state
        if fake:
            try:
                return _fake_measure(model, batches, loss_weights, optimizer, device, options, micro_batch_size,
                                     explain)
            except _Untraceable as untraceable:
                if home.type == "meta":
                    raise ValueError(_("this training step cannot be traced without values: {line} reads a "
                                       "tensor's value ({what}), and a model on the meta device has none to "
                                       "measure with: build it on the CPU to measure a real step").format(
                                           line=untraceable.line, what=untraceable.what)) from untraceable.error
                warnings.warn(_("this training step cannot be traced without values: {line} reads a tensor's "
                                "value ({what}); it was measured with a real step on the CPU instead (exact for "
                                "this micro-batch; code that branches on values may need more on "
                                "others)").format(line=untraceable.line, what=untraceable.what), RuntimeWarning,
                              stacklevel=3)
                device = torch.device("cpu")
        # copies: a slice would count its whole dataset otherwise
        batches = _on(batches, lambda t: t.to(device, copy=True))
        copied = copy.deepcopy(model).to(device)
        cuda = device if device.type == "cuda" else None
        return _measure(copied, _clone_optimizer(optimizer, model, copied), batches, loss_weights,
                        ALLOCATOR if cuda else TRACKER, torch.cuda.get_device_name(device) if cuda else "cpu",
                        options, micro_batch_size, explain, cuda=cuda)


def _measured_sharded(model, optimizer, batches, loss_weights, options: cycle.CycleOptions, micro_batch_size: int,
                      fake: bool, explain: Callable) -> MemoryReport:
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
        warnings.warn(_("model is sharded with fully_shard (FSDP2): its step cannot be traced without values (a "
                        "trace runs no all-gather or reduce-scatter), so it was measured with a real step on every "
                        "process, then undone"), RuntimeWarning, stacklevel=4)
    params, buffers = list(model.parameters()), list(model.buffers())
    shards = [sharded.local(p).detach().clone() for p in params]
    kept = [b.detach().clone() for b in buffers]
    grads = [p.grad for p in params]
    device = sharded.local(params[0]).device
    batches = _on(batches, lambda t: t.to(device, copy=True))
    cuda = device if device.type == "cuda" else None
    try:
        with torch.random.fork_rng(devices=[device] if cuda else []), _no_collection():
            for p in params:
                p.grad = None
            report = _measure(model, _clone_optimizer(optimizer, model, model), batches, loss_weights,
                              ALLOCATOR if cuda else TRACKER, torch.cuda.get_device_name(device) if cuda else "cpu",
                              options, micro_batch_size, explain, cuda=cuda)
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


def _on(batches, copy_of: Callable) -> list:
    """The micro-batches with each tensor replaced by copy_of(it), a tensor found more than once copied once (the
    same micro-batch repeated stays one object, as measure_step's accum_steps passes of one (x, y))."""
    copies: dict[int, object] = {}
    for batch in batches:
        if id(batch) not in copies:
            copies[id(batch)] = _copied(batch, copy_of)
    return [copies[id(batch)] for batch in batches]


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
                file=mine[-1].filename, number=mine[-1].lineno, code=mine[-1].line)
        elif optimizer:
            self.line = _("the optimizer's step ({file}, line {number}: {code})").format(
                file=optimizer[-1].filename, number=optimizer[-1].lineno, code=optimizer[-1].line)
        else:
            self.line = _("a line of the step")


def _library_file(filename: str) -> bool:
    """A file of torch's or accumlib's (not the user's model)."""
    return any(filename.startswith(os.path.dirname(m.__file__) + os.sep) for m in (torch, cycle))


_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException)


def _fake_measure(model, batches, loss_weights, optimizer, device, options, micro_batch_size,
                  explain) -> MemoryReport:
    """_measure_cycle under FakeTensorMode; _Untraceable when the forward pass reads a tensor's value."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with FakeCopyMode(mode):
        copied = copy.deepcopy(model)
    _fake_on(copied, device, mode)  # where the step will run: train traces a model before it moves it there
    batches = _on(batches, mode.from_tensor)
    try:
        with mode:  # where the step runs (a fake 'cuda' one too); new storages of the micro-batch's size
            batches = _on(batches, functools.partial(_fake_made_on, device=device))
            return _measure(copied, _clone_optimizer(optimizer, model, copied), batches, loss_weights, FAKE,
                            f"{'cuda' if device.type == 'cuda' else 'cpu'} (fake)", options, micro_batch_size,
                            explain)
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


@contextlib.contextmanager
def explained_failure(x: torch.Tensor, y: torch.Tensor):
    """Re-raise an error of the model or loss_fn on (x, y) as a ValueError that names x and y (chained)."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, IndexError, TypeError) as error:
        raise ValueError(_("a training pass of the model on x (shape {x_shape}, {x_dtype}) and y (shape {y_shape}, "
                           "{y_dtype}) with loss_fn failed: {error}. Check that x is what the model takes and y what "
                           "loss_fn compares its output with").format(x_shape=tuple(x.shape), x_dtype=x.dtype,
                                                                      y_shape=tuple(y.shape), y_dtype=y.dtype,
                                                                      error=error)) from error


def _measure(model, opt, batches, loss_weights, method, device_name, options, micro_batch_size, explain,
             cuda=None) -> MemoryReport:
    """Track the run's first step (the optimizer creates its state in it) and, if it made state, a later one;
    report the heavier. On CUDA a whole warm-up step runs first (the allocator's cache, the libraries' workspaces)."""
    params = list(model.parameters())
    if cuda is not None:
        with explain():
            cycle._cycle(model, opt, batches[:1], [1.0], options)
    reports = []
    while not reports or (len(reports) == 1 and cuda is None and optimizer_state_tensors(opt)):
        tracker = LiveTensorBytes()
        tracker.track(params, "parameters")
        tracker.track([p.grad for p in params if p.grad is not None], "gradients")
        tracker.track(optimizer_state_tensors(opt), "optimizer state")
        if cuda is not None:
            torch.cuda.synchronize(cuda)
            before = torch.cuda.memory_allocated(cuda) - tracker.current  # what the step itself does not hold
            torch.cuda.reset_peak_memory_stats(cuda)
        with tracker, explain():
            _named_cycle(model, opt, batches, loss_weights, tracker, options)
        categories, peak = tracker.peak_categories(), tracker.peak
        if cuda is not None:
            torch.cuda.synchronize(cuda)
            peak = torch.cuda.max_memory_allocated(cuda) - before
            categories["other"] += peak - tracker.peak  # the allocator holds at least the live bytes: rounding
        reports.append(MemoryReport(device=device_name, method=method, micro_batch_size=micro_batch_size,
                                    accum_steps=len(batches), peak=peak, peak_phase=tracker.peak_phase,
                                    **{name.replace(" ", "_"): value for name, value in categories.items()}))
        _far_along(opt)
    return max(reports, key=lambda report: report.peak)


def _far_along(optimizer: torch.optim.Optimizer, steps: int = 10**4) -> None:
    """Set the optimizer's step counts to `steps`, as far into a run: a later step is then measured as it is from
    there on (RAdam, say, rectifies its update, with more temporaries, only from its 6th step on)."""
    for state in optimizer.state.values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            step.fill_(steps)
        elif isinstance(step, (int, float)) and not isinstance(step, bool):
            state["step"] = type(step)(steps)


def batch_of(example: tuple[torch.Tensor, torch.Tensor], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` samples made by repeating the example batch (shapes are all that matter for memory)."""
    x, y = _validate.pair("example", example)
    size = _validate.positive_int("size", size)
    reps = -(-size // len(x))
    return x.repeat(reps, *[1] * (x.dim() - 1))[:size], y.repeat(reps, *[1] * (y.dim() - 1))[:size]


def _step_peak(model, optimizer, x, y, options: cycle.CycleOptions, accum_steps: int,
               device: torch.device | None = None) -> MemoryReport:
    """The fake-mode report of a step of accum_steps passes of (x, y), measured with min(accum_steps, 2) passes.

    Exact, not an estimate: from the second pass on every pass starts from the same live tensors (weights, the
    whole .grad, optimizer state, the micro-batch, the loss summed so far), so passes 3..accum_steps peak exactly as
    pass 2 does.
    """
    passes = min(accum_steps, 2)
    report = _measure_cycle(model, optimizer, [(x, y)] * passes, [1 / passes] * passes, options.measured(), len(x),
                            True, device or next(model.parameters()).device,
                            functools.partial(explained_failure, x, y))
    return dataclasses.replace(report, accum_steps=accum_steps)


def check_fits(model, optimizer, x, y, *, accum_steps: int, budget_bytes: int, loss_fn: Callable | None = None,
               options: cycle.CycleOptions | None = None, device=None) -> MemoryReport:
    """Raise OutOfMemory when one step of accum_steps micro-batches (x, y) needs more than `budget_bytes`.

    Measured under FakeTensorMode (see `_step_peak`), with `train`'s cycle: `options` (the `cycle.CycleOptions`
    train runs its cycles with; its scheduler and scaler are left out) or, without them, loss_fn (default
    cross-entropy) and the cycle's defaults; returns the MemoryReport of that step. device: where the step will
    run (default: where the model is); a fake copy of the model is traced there (on CUDA each block counted as the
    allocator rounds it) and the model itself does not move, so a refusal leaves it where it was.
    """
    accum_steps = _check_step_inputs(model, x, y, optimizer, accum_steps)
    budget_bytes = _validate.positive_int("budget_bytes", budget_bytes)
    if options is None:
        options = _step_options(loss_fn, {})
    elif not isinstance(options, cycle.CycleOptions):
        raise TypeError(_("options must be an accumlib.cycle.CycleOptions (the options train runs its cycles with, "
                          "e.g. CycleOptions(clip_grad_norm=1.0)) or None, got {value!r} of type {type}").format(
                              value=_validate.Shown(options), type=type(options).__name__))
    elif loss_fn is not None:
        raise TypeError(_("check_fits takes loss_fn or options (whose loss_fn it uses), not both"))
    report = _step_peak(model, optimizer, x, y, options, accum_steps,
                        None if device is None else torch.device(device))
    if report.peak > budget_bytes:
        raise OutOfMemory(report.peak, budget_bytes, _("a micro-batch of {n} samples").format(n=len(x)))
    return report


def measured_cycle_peak(model, optimizer, batches, loss_weights, options: cycle.CycleOptions) -> int:
    """The peak bytes of the cycle of `batches` with `loss_weights`, as `measure_step` measures a step (the heavier
    of a run's first step and a later one), under FakeTensorMode on copies of the model and optimizer."""
    return _traced_cycle(model, optimizer, batches, loss_weights, options).peak


def _traced_cycle(model, optimizer, batches, loss_weights, options: cycle.CycleOptions) -> MemoryReport:
    """The report of the cycle of `batches` (any shapes), traced under FakeTensorMode where the model is."""
    sizes = [len(leaves[0]) for leaves in map(_leaves, batches) if leaves and leaves[0].dim()]
    return _measure_cycle(model, optimizer, list(batches), list(loss_weights), options.measured(),
                          max(sizes, default=0), True, next(model.parameters()).device)


def check_cycle_fits(model, optimizer, batches, loss_weights, *, options: cycle.CycleOptions, budget_bytes: int,
                     what: str, advice: str) -> MemoryReport:
    """Raise OutOfMemory (needing `what`, with `advice`) when the cycle of `batches` ((x, y) pairs as
    `cycle.accumulate_and_step` takes them, any shapes) with `loss_weights` needs more than `budget_bytes`.

    Traced as `check_fits` traces a step (FakeTensorMode, on copies of the model and optimizer, where the model
    is), every micro-batch as it is: `train` checks a loader's cycles with it, one per layout of batch shapes.
    """
    report = _traced_cycle(model, optimizer, batches, loss_weights, options)
    if report.peak > budget_bytes:
        raise OutOfMemory(report.peak, budget_bytes, what, advice=advice)
    return report


def cuda_budget(device: torch.device, budget_bytes: int | None):
    """On CUDA, cap this process's caching allocator for the block where a real card could honour `budget_bytes`;
    the allocator's OOM becomes OutOfMemory. Elsewhere, or without a budget, it does nothing.

    The budget itself is B bytes of the step's tensors as the allocator allocates them (512-byte blocks, see the
    module's docstring), which `check_fits` traces before training. The cap is on what the allocator reserves,
    which holds more: so it is set at what was reserved on entry (the model, cached blocks, cuBLAS's workspace,
    taken first by `_take_workspaces`) + B + one partly used segment of each pool (2 MiB + 20 MiB), and only when B
    is at least CUDA_CAP_MINIMUM (20 MiB, the large pool's segment): below that a cap would measure the allocator's
    granularity, not the simulated card, and refuse steps that check_fits found within B. The CUDA context is
    outside the allocator and never counted: a real card of N bytes offers N minus the context. cuDNN's workspaces
    inside the step are not in the trace either; the segment allowance absorbs small ones. A memory fraction the
    caller set (torch.cuda.set_per_process_memory_fraction) stays if it is tighter, and is in force again after.
    (Not run on a GPU yet: benchmarks/gpu_check.py checks these rules where there is one.)
    Where it does nothing it is a plain nullcontext (no generator, whose exit would set an error's __traceback__:
    a frozen dataclass exception would be replaced by the FrozenInstanceError of that).
    """
    if device.type != "cuda" or budget_bytes is None or budget_bytes < CUDA_CAP_MINIMUM:
        return contextlib.nullcontext()
    return _capped(device, budget_bytes)


@contextlib.contextmanager
def _capped(device: torch.device, budget_bytes: int):
    """`cuda_budget` where it caps the allocator."""
    _take_workspaces(device)
    torch.cuda.synchronize(device)
    cap = torch.cuda.memory_reserved(device) + budget_bytes + CUDA_SMALL_SEGMENT + CUDA_LARGE_SEGMENT
    total = torch.cuda.get_device_properties(device).total_memory
    callers = torch.cuda.get_per_process_memory_fraction(device)  # 1.0 unless the caller capped it: put back after
    torch.cuda.set_per_process_memory_fraction(min(cap / total, callers), device)  # never looser than the caller's
    try:
        yield
    except OutOfMemory:
        raise
    except torch.OutOfMemoryError as error:
        raise OutOfMemory(torch.cuda.max_memory_allocated(device), budget_bytes) from error
    finally:
        torch.cuda.set_per_process_memory_fraction(callers, device)


def _take_workspaces(device: torch.device) -> None:
    """Make cuBLAS take its workspace for the current stream now (a 1 x 1 matrix product), so that it counts as
    reserved before the cap, as a real card holds it whatever the batch."""
    one = torch.ones(1, 1, device=device)
    one @ one


@dataclass(frozen=True)
class FitPlan:
    """How to train with an effective batch of `target_batch` samples per step on a card of `budget_bytes`.

    The plan fits exactly when `train(..., micro_batch_size=plan.micro_batch_size, accum_steps=plan.accum_steps,
    memory_budget=plan.budget_bytes)` accepts it: both measure the step of accum_steps passes under FakeTensorMode.
    """

    target_batch: int  # the effective batch asked for: micro_batch_size * accum_steps samples per step
    budget_bytes: int  # the card: bytes available to one training step
    micro_batch_size: int  # samples per pass: the largest divisor of target_batch whose step fits the budget
    accum_steps: int  # passes per optimizer step: target_batch // micro_batch_size
    peak_bytes: int  # peak of one step of accum_steps passes of micro_batch_size (<= budget_bytes)
    largest_fitting: int  # the largest micro-batch (samples, <= target_batch) that fits, dividing target_batch or not
    next_micro_batch_size: int | None  # the next larger divisor of target_batch (None when micro_batch_size is it)
    next_peak_bytes: int | None  # its step's peak, with target_batch // it passes (> budget_bytes)


MAX_TARGET_BATCH = 10**9  # samples: fit_batch lists the divisors of target_batch by trial division


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def fit_batch(model: torch.nn.Module, example_batch, target_batch: int, budget_bytes: int, *, optimizer=None,
              loss_fn: Callable | None = None) -> FitPlan:
    """Plan (micro_batch_size, accum_steps) for an effective batch of exactly `target_batch` under `budget_bytes`.

    The micro-batch is the largest divisor d of target_batch whose step -- target_batch // d passes of d samples
    and one optimizer step, as `train` runs it -- peaks at most at budget_bytes. With accumulation the whole
    gradient stays alive through the cycle, so each candidate is measured with its own accum_steps.
    example_batch: (x, y) with at least one sample (its first sample stands for every sample: only shapes matter;
    nothing of the size of a candidate batch is allocated). target_batch: 1 to 10**9 samples. optimizer and
    loss_fn as for `measure_step`. Measured under FakeTensorMode: nothing is computed, the model is untouched.
    Raises OutOfMemory when even one sample per pass does not fit (for a model with BatchNorm, which refuses one
    sample per channel in training, the smallest divisor of target_batch above 1).
    """
    x, y = _validate.pair("example_batch", example_batch)
    _check_step_inputs(model, x, y, optimizer, 1)
    options = _step_options(loss_fn, {})
    target_batch = _validate.positive_int("target_batch", target_batch)
    if target_batch > MAX_TARGET_BATCH:
        raise ValueError(_("target_batch must be between 1 and {most:,} samples, got {value:,}").format(
            most=MAX_TARGET_BATCH, value=target_batch))
    budget_bytes = _validate.positive_int("budget_bytes", budget_bytes)

    def peak(size: int) -> int:  # a step of `size` samples per pass, with the passes an effective batch needs
        views = x[:1].expand(size, *x.shape[1:]), y[:1].expand(size, *y.shape[1:])  # no memory: fake copies below
        return _step_peak(model, optimizer, *views, options, -(-target_batch // size)).peak

    candidates = _divisors(target_batch)
    peaks = {target_batch: peak(target_batch)}
    if peaks[target_batch] <= budget_bytes:
        return FitPlan(target_batch, budget_bytes, target_batch, 1, peaks[target_batch], target_batch, None, None)
    try:
        peaks[1] = peak(1)
    except ValueError:  # BatchNorm in training refuses one value per channel: its smallest micro-batch is 2 or more
        if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise
        candidates = [d for d in candidates if d > 1]
    smallest = candidates[0]
    if smallest not in peaks:
        peaks[smallest] = peak(smallest)
    if peaks[smallest] > budget_bytes:
        what = _("even one sample per pass") if smallest == 1 else _(
            "even {size} samples per pass, the smallest micro-batch that divides target_batch={target} and that "
            "BatchNorm accepts in training").format(size=smallest, target=target_batch)
        raise OutOfMemory(peaks[smallest], budget_bytes, what,
                          advice=_("a larger card, a smaller model or an optimizer with less state is needed"))
    # Below target_batch every candidate accumulates (>= 2 passes) and its peak grows with the micro-batch:
    # bisect for the largest divisor that fits; the one after it (at worst target_batch itself) does not.
    low, high = 0, len(candidates) - 2  # indices; candidates[low] fits, candidates[high + 1] does not
    while low < high:
        mid = (low + high + 1) // 2
        peaks[candidates[mid]] = peak(candidates[mid])
        low, high = (mid, high) if peaks[candidates[mid]] <= budget_bytes else (low, mid - 1)
    micro, following = candidates[low], candidates[low + 1]
    if following not in peaks:
        peaks[following] = peak(following)
    fitting, too_big = micro, following  # the largest micro-batch that fits lies in [micro, following)
    while too_big - fitting > 1:
        mid = (fitting + too_big) // 2
        fitting, too_big = (mid, too_big) if peak(mid) <= budget_bytes else (fitting, mid)
    return FitPlan(target_batch, budget_bytes, micro, target_batch // micro, peaks[micro], fitting, following,
                   peaks[following])
