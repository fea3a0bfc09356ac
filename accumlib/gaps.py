"""The checks of the trick: `gradient_gap` (accumulated against full-batch gradient) and `parameter_gap` (two
models' weights), both as a max absolute difference in float64."""

from __future__ import annotations

from typing import Callable

import torch

from ._validate import function, new_order, one_of, positive_int
from .cycle_checks import _check_model
from .i18n import _
from .losses import _own_loss, _scalar_loss
from .restore import _BuffersKept
from .source import _refuse_dict


def _state(name: str, value) -> dict:
    if isinstance(value, torch.nn.Module):
        return value.state_dict()
    if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
        return value
    raise TypeError(
        _("{name} must be a torch.nn.Module or a state dict of tensors, got {type}").format(
            name=name, type=type(value).__name__
        )
    )


def _max_abs_difference(pairs) -> float:
    """max |a - b| over pairs of same-shaped tensors (in float64, on the CPU); NaN if any difference is NaN."""
    gaps = [
        (a.detach().to("cpu", torch.float64) - b.detach().to("cpu", torch.float64)).abs().max()
        for a, b in pairs
        if a.numel()
    ]
    return torch.stack(gaps).max().item() if gaps else 0.0  # torch's max keeps a NaN (Python's max may drop it)


def parameter_gap(model: torch.nn.Module | dict, reference: torch.nn.Module | dict) -> float:
    """Max |difference| over every parameter and buffer of two models (or state dicts) of the same layout.

    NaN when a difference is NaN (a NaN weight is never hidden).
    """
    a, b = _state("model", model), _state("reference", reference)
    if a.keys() != b.keys():
        raise ValueError(_("model and reference differ in layout: {keys}").format(keys=sorted(a.keys() ^ b.keys())[:5]))
    for key in a:
        if a[key].shape != b[key].shape:
            raise ValueError(
                _("model and reference differ in layout: {key} has shape {a} in model and {b} in reference").format(
                    key=key, a=tuple(a[key].shape), b=tuple(b[key].shape)
                )
            )
    return _max_abs_difference((a[key], b[key]) for key in a)


@new_order
def gradient_gap(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    accum_steps: int,
    loss_fn: Callable | None = None,
    normalize: str = "samples",
) -> float:
    """Max |accumulated gradient - full-batch gradient| over all parameters, for (x, y) split into `accum_steps`
    micro-batches (torch.tensor_split: as equal as possible, sizes differ by at most one).

    Args:
        model: the model; its parameters, buffers (BatchNorm statistics), `.grad` and the RNG are left as they
            were, also on an error.
        x, y: the whole batch, tensors with one row per sample, moved to the model's device.
        accum_steps: the micro-batches it is split into, 1 to len(x).
        loss_fn: loss_fn(output, target) -> the mean loss over its batch, as in `train`; None: the model's own
            (its output's `.loss` or 'loss' key), else cross-entropy.
        normalize: "samples" (each micro-batch's share of the samples) or "steps" (1 / accum_steps), as in
            `train`; or "none", the mistake `train` does not offer: no division, the accumulated gradient
            accum_steps times too large.

    Returns:
        The largest absolute difference, a float (NaN when a difference is NaN).
    """
    _check_model(model)
    loss_fn = _own_loss if loss_fn is None else function("loss_fn", loss_fn)
    for name, tensor in (("x", x), ("y", y)):
        _refuse_dict(tensor, name)
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            raise TypeError(
                _("{name} must be a tensor with one row per sample, got {value!r}").format(name=name, value=tensor)
            )
    if len(x) != len(y):
        raise ValueError(
            _("x has {x} samples but y has {y}; they must have the same length").format(x=len(x), y=len(y))
        )
    accum_steps = positive_int("accum_steps", accum_steps)
    one_of("normalize", normalize, ("samples", "steps", "none"))
    if accum_steps > len(x):
        raise ValueError(
            _("accum_steps={value} is larger than the batch ({n} samples); valid range: 1 to {n}").format(
                value=accum_steps, n=len(x)
            )
        )
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
        for xs, ys in zip(torch.tensor_split(x, accum_steps), torch.tensor_split(y, accum_steps), strict=True):
            share = {"samples": len(xs) / len(x), "steps": 1 / accum_steps, "none": 1.0}[normalize]
            torch._foreach_add_(accumulated, gradient(xs, ys, share))
        buffers.restore()
    return _max_abs_difference(zip(accumulated, full, strict=True))
