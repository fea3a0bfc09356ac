"""Issue 23's cases on accumulate_and_step and the memory tools, each asserting the outcome the issue asks for.

Case 2 (every optimizer torch ships, AdamW included, in measure_step, fit_batch and train(memory_budget=)):
    test_every_optimizer_in_torch_optim_is_measured_as_it_trains, test_closure_optimizers_are_refused_by_name
Case 4 (accumulate_and_step as strict as train, named before anything changes):
    test_an_optimizer_without_the_models_parameters_is_refused,
    test_negative_or_non_finite_weights_are_refused_in_every_numeric_form,
    test_tensor_weights_are_read_once_not_per_micro_batch,
    test_an_empty_micro_batch_is_refused_by_name, test_a_micro_batch_on_another_device_is_refused_by_name
Case 5 (.grad, weights, buffers and optimizer as found after an error or a skip; the message says so):
    test_an_error_mid_cycle_leaves_everything_as_found (loss_fn raising at micro-batch 3, a KeyboardInterrupt
    there, a real SIGINT there, a micro-batch of the wrong dtype),
    test_a_skipped_or_raised_non_finite_cycle_leaves_no_half_cycle_and_no_nan,
    test_after_a_step_the_gradients_are_freed
Case 7 (a forward that branches on a value: said, naming the model's line, and measured with a real step):
    test_an_untraceable_forward_is_measured_with_a_real_step_and_its_line_named,
    test_an_untraceable_forward_on_the_meta_device_is_refused_naming_its_line
Case 10, first part (a fit_batch plan at its exact boundary with Adam fits the step it trains):
    test_a_plan_at_its_exact_boundary_with_adam_trains_within_it

The model has BatchNorm (buffers the forward pass changes) and the .grad found is a non-zero tensor left by the
caller, so "as found" is tested on something that can change.
"""

import os
import signal
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import accumlib
from accumlib import memory
from accumlib.timing import HostReads
from builders import data, models

X, Y = data.digits(48)


def setup():
    """A BatchNorm CNN, Adam with state, and a .grad left by the caller on every parameter."""
    model = models.cnn(norm="batch")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumlib.train(model, (X[:16], Y[:16]), optimizer, micro_batch_size=8, accum_steps=1, device="cpu")
    for i, p in enumerate(model.parameters()):
        p.grad = torch.full_like(p, 0.5 + i)
    return model, optimizer


def state(model, optimizer):
    """Everything the call may change: weights and buffers, the optimizer's state, each .grad (object and values)."""
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {
            k: {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in s.items()}
            for k, s in optimizer.state_dict()["state"].items()
        },
        [(p.grad, None if p.grad is None else p.grad.clone()) for p in model.parameters()],
    )


def unchanged(before, model, optimizer) -> bool:
    after = state(model, optimizer)
    same_model = before[0].keys() == after[0].keys() and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    same_state = all(
        torch.equal(before[1][k][n], after[1][k][n])
        if isinstance(before[1][k][n], torch.Tensor)
        else before[1][k][n] == after[1][k][n]
        for k in before[1]
        for n in before[1][k]
    )
    same_grads = all(a[0] is b[0] and torch.equal(a[1], b[1]) for a, b in zip(before[2], after[2], strict=True))
    return same_model and same_state and same_grads


def cycle(n=4):
    return list(zip(X[: 8 * n].split(8), Y[: 8 * n].split(8), strict=True))


def raising_at(i, raise_):
    calls = []

    def loss_fn(output, target):
        calls.append(None)
        if len(calls) == i:
            raise_()
        return nn.functional.cross_entropy(output, target)

    return loss_fn


def _value_error():
    raise ValueError("the user's loss_fn fails")


def _keyboard_interrupt():
    raise KeyboardInterrupt


def _sigint():
    os.kill(os.getpid(), signal.SIGINT)  # Python's handler raises KeyboardInterrupt at the next bytecode


@pytest.mark.parametrize("how", ["loss_fn raises", "KeyboardInterrupt", "SIGINT", "wrong dtype"])
def test_an_error_mid_cycle_leaves_everything_as_found(how):
    model, optimizer = setup()
    before = state(model, optimizer)
    micro_batches, loss_fn = cycle(), nn.functional.cross_entropy
    if how == "wrong dtype":
        micro_batches[2] = (micro_batches[2][0].double(), micro_batches[2][1])
    else:
        loss_fn = raising_at(
            3, {"loss_fn raises": _value_error, "KeyboardInterrupt": _keyboard_interrupt, "SIGINT": _sigint}[how]
        )
    with pytest.raises((ValueError, KeyboardInterrupt, RuntimeError)):
        accumlib.accumulate_and_step(model, micro_batches, optimizer, [0.25] * 4, loss_fn=loss_fn)
    assert unchanged(before, model, optimizer)  # two micro-batches' gradients were built, none is left


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_skipped_or_raised_non_finite_cycle_leaves_no_half_cycle_and_no_nan(on_nonfinite):
    model, optimizer = setup()
    before = state(model, optimizer)
    nan_at_3 = raising_at(99, None)  # counts nothing; the NaN comes from the data

    micro_batches = cycle()
    micro_batches[2] = (torch.full_like(micro_batches[2][0], float("nan")), micro_batches[2][1])
    if on_nonfinite == "raise":
        with pytest.raises(
            accumlib.NonFiniteError,
            match="no step was taken; the weights, buffers, optimizer and the optimizer's .grad are as they were",
        ):
            accumlib.accumulate_and_step(
                model, micro_batches, optimizer, [0.25] * 4, loss_fn=nan_at_3, on_nonfinite="raise"
            )
    else:
        assert accumlib.accumulate_and_step(model, micro_batches, optimizer, [0.25] * 4, loss_fn=nan_at_3).skipped
    assert unchanged(before, model, optimizer)  # the message is true: no NaN, no half cycle in .grad
    assert not any(p.grad.isnan().any() for p in model.parameters())


def test_after_a_step_the_gradients_are_freed():
    """What a step leaves, as its docstring says: .grad None (read grad_norm from the result), so a next cycle
    holds no second copy of the gradients."""
    model, optimizer = setup()
    result = accumlib.accumulate_and_step(model, cycle(), optimizer, [0.25] * 4)
    assert not result.skipped and result.grad_norm > 0
    assert all(p.grad is None for p in model.parameters())


def test_an_optimizer_without_the_models_parameters_is_refused():
    model, optimizer = setup()
    before = state(model, optimizer)
    other = torch.optim.SGD(models.cnn(norm="batch").parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizer holds none of the model's trainable parameters"):
        accumlib.accumulate_and_step(model, cycle(), other, [0.25] * 4)
    assert unchanged(before, model, optimizer)


@pytest.mark.parametrize(
    "weight",
    [
        -0.25,
        float("nan"),
        float("inf"),
        np.float32(-1),
        np.float64("nan"),
        torch.tensor(-0.25),
        torch.tensor(float("nan")),
        torch.tensor(float("inf")),
        torch.tensor(-1, dtype=torch.int64),
        torch.tensor(True),
        torch.tensor(1j),
        torch.tensor([0.25]),
        "0.25",
        None,
        True,
    ],
    ids=lambda w: repr(w),
)
def test_negative_or_non_finite_weights_are_refused_in_every_numeric_form(weight):
    model, optimizer = setup()
    before = state(model, optimizer)
    with pytest.raises(ValueError, match=r"loss_weights\[2\] is .*finite numbers >= 0"):
        accumlib.accumulate_and_step(model, cycle(), optimizer, [0.25, 0.25, weight, 0.25])
    assert unchanged(before, model, optimizer)


def test_valid_weights_in_every_numeric_form_give_the_same_step():
    results = []
    for weights in (
        [0.25] * 4,
        [np.float32(0.25)] * 4,
        [torch.tensor(0.25)] * 4,
        [torch.tensor(0.25, dtype=torch.float64)] * 4,
    ):
        model, optimizer = setup()
        results.append(
            (
                accumlib.accumulate_and_step(model, cycle(), optimizer, weights).loss,
                [p.detach().clone() for p in model.parameters()],
            )
        )
    for loss, weights in results[1:]:
        # float32 model: a weight held as float32, float64 or a Python float is the same 0.25 (exact in binary), so
        # the gradients and the step are equal; a float64 0-d weight makes the loss's sum float64, which differs
        # from the float32 sum by float32 rounding (relative 2**-24 per addition, 4 of them)
        assert all(torch.equal(a, b) for a, b in zip(weights, results[0][1], strict=True))
        assert loss == pytest.approx(results[0][0], rel=4 * 2**-24)


def test_tensor_weights_are_read_once_not_per_micro_batch():
    counts = {}
    for n in (2, 6):
        model, _adam = setup()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # Adam's own step reads its step count per tensor
        with HostReads() as reads:
            accumlib.accumulate_and_step(model, cycle(n), optimizer, [torch.tensor(1 / n)] * n)
        counts[n] = reads.count
    assert counts[2] == counts[6] == 2  # the weights' one read and the cycle's one read (loss and norm)


def test_an_empty_micro_batch_is_refused_by_name():
    model, optimizer = setup()
    before = state(model, optimizer)
    micro_batches = cycle(3) + [(X[:0], Y[:0])]  # tensor_split of a short batch gives these
    with pytest.raises(
        ValueError,
        match=r"micro_batches\[3\] holds a tensor of shape \(0, 1, 8, 8\), without "
        "samples",
    ):
        accumlib.accumulate_and_step(model, micro_batches, optimizer, [1 / 3] * 3 + [0.0])
    assert unchanged(before, model, optimizer)


def test_a_micro_batch_on_another_device_is_refused_by_name():
    model, optimizer = setup()
    before = state(model, optimizer)
    micro_batches = cycle()
    micro_batches[1] = (micro_batches[1][0].to("meta"), micro_batches[1][1])
    with pytest.raises(ValueError, match=r"micro_batches\[1\] holds a tensor on meta but the model is on cpu"):
        accumlib.accumulate_and_step(model, micro_batches, optimizer, [0.25] * 4)
    assert unchanged(before, model, optimizer)


def test_closure_optimizers_are_refused_by_name():
    model, _ = setup()
    lbfgs = torch.optim.LBFGS(model.parameters())
    for call in (
        lambda: accumlib.accumulate_and_step(model, cycle(), lbfgs, [0.25] * 4),
        lambda: accumlib.train(model, (X, Y), lbfgs, micro_batch_size=8, accum_steps=2),
    ):
        with pytest.raises(ValueError, match="optimizer is a LBFGS, whose step\\(\\) needs a closure"):
            call()
    assert all(p.grad is not None for p in model.parameters())  # nothing ran


def torch_optimizers():
    """Every optimizer class torch.optim exports (but LBFGS, refused above), built with its defaults."""
    found = [getattr(torch.optim, name) for name in dir(torch.optim)]
    found = [
        c
        for c in found
        if isinstance(c, type)
        and issubclass(c, torch.optim.Optimizer)
        and c is not torch.optim.Optimizer
        and c is not torch.optim.LBFGS
    ]
    assert {torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, torch.optim.Muon} <= set(found)
    return sorted(found, key=lambda c: c.__name__)


XF, YF = data.digits(24, flat=True)


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))


@pytest.mark.parametrize("optimizer_class", torch_optimizers(), ids=lambda c: c.__name__)
def test_every_optimizer_in_torch_optim_is_measured_as_it_trains(optimizer_class):
    if optimizer_class is torch.optim.Muon:  # Muon takes 2-D weights only: the biases go to another optimizer

        def build(model):
            return optimizer_class([p for p in model.parameters() if p.dim() == 2], lr=0.02)
    else:

        def build(model):
            return optimizer_class(model.parameters(), **({"lr": 0.01} if optimizer_class is torch.optim.SGD else {}))

    model = small()
    if optimizer_class is torch.optim.SparseAdam:  # it refuses dense gradients: in training and measuring alike
        with pytest.raises((RuntimeError, ValueError), match="dense"):
            accumlib.train(model, (XF, YF), build(model), micro_batch_size=4, accum_steps=2)
        with pytest.raises(ValueError, match="dense"):
            memory.measure_step(model, XF[:4], YF[:4], optimizer=build(small()), accum_steps=2, fake=True)
        return
    real = memory.measure_step(model, XF[:4], YF[:4], optimizer=build(model), accum_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fake = memory.measure_step(model, XF[:4], YF[:4], optimizer=build(model), accum_steps=2, fake=True)
        plan = memory.fit_batch(model, (XF[:1], YF[:1]), 8, real.peak, optimizer=build(model))
    # the same storages, nothing computed; or, for an optimizer whose step reads a value (ASGD, Adafactor), said
    # and measured with a real step
    assert fake.peak == real.peak
    assert all("the optimizer's step (" in str(w.message) and "/optim/" in str(w.message) for w in caught)
    assert plan.micro_batch_size * plan.accum_steps == 8 and plan.peak_bytes <= real.peak
    optimizer = build(model)
    history = accumlib.train(
        model,
        (XF, YF),
        optimizer,
        micro_batch_size=4,
        accum_steps=2,
        epochs=2,
        memory_budget=real.peak,
        measure_memory=True,
        device="cpu",
    )
    assert max(r.peak_memory_bytes for r in history) <= real.peak
    # and a step once the optimizer has its state (the heavier of the two measure_step reports) is within it too
    later = accumlib.train(
        model,
        (XF[:8], YF[:8]),
        optimizer,
        micro_batch_size=4,
        accum_steps=2,
        memory_budget=real.peak,
        measure_memory=True,
        device="cpu",
    )
    assert later[0].peak_memory_bytes <= real.peak
    assert max(later[0].peak_memory_bytes, history[0].peak_memory_bytes) == real.peak  # exact, not a bound


class Branching(nn.Module):
    """A valid model whose forward reads a tensor's value, which FakeTensorMode cannot trace."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 10)

    def forward(self, x):
        if x.sum() > 0:
            return self.linear(x)
        return self.linear(-x)


def test_an_untraceable_forward_is_measured_with_a_real_step_and_its_line_named():
    model = Branching()
    with pytest.warns(
        RuntimeWarning,
        match=r"the model or loss_fn \(.*test_hostile_newer_cycle.py, line \d+: if "
        r"x.sum\(\) > 0:\) reads a tensor's value.*measured with a real step "
        "on the CPU",
    ):
        fake = memory.measure_step(model, XF[:4], YF[:4], accum_steps=2, fake=True)
    assert fake.peak == memory.measure_step(model, XF[:4], YF[:4], accum_steps=2).peak  # exact on the CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        plan = memory.fit_batch(model, (XF[:1], YF[:1]), 8, fake.peak)
        history = accumlib.train(
            model,
            (XF, YF),
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=plan.micro_batch_size,
            accum_steps=plan.accum_steps,
            memory_budget=plan.budget_bytes,
            measure_memory=True,
            device="cpu",
        )
    assert len(history) == 24 // 8 and max(r.peak_memory_bytes for r in history) <= plan.budget_bytes


def test_an_untraceable_forward_on_the_meta_device_is_refused_naming_its_line():
    with torch.device("meta"):
        model = Branching()
    with pytest.raises(
        ValueError,
        match=r"line \d+: if x.sum\(\) > 0:\) reads a tensor's value.*meta device has "
        "none",
    ):
        memory.measure_step(model, XF[:4], YF[:4], fake=True)


def test_a_plan_at_its_exact_boundary_with_adam_trains_within_it():
    model = models.cnn(norm="batch")

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=0.01)

    loose = memory.fit_batch(model, (X[:1], Y[:1]), 16, 10**9, optimizer=adam(model))
    wanted = memory.measure_step(model, X[:4], Y[:4], optimizer=adam(model), accum_steps=4).peak
    plan = memory.fit_batch(model, (X[:1], Y[:1]), 16, wanted, optimizer=adam(model))  # the exact boundary
    assert loose.micro_batch_size == 16 and (plan.micro_batch_size, plan.peak_bytes) == (4, wanted)
    optimizer = adam(model)
    history = accumlib.train(
        model,
        (X, Y),
        optimizer,
        micro_batch_size=4,
        accum_steps=4,
        epochs=2,
        memory_budget=plan.budget_bytes,
        measure_memory=True,
        device="cpu",
    )
    later = accumlib.train(
        model,
        (X[:16], Y[:16]),
        optimizer,
        micro_batch_size=4,
        accum_steps=4,
        memory_budget=plan.budget_bytes,
        measure_memory=True,
        device="cpu",
    )
    peaks = [r.peak_memory_bytes for r in history] + [later[0].peak_memory_bytes]
    assert max(peaks) == plan.budget_bytes  # the step it trains reaches its plan, and not a byte over
    with pytest.raises(memory.OutOfMemory):  # one byte less is refused before anything changes
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=4, memory_budget=plan.budget_bytes - 1)
