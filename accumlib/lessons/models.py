"""Small models for the lessons: fast on 2 CPU cores, built reproducibly from a seed."""

from __future__ import annotations

import functools
import threading

import torch
from torch import nn

from .. import _validate
from ..i18n import _
from .data import PAD


_GLOBAL_RNG = threading.Lock()  # layer initialisers draw from the global RNG: one seeded build at a time


def _seeded(build):
    """Give a model builder `seed=` (fixes the initial weights, global RNG untouched) and `dtype=` arguments.

    Thread-safe: dashboards build models in background threads while a stale run may still be building one.
    """

    @functools.wraps(build)
    def builder(*args, seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs) -> nn.Module:
        _validate.non_negative_int("seed", seed)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(
                _("dtype must be a floating-point torch.dtype such as torch.float32, got {dtype!r}").format(dtype=dtype)
            )
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build(*args, **kwargs).to(dtype)

    return builder


@_seeded
def mlp(inputs: int = 64, hidden: int = 64, classes: int = 10) -> nn.Module:
    """A two-layer perceptron for flat digits: no BatchNorm, no dropout, so accumulation is exact."""
    _sizes(inputs=inputs, hidden=hidden, classes=classes)
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@_seeded
def wide_mlp(inputs: int = 64, width: int = 2048, classes: int = 10) -> nn.Module:
    """A wide perceptron whose weights (and Adam's state) dwarf its activations: accumulation barely helps."""
    _sizes(inputs=inputs, width=width, classes=classes)
    return nn.Sequential(
        nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes)
    )


def _sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        _validate.positive_int(name, value)


def _norm(kind: str | None, channels: int) -> nn.Module:
    """The normalisation layer of `cnn` (kind already checked)."""
    return {None: nn.Identity, "batch": lambda: nn.BatchNorm2d(channels), "group": lambda: nn.GroupNorm(4, channels)}[
        kind
    ]()


@_seeded
def cnn(norm: str | None = None, channels: tuple[int, int] = (16, 32), classes: int = 10) -> nn.Module:
    """A small CNN for 1x8x8 digits; norm=None, "batch" (BatchNorm2d) or "group" (GroupNorm, 4 groups).

    channels: the output channels of its two convolutions (GroupNorm needs multiples of 4); a larger pair makes
    each sample cost more arithmetic (cnn(channels=(64, 128)): about 15 times the multiply-adds of the default per
    sample).
    """
    _validate.one_of("norm", norm, (None, "batch", "group"))
    if not isinstance(channels, (tuple, list)) or len(channels) != 2:
        raise TypeError(
            _("channels must be a pair of positive integers such as (16, 32), got {channels!r}").format(
                channels=channels
            )
        )
    c1, c2 = (_validate.positive_int("channels", c) for c in channels)
    _validate.positive_int("classes", classes)
    if norm == "group" and (c1 % 4 or c2 % 4):
        raise ValueError(
            _("channels must be multiples of 4 with norm='group' (GroupNorm with 4 groups), got {channels!r}").format(
                channels=channels
            )
        )
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1),
        _norm(norm, c1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1),
        _norm(norm, c2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 16, classes),
    )


@_seeded
def sequence_model(vocab: int = 16, dim: int = 16) -> nn.Module:
    """A tiny next-token model: embedding, a per-position MLP, logits of shape (batch, length, vocab)."""
    _sizes(vocab=vocab, dim=dim)
    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, vocab))


def token_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropies over non-padding positions (train with normalize="count",
    loss_reduction="sum")."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD, reduction="sum")


def token_loss_mean(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over this batch's non-padding positions (what most scripts use)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD)
