"""What a refusal must leave as it found: a model's and an optimizer's state, compared exactly (the library's tests).

`snapshot` and `same`: the values; `state` and `unchanged`: the values and each .grad's very tensor (a call that
set .grad aside must give back the tensor it found, not a copy); `stable_records`: a run's records, comparable;
`identical`: two state dicts equal bit for bit, each tensor's dtype too.
"""

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


def state(model, optimizer):
    """Everything the call may change: weights and buffers, the optimizer's state, each .grad (object and values)."""
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {
            k: {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in s.items()}
            for k, s in optimizer.state_dict()["state"].items()
        },
        [(p.grad, None if p.grad is None else p.grad.clone()) for p in model.parameters()],
    )


def unchanged(before, model, optimizer) -> bool:
    after = state(model, optimizer)
    same_model = before[0].keys() == after[0].keys() and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    same_state = all(
        torch.equal(before[1][k][n], after[1][k][n])
        if isinstance(before[1][k][n], torch.Tensor)
        else before[1][k][n] == after[1][k][n]
        for k in before[1]
        for n in before[1][k]
    )
    same_grads = all(a[0] is b[0] and torch.equal(a[1], b[1]) for a, b in zip(before[2], after[2], strict=True))
    return same_model and same_state and same_grads


def identical(a, b) -> bool:
    """Two nested structures (state dicts) equal, every tensor bit for bit (its dtype and shape too)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(identical, a, b))
    return a == b
