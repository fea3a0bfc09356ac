"""Hostile input to train, accumulate_and_step, gradient_gap and parameter_gap: every bad argument is refused with
an error that names the parameter (and the value), before any weight, buffer, gradient or optimizer state changes.

The model has BatchNorm (buffers that a forward pass changes) and an Adam optimizer with state from a first run.
"""

import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

import accumlib
from builders import data, models

X, Y = data.digits(48)  # 48 samples, micro-batch 4 x accum_steps 2: 6 optimizer steps per epoch


def trained():
    """A BatchNorm CNN and an Adam optimizer that has state, after one short run."""
    model = models.cnn(norm="batch")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumlib.train(model, (X[:16], Y[:16]), optimizer, micro_batch_size=8, accum_steps=1)
    return model, optimizer


def snapshot(model, optimizer):
    return (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
    )


def same(a, b) -> bool:
    """Equal tensors (NaN equal to NaN), dicts, lists and plain values, recursively."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, z) for x, z in zip(a, b, strict=True))
    return a == b


class Built:
    """An argument built from the test's model and optimizer, just before the call."""

    def __init__(self, build):
        self.build = build


def other_optimizer(model=None, optimizer=None):
    return torch.optim.SGD(models.cnn(norm="batch").parameters(), lr=0.1)


ce = nn.functional.cross_entropy
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
    # tests/library/test_pipeline.py; a cycle without loss terms is refused when its counts are computed, before
    # that cycle changes anything (the cycles before it have stepped): tests/library/test_hostile_newer_train.py,
    # case 6
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


def raises_on_second_call():
    calls = []

    def loss(output, target):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("user code failed")
        return ce(output, target)

    return loss


GAP_CASES = [
    ("model-none", dict(model=None), TypeError, ["model", "None"]),
    ("loss-class", dict(loss_fn=nn.CrossEntropyLoss), TypeError, ["loss_fn", "CrossEntropyLoss()"]),
    ("loss-returns-float", dict(loss_fn=lambda o, t: ce(o, t).item()), TypeError, ["loss_fn", "float"]),
    ("x-dict", dict(x={"pixels": X}), TypeError, ["x", "dict"]),
    ("x-list", dict(x=X.tolist()), TypeError, ["x"]),
    ("y-number", dict(y=3), TypeError, ["y", "3"]),
    ("lengths", dict(y=Y[:-1]), ValueError, ["x has 48", "y has 47"]),
    ("accum-steps-bool", dict(accum_steps=True), TypeError, ["accum_steps", "True"]),
    ("accum-steps-zero", dict(accum_steps=0), ValueError, ["accum_steps", "0"]),
    ("accum-steps-too-large", dict(accum_steps=49), ValueError, ["accum_steps=49", "1 to 48"]),
    ("normalize-count", dict(normalize="count"), ValueError, ["normalize", "'count'"]),
    ("normalize-false", dict(normalize=False), ValueError, ["normalize", "False"]),
    ("frozen", dict(model=models.cnn().requires_grad_(False)), ValueError, ["model", "trainable"]),
    ("loss-fails-midway", dict(loss_fn=raises_on_second_call()), RuntimeError, ["user code failed"]),
]


@pytest.mark.parametrize("case,changes,error,names", GAP_CASES, ids=[c[0] for c in GAP_CASES])
def test_gradient_gap_refuses_and_leaves_the_model_as_it_was(case, changes, error, names):
    model = models.cnn(norm="batch")
    model[0].weight.grad = torch.ones_like(model[0].weight)
    arguments = dict(model=model, loss_fn=ce, x=X, y=Y, accum_steps=4) | changes
    before = snapshot(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(error) as info:
        accumlib.gradient_gap(**arguments)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert same(snapshot(model, torch.optim.SGD(model.parameters(), lr=0.1)), before)  # buffers, even mid-way


def test_parameter_gap_refuses_what_it_cannot_compare():
    a = models.mlp()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module or a state dict"):
        accumlib.parameter_gap(None, a)
    with pytest.raises(TypeError, match="reference must be a torch.nn.Module or a state dict"):
        accumlib.parameter_gap(a, [1, 2])
    squeezed = {k: v[:1] if k == "2.bias" else v for k, v in a.state_dict().items()}  # broadcasts silently before
    with pytest.raises(ValueError, match=r"2.bias has shape \(10,\) in model and \(1,\) in reference"):
        accumlib.parameter_gap(a, squeezed)


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
    assert same(snapshot(model, optimizer)[:2], before[:2])  # weights, buffers (put back) and optimizer state


class OwnLoss(nn.Module):
    """A model that computes its own loss from labels (as a Hugging Face model does), in one of the broken forms."""

    def __init__(self, kind: str, key: bool):
        super().__init__()
        self.layer, self.kind, self.key = nn.Linear(64, 10), kind, key

    def forward(self, x, labels):
        per_sample = nn.functional.cross_entropy(self.layer(x.flatten(1)), labels, reduction="none")
        loss = {
            "a vector": per_sample,
            "a float": 0.5,
            "detached": per_sample.mean().detach(),
            "an integer tensor": labels.sum(),
            "a tensor without grad": per_sample.mean(),
        }[self.kind]
        if self.kind == "a tensor without grad":
            self.requires_grad_(False)  # frozen from here on, as an on_step that freezes the model leaves it
        return {"loss": loss} if self.key else type("Output", (), {"loss": loss})()


@pytest.mark.parametrize("key", [True, False], ids=["output['loss']", "output.loss"])
@pytest.mark.parametrize(
    "kind, error, message",
    [
        ("a vector", ValueError, "must be a scalar, got a tensor of shape (4,): reduce it in the model"),
        (
            "a float",
            TypeError,
            "must be a scalar tensor, got 0.5 of type float: let the model return the tensor itself",
        ),
        (
            "detached",
            ValueError,
            "has no gradient (requires_grad=False): the model computed it outside its parameters'",
        ),
        ("an integer tensor", TypeError, "is a tensor of torch.int64, which has no gradient"),
        ("a tensor without grad", ValueError, "has no gradient (requires_grad=False)"),
    ],
)
def test_a_models_own_broken_loss_is_named_as_the_models_not_as_loss_fn(kind, error, message, key):
    """Without loss_fn, the model's own loss is refused naming it (the user passed no loss_fn), before the step."""
    torch.manual_seed(0)
    model = OwnLoss(kind, key)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = copy.deepcopy(model.state_dict())
    where = "output['loss']" if key else "output.loss"
    batches = [{"x": X[i : i + 4], "labels": Y[i : i + 4]} for i in range(0, 8, 4)]
    with pytest.raises(error) as refused:
        accumlib.train(model, batches, optimizer, accum_steps=2, device="cpu")
    assert str(refused.value).startswith(f"the model's own loss ({where}; no loss_fn was given) {message}")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), before.values(), strict=True))


@dataclasses.dataclass(frozen=True)
class FrozenError(Exception):
    why: str


class ReadOnlyHistory(Exception):
    @property
    def history(self):
        return "its own"


def raising(error):
    def raise_it(*_):
        raise error

    return raise_it


@pytest.mark.parametrize("error", [FrozenError("the loss"), ReadOnlyHistory("the loss")], ids=["frozen", "read-only"])
@pytest.mark.parametrize("where", ["loss_fn", "on_step"])
def test_an_exception_that_takes_no_history_is_raised_as_it_is(error, where):
    """A frozen-dataclass exception, or one whose history is read-only, reaches the caller itself (not the
    AttributeError of attaching the history, nor contextlib's FrozenInstanceError of setting its __traceback__)."""
    model = nn.Linear(64, 10)
    callbacks = {where: raising(error)}
    with pytest.raises(type(error)) as raised:
        accumlib.train(
            model,
            (X.flatten(1), Y),
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=1,
            device="cpu",
            **callbacks,
        )
    assert raised.value is error
    plain = ValueError("a plain one")  # one that takes attributes carries the records so far, as before
    with pytest.raises(ValueError) as raised:
        accumlib.train(
            model,
            (X.flatten(1), Y),
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=1,
            device="cpu",
            **{where: raising(plain)},
        )
    assert len(raised.value.history) == (1 if where == "on_step" else 0)
