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

Remedies, and what each fixes (`compare_remedies` measures both on held-out data):
- GroupNorm normalises each sample over groups of its own channels, with no batch statistics: accumulation is
  exact again (the same weights as one batch, up to float rounding), and eval mode changes nothing.
- Re-estimating the running statistics after training (`reestimate`, PyTorch's `swa_utils.update_bn`) replaces
  them by averages over large batches of training data. It fixes only the statistics eval mode uses: the weights,
  trained with micro-batch statistics, stay exactly as they were.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from . import _validate
from .loop import parameter_gap, train
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
        raise ValueError(f"{name} has no BatchNorm layer (BatchNorm1d/2d/3d): there are no batch statistics to measure")
    for layer_name, layer in layers.items():
        if layer.running_mean is None:
            raise ValueError(f"{name}'s BatchNorm layer {layer_name!r} keeps no running statistics "
                             f"(track_running_stats=False): build it with track_running_stats=True")
    return layers


def _on_model(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """x moved to where the model's weights are (as `train` moves its micro-batches): one device for a measurement."""
    return x.to(resolve_device(model, None))


def _check_samples(name: str, x, at_least: int = 1) -> None:
    _validate.samples(name, x)
    if len(x) < at_least:
        raise ValueError(f"{name} must hold at least {at_least} samples, got {len(x)}")


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
        raise ValueError(f"micro_batch_size must be between 1 and {len(x)} (the batch), got {micro_batch_size}")
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
        raise ValueError("model and reference must have BatchNorm layers of the same names: "
                         f"{sorted(batchnorm_layers(model))} against {sorted(batchnorm_layers(reference))}")
    return _divergence(_running(model), _running(reference), _scale(reference))


@dataclass(frozen=True)
class RunningAverageMove:
    """How far one BatchNorm layer's running average moves in `updates` updates, measured on the layer."""

    layer: str
    momentum: float | None  # the layer's own momentum (None: a plain average of every batch so far)
    updates: int  # train-mode forward passes
    moved: float  # fraction of the way from where the average started to the statistic it was fed (0..1)

    @property
    def remaining(self) -> float:
        """Weight the starting value still has in the average (1 - moved)."""
        return 1 - self.moved


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
            raise ValueError(f"model's layer {name!r} is a {type(layer).__name__}; running_average_moved measures "
                             f"BatchNorm1d, BatchNorm2d and BatchNorm3d")
        probe = copy.deepcopy(layer).train()
        probe.reset_running_stats()
        ones = torch.ones(2, layer.num_features, *[1] * _SPATIAL_DIMS[kind], dtype=layer.running_mean.dtype,
                          device=layer.running_mean.device)
        with torch.no_grad():
            for _ in range(updates):
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
        raise ValueError(f"batch_size must be between 1 and {len(x)} (the samples of x), got {batch_size}")
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
        raise ValueError(f"batch_size must be between 1 and {len(x)} (the samples of x), got {batch_size}")
    torch.optim.swa_utils.update_bn(DataLoader(TensorDataset(x), batch_size=batch_size), model,
                                    device=resolve_device(model, None))  # each batch moved to the model's device
    return model


def to_groupnorm(model: nn.Module, groups: int = 4) -> nn.Module:
    """A copy of `model` with each BatchNorm layer replaced by GroupNorm(groups, channels), affine weights kept."""
    layers = batchnorm_layers(model)
    if not layers:
        raise ValueError("model has no BatchNorm layer to replace")
    groups = _validate.positive_int("groups", groups)
    for name, layer in layers.items():
        if layer.num_features % groups:
            raise ValueError(f"groups={groups} must divide the {layer.num_features} channels of layer {name}")
    model = copy.deepcopy(model)
    for name, layer in list(batchnorm_layers(model).items()):
        gn = nn.GroupNorm(groups, layer.num_features, eps=layer.eps, affine=layer.affine)
        if layer.affine:
            gn.load_state_dict({"weight": layer.weight.detach(), "bias": layer.bias.detach()})
        parent, _, child = name.rpartition(".")
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
    loss_fn = _validate.loss_function("loss_fn", loss_fn) or nn.functional.cross_entropy
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
        raise ValueError("loss_fn must return a scalar tensor (the mean loss over the samples)")
    classified = logits.dim() == 2 and y.dim() == 1 and not y.is_floating_point()
    accuracy = (logits.argmax(1) == y).double().mean().item() if classified else None
    stats = running_stats_error(model, x) if batchnorm_layers(model) and len(x) > 1 else []
    return Evaluation(loss.item(), accuracy, stats)


def _sgd(params) -> torch.optim.Optimizer:
    """SGD with lr=0.05, the default optimizer of the BatchNorm experiments."""
    return torch.optim.SGD(params, lr=0.05)


def _check_experiment(model, data, micro_batch_size, accum_steps, epochs, optimizer_fn):
    """Validate the arguments of the training experiments; return (X, y, m, k, epochs), X and y where the model is."""
    _layers_with_running_stats(model)
    X, y = _validate.pair("data", data)
    m = _validate.positive_int("micro_batch_size", micro_batch_size)
    k = _validate.positive_int("accum_steps", accum_steps)
    epochs = _validate.positive_int("epochs", epochs)
    if k < 2:
        raise ValueError(f"accum_steps must be at least 2 to compare accumulation with one batch, got {k}")
    if m * k > len(X):
        raise ValueError(f"micro_batch_size * accum_steps = {m * k} exceeds the {len(X)} samples of data")
    if not callable(optimizer_fn) or isinstance(optimizer_fn, torch.optim.Optimizer):
        raise TypeError(f"optimizer_fn must be a function from parameters to an optimizer, e.g. "
                        f"lambda params: torch.optim.SGD(params, lr=0.05), got {type(optimizer_fn).__name__}")
    device = resolve_device(model, None)
    return X.to(device), y.to(device), m, k, epochs


def _trained(model, X, y, m, k, epochs, optimizer_fn, snapshots: list | None = None) -> nn.Module:
    """A copy of model trained by `train` on (X, y) in order (no shuffling); snapshots gets the parameters each
    step used (the starting ones, then those after every step but the last)."""
    model = copy.deepcopy(model)
    optimizer = optimizer_fn(model.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer_fn must return a torch.optim.Optimizer, returned {type(optimizer).__name__}")

    def weights() -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in model.named_parameters()}

    if snapshots is not None:
        snapshots.append(weights())
    train(model, (X, y), optimizer, micro_batch_size=m, accum_steps=k, epochs=epochs, shuffle=False,
          measure_memory=False, device=X.device,
          on_step=None if snapshots is None else lambda record: snapshots.append(weights()))
    if snapshots is not None:
        snapshots.pop()  # the weights after the last step were used by no step
    return model


def _replay(model, snapshots, cycles: list[torch.Tensor], split: int, repeats: Callable[[int], int]) -> nn.Module:
    """A copy of model whose running statistics come from train-mode forward passes of each cycle's samples with
    that step's weights: the cycle in pieces of `split` samples, each fed repeats(len(cycle)) times."""
    model = copy.deepcopy(model).train()
    with torch.no_grad():
        for weights, cycle in zip(snapshots, cycles):
            for name, p in model.named_parameters():
                p.copy_(weights[name])
            for piece in cycle.split(split):
                for _ in range(repeats(len(cycle))):
                    model(piece)
    return model


@dataclass(frozen=True)
class DivergenceCauses:
    """Why the running statistics of an (m, k) run differ from those of an (m * k, 1) run, one cause at a time.

    Both runs train copies of one model on the same samples in the same order. Replaying the forward passes with
    each step's recorded weights, one thing is changed at a time, from the accumulated run to the one-batch run:
      noise: micro-batches of m -> the whole cycle's batch of m * k, fed k times (same weights, same updates);
      update_count: k updates per step -> one (same weights, same batch statistics);
      weights: the accumulated run's weights -> the one-batch run's (same batches, same updates).
    Each is a list of LayerDeviation relative to the one-batch run's running variance, like `total_divergence`.
    They are the links of a chain from one run to the other, not parts of a sum: for every layer and statistic
    the total is at most noise + update_count + weights (the triangle inequality), and the largest link is the
    main cause. replay_gap checks the replay: the largest |replayed - recorded| running statistic of the two real
    runs (0 up to float rounding).
    """

    micro_batch_size: int
    accum_steps: int
    updates_accumulated: int  # running-average updates per BatchNorm layer in the (m, k) run
    updates_one_batch: int  # in the (m * k, 1) run
    total_divergence: list[LayerDeviation]  # the (m, k) run against the (m * k, 1) run
    noise: list[LayerDeviation]
    update_count: list[LayerDeviation]
    weights: list[LayerDeviation]
    weight_gap: float  # max |parameter of the (m, k) run - that of the (m * k, 1) run|
    replay_gap: float


def divergence_causes(model: nn.Module, data, *, micro_batch_size: int, accum_steps: int, epochs: int = 1,
                      optimizer_fn: Callable = _sgd) -> DivergenceCauses:
    """Train copies of `model` (a BatchNorm model, left untouched) with (micro_batch_size, accum_steps) and with
    one batch of micro_batch_size * accum_steps on `data` = (X, y), in order, and separate the three causes of the
    difference between their running statistics (see DivergenceCauses). optimizer_fn(parameters) -> optimizer
    (default SGD, lr=0.05). Deterministic on the CPU; about a second of CPU time for 512 digits at (4, 8).
    """
    X, y, m, k, epochs = _check_experiment(model, data, micro_batch_size, accum_steps, epochs, optimizer_fn)

    def passes(n: int) -> int:  # micro-batches of m in a cycle of n samples
        return -(-n // m)

    with torch.random.fork_rng(devices=[]):
        accumulated_weights, one_batch_weights = [], []
        accumulated = _trained(model, X, y, m, k, epochs, optimizer_fn, accumulated_weights)
        one_batch = _trained(model, X, y, m * k, 1, epochs, optimizer_fn, one_batch_weights)
        cycles = list(X.split(m * k)) * epochs  # the samples of each step: train's order without shuffling
        replays = {
            "accumulated": _replay(model, accumulated_weights, cycles, m, lambda n: 1),
            "whole batch, k updates": _replay(model, accumulated_weights, cycles, m * k, passes),
            "whole batch, one update": _replay(model, accumulated_weights, cycles, m * k, lambda n: 1),
            "one batch": _replay(model, one_batch_weights, cycles, m * k, lambda n: 1),
        }
    stats = {name: _running(replayed) for name, replayed in replays.items()}
    scale = _scale(one_batch)
    replay_gap = max((a - b).abs().max().item()
                     for replayed, real in ((replays["accumulated"], accumulated), (replays["one batch"], one_batch))
                     for pair in zip(_running(replayed).values(), _running(real).values()) for a, b in zip(*pair))
    return DivergenceCauses(
        micro_batch_size=m, accum_steps=k,
        updates_accumulated=sum(passes(len(c)) for c in cycles), updates_one_batch=len(cycles),
        total_divergence=_divergence(_running(accumulated), _running(one_batch), scale),
        noise=_divergence(stats["accumulated"], stats["whole batch, k updates"], scale),
        update_count=_divergence(stats["whole batch, k updates"], stats["whole batch, one update"], scale),
        weights=_divergence(stats["whole batch, one update"], stats["one batch"], scale),
        weight_gap=_parameter_gap(accumulated, one_batch), replay_gap=replay_gap)


def _parameter_gap(model: nn.Module, reference: nn.Module) -> float:
    """Max |difference| over the parameters (not the buffers) of two models of the same layout."""
    return parameter_gap(dict(model.named_parameters()), dict(reference.named_parameters()))


@dataclass(frozen=True)
class Outcome:
    """One trained model of `compare_remedies`, evaluated in eval mode on the held-out data."""

    evaluation: Evaluation
    weight_gap: float  # max |parameter - that of the same normalisation trained with one batch of m * k|


@dataclass(frozen=True)
class Remedies:
    """BatchNorm and GroupNorm copies of one model, trained with (m, k) and with one batch of m * k, on held-out data.

    batchnorm_reestimated and batchnorm_one_batch_reestimated are the two BatchNorm runs after `reestimate` on the
    training data (all of it as one batch): reestimate_weight_change (max |parameter change| it caused) is 0.0, so
    their weight_gap is that of the runs they came from: re-estimation fixes the statistics eval mode uses, not the
    weights, and what still separates the two re-estimated runs is their weights. groupnorm_accumulated.weight_gap
    is float rounding: with GroupNorm accumulation is exact.
    """

    micro_batch_size: int
    accum_steps: int
    batchnorm_one_batch: Outcome
    batchnorm_accumulated: Outcome
    batchnorm_reestimated: Outcome
    batchnorm_one_batch_reestimated: Outcome
    groupnorm_one_batch: Outcome
    groupnorm_accumulated: Outcome
    reestimate_weight_change: float


def compare_remedies(model: nn.Module, data, held_out, *, micro_batch_size: int, accum_steps: int, epochs: int = 1,
                     groups: int = 4, optimizer_fn: Callable = _sgd) -> Remedies:
    """Train copies of `model` (a BatchNorm model, left untouched) and of its GroupNorm twin (`to_groupnorm`, same
    starting weights) on `data` = (X, y), in order, with (micro_batch_size, accum_steps) and with one batch of
    their product; re-estimate both BatchNorm copies on X; evaluate every copy in eval mode on
    `held_out` = (X, y) (data none of them was trained or re-estimated on). Deterministic on the CPU.
    """
    X, y, m, k, epochs = _check_experiment(model, data, micro_batch_size, accum_steps, epochs, optimizer_fn)
    held_x, held_y = (t.to(X.device) for t in _validate.pair("held_out", held_out))
    grouped = to_groupnorm(model, groups)
    with torch.random.fork_rng(devices=[]):
        runs = {(norm, split): _trained(net, X, y, *split, epochs, optimizer_fn)
                for norm, net in (("batch", model), ("group", grouped)) for split in ((m, k), (m * k, 1))}
    reestimated = {split: reestimate(copy.deepcopy(runs["batch", split]), X) for split in ((m, k), (m * k, 1))}

    def outcome(net: nn.Module, norm: str) -> Outcome:
        return Outcome(evaluate(net, held_x, held_y), _parameter_gap(net, runs[norm, (m * k, 1)]))

    return Remedies(m, k, outcome(runs["batch", (m * k, 1)], "batch"), outcome(runs["batch", (m, k)], "batch"),
                    outcome(reestimated[m, k], "batch"), outcome(reestimated[m * k, 1], "batch"),
                    outcome(runs["group", (m * k, 1)], "group"), outcome(runs["group", (m, k)], "group"),
                    max(_parameter_gap(reestimated[split], runs["batch", split]) for split in reestimated))
