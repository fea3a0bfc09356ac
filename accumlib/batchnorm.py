"""What BatchNorm sees under accumulation: micro-batch statistics against the full batch, and the remedies.

BatchNorm normalises each micro-batch with that micro-batch's own mean and variance, so accumulation no longer
equals the big batch, and the running statistics average noisier estimates. Remedies compared here: GroupNorm
(no batch statistics, accumulation exact again) and re-estimating the running statistics after training.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ._validate import positive_int


@dataclass(frozen=True)
class LayerDeviation:
    """How far one BatchNorm layer's statistics stray from the reference, averaged over channels."""

    layer: str
    mean: float  # mean |micro mean - reference mean| / reference std (dimensionless)
    variance: float  # mean |micro variance - reference variance| / reference variance (dimensionless)


def batchnorm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}


def _bn_inputs(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs of every BatchNorm layer in a train-mode forward of x as one batch (model left untouched)."""
    model = copy.deepcopy(model).train()
    seen: dict[str, torch.Tensor] = {}
    if not batchnorm_layers(model):
        raise ValueError("model has no BatchNorm layer")
    for name, layer in batchnorm_layers(model).items():
        layer.register_forward_pre_hook(lambda _, args, name=name: seen.__setitem__(name, args[0].detach()))
    with torch.no_grad():
        model(x)
    return seen


def _channel_stats(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [d for d in range(t.dim()) if d != 1]
    return t.mean(dims), t.var(dims, unbiased=False)


def micro_batch_deviation(model: nn.Module, x: torch.Tensor, micro_batch_size: int) -> list[LayerDeviation]:
    """Per BatchNorm layer: deviation of each micro-batch's statistics from those of the whole batch x."""
    micro_batch_size = positive_int("micro_batch_size", micro_batch_size)
    if micro_batch_size > len(x):
        raise ValueError(f"micro_batch_size must be between 1 and {len(x)} (the batch), got {micro_batch_size}")
    result = []
    for name, inputs in _bn_inputs(model, x).items():
        mean, var = _channel_stats(inputs)
        mean_dev, var_dev = [], []
        for chunk in torch.split(inputs, micro_batch_size):
            m, v = _channel_stats(chunk)
            mean_dev.append(((m - mean).abs() / (var + 1e-5).sqrt()).mean())
            var_dev.append((v / (var + 1e-5) - 1).abs().mean())
        result.append(LayerDeviation(name, torch.stack(mean_dev).mean().item(), torch.stack(var_dev).mean().item()))
    return result


def running_stats_error(model: nn.Module, x: torch.Tensor) -> list[LayerDeviation]:
    """Per BatchNorm layer: deviation of running_mean/running_var from the exact statistics of data x."""
    result = []
    layers = batchnorm_layers(model)
    for name, inputs in _bn_inputs(model, x).items():
        dims = [d for d in range(inputs.dim()) if d != 1]
        mean, var = inputs.mean(dims), inputs.var(dims, unbiased=True)
        layer = layers[name]
        result.append(LayerDeviation(
            name, ((layer.running_mean - mean).abs() / (var + layer.eps).sqrt()).mean().item(),
            ((layer.running_var - var).abs() / (var + layer.eps)).mean().item()))
    return result


def running_stats_divergence(model: nn.Module, reference: nn.Module) -> list[LayerDeviation]:
    """Per BatchNorm layer: how far model's running statistics are from those of `reference` (same layout)."""
    ref_layers = batchnorm_layers(reference)
    result = []
    for name, layer in batchnorm_layers(model).items():
        ref = ref_layers[name]
        result.append(LayerDeviation(
            name, ((layer.running_mean - ref.running_mean).abs() / (ref.running_var + ref.eps).sqrt()).mean().item(),
            ((layer.running_var - ref.running_var).abs() / (ref.running_var + ref.eps)).mean().item()))
    return result


def collect_running_stats(model: nn.Module, x: torch.Tensor, batch_size: int, updates: int = 200) -> nn.Module:
    """A copy of `model` whose running statistics come from `updates` train-mode passes of batch_size samples.

    Weights stay fixed, so what remains of the error against the exact statistics is the micro-batch noise
    that BatchNorm's running average keeps (about 1/sqrt(batch_size)).
    """
    batch_size, updates = positive_int("batch_size", batch_size), positive_int("updates", updates)
    model = copy.deepcopy(model).train()
    for layer in batchnorm_layers(model).values():
        layer.reset_running_stats()
    batches = torch.split(x, batch_size)
    with torch.no_grad():
        for i in range(updates):
            model(batches[i % len(batches)])
    return model


def reestimate(model: nn.Module, x: torch.Tensor, batch_size: int | None = None) -> nn.Module:
    """Recompute the running statistics from x in batches of batch_size (default: all of x at once), in place.

    Uses torch.optim.swa_utils.update_bn (a cumulative average over the batches). Returns the model.
    """
    batch_size = positive_int("batch_size", batch_size or len(x))
    torch.optim.swa_utils.update_bn(DataLoader(TensorDataset(x), batch_size=batch_size), model)
    return model


def to_groupnorm(model: nn.Module, groups: int = 4) -> nn.Module:
    """A copy of `model` with each BatchNorm2d replaced by GroupNorm(groups, channels), affine weights kept."""
    groups = positive_int("groups", groups)
    model = copy.deepcopy(model)
    for name, layer in list(batchnorm_layers(model).items()):
        if layer.num_features % groups:
            raise ValueError(f"groups={groups} must divide the {layer.num_features} channels of layer {name}")
        gn = nn.GroupNorm(groups, layer.num_features, eps=layer.eps, affine=layer.affine)
        if layer.affine:
            gn.load_state_dict({"weight": layer.weight.detach(), "bias": layer.bias.detach()})
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, gn)
    return model
