"""Seeded models for the library's tests, for builders.data's images (64 pixels, 10 classes) and tokens."""

import functools

import torch
from torch import nn

from .data import PAD


def _seeded(build):
    """`seed=` fixes the initial weights (the global RNG is left as it was) and `dtype=` casts them."""

    @functools.wraps(build)
    def builder(*args, seed: int = 0, dtype: torch.dtype = torch.float32, **kwargs) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return build(*args, **kwargs).to(dtype)

    return builder


@_seeded
def mlp(inputs: int = 64, hidden: int = 64, classes: int = 10) -> nn.Sequential:
    """Two linear layers: no BatchNorm or dropout, so accumulated and full-batch gradients agree exactly."""
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@_seeded
def wide_mlp(inputs: int = 64, width: int = 2048, classes: int = 10) -> nn.Sequential:
    """Weights (and Adam's state) far larger than the activations of a small batch."""
    return nn.Sequential(
        nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes)
    )


@_seeded
def cnn(norm: str | None = None, channels: tuple[int, int] = (16, 32), classes: int = 10) -> nn.Sequential:
    """Two 3x3 convolutions for 1x8x8 images; norm None, "batch" (BatchNorm2d) or "group" (GroupNorm, 4 groups)."""

    def normalise(c: int) -> nn.Module:
        if norm is None:
            return nn.Identity()
        return nn.BatchNorm2d(c) if norm == "batch" else nn.GroupNorm(4, c)

    c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1),
        normalise(c1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1),
        normalise(c2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 16, classes),
    )


@_seeded
def sequence_model(vocab: int = 16, dim: int = 16) -> nn.Sequential:
    """Next-token logits of shape (batch, length, vocab): an embedding and a per-position MLP."""
    return nn.Sequential(nn.Embedding(vocab, dim), nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, vocab))


def token_loss_sum(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy over the targets that are not PAD (normalize="count", reduction "sum")."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD, reduction="sum")


def token_loss_mean(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean of the same over one batch's tokens (what most scripts use)."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD)
