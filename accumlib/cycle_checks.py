"""The checks of what a cycle is given, before anything changes: the model, the optimizer (some of the model's
trainable parameters, no closure), one finite weight >= 0 per micro-batch and a list's micro-batches on the model's
device and not empty. `train` and `gradient_gap` share the model's and the optimizer's."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Sized

import torch
from torch.utils._pytree import tree_leaves

from ._validate import Shown
from .i18n import _


def _check_cycle(model, optimizer, micro_batches, loss_weights) -> None:
    """accumulate_and_step's model, optimizer and data, checked before anything changes (loss weights given as
    tensors are read from the device once, together; nothing else is)."""
    _check_model(model)
    params = _check_optimizer(model, optimizer)  # some of the model's trainable parameters, without a closure
    for name, value in (("micro_batches", micro_batches), ("loss_weights", loss_weights)):
        if not isinstance(value, Sized) or isinstance(value, (str, dict, torch.Tensor)):
            raise TypeError(
                _("{name} must be a list (one item per micro-batch), got {value!r} of type {type}").format(
                    name=name, value=value, type=type(value).__name__
                )
            )
    if not micro_batches:
        raise ValueError(_("micro_batches is empty: a cycle needs at least one micro-batch"))
    if len(micro_batches) != len(loss_weights):
        raise ValueError(
            _(
                "loss_weights has {weights} values but micro_batches has {micro} micro-batches: give one "
                "weight per micro-batch"
            ).format(weights=len(loss_weights), micro=len(micro_batches))
        )
    _check_weights(
        loss_weights,
        min(
            (p.dtype for p in params if p.is_floating_point()),
            key=lambda dtype: torch.finfo(dtype).max,
            default=torch.float64,
        ),
    )
    _check_micro_batches(model, micro_batches)


def _check_weights(loss_weights, dtype: torch.dtype = torch.float64) -> None:
    """One finite number >= 0 per micro-batch: a Python number, a NumPy scalar or a 0-d real tensor, at most the
    largest finite value of `dtype` (the optimizer's parameters': past it the weighted loss is no number of that
    dtype). The tensors are read together, in one host read, before anything changes."""
    largest, tensors, values = torch.finfo(dtype).max, [], []
    for i, weight in enumerate(loss_weights):
        if (
            isinstance(weight, torch.Tensor)
            and weight.dim() == 0
            and not (weight.is_complex() or weight.dtype == torch.bool)
        ):
            tensors.append((i, weight))
        elif not isinstance(weight, numbers.Real) or isinstance(weight, bool) or not 0 <= weight < math.inf:
            raise ValueError(
                _(
                    "loss_weights[{i}] is {value!r}: loss_weights must hold finite numbers >= 0 (or 0-d "
                    "real tensors), one per micro-batch"
                ).format(i=i, value=Shown(weight))
            )
        else:
            values.append((i, weight, weight))
    if tensors:
        read = torch.stack([w.detach().to("cpu", torch.float64) for _i, w in tensors]).tolist()  # the one read
        for (i, weight), value in zip(tensors, read, strict=True):
            if not 0 <= value < math.inf:
                raise ValueError(
                    _(
                        "loss_weights[{i}] is {value!r}: loss_weights must hold finite numbers >= 0 (or "
                        "0-d real tensors), one per micro-batch"
                    ).format(i=i, value=weight)
                )
            values.append((i, weight, value))
    for i, weight, value in values:  # a weight past the dtype's range: refused by name, not an error inside
        if value > largest:
            raise ValueError(
                _(
                    "loss_weights[{i}] is {value!r}, more than the largest {dtype} ({largest:g}), the "
                    "dtype of the optimizer's parameters: the weighted loss would be no {dtype} number; "
                    "valid: finite numbers from 0 to {largest:g}"
                ).format(i=i, value=Shown(weight), dtype=str(dtype).removeprefix("torch."), largest=largest)
            )


def _check_micro_batches(model: torch.nn.Module, micro_batches) -> None:
    """Each micro-batch of a list or tuple (a lazy sequence is fetched by the cycle itself): no tensor in it empty
    along its first dimension, every tensor on a device of the model's parameters."""
    if not isinstance(micro_batches, (list, tuple)):
        return
    devices = {p.device for p in model.parameters()}
    for i, batch in enumerate(micro_batches):
        for tensor in (t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)):
            if tensor.dim() and not len(tensor):
                raise ValueError(
                    _(
                        "micro_batches[{i}] holds a tensor of shape {shape}, without samples: an empty "
                        "micro-batch has no mean loss (NaN); leave it out of the cycle"
                    ).format(i=i, shape=tuple(tensor.shape))
                )
            if tensor.device not in devices:
                raise ValueError(
                    _(
                        "micro_batches[{i}] holds a tensor on {device} but the model is on {model}: move "
                        "the micro-batches to the model's device first (x.to(device))"
                    ).format(i=i, device=tensor.device, model=", ".join(sorted(map(str, devices))))
                )


def _check_model(model) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            _("model must be a torch.nn.Module, got {value!r} of type {type}").format(
                value=model, type=type(model).__name__
            )
        )


def _check_optimizer_type(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            _("optimizer must be a torch.optim.Optimizer, got {value!r} of type {type}").format(
                value=optimizer, type=type(optimizer).__name__
            )
        )
    closure = inspect.signature(type(optimizer).step).parameters.get("closure")
    if closure is not None and closure.default is inspect.Parameter.empty:  # LBFGS
        raise ValueError(
            _(
                "optimizer is a {type}, whose step() needs a closure that computes the loss again; an "
                "accumulated step has none: use an optimizer whose step() takes no closure, such as SGD, "
                "Adam or AdamW"
            ).format(type=type(optimizer).__name__)
        )


def _check_optimizer(model: torch.nn.Module, optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters, once it is known to hold some of the model's trainable ones."""
    _check_optimizer_type(optimizer)
    model_params = list(model.parameters())
    if not model_params:
        raise ValueError(_("model has no parameters: there is nothing to train"))
    trainable = {id(p) for p in model_params if p.requires_grad}
    if not trainable:
        raise ValueError(
            _(
                "every parameter of model is frozen (requires_grad=False): there is nothing to train; "
                "unfreeze the ones to train with p.requires_grad_(True)"
            )
        )
    held = [p for group in optimizer.param_groups for p in group["params"]]
    if not any(id(p) in trainable for p in held):
        raise ValueError(
            _(
                "optimizer holds none of the model's trainable parameters: build it from "
                "model.parameters() (or the trainable ones you want to train)"
            )
        )
    return held
