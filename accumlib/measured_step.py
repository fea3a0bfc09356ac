"""One step's memory, measured on the model and optimizer it is given (`tracing` gives it copies): the tracker
adopts what exists before the step, names each storage the step creates as it goes, and fills a `MemoryReport`."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch.utils._pytree import tree_leaves, tree_map

from . import cycle, phases, sharded
from .i18n import _
from .options import CycleOptions
from .tracker import CATEGORIES, CATEGORY_DEFINITIONS, LiveTensorBytes, _model_tensors, optimizer_state_tensors

TRACKER = "live tensor storages (TorchDispatchMode)"
FAKE = "live tensor storages under FakeTensorMode (nothing computed)"
ALLOCATOR = "CUDA caching allocator (max_memory_allocated)"


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


MemoryReport.__doc__ = MemoryReport.__doc__.rstrip(" ") + "".join(
    f"    {name}: {definition}.\n" for name, definition in CATEGORY_DEFINITIONS.items()
)


def _clone_optimizer(
    optimizer: torch.optim.Optimizer | None, original: torch.nn.Module, copied: torch.nn.Module
) -> torch.optim.Optimizer:
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
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [copies[id(p)] for p in group["params"] if id(p) in copies and copies[id(p)].requires_grad],
        }
        for group in optimizer.param_groups
    ]
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


def _named_cycle(model, optimizer, batches, loss_weights, tracker: LiveTensorBytes, options: CycleOptions) -> None:
    """One cycle of `batches` with `loss_weights` (train's cycle: `cycle._cycle`, with `options`) under `tracker`,
    naming what each new storage holds as the step goes."""
    hooks = []
    for p in model.parameters():
        if p.requires_grad:
            hooks.append(p.register_hook(lambda g: tracker.tag([g], "incoming gradients")))
            hooks.append(p.register_post_accumulate_grad_hook(lambda p: tracker.tag([p.grad], "gradients")))

    def mark(phase: str) -> None:
        if phase in ("forward", "read"):  # FSDP2's gradients (no hook sees them): its shards, its unsharded ones
            tracker.tag(sharded.held_gradients(model), "gradients")
        tracker.phase = phase

    tracker.track(_model_tensors(model), "parameters")
    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(lambda t: tracker.tag([t], "activations") or t, lambda t: t),
            phases.marked(model, optimizer, mark),
        ):
            cycle._cycle(model, optimizer, _Fetched(batches, tracker), loss_weights, options)
        tracker.tag(optimizer_state_tensors(optimizer), "optimizer state")  # made by the step, if it was the first
    finally:
        for hook in hooks:
            hook.remove()


def _on(batches, copy_of: Callable) -> list:
    """The micro-batches with each tensor replaced by copy_of(it), a tensor found more than once copied once (the
    same micro-batch repeated stays one object, as measure_step's accum_steps passes of one (x, y))."""
    copies: dict[int, object] = {}
    for batch in batches:
        if id(batch) not in copies:
            copies[id(batch)] = _copied(batch, copy_of)
    return [copies[id(batch)] for batch in batches]


@contextlib.contextmanager
def explained_failure(x: torch.Tensor, y: torch.Tensor):
    """Re-raise an error of the model or loss_fn on (x, y) as a ValueError that names x and y (chained)."""
    try:
        yield
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, IndexError, TypeError) as error:
        raise ValueError(
            _(
                "a training pass of the model on x (shape {x_shape}, {x_dtype}) and y (shape {y_shape}, "
                "{y_dtype}) with loss_fn failed: {error}. Check that x is what the model takes and y what "
                "loss_fn compares its output with"
            ).format(x_shape=tuple(x.shape), x_dtype=x.dtype, y_shape=tuple(y.shape), y_dtype=y.dtype, error=error)
        ) from error


def _measure(
    model, opt, batches, loss_weights, method, device_name, options, micro_batch_size, explain, cuda=None
) -> MemoryReport:
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
        reports.append(
            MemoryReport(
                device=device_name,
                method=method,
                micro_batch_size=micro_batch_size,
                accum_steps=len(batches),
                peak=peak,
                peak_phase=tracker.peak_phase,
                **{name.replace(" ", "_"): value for name, value in categories.items()},
            )
        )
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
