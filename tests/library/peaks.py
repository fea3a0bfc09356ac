"""Models whose peak memory the tests of several modules compare with what train records (issue 19's one recipe:
measure_step, fit_batch, train(memory_budget=...) and timing run train's own cycle, so the planned peak is the
trained peak, byte for byte on the CPU): `Masked`, with a large buffer its forward reads but never changes, and
`batchnorm()`, with BatchNorm's running statistics; `trained_peaks`, each step's recorded peak of a run on `X, Y`.

Bytes are exact integers on the CPU (live tensor storages), so every comparison with them is ==.
"""

import torch
from torch import nn

import accumlib
from builders import data

X, Y = data.digits(96, flat=True)


class Masked(nn.Module):
    """A small model with one large buffer its forward reads but never changes (a causal mask, say)."""

    def __init__(self, size=256):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(64, 10)
        self.register_buffer("mask", torch.ones(size, size))

    def forward(self, x):
        return self.linear(x) * self.mask[0, :10]


def batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def trained_peaks(model, optimizer, m, k, epochs=1):
    history = accumlib.train(
        model,
        (X[: m * k * 2], Y[: m * k * 2]),
        optimizer,
        micro_batch_size=m,
        accum_steps=k,
        epochs=epochs,
        measure_memory=True,
        device="cpu",
    )
    return [r.peak_memory_bytes for r in history]
