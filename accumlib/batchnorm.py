"""What BatchNorm sees under accumulation, measured: micro-batch statistics, running statistics, and the remedies.

BatchNorm (batch normalisation) rescales each channel of a layer's input with the mean and variance of that
channel over the batch it is given. Under accumulation that batch is the micro-batch, so the forward pass, the
loss and the gradient of a micro-batch depend on which other samples share it: accumulated gradients no longer
equal those of the effective batch.

Running statistics: every BatchNorm layer also keeps `running_mean` and `running_var`, moving averages of the
batch statistics it has seen in training. Each train-mode forward pass is one update:
running = (1 - momentum) * running + momentum * batch statistic (momentum 0.1 by default; momentum=None: a plain
average of all batches so far). Under accumulation there is one update per micro-batch, so accum_steps times as
many, of noisier statistics.

Eval mode (`model.eval()`): BatchNorm normalises with the running statistics instead of the batch's, so a
prediction no longer depends on the other samples; that is how a model is evaluated and used after training.

Remedies, and what each fixes (lesson 7's experiment, `accumlib.lessons.batchnorm_lab.compare_micro_batches`,
measures them on held-out data, with the number of running-statistic updates held equal):
- A larger micro-batch: less noisy statistics in training and in the running averages.
- Re-estimating the running statistics after training (`reestimate`, PyTorch's `swa_utils.update_bn`) replaces
  them by averages over large batches of training data. It fixes only the statistics eval mode uses: the weights,
  trained with micro-batch statistics, stay exactly as they were.
- GroupNorm normalises each sample over groups of its own channels, with no batch statistics: accumulation is
  exact again (the same weights as one batch, up to float rounding), and eval mode changes nothing; but it is a
  different model, to be checked on held-out data.
- SyncBatchNorm computes the statistics over the micro-batches of all DDP processes in the same forward pass (not
  over the micro-batches of a cycle); PyTorch runs it on GPUs only, so nothing here measures it.
"""

from __future__ import annotations
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import _validate
from .i18n import _
from .memory import resolve_device


@dataclass(frozen=True)
class LayerDeviation:
    """How far one BatchNorm layer's statistics stray from the reference, averaged over channels."""

    layer: str
    mean: float  # mean |mean - reference mean| / reference std (dimensionless)
    variance: float  # mean |variance - reference variance| / reference variance (dimensionless)


def total(deviations: list[LayerDeviation]) -> float:
    """One number for a list of layer deviations: the sum over layers of mean + variance (dimensionless)."""
    return sum(d.mean + d.variance for d in deviations)


def batchnorm_layers(model: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """The model's BatchNorm layers by name (every `_BatchNorm`: BatchNorm1d/2d/3d, SyncBatchNorm)."""
    return {
        name: m
        for name, m in _validate.module("model", model).named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    }


def _layers_with_running_stats(model: nn.Module, name: str = "model") -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers of model; raise ValueError naming `name` when there are none or one keeps no statistics."""
    layers = {
        layer_name: m
        for layer_name, m in _validate.module(name, model).named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    }
    if not layers:
        raise ValueError(
            _("{name} has no BatchNorm layer (BatchNorm1d/2d/3d): there are no batch statistics to measure").format(
                name=name
            )
        )
    for layer_name, layer in layers.items():
        if layer.running_mean is None:
            raise ValueError(
                _(
                    "{name}'s BatchNorm layer {layer!r} keeps no running statistics "
                    "(track_running_stats=False): build it with track_running_stats=True"
                ).format(name=name, layer=layer_name)
            )
    return layers


def _on_model(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x moved to where the model's weights are (as `train` moves its micro-batches): one device for a measurement."""
    return x.to(resolve_device(model, None))


def _check_samples(name: str, x, at_least: int = 1) -> None:
    _validate.samples(name, x)
    if len(x) < at_least:
        raise ValueError(
            _("{name} must hold at least {at_least} samples, got {n}").format(name=name, at_least=at_least, n=len(x))
        )


def _bn_inputs(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Inputs of every BatchNorm layer in a train-mode forward of x as one batch (model left untouched)."""
    model = copy.deepcopy(model).train()
    seen: dict[str, torch.Tensor] = {}
    for name, layer in batchnorm_layers(model).items():
        layer.register_forward_pre_hook(lambda _, args, name=name: seen.__setitem__(name, args[0].detach()))
    with torch.no_grad():
        model(x)
    return seen


def _channel_stats(t: torch.Tensor, unbiased: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [d for d in range(t.dim()) if d != 1]
    return t.mean(dims), t.var(dims, unbiased=unbiased)


def micro_batch_deviation(model: nn.Module, x: torch.Tensor, micro_batch_size: int) -> list[LayerDeviation]:
    """Per BatchNorm layer: deviation of each micro-batch's statistics from those of the whole batch x."""
    _layers_with_running_stats(model)
    _check_samples("x", x)
    micro_batch_size = _validate.positive_int("micro_batch_size", micro_batch_size)
    if micro_batch_size > len(x):
        raise ValueError(
            _("micro_batch_size must be between 1 and {n} (the batch), got {value}").format(
                n=len(x), value=micro_batch_size
            )
        )
    x = _on_model(model, x)
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
    """Per BatchNorm layer: deviation of running_mean/running_var from the statistics of the data x itself.

    The reference is what BatchNorm computes from all of x as one batch (a train-mode forward, unbiased
    variance, as `running_var` keeps it): the statistics a perfect re-estimation on x would hold. Pass held-out
    data to see how well the running statistics describe data they were not computed from.
    """
    layers = _layers_with_running_stats(model)
    _check_samples("x", x, 2)
    x = _on_model(model, x)
    result = []
    for name, inputs in _bn_inputs(model, x).items():
        mean, var = _channel_stats(inputs, unbiased=True)
        layer = layers[name]
        result.append(
            LayerDeviation(
                name,
                ((layer.running_mean - mean).abs() / (var + layer.eps).sqrt()).mean().item(),
                ((layer.running_var - var).abs() / (var + layer.eps)).mean().item(),
            )
        )
    return result


def _running(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (layer.running_mean, layer.running_var) for name, layer in batchnorm_layers(model).items()}


def running_statistics(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A copy of every BatchNorm layer's (running_mean, running_var), by layer name: a snapshot to compare later."""
    return {name: (mean.clone(), var.clone()) for name, (mean, var) in _running(model).items() if mean is not None}


def _divergence(stats: dict, reference: dict, scale: dict) -> list[LayerDeviation]:
    """Per layer: |running statistics - reference| relative to the spread `scale` gives (running_var, eps)."""
    result = []
    for name, (mean, var) in stats.items():
        ref_mean, ref_var = reference[name]
        scale_var, eps = scale[name]
        result.append(
            LayerDeviation(
                name,
                ((mean - ref_mean).abs() / (scale_var + eps).sqrt()).mean().item(),
                ((var - ref_var).abs() / (scale_var + eps)).mean().item(),
            )
        )
    return result


def _scale(model: nn.Module) -> dict:
    return {name: (layer.running_var, layer.eps) for name, layer in batchnorm_layers(model).items()}


def running_stats_divergence(model: nn.Module, reference: nn.Module) -> list[LayerDeviation]:
    """Per BatchNorm layer: how far model's running statistics are from those of `reference` (same layout)."""
    if _layers_with_running_stats(model).keys() != _layers_with_running_stats(reference, "reference").keys():
        raise ValueError(
            _("model and reference must have BatchNorm layers of the same names: {model} against {reference}").format(
                model=sorted(batchnorm_layers(model)), reference=sorted(batchnorm_layers(reference))
            )
        )
    return _divergence(_running(model), _running(reference), _scale(reference))


def reestimate(model: nn.Module, x: torch.Tensor, batch_size: int | None = None) -> nn.Module:
    """Recompute the running statistics from x in batches of batch_size (default: all of x at once), in place.

    Uses torch.optim.swa_utils.update_bn (a plain average over the batches). Only the running statistics change:
    parameters are untouched. Returns the model.
    """
    _layers_with_running_stats(model)
    _check_samples("x", x, 2)
    batch_size = len(x) if batch_size is None else _validate.positive_int("batch_size", batch_size)
    if batch_size > len(x):
        raise ValueError(
            _("batch_size must be between 1 and {n} (the samples of x), got {value}").format(n=len(x), value=batch_size)
        )
    torch.optim.swa_utils.update_bn(
        DataLoader(TensorDataset(x), batch_size=batch_size), model, device=resolve_device(model, None)
    )  # each batch moved to the model's device
    return model


def to_groupnorm(model: nn.Module, groups: int = 4) -> nn.Module:
    """A copy of `model` with each BatchNorm layer replaced by GroupNorm(groups, channels), affine weights kept."""
    layers = batchnorm_layers(model)
    if not layers:
        raise ValueError(_("model has no BatchNorm layer to replace"))
    groups = _validate.positive_int("groups", groups)
    for name, layer in layers.items():
        if layer.num_features % groups:
            raise ValueError(
                _("groups={groups} must divide the {channels} channels of layer {name}").format(
                    groups=groups, channels=layer.num_features, name=name
                )
            )
    model = copy.deepcopy(model)
    for name, layer in list(batchnorm_layers(model).items()):
        like = next(iter(layer.parameters()), None)
        like = like if like is not None else layer.running_mean
        gn = nn.GroupNorm(
            groups,
            layer.num_features,
            eps=layer.eps,
            affine=layer.affine,
            **({} if like is None else dict(dtype=like.dtype, device=like.device)),
        )  # the layer's own
        if layer.affine:
            gn.load_state_dict({"weight": layer.weight.detach(), "bias": layer.bias.detach()})
        parent, _dot, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, gn)
    return model


@dataclass(frozen=True)
class Evaluation:
    """A model in eval mode on some data: what it predicts with its running statistics."""

    loss: float  # mean loss per sample (loss_fn)
    accuracy: float | None  # fraction of samples whose largest logit is the label; None unless (N, C) logits
    statistics_error: list[LayerDeviation]  # running statistics against the data's own (empty without BatchNorm)

    @property
    def statistics_error_total(self) -> float:
        """`total` of statistics_error (0.0 without BatchNorm)."""
        return total(self.statistics_error)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, loss_fn: Callable | None = None) -> Evaluation:
    """Evaluate `model` in eval mode on (x, y), ideally data it was not trained on; the model is left as it was.

    Returns the mean loss (loss_fn(model(x), y), default cross-entropy), the accuracy (for (N, C) logits and
    (N,) labels) and, for a model with BatchNorm, `running_stats_error` against the statistics of x itself.
    """
    _validate.module("model", model)
    _validate.samples("x", x, "y", y)
    loss_fn = _validate.function("loss_fn", loss_fn, optional=True) or nn.functional.cross_entropy
    x, y = _on_model(model, x), _on_model(model, y)
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            logits = model(x)
            loss = loss_fn(logits, y)
    finally:
        for m, training in modes.items():
            m.training = training
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError(_("loss_fn must return a scalar tensor (the mean loss over the samples)"))
    classified = logits.dim() == 2 and y.dim() == 1 and not y.is_floating_point()
    accuracy = (logits.argmax(1) == y).double().mean().item() if classified else None
    stats = running_stats_error(model, x) if batchnorm_layers(model) and len(x) > 1 else []
    return Evaluation(loss.item(), accuracy, stats)
