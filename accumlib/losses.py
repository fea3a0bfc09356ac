"""A micro-batch's loss as the cycle backpropagates it: a scalar tensor with a gradient (`_scalar_loss`), and
without loss_fn the model's own (`_own_loss`: a `.loss` attribute or a "loss" key, as a Hugging Face model gives it,
else cross-entropy), each refused by name when it is not."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ._validate import Shown
from .i18n import _


def _scalar_loss(loss) -> torch.Tensor:
    """`loss` if it is a 0-d tensor with a gradient; a clear error otherwise (no value read from the device)."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            _(
                "loss_fn must return a scalar tensor, got {value!r} of type {type}: return the tensor itself "
                "(not loss.item() or float(loss))"
            ).format(value=loss, type=type(loss).__name__)
        )
    if loss.dim() != 0:
        raise ValueError(
            _(
                "loss_fn must return a scalar, got a tensor of shape {shape}: reduce it (reduction='mean' or 'sum')"
            ).format(shape=tuple(loss.shape))
        )
    if not loss.requires_grad:
        raise ValueError(
            _(
                "loss_fn returned a tensor without a gradient (requires_grad=False): compute it from the "
                "model's output, without .detach() or torch.no_grad()"
            )
        )
    return loss


def _own_loss(output, target):
    """The loss without loss_fn: cross_entropy(output, target) for a tensor output (logits), else the model's own
    (a `.loss` attribute or a "loss" key); either refused naming it when it has no gradient."""
    if isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor):
        loss = torch.nn.functional.cross_entropy(output, target)
        if not loss.requires_grad:  # named as the default loss: the user gave no loss_fn to blame
            raise ValueError(
                _(
                    "the default loss (cross-entropy of the model's output; no loss_fn was given) has no gradient "
                    "(requires_grad=False): the model computed its output outside its parameters' graph (under "
                    "torch.no_grad() or with .detach()), or every parameter is frozen (requires_grad=False: an "
                    "on_step that freezes the model does this)"
                )
            )
        return loss
    mapping = isinstance(output, Mapping)
    loss = output.get("loss") if mapping else getattr(output, "loss", None)
    if type(loss) is torch.Tensor and loss.requires_grad and not loss.dim():  # a plain scalar with a gradient
        return loss
    if loss is not None:  # a tensor subclass (FakeTensor in a trace, DTensor) passes as a plain tensor does
        _refuse_model_loss(loss, "output['loss']" if mapping else "output.loss")
        return loss
    raise TypeError(
        _(
            "the model returned {type} without a loss (no .loss attribute or 'loss' key) and no loss_fn "
            "was given: put the labels in the batch so that the model computes its loss, or give "
            "loss_fn(output, target)"
        ).format(type=type(output).__name__)
    )


def _refuse_model_loss(loss, where: str) -> None:
    """The model's own loss (`where`: its output's .loss or 'loss' key; no loss_fn was given), refused naming it
    unless it is a floating-point 0-d tensor with a gradient (no value read from the device)."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            _(
                "the model's own loss ({where}; no loss_fn was given) must be a scalar tensor, got "
                "{value!r} of type {type}: let the model return the tensor itself (not loss.item() or "
                "float(loss)), or give loss_fn(output, target)"
            ).format(where=where, value=Shown(loss), type=type(loss).__name__)
        )
    if loss.dim() != 0:
        raise ValueError(
            _(
                "the model's own loss ({where}; no loss_fn was given) must be a scalar, got a tensor of "
                "shape {shape}: reduce it in the model (a mean or a sum), or give loss_fn(output, target) "
                "that does"
            ).format(where=where, shape=tuple(loss.shape))
        )
    if not loss.is_floating_point():
        raise TypeError(
            _(
                "the model's own loss ({where}; no loss_fn was given) is a tensor of {dtype}, which has no "
                "gradient: a loss is a floating-point scalar computed from the model's outputs"
            ).format(where=where, dtype=loss.dtype)
        )
    if not loss.requires_grad:
        raise ValueError(
            _(
                "the model's own loss ({where}; no loss_fn was given) has no gradient "
                "(requires_grad=False): the model computed it outside its parameters' graph (under "
                "torch.no_grad() or with .detach()), or every parameter is frozen (requires_grad=False: "
                "an on_step that freezes the model does this)"
            ).format(where=where)
        )
