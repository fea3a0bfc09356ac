"""What a caller hands train and accumulate_and_step in the tests of several modules, as a caller leaves it.

The cycle's caller: a BatchNorm CNN (buffers that a forward pass changes) and an Adam optimizer with state from a
first run (`trained`), also with a non-zero .grad on every parameter (`setup`), so that "as found" is tested on
something that can change; `cycle(n)`, n micro-batches of 8 samples over it; `Built`, an argument made from the
test's model and optimizer just before the call. train's BatchNorm MLP (`bn_model`, on `DIGITS` with `OPTIONS`):
the model whose modes, skips and notes a run is checked on; `stop_at(step)`, an on_step that ends a run there.
Comparing what a call left: states.py.
"""

import torch
from torch import nn

import accumlib
from builders import data, models

X, Y = data.digits(48)  # 48 samples, micro-batch 4 x accum_steps 2: 6 optimizer steps per epoch
ce = nn.functional.cross_entropy  # the loss the refusal cases break


def trained():
    """A BatchNorm CNN and an Adam optimizer that has state, after one short run."""
    model = models.cnn(norm="batch")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumlib.train(model, (X[:16], Y[:16]), optimizer, micro_batch_size=8, accum_steps=1)
    return model, optimizer


class Built:
    """An argument built from the test's model and optimizer, just before the call."""

    def __init__(self, build):
        self.build = build


def setup():
    """A BatchNorm CNN, Adam with state, and a .grad left by the caller on every parameter."""
    model = models.cnn(norm="batch")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumlib.train(model, (X[:16], Y[:16]), optimizer, micro_batch_size=8, accum_steps=1, device="cpu")
    for i, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, 0.5 + i)
    return model, optimizer


def cycle(n=4):
    return list(zip(X[: 8 * n].split(8), Y[: 8 * n].split(8), strict=True))


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Dropout(0.0), nn.ReLU(), nn.Linear(16, 10))


DIGITS = data.digits(40, flat=True)


OPTIONS = dict(micro_batch_size=4, accum_steps=2, seed=1)


def stop_at(step):
    """An on_step that ends the run with StopTraining once step `step` is recorded."""

    def on_step(record):
        if record.step == step:
            raise accumlib.StopTraining

    return on_step
