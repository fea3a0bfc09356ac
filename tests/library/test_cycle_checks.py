"""accumlib.cycle_checks: what a cycle is given, refused by name before anything changes: the model, the optimizer
(some of the model's trainable parameters, no closure), one finite weight >= 0 per micro-batch in every numeric
form, a list's micro-batches on the model's device and not empty (issue 23, case 4: accumulate_and_step as strict as
train); and the rest of accumulate_and_step's arguments, refused alike. The model has BatchNorm (buffers the forward
pass changes) and the .grad found is a non-zero tensor left by the caller (found.setup), so "as found" is tested on
something that can change."""

import math

import numpy as np
import pytest
import torch
from found import X, Y, Built, ce, cycle, setup, trained
from states import same, snapshot, state, unchanged
from torch import nn

import accumlib
from accumlib import cycle_checks
from builders import models

MODEL = nn.Linear(3, 2)


def test_an_optimizer_the_cycle_cannot_step_is_refused_naming_why():
    with pytest.raises(ValueError, match=r"^optimizer is a LBFGS, whose step\(\) needs a closure"):
        cycle_checks._check_optimizer(MODEL, torch.optim.LBFGS(MODEL.parameters()))
    with pytest.raises(ValueError, match=r"^optimizer holds none of the model's trainable parameters"):
        cycle_checks._check_optimizer(MODEL, torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1))
    held = torch.optim.SGD(MODEL.parameters(), lr=0.1)
    assert cycle_checks._check_optimizer(MODEL, held) == list(MODEL.parameters())


def test_loss_weights_are_finite_non_negative_and_within_the_parameters_dtype():
    cycle_checks._check_weights([0.5, torch.tensor(0.5), 0])
    with pytest.raises(ValueError, match=r"^loss_weights\[1\] is -0\.5: "):
        cycle_checks._check_weights([0.5, -0.5])
    with pytest.raises(ValueError, match=r"^loss_weights\[0\] is tensor\(inf\)"):
        cycle_checks._check_weights([torch.tensor(float("inf"))])
    with pytest.raises(ValueError, match=r"more than the largest float16 \(65504\)"):
        cycle_checks._check_weights([1e5], torch.float16)


def test_a_micro_batch_without_samples_or_off_the_models_device_is_refused():
    with pytest.raises(ValueError, match=r"^micro_batches\[1\] holds a tensor of shape \(0, 3\), without samples"):
        cycle_checks._check_micro_batches(MODEL, [(torch.zeros(2, 3), torch.zeros(2)), (torch.zeros(0, 3), None)])
    with pytest.raises(ValueError, match=r"^micro_batches\[0\] holds a tensor on meta but the model is on cpu"):
        cycle_checks._check_micro_batches(MODEL, [(torch.zeros(2, 3, device="meta"), None)])


CYCLE_CASES = [
    ("model-none", dict(model=None), TypeError, ["model", "None"]),
    ("optimizer-string", dict(optimizer="adam"), TypeError, ["optimizer", "'adam'"]),
    (
        "micro-batches-generator",
        dict(micro_batches=(b for b in [(X[:4], Y[:4])])),
        TypeError,
        ["micro_batches", "generator"],
    ),
    ("micro-batches-empty", dict(micro_batches=[], loss_weights=[]), ValueError, ["micro_batches", "empty"]),
    ("weights-one-number", dict(loss_weights=0.5), TypeError, ["loss_weights", "0.5"]),
    ("weights-too-few", dict(loss_weights=[1.0]), ValueError, ["loss_weights has 1", "micro_batches has 2"]),
    ("weights-negative", dict(loss_weights=[0.5, -0.5]), ValueError, ["loss_weights", "-0.5"]),
    ("weights-nan", dict(loss_weights=[0.5, math.nan]), ValueError, ["loss_weights", "nan"]),
    ("weights-text", dict(loss_weights=["0.5", "0.5"]), ValueError, ["loss_weights", "'0.5'"]),
    ("clip-zero", dict(clip_grad_norm=0), ValueError, ["clip_grad_norm", "0"]),
    ("scaler-string", dict(scaler="fp16"), TypeError, ["scaler", "'fp16'"]),
    ("on-nonfinite-unknown", dict(on_nonfinite="warn"), ValueError, ["on_nonfinite", "'warn'"]),
    ("loss-returns-float", dict(loss_fn=lambda o, t: ce(o, t).item()), TypeError, ["loss_fn", "float"]),
    ("loss-class", dict(loss_fn=nn.CrossEntropyLoss), TypeError, ["loss_fn", "CrossEntropyLoss()"]),
    ("amp-dtype", dict(amp=torch.bfloat16), ValueError, ["amp", "torch.bfloat16", "'bf16'"]),
    ("scheduler-is-the-optimizer", dict(scheduler=Built(lambda m, o: o)), TypeError, ["scheduler", "Adam"]),
    ("ddp-no-sync-int", dict(ddp_no_sync=1), TypeError, ["ddp_no_sync", "1"]),
    ("check-gradients-int", dict(check_gradients=0), TypeError, ["check_gradients", "0"]),
]


@pytest.mark.parametrize("case,changes,error,names", CYCLE_CASES, ids=[c[0] for c in CYCLE_CASES])
def test_the_cycle_function_refuses_before_anything_changes(case, changes, error, names):
    model, optimizer = trained()
    arguments = dict(
        model=model, optimizer=optimizer, micro_batches=[(X[:4], Y[:4]), (X[4:8], Y[4:8])], loss_weights=[0.5, 0.5]
    )
    arguments |= {k: v.build(model, optimizer) if isinstance(v, Built) else v for k, v in changes.items()}
    before = snapshot(model, optimizer)
    with pytest.raises(error) as info:
        accumlib.accumulate_and_step(**arguments)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert same(snapshot(model, optimizer), before)  # weights, buffers (put back), each .grad, optimizer state


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
