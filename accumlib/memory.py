"""Peak memory of a training step, by category, in bytes: on CUDA from the allocator, on the CPU from live tensors.

On the CPU, `LiveTensorBytes` (a TorchDispatchMode) counts the bytes of every tensor storage alive while a step
runs: byte-exact and identical from run to run, unlike process RSS. Under FakeTensorMode the same count comes
without computing anything (`measure_step(..., fake=True)`), fast enough for "does this fit?" questions.
"""
from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ._validate import positive_int

TRACKER = "live tensor storages (TorchDispatchMode)"
FAKE = "live tensor storages under FakeTensorMode (nothing computed)"
ALLOCATOR = "CUDA caching allocator (max_memory_allocated)"


class OutOfMemory(torch.OutOfMemoryError):
    """A step needs more bytes than the (simulated) card has."""

    def __init__(self, needed_bytes: int, available_bytes: int, what: str = "this micro-batch"):
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes
        super().__init__(f"out of memory: {what} needs {needed_bytes:,} bytes ({needed_bytes / 2**20:.2f} MiB) "
                         f"but the budget is {available_bytes:,} bytes ({available_bytes / 2**20:.2f} MiB); "
                         f"use a smaller micro_batch_size and more accum_steps")


CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "other")


class _Storage:
    """One live storage: its bytes and what it holds (one of CATEGORIES)."""

    __slots__ = ("nbytes", "category")

    def __init__(self, nbytes: int, category: str):
        self.nbytes, self.category = nbytes, category


class LiveTensorBytes(TorchDispatchMode):
    """Counts bytes of live tensor storages: those adopted with `track` and every one created under the mode.

    `current` and `peak` are in bytes. A storage is counted once however many views share it, and stops
    counting when it is freed (a weakref finalizer on the storage). Storages carry a category (`tag`), and
    `peak_categories()` splits the peak by what was alive at that moment, so the categories add up to it.
    """

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self._live: dict[int, _Storage] = {}
        self._at_peak: list[_Storage] = []
        self._finalizers: list[weakref.finalize] = []

    def track(self, tensors: Iterable[torch.Tensor], category: str = "other") -> None:
        """Count these (already existing) tensors' storages from now on, under `category`."""
        for t in tensors:
            self._track(t, category)

    def tag(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Name what these live storages hold, unless they already have a category other than "other"."""
        for t in tensors:
            record = self._live.get(id(t.untyped_storage()))
            if record is not None and record.category == "other":
                record.category = category

    def peak_categories(self) -> dict[str, int]:
        """Bytes by category of the storages alive at the peak; they add up to `peak`."""
        totals = dict.fromkeys(CATEGORIES, 0)
        for record in self._at_peak:
            totals[record.category] += record.nbytes
        return totals

    def _track(self, t: torch.Tensor, category: str = "other") -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        record = self._live[key] = _Storage(storage.nbytes(), category)
        self.current += record.nbytes
        if self.current > self.peak:
            self.peak = self.current
            self._at_peak = list(self._live.values())  # the records themselves: later tags still apply
        self._finalizers.append(weakref.finalize(storage, self._free, key))

    def _free(self, key: int) -> None:
        record = self._live.pop(key, None)
        if record is not None:
            self.current -= record.nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    def __exit__(self, *exc):
        for f in self._finalizers:
            f.detach()
        return super().__exit__(*exc)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _persistent_tensors(params, optimizer) -> list[torch.Tensor]:
    grads = [p.grad for p in params if p.grad is not None]
    return list(params) + grads + optimizer_state_tensors(optimizer)


class _Peak:
    bytes: int | None = None


@contextlib.contextmanager
def step_peak(device: torch.device, params, optimizer):
    """Context manager: `.bytes` is the peak bytes of the block (parameters, gradients and state included)."""
    result = _Peak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        result.bytes = torch.cuda.max_memory_allocated(device)
    else:
        tracker = LiveTensorBytes()
        tracker.track(_persistent_tensors(params, optimizer))
        with tracker:
            yield result
        result.bytes = tracker.peak


@dataclass(frozen=True)
class MemoryReport:
    """Bytes of one training step (accum_steps forward/backward passes of one micro-batch, one optimizer step)."""

    device: str
    method: str
    micro_batch_size: int
    accum_steps: int
    parameters: int  # bytes
    gradients: int  # bytes
    optimizer_state: int  # bytes
    activations: int  # bytes saved for backward (parameters excluded)
    other: int  # bytes: inputs, outputs and temporaries (on CUDA also the allocator's rounding and workspaces)
    peak: int  # bytes, the highest total alive at any moment of the step

    def categories(self) -> dict[str, int]:
        """Bytes by category, each as alive at the moment of the peak: they add up to the peak."""
        return {"parameters": self.parameters, "gradients": self.gradients, "optimizer state": self.optimizer_state,
                "activations": self.activations, "other": self.other}


def _clone_optimizer(optimizer: torch.optim.Optimizer | None, params) -> torch.optim.Optimizer:
    if optimizer is None:
        return torch.optim.SGD(params, lr=0.1)
    return type(optimizer)(params, **optimizer.defaults)


def _run_step(model, optimizer, x, y, loss_fn, accum_steps, tracker: LiveTensorBytes | None = None) -> None:
    """accum_steps forward/backward passes of (x, y), one optimizer step; `tracker` learns what each storage holds."""
    name = tracker.tag if tracker is not None else (lambda tensors, category: None)
    hooks = [p.register_post_accumulate_grad_hook(lambda p: name([p.grad], "gradients"))
             for p in model.parameters() if p.requires_grad]
    try:
        optimizer.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: name([t], "activations") or t, lambda t: t):
            for _ in range(accum_steps):
                loss = loss_fn(model(x), y) / accum_steps
                loss.backward()
                del loss
        optimizer.step()
        name(optimizer_state_tensors(optimizer), "optimizer state")
    finally:
        for hook in hooks:
            hook.remove()


def measure_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, optimizer=None,
                 loss_fn: Callable | None = None, accum_steps: int = 1, fake: bool = False,
                 device=None) -> MemoryReport:
    """Measure the memory of one step on a copy of `model` (the model and optimizer are not touched).

    x, y: one micro-batch. optimizer: its type and settings are copied (default: SGD, which keeps no state).
    A warm-up step comes first, so the step measured is a steady one (Adam's state exists, as from step 2 on).
    The categories are what was alive at the moment of the peak.
    fake=True runs under FakeTensorMode: the same bytes as the CPU tracker, nothing computed.
    device: "cpu" or "cuda" (default: where the model is); on CUDA the peak is the allocator's.
    """
    accum_steps = positive_int("accum_steps", accum_steps)
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    device = torch.device(device) if device is not None else next(model.parameters()).device
    x, y = x.clone(), y.clone()  # a slice of a dataset would otherwise count the whole dataset's storage
    if fake:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        with FakeCopyMode(mode):
            copied = copy.deepcopy(model)
        with mode:
            x, y = mode.from_tensor(x), mode.from_tensor(y)
            return _tracked(copied, optimizer, x, y, loss_fn, accum_steps, FAKE, "cpu (fake)")
    if device.type == "cuda":
        return _allocator(model, optimizer, x, y, loss_fn, accum_steps, device)
    return _tracked(copy.deepcopy(model), optimizer, x, y, loss_fn, accum_steps, TRACKER, "cpu")


def _tracked(model, optimizer, x, y, loss_fn, accum_steps, method, device_name) -> MemoryReport:
    params = list(model.parameters())
    opt = _clone_optimizer(optimizer, params)
    _run_step(model, opt, x, y, loss_fn, accum_steps)  # warm-up: the optimizer state exists from step 2 on
    tracker = LiveTensorBytes()
    tracker.track(params, "parameters")
    tracker.track([p.grad for p in params if p.grad is not None], "gradients")
    tracker.track(optimizer_state_tensors(opt), "optimizer state")
    tracker.track([x, y])
    with tracker:
        _run_step(model, opt, x, y, loss_fn, accum_steps, tracker)
    return _report(device_name, method, len(x), accum_steps, tracker.peak_categories(), tracker.peak)


def _allocator(model, optimizer, x, y, loss_fn, accum_steps, device) -> MemoryReport:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    model = copy.deepcopy(model).to(device)
    x, y = x.to(device), y.to(device)
    params = list(model.parameters())
    opt = _clone_optimizer(optimizer, params)
    _run_step(model, opt, x, y, loss_fn, accum_steps)  # warm-up: optimizer state, workspaces
    tracker = LiveTensorBytes()
    tracker.track(params, "parameters")
    tracker.track([p.grad for p in params if p.grad is not None], "gradients")
    tracker.track(optimizer_state_tensors(opt), "optimizer state")
    tracker.track([x, y])
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    with tracker:
        _run_step(model, opt, x, y, loss_fn, accum_steps, tracker)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    categories = tracker.peak_categories()
    categories["other"] += peak - tracker.peak  # the allocator holds at least the live bytes: rounding, workspaces
    return _report(torch.cuda.get_device_name(device), ALLOCATOR, len(x), accum_steps, categories, peak)


def _report(device_name, method, micro, accum_steps, categories: dict[str, int], peak: int) -> MemoryReport:
    return MemoryReport(device=device_name, method=method, micro_batch_size=micro, accum_steps=accum_steps,
                        parameters=categories["parameters"], gradients=categories["gradients"],
                        optimizer_state=categories["optimizer state"], activations=categories["activations"],
                        other=categories["other"], peak=peak)


def batch_of(example: tuple[torch.Tensor, torch.Tensor], size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`size` samples made by repeating the example batch (shapes are all that matter for memory)."""
    x, y = example
    reps = -(-size // len(x))
    return x.repeat(reps, *[1] * (x.dim() - 1))[:size], y.repeat(reps, *[1] * (y.dim() - 1))[:size]


def check_fits(model, optimizer, x, y, *, loss_fn, accum_steps: int, budget_bytes: int) -> MemoryReport:
    """Raise OutOfMemory when one step of accum_steps micro-batches (x, y) needs more than `budget_bytes`."""
    report = measure_step(model, x.cpu(), y.cpu(), optimizer=optimizer, loss_fn=loss_fn, accum_steps=accum_steps,
                          fake=True)
    if report.peak > budget_bytes:
        raise OutOfMemory(report.peak, budget_bytes, f"a micro-batch of {len(x)} samples")
    return report


@contextlib.contextmanager
def cuda_budget(device: torch.device, budget_bytes: int | None):
    """On CUDA, cap this process's allocator at `budget_bytes` for the block; its OOM becomes OutOfMemory."""
    if device.type != "cuda" or budget_bytes is None:
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(budget_bytes / total, 1.0), device)
    try:
        yield
    except OutOfMemory:
        raise
    except torch.OutOfMemoryError as error:
        raise OutOfMemory(torch.cuda.max_memory_allocated(device), budget_bytes) from error
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


@dataclass(frozen=True)
class FitPlan:
    """How to reach `target_batch` samples per step under `budget_bytes`."""

    micro_batch_size: int  # the largest divisor of target_batch that fits
    accum_steps: int  # target_batch // micro_batch_size
    largest_fitting: int  # the largest micro-batch that fits at all (samples)
    peak_bytes: int  # peak of one step at micro_batch_size
    budget_bytes: int


def fit_batch(model: torch.nn.Module, example_batch, target_batch: int, budget_bytes: int, *, optimizer=None,
              loss_fn: Callable | None = None) -> FitPlan:
    """The largest micro-batch that fits `budget_bytes`, and the accum_steps that reach `target_batch` exactly.

    example_batch: (x, y) with at least one sample; measured under FakeTensorMode, so nothing is computed.
    Raises OutOfMemory when even one sample does not fit.
    """
    target_batch = positive_int("target_batch", target_batch)
    budget_bytes = positive_int("budget_bytes", budget_bytes)

    def peak(size: int) -> int:
        x, y = batch_of(example_batch, size)
        return measure_step(model, x, y, optimizer=optimizer, loss_fn=loss_fn, fake=True).peak

    if peak(1) > budget_bytes:
        raise OutOfMemory(peak(1), budget_bytes, "even one sample")
    low, high = 1, target_batch  # peak(low) fits; find the largest size <= target that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if peak(mid) <= budget_bytes else (low, mid - 1)
    micro = max(d for d in range(1, low + 1) if target_batch % d == 0)
    return FitPlan(micro, target_batch // micro, low, peak(micro), budget_bytes)
