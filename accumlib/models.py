"""Small models for the lessons: fast on 2 CPU cores, built reproducibly from a seed."""
from __future__ import annotations

import functools
import threading

import torch
from torch import nn

from .data import PAD


_GLOBAL_RNG = threading.Lock()  # layer initialisers draw from the global RNG: one seeded build at a time


def _seeded(build):
    """Give a model builder `seed=` (fixes the initial weights, global RNG untouched) and `dtype=` arguments.

    Thread-safe: dashboards build models in background threads while a stale run may still be building one.
    """
    @functools.wraps(build)
    def builder(*args, seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs) -> nn.Module:
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build(*args, **kwargs).to(dtype)
    return builder


@_seeded
def mlp(inputs: int = 64, hidden: int = 64, classes: int = 10) -> nn.Module:
    """A two-layer perceptron for flat digits: no BatchNorm, no dropout, so accumulation is exact."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@_seeded
def wide_mlp(inputs: int = 64, width: int = 2048, classes: int = 10) -> nn.Module:
    """A wide perceptron whose weights (and Adam's state) dwarf its activations: accumulation barely helps."""
    return nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, classes))


def _norm(kind: str | None, channels: int) -> nn.Module:
    if kind is None:
        return nn.Identity()
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(4, channels)
    raise ValueError(f"norm must be None, 'batch' or 'group', got {kind!r}")


@_seeded
def cnn(norm: str | None = None, channels: tuple[int, int] = (16, 32), classes: int = 10) -> nn.Module:
    """A small CNN for 1x8x8 digits; norm=None, "batch" (BatchNorm2d) or "group" (GroupNorm, 4 groups)."""
    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1), _norm(norm, c1), nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1), _norm(norm, c2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c2 * 16, classes))


@_seeded
def sequence_model(vocab: int = 16, dim: int = 16) -> nn.Module:
    """A tiny next-token model: embedding, a per-position MLP, logits of shape (batch, length, vocab)."""
    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, vocab))


def token_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropies over non-padding positions (use with normalize="count")."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD, reduction="sum")


def token_loss_mean(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over this batch's non-padding positions (what most scripts use)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD)
