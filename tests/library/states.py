"""What a refusal must leave as it found: a model's and an optimizer's state, compared exactly (the library's tests)."""

import copy
import dataclasses

import torch


def snapshot(model, optimizer):
    """The model's state entries, each parameter's .grad and the optimizer's state, copied."""
    return (
        [t.clone() for t in model.state_dict().values()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        copy.deepcopy(optimizer.state_dict()),
    )


def same(a, b) -> bool:
    """Equal to the bit: tensors with torch.equal, containers entry by entry."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, z) for x, z in zip(a, b, strict=True))
    return a == b


def stable_records(history) -> list[dict]:
    """A run's records without their wall seconds: identical across runs with the same arguments on the CPU."""
    return [{k: v for k, v in dataclasses.asdict(r).items() if k != "seconds"} for r in history]
