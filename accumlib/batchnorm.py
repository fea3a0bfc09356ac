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

Remedies, and what each fixes (`compare_micro_batches` measures them on held-out data, with the number of
running-statistic updates held equal):
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

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import _validate
from .gaps import parameter_gap
from .loop import train
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
    return {name: m for name, m in _validate.module("model", model).named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)}


def _layers_with_running_stats(model: nn.Module, name: str = "model") -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """The BatchNorm layers of model; raise ValueError naming `name` when there are none or one keeps no statistics."""
    layers = {layer_name: m for layer_name, m in _validate.module(name, model).named_modules()
              if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    if not layers:
        raise ValueError(_("{name} has no BatchNorm layer (BatchNorm1d/2d/3d): there are no batch statistics to "
                           "measure").format(name=name))
    for layer_name, layer in layers.items():
        if layer.running_mean is None:
            raise ValueError(_("{name}'s BatchNorm layer {layer!r} keeps no running statistics "
                               "(track_running_stats=False): build it with track_running_stats=True").format(
                name=name, layer=layer_name))
    return layers


def _on_model(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x moved to where the model's weights are (as `train` moves its micro-batches): one device for a measurement."""
    return x.to(resolve_device(model, None))


def _check_samples(name: str, x, at_least: int = 1) -> None:
    _validate.samples(name, x)
    if len(x) < at_least:
        raise ValueError(_("{name} must hold at least {at_least} samples, got {n}").format(name=name, at_least=at_least,
                                                                                           n=len(x)))


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
        raise ValueError(_("micro_batch_size must be between 1 and {n} (the batch), got {value}").format(
            n=len(x), value=micro_batch_size))
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
        result.append(LayerDeviation(
            name, ((layer.running_mean - mean).abs() / (var + layer.eps).sqrt()).mean().item(),
            ((layer.running_var - var).abs() / (var + layer.eps)).mean().item()))
    return result


def _running(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (layer.running_mean, layer.running_var) for name, layer in batchnorm_layers(model).items()}


def running_statistics(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A copy of every BatchNorm layer's (running_mean, running_var), by layer name: a snapshot to compare later."""
    return {name: (mean.clone(), var.clone()) for name, (mean, var) in _running(model).items()
            if mean is not None}


def _divergence(stats: dict, reference: dict, scale: dict) -> list[LayerDeviation]:
    """Per layer: |running statistics - reference| relative to the spread `scale` gives (running_var, eps)."""
    result = []
    for name, (mean, var) in stats.items():
        ref_mean, ref_var = reference[name]
        scale_var, eps = scale[name]
        result.append(LayerDeviation(name, ((mean - ref_mean).abs() / (scale_var + eps).sqrt()).mean().item(),
                                     ((var - ref_var).abs() / (scale_var + eps)).mean().item()))
    return result


def _scale(model: nn.Module) -> dict:
    return {name: (layer.running_var, layer.eps) for name, layer in batchnorm_layers(model).items()}


def running_stats_divergence(model: nn.Module, reference: nn.Module) -> list[LayerDeviation]:
    """Per BatchNorm layer: how far model's running statistics are from those of `reference` (same layout)."""
    if _layers_with_running_stats(model).keys() != _layers_with_running_stats(reference, "reference").keys():
        raise ValueError(_("model and reference must have BatchNorm layers of the same names: {model} against "
                           "{reference}").format(model=sorted(batchnorm_layers(model)),
                                                 reference=sorted(batchnorm_layers(reference))))
    return _divergence(_running(model), _running(reference), _scale(reference))


@dataclass(frozen=True)
class RunningAverageMove:
    """How far one BatchNorm layer's running average moves in `updates` updates, measured on the layer."""

    layer: str
    momentum: float | None  # the layer's own momentum (None: a plain average of every batch so far)
    updates: int  # train-mode forward passes
    moved: float  # fraction of the way from where the average started to the statistic it was fed (0..1)


_SPATIAL_DIMS = {nn.BatchNorm1d: 0, nn.BatchNorm2d: 2, nn.BatchNorm3d: 3}


def running_average_moved(model: nn.Module, updates: int) -> list[RunningAverageMove]:
    """Per BatchNorm layer: the fraction of the way its running mean moves in `updates` train-mode updates.

    Measured on a copy of each layer, with its own momentum: its running statistics reset (mean 0), then fed
    `updates` batches whose every channel has mean 1; the running mean it ends with is the fraction moved. After
    a training run with n forward passes, `moved` says how much of the running statistics comes from that run
    and `remaining` how much is still the starting value. The model is untouched.
    """
    layers = _layers_with_running_stats(model)
    updates = _validate.positive_int("updates", updates)
    result = []
    for name, layer in layers.items():
        kind = next((k for k in _SPATIAL_DIMS if type(layer) is k), None)
        if kind is None:
            raise ValueError(_("model's layer {name!r} is a {type}; running_average_moved measures BatchNorm1d, "
                               "BatchNorm2d and BatchNorm3d").format(name=name, type=type(layer).__name__))
        probe = copy.deepcopy(layer).train()
        probe.reset_running_stats()
        ones = torch.ones(2, layer.num_features, *[1] * _SPATIAL_DIMS[kind], dtype=layer.running_mean.dtype,
                          device=layer.running_mean.device)
        with torch.no_grad():
            for _update in range(updates):
                probe(ones)
        result.append(RunningAverageMove(name, layer.momentum, updates, probe.running_mean.mean().item()))
    return result


def collect_running_stats(model: nn.Module, x: torch.Tensor, batch_size: int, updates: int = 200) -> nn.Module:
    """A copy of `model` whose running statistics come from `updates` train-mode passes of batch_size samples.

    Weights stay fixed, so what remains of the error against the exact statistics is the micro-batch noise
    that BatchNorm's running average keeps (about 1/sqrt(batch_size)).
    """
    _layers_with_running_stats(model)
    _check_samples("x", x)
    batch_size, updates = _validate.positive_int("batch_size", batch_size), _validate.positive_int("updates", updates)
    if batch_size > len(x):
        raise ValueError(_("batch_size must be between 1 and {n} (the samples of x), got {value}").format(
            n=len(x), value=batch_size))
    model = copy.deepcopy(model).train()
    for layer in batchnorm_layers(model).values():
        layer.reset_running_stats()
    batches = torch.split(_on_model(model, x), batch_size)
    with torch.no_grad():
        for i in range(updates):
            model(batches[i % len(batches)])
    return model


def reestimate(model: nn.Module, x: torch.Tensor, batch_size: int | None = None) -> nn.Module:
    """Recompute the running statistics from x in batches of batch_size (default: all of x at once), in place.

    Uses torch.optim.swa_utils.update_bn (a plain average over the batches). Only the running statistics change:
    parameters are untouched. Returns the model.
    """
    _layers_with_running_stats(model)
    _check_samples("x", x, 2)
    batch_size = len(x) if batch_size is None else _validate.positive_int("batch_size", batch_size)
    if batch_size > len(x):
        raise ValueError(_("batch_size must be between 1 and {n} (the samples of x), got {value}").format(
            n=len(x), value=batch_size))
    torch.optim.swa_utils.update_bn(DataLoader(TensorDataset(x), batch_size=batch_size), model,
                                    device=resolve_device(model, None))  # each batch moved to the model's device
    return model


def to_groupnorm(model: nn.Module, groups: int = 4) -> nn.Module:
    """A copy of `model` with each BatchNorm layer replaced by GroupNorm(groups, channels), affine weights kept."""
    layers = batchnorm_layers(model)
    if not layers:
        raise ValueError(_("model has no BatchNorm layer to replace"))
    groups = _validate.positive_int("groups", groups)
    for name, layer in layers.items():
        if layer.num_features % groups:
            raise ValueError(_("groups={groups} must divide the {channels} channels of layer {name}").format(
                groups=groups, channels=layer.num_features, name=name))
    model = copy.deepcopy(model)
    for name, layer in list(batchnorm_layers(model).items()):
        like = next(iter(layer.parameters()), None)
        like = like if like is not None else layer.running_mean
        gn = nn.GroupNorm(groups, layer.num_features, eps=layer.eps, affine=layer.affine,
                          **({} if like is None else dict(dtype=like.dtype, device=like.device)))  # the layer's own
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


def gradient_size(model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> float:
    """The largest |entry| of the gradient of loss_fn(model(x), y) (one batch, train mode): the scale against which
    `accumlib.gradient_gap` is read. The model's parameters, buffers and `.grad` are left as they were."""
    _validate.module("model", model)
    _validate.samples("x", x, "y", y)
    loss_fn = _validate.function("loss_fn", loss_fn, optional=True) or nn.functional.cross_entropy
    model = copy.deepcopy(model).train()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss_fn(model(x), y), params, allow_unused=True, materialize_grads=True)
    return max(g.abs().max().item() for g in grads)


def _sgd(params) -> torch.optim.Optimizer:
    """SGD with lr=0.05, the default optimizer of the BatchNorm experiments."""
    return torch.optim.SGD(params, lr=0.05)


def _check_experiment(model, data, effective_batch, epochs, optimizer_fn):
    """Validate the arguments of the training experiment; return (X, y, epochs), X and y where the model is."""
    _layers_with_running_stats(model)
    X, y = _validate.pair("data", data)
    epochs = _validate.positive_int("epochs", epochs)
    if effective_batch > len(X):
        raise ValueError(_("effective_batch={value} exceeds the {n} samples of data").format(value=effective_batch,
                                                                                            n=len(X)))
    if not callable(optimizer_fn) or isinstance(optimizer_fn, torch.optim.Optimizer):
        raise TypeError(_("optimizer_fn must be a function from parameters to an optimizer, e.g. lambda params: "
                          "torch.optim.SGD(params, lr={lr}), got {type}").format(lr=0.05,
                                                                                type=type(optimizer_fn).__name__))
    device = resolve_device(model, None)
    return X.to(device), y.to(device), epochs


def _trained(model, X, y, m, k, epochs, optimizer_fn) -> nn.Module:
    """A copy of model trained by `train` on (X, y) with (m, k), in order (no shuffling)."""
    model = copy.deepcopy(model)
    optimizer = optimizer_fn(model.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(_("optimizer_fn must return a torch.optim.Optimizer, returned {type}").format(
            type=type(optimizer).__name__))
    train(model, (X, y), optimizer, micro_batch_size=m, accum_steps=k, epochs=epochs, shuffle=False,
          measure_memory=False, device=X.device)
    return model


def _parameter_gap(model: nn.Module, reference: nn.Module) -> float:
    """Max |difference| over the parameters (not the buffers) of two models of the same layout."""
    return parameter_gap(dict(model.named_parameters()), dict(reference.named_parameters()))


@dataclass(frozen=True)
class Outcome:
    """One model of `compare_micro_batches`, trained with (micro_batch_size, accum_steps) on the same samples."""

    micro_batch_size: int
    accum_steps: int
    training_updates: int  # running-statistic updates per BatchNorm layer that training made: one per micro-batch
    weight_gap: float  # max |parameter - that of the same normalisation trained with the largest micro-batch|
    settled: Evaluation  # on held-out data, running statistics from `updates` micro-batches of its own size
    reestimated: Evaluation | None  # on held-out data, after `reestimate` on all the training data (None: GroupNorm)


@dataclass(frozen=True)
class MicroBatchComparison:
    """BatchNorm trained at one effective batch split into micro-batches of each size; GroupNorm beside it.

    Every run trains a copy of the same model on the same samples in the same order, for the same number of
    optimizer steps. Training leaves each BatchNorm model with a different number of running-statistic updates
    (one per micro-batch: `Outcome.training_updates`), so its running statistics are collected anew before
    evaluation: `updates` train-mode passes of micro-batches of the model's own size, its weights fixed
    (`collect_running_stats`). The same number of updates for every model, enough for the averages to settle
    (`settled_fraction` of the way at the layers' momentum): what remains is the noise of the micro-batch.
    `reestimated` then replaces them with statistics of all the training data; the weights do not change
    (`reestimate_weight_change` is 0.0), so what still separates those rows is the weights, trained with the
    micro-batch's statistics. GroupNorm keeps no statistics: its rows differ by float rounding only.
    """

    effective_batch: int
    epochs: int
    optimizer_steps: int  # per run
    updates: int  # running-statistic updates of every settled evaluation
    settled_fraction: float  # how far a running average moves in `updates` updates (running_average_moved)
    batchnorm: list[Outcome]  # by micro-batch size, smallest first
    groupnorm: list[Outcome]  # the two largest micro-batch sizes
    reestimate_weight_change: float


def compare_micro_batches(model: nn.Module, data, held_out, *, effective_batch: int,
                          micro_batch_sizes: tuple[int, ...], epochs: int = 1, updates: int = 100, groups: int = 4,
                          optimizer_fn: Callable = _sgd) -> MicroBatchComparison:
    """Train copies of `model` (a BatchNorm model, left untouched) on `data` = (X, y), in order, with the effective
    batch split into micro-batches of each size in micro_batch_sizes (each must divide effective_batch; two or
    more); collect each copy's running statistics from `updates` micro-batches of its own size, then re-estimate
    them on X; train its GroupNorm twin (`to_groupnorm`, the same starting weights) at the two largest sizes;
    evaluate every model in eval mode on `held_out` = (X, y), data none of them saw (see MicroBatchComparison).
    Deterministic on the CPU; in float64 the printed digits hold on every CPU.
    """
    _layers_with_running_stats(model)
    effective_batch = _validate.positive_int("effective_batch", effective_batch)
    if not isinstance(micro_batch_sizes, (tuple, list)) or len(micro_batch_sizes) < 2:
        raise TypeError(_("micro_batch_sizes must be a tuple of two or more sizes, got {value!r}").format(
            value=micro_batch_sizes))
    sizes = sorted({_validate.positive_int("micro_batch_sizes", m) for m in micro_batch_sizes})
    if len(sizes) < 2 or any(effective_batch % m for m in sizes):
        raise ValueError(_("micro_batch_sizes must hold two or more different sizes that divide "
                           "effective_batch={effective_batch}, got {value!r}").format(effective_batch=effective_batch,
                                                                                     value=micro_batch_sizes))
    X, y, epochs = _check_experiment(model, data, effective_batch, epochs, optimizer_fn)
    held_x, held_y = (t.to(X.device) for t in _validate.pair("held_out", held_out))
    updates = _validate.positive_int("updates", updates)
    grouped = to_groupnorm(model, groups)
    runs, twins = {}, {}
    with torch.random.fork_rng(devices=[]):
        for m in sizes:
            runs[m] = _trained(model, X, y, m, effective_batch // m, epochs, optimizer_fn)
        for m in sizes[-2:]:
            twins[m] = _trained(grouped, X, y, m, effective_batch // m, epochs, optimizer_fn)
    largest = sizes[-1]
    passes = -(-len(X) // effective_batch)  # optimizer steps per epoch; the last cycle may be short
    change = 0.0
    batchnorm = []
    for m in sizes:
        settled = collect_running_stats(runs[m], X, m, updates)
        reestimated = reestimate(copy.deepcopy(runs[m]), X)
        change = max(change, _parameter_gap(reestimated, runs[m]))
        batchnorm.append(Outcome(m, effective_batch // m, epochs * -(-len(X) // m),
                                 _parameter_gap(runs[m], runs[largest]), evaluate(settled, held_x, held_y),
                                 evaluate(reestimated, held_x, held_y)))
    groupnorm = [Outcome(m, effective_batch // m, 0, _parameter_gap(twins[m], twins[largest]),
                         evaluate(twins[m], held_x, held_y), None) for m in sizes[-2:]]
    moved = running_average_moved(model, updates)
    return MicroBatchComparison(effective_batch, epochs, epochs * passes, updates, min(m.moved for m in moved),
                                batchnorm, groupnorm, change)
