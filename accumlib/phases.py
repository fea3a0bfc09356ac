"""Which part of a cycle is running, seen from PyTorch's own hooks, for whoever measures a cycle (`tracker`'s count
of bytes, `measured_step`'s names, `timing`'s clock): the cycle itself calls no measurer.

    with phases.marked(model, optimizer, mark):   # mark("forward"), mark("read"), mark("step") as each begins
        cycle._cycle(model, optimizer, batches, weights, options)
    phases.in_backward()                          # True inside a backward(): an op autograd runs
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves


def in_backward() -> bool:
    """Whether this thread is running a backward() now (the op being run is one autograd runs)."""
    return torch._C._current_graph_task_id() != -1


@contextlib.contextmanager
def marked(model: torch.nn.Module, optimizer: torch.optim.Optimizer, mark: Callable[[str], None]):
    """Context manager: mark(phase) as each part of the cycles of `model` and `optimizer` inside the block begins,
    from hooks on them (removed on exit; other models and other threads' cycles are not seen):

    - "forward": a micro-batch's forward pass (the model's forward pre-hook, before any of its own, such as
      FSDP2's all-gather);
    - "read": a backward() has ended (what follows: the next micro-batch's fetch, or after the last one the
      gradient norms and the one host read);
    - "step": the optimizer's step (its step pre-hook).
    """
    ending: list[bool] = []  # True while the running backward's end is queued

    def ended() -> None:
        ending.clear()
        mark("read")

    def reached(grad_outputs):  # the backward reached the model's output: its end is queued, once
        if not ending:
            ending.append(True)
            torch.autograd.Variable._execution_engine.queue_callback(ended)

    def forward_begins(module, args) -> None:
        mark("forward")

    def forward_ended(module, args, output) -> None:
        for leaf in tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.grad_fn is not None:
                leaf.grad_fn.register_prehook(reached)

    handles = [
        model.register_forward_pre_hook(forward_begins, prepend=True),
        model.register_forward_hook(forward_ended),
        optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: mark("step")),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
