"""Issue 28: every integer-like and float-like argument taken as Python converts it (`operator.index`, `float()`):
NumPy scalars and 0-d tensors train exactly as the Python number would; truth values are refused; values past
what a run can use are refused by name before anything changes, not left to fail inside (islice, OverflowError, a
torch conversion). "Nothing changed" compares every weight, buffer, .grad and the optimizer's state exactly."""

import copy
import re
import sys

import numpy as np
import pytest
import torch
from torch import nn
from states import same, snapshot, stable_records

import accumlib
from accumlib import _validate, cycle, memory

X = torch.randn(24, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(1))


def fresh(dtype=torch.float64):
    torch.manual_seed(0)
    model = nn.Linear(6, 3).to(dtype)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def trained():
    """A model and an Adam optimizer with state, and a .grad left on a parameter: a refusal must leave them all."""
    model, optimizer = fresh()
    accumlib.train(model, (X, Y), optimizer, micro_batch_size=8, accum_steps=1, max_steps=1, device="cpu")
    model.weight.grad = torch.ones_like(model.weight)
    return model, optimizer


def fit(**arguments):
    model, optimizer = fresh()
    history = accumlib.train(
        model, (X, Y), optimizer, device="cpu", **{"micro_batch_size": 4, "accum_steps": 2, **arguments}
    )
    return model.state_dict(), stable_records(history)


@pytest.mark.parametrize(
    "name, value, python",
    [
        ("seed", np.int64(3), 3),
        ("seed", np.uint64(2**64 - 1), 2**64 - 1),
        ("seed", torch.tensor(3), 3),
        ("accum_steps", np.int32(3), 3),
        ("micro_batch_size", torch.tensor(5, dtype=torch.uint8), 5),
        ("max_steps", np.int64(2), 2),
        ("epochs", torch.tensor(2), 2),
        ("clip_grad_norm", np.float32(0.5), 0.5),
        ("clip_grad_norm", torch.tensor(0.25, dtype=torch.float64), 0.25),
        ("max_skipped_steps", np.int16(4), 4),
    ],
)
def test_numpy_scalars_and_0d_tensors_train_exactly_as_the_python_number(name, value, python):
    weights, records = fit(**{name: value})
    expected_weights, expected_records = fit(**{name: python})
    assert same(weights, expected_weights) and records == expected_records


@pytest.mark.parametrize(
    "value", [True, np.True_, torch.tensor(True), torch.tensor([3]), torch.tensor(3.0), np.float64(3.0), "3"]
)
def test_truth_values_floats_and_shaped_tensors_are_no_integer(value):
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(TypeError, match=r"^seed must be an integer, got .* of type "):
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=1, seed=value, device="cpu")
    assert same(snapshot(model, optimizer), before)


@pytest.mark.parametrize(
    "name, value",
    [
        ("max_steps", 10**30),
        ("accum_steps", sys.maxsize + 1),
        ("epochs", np.uint64(2**64 - 1)),
        ("max_skipped_steps", 10**40),
        ("resume_from_step", 2**63),
        ("memory_budget", 10**19),
    ],
)
def test_counts_past_sys_maxsize_are_refused_by_name_before_anything_changes(name, value):
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(ValueError, match=rf"^{name}=.+ is more than a run can use: valid up to {sys.maxsize} "):
        accumlib.train(model, (X, Y), optimizer, **{"micro_batch_size": 4, "accum_steps": 1, name: value}, device="cpu")
    assert same(snapshot(model, optimizer), before)


def test_sys_maxsize_itself_is_a_count_a_run_can_use():
    weights, records = fit(max_steps=sys.maxsize, epochs=1)  # every step of the epoch: the data ends first
    expected_weights, expected_records = fit()
    assert same(weights, expected_weights) and records == expected_records and len(records) == 3


@pytest.mark.parametrize(
    "value", [10**400, -(10**400), float("inf"), float("nan")], ids=["1e400", "-1e400", "inf", "nan"]
)
def test_a_clip_norm_past_floats_range_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^clip_grad_norm must be a positive, finite number, got "):
        cycle.CycleOptions(clip_grad_norm=value)
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(ValueError, match=r"^clip_grad_norm must be a positive, finite number, got "):
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=1, clip_grad_norm=value, device="cpu")
    assert same(snapshot(model, optimizer), before)


def test_a_huge_value_is_shown_shortened():
    with pytest.raises(ValueError) as refused:
        cycle.CycleOptions(clip_grad_norm=10**400)
    assert str(refused.value).endswith(
        "got 10000000000000000000000000000000000000...00000000000000000000000000000000000000 (401 characters)"
    )
    assert repr(_validate.Shown(12345)) == "12345"


@pytest.mark.parametrize(
    "dtype, weight",
    [
        (torch.float32, 1e308),
        (torch.float32, 10**39),
        (torch.float32, torch.tensor(1e300, dtype=torch.float64)),
        (torch.float16, 7e4),
    ],
)
def test_a_loss_weight_past_the_parameters_dtype_is_refused_by_name_before_anything_changes(dtype, weight):
    model, optimizer = trained()
    model.to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, optimizer)
    largest = torch.finfo(dtype).max
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(
        ValueError,
        match=rf"^loss_weights\[1\] is .*, more than the largest {name} "
        rf"{re.escape(f'({largest:g})')}, the dtype of the optimizer's parameters",
    ):
        accumlib.accumulate_and_step(model, [(X[:4].to(dtype), Y[:4])] * 2, optimizer, [0.5, weight])
    assert same(snapshot(model, optimizer), before)


def test_a_float64_model_takes_a_weight_a_float32_could_not_hold():
    """1e150 (past float32's 3.4e38; its squares, in the norm, within float64's range) trains as the weighted loss
    of the hand-written step, bit for bit: the update lr * gradient is of the weights' own size."""
    model, _ = fresh()
    reference = copy.deepcopy(model)
    result = accumlib.accumulate_and_step(
        model, [(X[:4], Y[:4])], torch.optim.SGD(model.parameters(), lr=1e-150), [1e150]
    )
    loss = nn.functional.cross_entropy(reference(X[:4]), Y[:4]) * 1e150
    loss.backward()
    torch.optim.SGD(reference.parameters(), lr=1e-150).step()
    assert not result.skipped and result.loss == loss.item()
    assert accumlib.parameter_gap(model, reference) == 0 and accumlib.parameter_gap(model, fresh()[0]) > 1e-3


@pytest.mark.parametrize("options", ["fast", {"clip_grad_norm": 1.0}, 1.0])
def test_check_fits_refuses_options_that_are_no_cycle_options(options):
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(
        TypeError,
        match=r"^options must be an accumlib.CycleOptions, got .* of type ",
    ):
        memory.check_fits(model, X[:4], Y[:4], optimizer=optimizer, accum_steps=1, memory_budget=2**30, options=options)
    assert same(snapshot(model, optimizer), before)


@pytest.mark.parametrize("budget, error", [("1GB", TypeError), (0, ValueError), (2.0**30, TypeError)])
def test_check_fits_refuses_a_budget_that_is_no_count_of_bytes(budget, error):
    model, optimizer = trained()
    with pytest.raises(error, match=r"^memory_budget must be a positive integer"):
        memory.check_fits(model, X[:4], Y[:4], optimizer=optimizer, accum_steps=1, memory_budget=budget)


@pytest.mark.parametrize("kind", [np.int64, np.float32, torch.tensor])
def test_count_returning_a_numpy_number_counts_as_the_python_number(kind):
    batches = [(X[i : i + 4], Y[i : i + 4]) for i in range(0, 24, 4)]

    def run(convert):
        model, optimizer = fresh()
        history = accumlib.train(
            model,
            batches,
            optimizer,
            accum_steps=3,
            normalize="count",
            loss_reduction="mean",
            count=lambda x, y: convert(len(y) - 1),
            device="cpu",
        )
        return model.state_dict(), stable_records(history)

    weights, records = run(kind)
    expected_weights, expected_records = run(int)
    assert same(weights, expected_weights) and records == expected_records


def test_an_optimizer_fn_is_one_check_with_one_message_for_every_caller():
    """timing's and the BatchNorm experiment's optimizer_fn share _validate's two checks: an optimizer passed
    instead of a function, and a function that makes no optimizer, each refused naming the parameter."""
    sgd = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(
        TypeError,
        match=r"^optimizer_fn must be a function from parameters to an optimizer, e\.g\. "
        r"lambda params: torch\.optim\.SGD\(params, lr=0\.01\), got SGD$",
    ):
        accumlib.time_config(nn.Linear(6, 3), (X, Y), micro_batch_size=2, accum_steps=2, optimizer_fn=sgd)
    with pytest.raises(TypeError, match=r"^optimizer_fn must return a torch\.optim\.Optimizer, returned list$"):
        accumlib.time_config(nn.Linear(6, 3), (X, Y), micro_batch_size=2, accum_steps=2, optimizer_fn=list)
    assert _validate.optimizer_fn("make", torch.optim.SGD, lr=0.5) is torch.optim.SGD
    assert _validate.made_optimizer("make", sgd) is sgd
