"""Lesson 7's experiment: BatchNorm trained at one effective batch split into micro-batches of each size, with the
running-statistic updates held equal, beside its GroupNorm twin, and what each remedy fixes (`compare_micro_batches`);
the measurements it stands on: how far a running average moves (`running_average_moved`), running statistics
collected anew with the weights fixed (`collect_running_stats`), the gradient's scale (`gradient_size`).

What BatchNorm is, its running statistics and the remedies themselves: `accumlib.batchnorm`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .. import _validate, parameter_gap, train
from ..batchnorm import (
    Evaluation,
    _check_samples,
    _layers_with_running_stats,
    _on_model,
    batchnorm_layers,
    evaluate,
    reestimate,
    to_groupnorm,
)
from ..i18n import _
from ..memory import resolve_device


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
            raise ValueError(
                _(
                    "model's layer {name!r} is a {type}; running_average_moved measures BatchNorm1d, "
                    "BatchNorm2d and BatchNorm3d"
                ).format(name=name, type=type(layer).__name__)
            )
        probe = copy.deepcopy(layer).train()
        probe.reset_running_stats()
        ones = torch.ones(
            2,
            layer.num_features,
            *[1] * _SPATIAL_DIMS[kind],
            dtype=layer.running_mean.dtype,
            device=layer.running_mean.device,
        )
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
        raise ValueError(
            _("batch_size must be between 1 and {n} (the samples of x), got {value}").format(n=len(x), value=batch_size)
        )
    model = copy.deepcopy(model).train()
    for layer in batchnorm_layers(model).values():
        layer.reset_running_stats()
    batches = torch.split(_on_model(model, x), batch_size)
    with torch.no_grad():
        for i in range(updates):
            model(batches[i % len(batches)])
    return model


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
        raise ValueError(
            _("effective_batch={value} exceeds the {n} samples of data").format(value=effective_batch, n=len(X))
        )
    _validate.optimizer_fn("optimizer_fn", optimizer_fn, lr=0.05)
    device = resolve_device(model, None)
    return X.to(device), y.to(device), epochs


def _trained(model, X, y, m, k, epochs, optimizer_fn) -> nn.Module:
    """A copy of model trained by `train` on (X, y) with (m, k), in order (no shuffling)."""
    model = copy.deepcopy(model)
    optimizer = _validate.made_optimizer("optimizer_fn", optimizer_fn(model.parameters()))
    train(
        model,
        (X, y),
        optimizer,
        micro_batch_size=m,
        accum_steps=k,
        epochs=epochs,
        shuffle=False,
        measure_memory=False,
        device=X.device,
    )
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


def compare_micro_batches(
    model: nn.Module,
    data,
    held_out,
    *,
    effective_batch: int,
    micro_batch_sizes: tuple[int, ...],
    epochs: int = 1,
    updates: int = 100,
    groups: int = 4,
    optimizer_fn: Callable = _sgd,
) -> MicroBatchComparison:
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
        raise TypeError(
            _("micro_batch_sizes must be a tuple of two or more sizes, got {value!r}").format(value=micro_batch_sizes)
        )
    sizes = sorted({_validate.positive_int("micro_batch_sizes", m) for m in micro_batch_sizes})
    if len(sizes) < 2 or any(effective_batch % m for m in sizes):
        raise ValueError(
            _(
                "micro_batch_sizes must hold two or more different sizes that divide "
                "effective_batch={effective_batch}, got {value!r}"
            ).format(effective_batch=effective_batch, value=micro_batch_sizes)
        )
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
        batchnorm.append(
            Outcome(
                m,
                effective_batch // m,
                epochs * -(-len(X) // m),
                _parameter_gap(runs[m], runs[largest]),
                evaluate(settled, held_x, held_y),
                evaluate(reestimated, held_x, held_y),
            )
        )
    groupnorm = [
        Outcome(
            m,
            effective_batch // m,
            0,
            _parameter_gap(twins[m], twins[largest]),
            evaluate(twins[m], held_x, held_y),
            None,
        )
        for m in sizes[-2:]
    ]
    moved = running_average_moved(model, updates)
    return MicroBatchComparison(
        effective_batch, epochs, epochs * passes, updates, min(m.moved for m in moved), batchnorm, groupnorm, change
    )
