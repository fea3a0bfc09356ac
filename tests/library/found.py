"""What a caller hands train and accumulate_and_step in the tests of several modules, as a caller leaves it.

The cycle's caller: a BatchNorm CNN (buffers that a forward pass changes) and an Adam optimizer with state from a
first run (`trained`), also with a non-zero .grad on every parameter (`setup`), so that "as found" is tested on
something that can change; `cycle(n)`, n micro-batches of 8 samples over it; `Built`, an argument made from the
test's model and optimizer just before the call. train's BatchNorm MLP (`bn_model`, on `DIGITS` with `OPTIONS`):
the model whose modes, skips and notes a run is checked on; `stop_at(step)`, an on_step that ends a run there.
A small linear model (`linear()`, a Linear(6, 3)) on `X6, Y6` and `SMALL`, 8 batches of 4 of them: the cycle's old
argument order and train's memory budget over a loader; `nan_gradient_on_label_99`, a loss_fn whose value is finite
and whose gradient is NaN for a planted label.
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


X64, Y64 = data.digits(flat=True, dtype=torch.float64)
X6 = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))  # a small linear model's data: 6 features
Y6 = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(1))  # and 3 classes


def linear():
    torch.manual_seed(0)
    return nn.Linear(6, 3)


SMALL = [(X6[i : i + 4], Y6[i : i + 4]) for i in range(0, 32, 4)]  # 8 batches of 4: 4 cycles of 2 at accum_steps=2


def nan_gradient_on_label_99(out, target):
    """cross-entropy, plus for a micro-batch holding the planted label 99 a term whose value is 0 and whose gradient
    is NaN: the square root of a zero length (its derivative at 0 is infinite, times 0 from the square: NaN)."""
    value = torch.nn.functional.cross_entropy(out, target.clamp(max=9))
    if (target == 99).any():
        value = value + torch.sqrt((out - out.detach()).pow(2).sum())
    return value


def nan_gradient_run(**options):
    X, y = X64[:24].clone(), Y64[:24].clone()
    y[13] = 99  # in the second cycle (micro-batch 4, accum_steps 3, in order)
    model = models.mlp(dtype=torch.float64)
    weights = []
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        micro_batch_size=4,
        accum_steps=3,
        shuffle=False,
        loss_fn=nan_gradient_on_label_99,
        on_step=lambda r: weights.append(model[0].weight.detach().clone()),
        **options,
    )
    return history, weights
