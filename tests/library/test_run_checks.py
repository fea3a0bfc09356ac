"""accumlib.run_checks: train's arguments checked before anything changes, each refusal naming the parameter (and
the value), with no weight, buffer, gradient or optimizer state changed: the model has BatchNorm (buffers that a
forward pass changes) and an Adam optimizer with state from a first run (found.trained); the device to train on
refused unless it can hold the model; max_skipped_steps a positive integer."""

import math

import pytest
import torch
from found import DIGITS, OPTIONS, X, Y, Built, bn_model, ce, trained
from states import same, snapshot
from torch import nn

import accumlib
from builders import data, models


def test_cuda_is_refused_where_there_is_none():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(ValueError, match="device='cuda' is not available"):
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=2, device="cuda")
    assert same(snapshot(model, optimizer), before)


def other_optimizer(model=None, optimizer=None):
    return torch.optim.SGD(models.cnn(norm="batch").parameters(), lr=0.1)


CASES = [
    # model
    ("model-none", dict(model=None), TypeError, ["model", "None"]),
    ("model-string", dict(model="resnet"), TypeError, ["model", "'resnet'"]),
    ("model-without-parameters", dict(model=nn.ReLU()), ValueError, ["model", "no parameters"]),
    ("model-frozen", dict(model=models.cnn().requires_grad_(False)), ValueError, ["model", "frozen", "requires_grad"]),
    # data
    (
        "data-dict-batch",
        dict(data={"input_ids": X, "labels": Y}),
        TypeError,
        ["data", "dict", "'input_ids'", "not supported"],
    ),
    ("data-dict-inputs", dict(data=({"pixels": X}, Y)), TypeError, ["data[0] (X)", "dict", "'pixels'"]),
    # a Dataset of dict samples, or of ({"pixels": x}, y) pairs, trains (model(**inputs)):
    # tests/library/test_pipeline.py; a cycle without loss terms is recorded as empty and not stepped, the run goes
    # on: tests/library/test_loss_weights.py, case 6
    ("data-one-tensor", dict(data=[X]), TypeError, ["data", "tuple (X, y)"]),
    ("data-three-items", dict(data=(X, Y, Y)), TypeError, ["data", "3 items"]),
    ("data-numpy", dict(data=(X.numpy(), Y)), TypeError, ["data", "X"]),
    ("data-number", dict(data=5), TypeError, ["data", "int"]),
    ("data-lengths", dict(data=(X, Y[:-1])), ValueError, ["X has 48 samples but y has 47"]),
    ("data-empty", dict(data=(X[:0], Y[:0])), ValueError, ["data", "empty"]),
    ("micro-batch-larger-than-data", dict(micro_batch_size=49), ValueError, ["micro_batch_size=49", "1 to 48"]),
    # optimizer
    ("optimizer-none", dict(optimizer=None), TypeError, ["optimizer", "None"]),
    (
        "optimizer-of-another-model",
        dict(optimizer=Built(other_optimizer)),
        ValueError,
        ["optimizer", "none of the model's trainable parameters"],
    ),
    # loss_fn
    ("loss-class", dict(loss_fn=nn.CrossEntropyLoss), TypeError, ["loss_fn", "CrossEntropyLoss()"]),
    ("loss-string", dict(loss_fn="cross_entropy"), TypeError, ["loss_fn", "'cross_entropy'"]),
    ("loss-returns-float", dict(loss_fn=lambda o, t: ce(o, t).item()), TypeError, ["loss_fn", "float", "item()"]),
    ("loss-per-sample", dict(loss_fn=lambda o, t: ce(o, t, reduction="none")), ValueError, ["loss_fn", "(4,)"]),
    ("loss-detached", dict(loss_fn=lambda o, t: ce(o, t).detach()), ValueError, ["loss_fn", "requires_grad"]),
    # normalize and count
    ("normalize-unknown", dict(normalize="tokens"), ValueError, ["normalize", "'tokens'"]),
    ("normalize-none", dict(normalize=None), ValueError, ["normalize", "None"]),
    ("count-without-normalize", dict(count=data.count_tokens), ValueError, ["count", "normalize='count'"]),
    ("normalize-without-count", dict(normalize="count"), ValueError, ["count", "normalize='count'"]),
    ("count-not-callable", dict(normalize="count", count=5), TypeError, ["count", "5"]),
    ("count-returns-text", dict(normalize="count", count=lambda y: "many"), TypeError, ["count", "'many'"]),
    ("count-returns-vector", dict(normalize="count", count=lambda y: y), TypeError, ["count", "0-d tensor"]),
    ("count-negative", dict(normalize="count", count=lambda y: -1), ValueError, ["count", "-1", "step 1"]),
    # clipping
    *[
        (f"clip-{value!r}", dict(clip_grad_norm=value), error, ["clip_grad_norm", repr(value)])
        for value, error in [
            (0, ValueError),
            (-1.0, ValueError),
            ("1", TypeError),
            (True, TypeError),
            (math.inf, ValueError),
            (math.nan, ValueError),
        ]
    ],
    # amp and scaler
    *[(f"amp-{value!r}", dict(amp=value), ValueError, ["amp", repr(value)]) for value in (0, 1, "yes", "FP16", None)],
    ("scaler-not-a-scaler", dict(amp="fp16", scaler="scaler"), TypeError, ["scaler", "'scaler'"]),
    ("scaler-without-amp", dict(scaler=torch.amp.GradScaler("cpu")), ValueError, ["scaler", "amp=False"]),
    # device
    ("device-meta", dict(device="meta"), ValueError, ["device='meta'", "wipe"]),
    ("device-unknown", dict(device="gpu"), ValueError, ["device='gpu'"]),
    ("device-bool", dict(device=True), TypeError, ["device", "True"]),
    ("device-float", dict(device=1.5), TypeError, ["device", "1.5"]),
    # seed and the switches
    *[(f"seed-{value!r}", dict(seed=value), TypeError, ["seed", repr(value)]) for value in ("a", 1.5, True)],
    ("seed-too-large", dict(seed=2**70), ValueError, ["seed", str(2**70)]),
    *[
        (f"{name}-{value!r}", {name: value}, TypeError, [name, repr(value), "True or False"])
        for name, value in [
            ("shuffle", "False"),
            ("shuffle", "no"),
            ("shuffle", 0),
            ("shuffle", None),
            ("measure_memory", "no"),
            ("measure_memory", 1),
            ("ddp_no_sync", 1),
            ("check_gradients", "no"),
            ("check_gradients", None),
        ]
    ],
    ("on-nonfinite-unknown", dict(on_nonfinite="ignore"), ValueError, ["on_nonfinite", "'ignore'"]),
    ("on-nonfinite-bool", dict(on_nonfinite=True), ValueError, ["on_nonfinite", "True"]),
    # callbacks and the scheduler
    ("on-step-number", dict(on_step=5), TypeError, ["on_step", "5"]),
    ("on-step-string", dict(on_step="print"), TypeError, ["on_step", "'print'"]),
    ("on-step-class", dict(on_step=accumlib.StepRecord), TypeError, ["on_step", "StepRecord"]),
    ("scheduler-string", dict(scheduler="cosine"), TypeError, ["scheduler", "'cosine'"]),
    ("scheduler-is-the-optimizer", dict(scheduler=Built(lambda m, o: o)), TypeError, ["scheduler", "Adam"]),
    (
        "scheduler-of-another-optimizer",
        dict(scheduler=Built(lambda m, o: torch.optim.lr_scheduler.StepLR(other_optimizer(), step_size=1))),
        ValueError,
        ["scheduler", "another optimizer"],
    ),
    (
        "one-cycle-too-short",
        dict(scheduler=Built(lambda m, o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=5))),
        ValueError,
        ["scheduler", "OneCycleLR", "total_steps=5", "6 optimizer steps"],
    ),
    # memory budget
    ("memory-budget-zero", dict(memory_budget=0), ValueError, ["memory_budget", "0"]),
    ("memory-budget-string", dict(memory_budget="1MB"), TypeError, ["memory_budget", "'1MB'"]),
]


COUNT_CASES = [
    (f"{name}-{value!r}", {name: value}, error, [name, repr(value), "positive integer"])
    for name in ("micro_batch_size", "accum_steps", "epochs")
    for value, error in [(True, TypeError), (2.0, TypeError), ("4", TypeError), (0, ValueError), (-3, ValueError)]
]


@pytest.mark.parametrize("case,changes,error,names", CASES + COUNT_CASES, ids=[c[0] for c in CASES + COUNT_CASES])
def test_train_refuses_before_anything_changes(case, changes, error, names):
    model, optimizer = trained()
    arguments = dict(model=model, data=(X, Y), optimizer=optimizer, micro_batch_size=4, accum_steps=2)
    arguments |= {k: v.build(model, optimizer) if isinstance(v, Built) else v for k, v in changes.items()}
    before = snapshot(model, optimizer)  # after building the arguments: a scheduler's constructor sets the lr
    with pytest.raises(error) as info:
        accumlib.train(arguments.pop("model"), arguments.pop("data"), arguments.pop("optimizer"), **arguments)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert same(snapshot(model, optimizer), before)


@pytest.mark.parametrize(
    "value,error", [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError), (None, TypeError)]
)
def test_max_skipped_steps_must_be_a_positive_integer(value, error):
    model = bn_model()
    with pytest.raises(error, match=f"max_skipped_steps must be a positive integer.*{value!r}"):
        accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), max_skipped_steps=value, **OPTIONS)
