"""Bad input to the measurements, each case with its error type and the parameter its message must name, and the
caller's models and optimizer, which every refusal must leave untouched: weights, buffers, gradients, modes, Adam's
state and torch's random state (`snapshot`). `check(case)` runs one. Each module's cases are run by its tests:
`MEMORY` (fit_batch, measure_step, batch_of) by test_memory.py, `TIMING` (time_config, decompose_time) by
test_timing.py, `BATCHNORM` by test_batchnorm.py (the lessons' model builders: tests/lessons/test_models.py)."""

import pytest
import torch
from states import same
from torch import nn

import accumlib
from accumlib import batchnorm, memory, timing
from builders import data, models

X, Y = data.digits(64)
EXAMPLE = (X[:1], Y[:1])
NET = models.cnn()
BN_NET = models.cnn(norm="batch")
ADAM = torch.optim.Adam(NET.parameters())
NET(X[:4]).sum().backward()  # the user's model has gradients and the optimizer has state: both must survive
ADAM.step()
FROZEN = models.cnn().requires_grad_(False)
NO_STATS = nn.Sequential(
    nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, track_running_stats=False), nn.Flatten(), nn.Linear(144, 10)
)
with torch.device("meta"):
    META = models.cnn()


def fit(**kwargs):
    arguments = {"model": NET, "example_batch": EXAMPLE, "target_batch": 64, "memory_budget": 2**20, **kwargs}
    return memory.fit_batch(
        arguments.pop("model"),
        arguments.pop("example_batch"),
        arguments.pop("target_batch"),
        arguments.pop("memory_budget"),
        **arguments,
    )


def step(**kwargs):
    arguments = {"model": NET, "x": X[:4], "y": Y[:4], **kwargs}
    return memory.measure_step(arguments.pop("model"), arguments.pop("x"), arguments.pop("y"), **arguments)


def timed(**kwargs):
    arguments = {"model": NET, "data": (X, Y), "micro_batch_size": 4, "accum_steps": 2, **kwargs}
    return accumlib.time_config(arguments.pop("model"), arguments.pop("data"), **arguments)


def decomposed(**kwargs):
    arguments = {"model": NET, "data": (X, Y), "repeats": 1, **kwargs}
    return timing.decompose_time(arguments.pop("model"), arguments.pop("data"), **arguments)


MEMORY = {  # id: (call, error type, the parameter its message must name)
    "fit: empty example": (lambda: fit(example_batch=(X[:0], Y[:0])), ValueError, "example_batch"),
    "fit: dict example": (lambda: fit(example_batch={"input_ids": X[:1], "labels": Y[:1]}), TypeError, "example_batch"),
    "fit: one tensor as example": (lambda: fit(example_batch=X[:1]), TypeError, "example_batch"),
    "fit: numpy example": (lambda: fit(example_batch=(X[:1].numpy(), Y[:1].numpy())), TypeError, "example_batch"),
    "fit: x and y of different lengths": (lambda: fit(example_batch=(X[:2], Y[:1])), ValueError, "example_batch"),
    "fit: budget 0": (lambda: fit(memory_budget=0), ValueError, "memory_budget"),
    "fit: negative budget": (lambda: fit(memory_budget=-5), ValueError, "memory_budget"),
    "fit: float budget": (lambda: fit(memory_budget=2.5e5), TypeError, "memory_budget"),
    "fit: bool budget": (lambda: fit(memory_budget=True), TypeError, "memory_budget"),
    "fit: budget as text": (lambda: fit(memory_budget="1MB"), TypeError, "memory_budget"),
    "fit: budget None": (lambda: fit(memory_budget=None), TypeError, "memory_budget"),
    "fit: target 0": (lambda: fit(target_batch=0), ValueError, "target_batch"),
    "fit: float target": (lambda: fit(target_batch=3.0), TypeError, "target_batch"),
    "fit: bool target": (lambda: fit(target_batch=True), TypeError, "target_batch"),
    "fit: absurd target": (lambda: fit(target_batch=10**12), ValueError, "target_batch"),
    "fit: model None": (lambda: fit(model=None), TypeError, "model"),
    "fit: model builder not called": (lambda: fit(model=models.cnn), TypeError, "model"),
    "fit: model class": (lambda: fit(model=nn.Linear), TypeError, "model"),
    "fit: every parameter frozen": (lambda: fit(model=FROZEN), ValueError, "model"),
    "fit: optimizer class": (lambda: fit(optimizer=torch.optim.Adam), TypeError, "optimizer"),
    "fit: optimizer name": (lambda: fit(optimizer="adam"), TypeError, "optimizer"),
    "fit: LBFGS needs a closure": (lambda: fit(optimizer=torch.optim.LBFGS(NET.parameters())), ValueError, "optimizer"),
    "fit: loss class": (lambda: fit(loss_fn=nn.CrossEntropyLoss), TypeError, "loss_fn"),
    "fit: loss returns a float": (lambda: fit(loss_fn=lambda out, y: 1.0), ValueError, "loss_fn"),
    "fit: loss not reduced": (lambda: fit(loss_fn=nn.CrossEntropyLoss(reduction="none")), ValueError, "loss_fn"),
    "step: model without parameters": (lambda: step(model=nn.ReLU()), ValueError, "model"),
    "step: x a list": (lambda: step(x=X[:4].tolist()), TypeError, "x"),
    "step: x a dict": (lambda: step(x={"input_ids": X[:4]}), TypeError, "x"),
    "step: x a scalar": (lambda: step(x=torch.tensor(1.0)), ValueError, "x"),
    "step: y shorter than x": (lambda: step(y=Y[:3]), ValueError, "y"),
    "step: x of the wrong dtype": (lambda: step(x=X[:4].long()), ValueError, "x"),
    "step: x of the wrong shape": (lambda: step(x=X[:4].flatten(1)), ValueError, "x"),
    "step: y of the wrong dtype": (lambda: step(y=Y[:4].float()), ValueError, "y"),
    "step: accum_steps 0": (lambda: step(accum_steps=0), ValueError, "accum_steps"),
    "step: float accum_steps": (lambda: step(accum_steps=2.0), TypeError, "accum_steps"),
    "step: fake as text": (lambda: step(fake="no"), TypeError, "fake"),
    "step: fake as 0": (lambda: step(fake=0), TypeError, "fake"),
    "step: device meta": (lambda: step(device="meta"), ValueError, "device"),
    "step: unknown device": (lambda: step(device="gpu"), ValueError, "device"),
    "step: device a number": (lambda: step(device=3), TypeError, "device"),
    "step: meta model, real measurement": (lambda: step(model=META), ValueError, "model"),
    "batch_of: size 0": (lambda: memory.batch_of(EXAMPLE, 0), ValueError, "size"),
    "batch_of: empty example": (lambda: memory.batch_of((X[:0], Y[:0]), 4), ValueError, "example_batch"),
}
if not torch.cuda.is_available():
    MEMORY["step: cuda where there is none"] = (lambda: step(device="cuda"), ValueError, "device")
TIMING = {
    "time: dict data": (lambda: timed(data={"x": X, "y": Y}), TypeError, "data"),
    "time: x and y of different lengths": (lambda: timed(data=(X, Y[:10])), ValueError, "data"),
    "time: repeats 0": (lambda: timed(repeats=0), ValueError, "repeats"),
    "time: negative warmup": (lambda: timed(warmup=-1), ValueError, "warmup"),
    "time: float warmup": (lambda: timed(warmup=1.5), TypeError, "warmup"),
    "time: an optimizer instead of a function": (lambda: timed(optimizer_fn=ADAM), TypeError, "optimizer_fn"),
    "time: optimizer_fn returns None": (lambda: timed(optimizer_fn=lambda params: None), TypeError, "optimizer_fn"),
    "time: float micro_batch_size": (lambda: timed(micro_batch_size=4.0), TypeError, "micro_batch_size"),
    "time: accum_steps 0": (lambda: timed(accum_steps=0), ValueError, "accum_steps"),
    "time: device meta": (lambda: timed(device="meta"), ValueError, "device"),
    "time: meta model": (lambda: timed(model=META), ValueError, "model"),
    "time: model None": (lambda: timed(model=None), TypeError, "model"),
    "time: model without parameters": (lambda: timed(model=nn.Flatten()), ValueError, "model"),
    "time: loss class": (lambda: timed(loss_fn=nn.CrossEntropyLoss), TypeError, "loss_fn"),
    "decompose: one split": (lambda: decomposed(accum_steps=(1,)), ValueError, "accum_steps"),
    "decompose: a number of splits": (lambda: decomposed(accum_steps=4), TypeError, "accum_steps"),
    "decompose: split not dividing": (lambda: decomposed(accum_steps=(1, 3)), ValueError, "accum_steps"),
    "decompose: split twice": (lambda: decomposed(accum_steps=(1, 1, 2)), ValueError, "accum_steps"),
    "decompose: data too small": (lambda: decomposed(effective_batch=128), ValueError, "effective_batch"),
    "decompose: threads 0": (lambda: decomposed(threads=0), ValueError, "threads"),
    "decompose: loss not reduced": (
        lambda: decomposed(loss_fn=nn.CrossEntropyLoss(reduction="none")),
        ValueError,
        "loss_fn",
    ),
    "decompose: x of the wrong shape": (lambda: decomposed(data=(X.flatten(1), Y)), ValueError, "x"),
    "decompose: meta model": (lambda: decomposed(model=META), ValueError, "model"),
}
BATCHNORM = {
    "deviation: no BatchNorm": (lambda: batchnorm.micro_batch_deviation(NET, X, 4), ValueError, "model"),
    "deviation: x a list": (lambda: batchnorm.micro_batch_deviation(BN_NET, X.tolist(), 4), TypeError, "x"),
    "deviation: micro-batch larger than x": (
        lambda: batchnorm.micro_batch_deviation(BN_NET, X, 65),
        ValueError,
        "micro_batch_size",
    ),
    "reestimate: no BatchNorm": (lambda: batchnorm.reestimate(NET, X), ValueError, "model"),
    "reestimate: batch_size 0": (lambda: batchnorm.reestimate(BN_NET, X, 0), ValueError, "batch_size"),
    "reestimate: batch larger than x": (lambda: batchnorm.reestimate(BN_NET, X, 100), ValueError, "batch_size"),
    "error: one sample": (lambda: batchnorm.running_stats_error(BN_NET, X[:1]), ValueError, "x"),
    "error: no running statistics": (lambda: batchnorm.running_stats_error(NO_STATS, X), ValueError, "model"),
    "divergence: reference without BatchNorm": (
        lambda: batchnorm.running_stats_divergence(BN_NET, NET),
        ValueError,
        "reference",
    ),
    "evaluate: y shorter than x": (lambda: batchnorm.evaluate(BN_NET, X, Y[:3]), ValueError, "y"),
    "evaluate: loss class": (
        lambda: batchnorm.evaluate(BN_NET, X, Y, loss_fn=nn.CrossEntropyLoss),
        TypeError,
        "loss_fn",
    ),
    "groupnorm: no BatchNorm": (lambda: batchnorm.to_groupnorm(NET), ValueError, "model"),
    "groupnorm: groups 0": (lambda: batchnorm.to_groupnorm(BN_NET, groups=0), ValueError, "groups"),
}


def snapshot():
    """Everything of the user's that a measurement could change: weights, buffers, gradients, modes, optimizer."""
    models_state = [(name, t.clone()) for net in (NET, BN_NET) for name, t in net.state_dict().items()]
    grads = [None if p.grad is None else p.grad.clone() for net in (NET, BN_NET) for p in net.parameters()]
    modes = [m.training for net in (NET, BN_NET) for m in net.modules()]
    optimizer = [(k, v.clone()) for state in ADAM.state.values() for k, v in state.items()]
    return models_state, grads, modes, optimizer, torch.random.get_rng_state()


def check(case) -> None:
    """One case's call raises its error type, with a message naming its parameter, and changes nothing `snapshot`
    sees."""
    call, error, parameter = case
    before = snapshot()
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
    assert same(before, snapshot())
