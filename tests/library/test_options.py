"""`accumlib.options`: the cycle's options in one object (`CycleOptions`), each declared once and checked once,
taken alike by `accumulate_and_step`, `train` and `measure_step` (issue 19).

Every refusal is compared by its whole message; "nothing changed" compares every weight, buffer, .grad and the
optimizer's state exactly (torch.equal): a refusal computes nothing, so nothing may differ in any digit.
"""

import dataclasses

import pytest
import torch
from torch import nn
from states import same, snapshot

import accumlib
from accumlib import batchnorm, memory, timing

X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(1))


def trained():
    """A model with a buffer, and an Adam optimizer with state and a .grad left on a parameter (held by nobody's
    step: a refusal must leave it too)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumlib.train(model, (X[:16], Y[:16]), optimizer, micro_batch_size=8, accum_steps=1, device="cpu")
    model[0].weight.grad = torch.ones_like(model[0].weight)
    return model, optimizer


other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
REFUSED = [  # (an option accumulate_and_step refuses, its value)
    ("loss_fn", 5),
    ("loss_fn", nn.CrossEntropyLoss),
    ("loss_fn", "cross_entropy"),
    ("clip_grad_norm", 0),
    ("clip_grad_norm", -1.0),
    ("clip_grad_norm", float("inf")),
    ("clip_grad_norm", "1"),
    ("clip_grad_norm", True),
    ("scaler", "fp16"),
    ("scaler", object()),
    ("scheduler", object()),
    ("scheduler", torch.optim.lr_scheduler.StepLR(other, 1)),
    ("ddp_no_sync", 1),
    ("ddp_no_sync", "yes"),
    ("ddp_no_sync", None),
    ("on_nonfinite", "ignore"),
    ("on_nonfinite", True),
    ("on_nonfinite", None),
    ("check_gradients", 0),
    ("check_gradients", None),
    ("check_gradients", "no"),
    ("amp", "fp32"),
    ("amp", 1),
    ("amp", torch.bfloat16),
    ("amp", None),
]


@pytest.mark.parametrize(
    "name, value",
    REFUSED,
    ids=[f"{n}={v!r}"[:40] if " at 0x" not in repr(v) else f"{n}={type(v).__name__}" for n, v in REFUSED],
)  # no address: xdist workers must agree
def test_train_refuses_each_cycle_option_with_accumulate_and_steps_message_and_changes_nothing(name, value):
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises((TypeError, ValueError)) as cycle_error:
        accumlib.accumulate_and_step(model, [(X[:8], Y[:8])], optimizer, [1.0], **{name: value})
    assert same(snapshot(model, optimizer), before)
    with pytest.raises(type(cycle_error.value)) as train_error:
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=8, accum_steps=2, device="cpu", **{name: value})
    assert str(train_error.value) == str(cycle_error.value)
    assert name in str(train_error.value)  # the message names the option
    assert same(snapshot(model, optimizer), before)
    with pytest.raises(type(cycle_error.value)) as options_error:  # the one check, where the options are built
        if hasattr(value, "optimizer"):  # a scheduler of another optimizer: refused against the optimizer
            accumlib.CycleOptions(scheduler=value).check_scheduler(optimizer)
        else:
            accumlib.CycleOptions(**{name: value})
    assert str(options_error.value) == str(cycle_error.value)


LOSS_FN_REFUSED = [5, nn.CrossEntropyLoss, "cross_entropy"]
MEASUREMENTS = {  # every function of the library that takes loss_fn, called with a refused one
    "measure_step": lambda bad, model, opt: memory.measure_step(model, X[:8], Y[:8], optimizer=opt, loss_fn=bad),
    "check_fits": lambda bad, model, opt: memory.check_fits(
        model, X[:8], Y[:8], optimizer=opt, accum_steps=2, memory_budget=10**9, loss_fn=bad
    ),
    "fit_batch": lambda bad, model, opt: memory.fit_batch(
        model, (X[:8], Y[:8]), target_batch=16, memory_budget=10**9, optimizer=opt, loss_fn=bad
    ),
    "time_config": lambda bad, model, opt: timing.time_config(
        model, (X, Y), micro_batch_size=8, accum_steps=2, loss_fn=bad
    ),
    "decompose_time": lambda bad, model, opt: timing.decompose_time(model, (X, Y), effective_batch=16, loss_fn=bad),
    "batchnorm.evaluate": lambda bad, model, opt: batchnorm.evaluate(model, X[:8], Y[:8], loss_fn=bad),
}


@pytest.mark.parametrize("where", list(MEASUREMENTS))
@pytest.mark.parametrize("value", LOSS_FN_REFUSED, ids=["number", "class", "string"])
def test_every_function_that_takes_loss_fn_refuses_it_with_the_cycles_message_and_changes_nothing(where, value):
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(TypeError) as cycle_error:
        accumlib.CycleOptions(loss_fn=value)
    with pytest.raises(TypeError) as error:
        MEASUREMENTS[where](value, model, optimizer)
    assert str(error.value) == str(cycle_error.value)
    assert same(snapshot(model, optimizer), before)


def test_the_options_are_checked_once_per_run_not_per_step(monkeypatch):
    built = []
    check = accumlib.CycleOptions.__post_init__
    monkeypatch.setattr(accumlib.CycleOptions, "__post_init__", lambda self: built.append(self) or check(self))
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    history = accumlib.train(
        model,
        (X, Y),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=2,
        clip_grad_norm=1.0,
        device="cpu",
    )
    assert len(history) == 8 and len(built) == 1
    assert built[0].clip_grad_norm == 1.0 and built[0].loss_fn is None  # the model's own, or cross-entropy


def test_cycle_options_are_frozen_and_hold_the_checked_values():
    options = accumlib.CycleOptions(clip_grad_norm=2)
    assert options.clip_grad_norm == 2.0 and type(options.clip_grad_norm) is float
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.check_gradients = "no"  # a checked object stays checked


# --- each option declared once: CycleOptions, taken alike by accumulate_and_step, train and measure_step ---------


def smoothed(output, target):
    return nn.functional.cross_entropy(output, target, label_smoothing=0.1)


# for each CycleOptions field, options that make it act (given the optimizer): the test below fails for a field
# added without one, so a new option is tested by both entry points at once
OPTION_SAMPLES = {
    "loss_fn": lambda opt: dict(loss_fn=smoothed),
    "clip_grad_norm": lambda opt: dict(clip_grad_norm=0.05),
    "amp": lambda opt: dict(amp="bf16"),
    "scaler": lambda opt: dict(amp="fp16", scaler=torch.amp.GradScaler("cpu", init_scale=2.0**4)),
    "scheduler": lambda opt: dict(scheduler=torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)),
    "ddp_no_sync": lambda opt: dict(ddp_no_sync=False),
    "on_nonfinite": lambda opt: dict(on_nonfinite="raise"),
    "check_gradients": lambda opt: dict(check_gradients=False),
}
FIELDS = [f.name for f in dataclasses.fields(accumlib.CycleOptions)]


def test_every_cycle_option_has_a_sample_and_a_line_of_documentation():
    assert sorted(OPTION_SAMPLES) == sorted(FIELDS)
    doc = accumlib.CycleOptions.__doc__
    assert all(f"\n        {name}: " in doc for name in FIELDS)  # its Args: line, written from its field
    assert not any(f"{name}:" in accumlib.train.__doc__ for name in FIELDS)  # said once, not again in train


def one_step(entry: str, how: str, name: str):
    """(weights, loss, lr) after one step of 4 micro-batches of 8 (float32, on the CPU) with the sample options of
    `name` (None: the defaults), given to `entry` ("train" or "cycle") as keywords or as options=CycleOptions(...)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    chosen = {} if name is None else OPTION_SAMPLES[name](optimizer)
    given = dict(options=accumlib.CycleOptions(**chosen)) if how == "options" else chosen
    if entry == "train":
        history = accumlib.train(
            model,
            (X[:32], Y[:32]),
            optimizer,
            micro_batch_size=8,
            accum_steps=4,
            max_steps=1,
            shuffle=False,
            device="cpu",
            **given,
        )
        result = history[0]
    else:
        result = accumlib.accumulate_and_step(
            model, list(zip(X[:32].split(8), Y[:32].split(8), strict=True)), optimizer, [0.25] * 4, **given
        )
    return [t.clone() for t in model.state_dict().values()], result.loss, optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("name", FIELDS)
def test_each_option_gives_the_same_step_as_a_keyword_or_in_options_in_train_and_in_accumulate_and_step(name):
    """One declaration, two entry points, two ways to pass it: the same weights and loss, bit for bit (train's
    cycle of 4 equal micro-batches has the weights 1/4 given to accumulate_and_step); and the option acts."""
    steps = {(entry, how): one_step(entry, how, name) for entry in ("train", "cycle") for how in ("keyword", "options")}
    reference = steps["cycle", "keyword"]
    assert all(same(step, reference) for step in steps.values())
    acts = name not in ("ddp_no_sync", "on_nonfinite", "check_gradients")  # they act under DDP, on a NaN, or not
    assert same(one_step("cycle", "keyword", None), reference) != acts  # the weights, the loss or the lr


@pytest.mark.parametrize("entry", ["train", "accumulate_and_step"])
def test_an_option_given_as_a_keyword_and_in_options_is_refused_by_name_before_anything_changes(entry):
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    call = (
        (lambda **kw: accumlib.train(model, (X, Y), optimizer, micro_batch_size=8, accum_steps=2, device="cpu", **kw))
        if entry == "train"
        else (lambda **kw: accumlib.accumulate_and_step(model, [(X[:8], Y[:8])], optimizer, [1.0], **kw))
    )
    with pytest.raises(TypeError, match=rf"^{entry}\(\) got 'clip_grad_norm' both as a keyword and in options=: "):
        call(options=accumlib.CycleOptions(clip_grad_norm=1.0), clip_grad_norm=2.0)
    with pytest.raises(
        TypeError,
        match=rf"^{entry}\(\) got an unexpected keyword argument 'autocast_dtype'; the "
        r"cycle's options are loss_fn, clip_grad_norm, amp, scaler, ",
    ):
        call(autocast_dtype=torch.bfloat16)  # one word for one idea: amp
    with pytest.raises(TypeError, match=r"^options must be an accumlib.CycleOptions, got \{'amp': 'bf16'\}"):
        call(options={"amp": "bf16"})
    assert same(snapshot(model, optimizer), before)


def test_cycle_options_take_keywords_only_so_a_new_field_cannot_shift_the_others():
    with pytest.raises(TypeError, match="positional"):
        accumlib.CycleOptions(nn.functional.cross_entropy, 1.0)


def test_a_disabled_scaler_with_fp16_is_refused_alike_by_both_entry_points():
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    disabled = dict(amp="fp16", scaler=torch.amp.GradScaler("cpu", enabled=False))
    with pytest.raises(ValueError) as cycle_error:
        accumlib.accumulate_and_step(model, [(X[:8], Y[:8])], optimizer, [1.0], **disabled)
    with pytest.raises(ValueError) as train_error:
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=8, accum_steps=2, device="cpu", **disabled)
    assert str(cycle_error.value) == str(train_error.value) and "amp='fp16'" in str(train_error.value)
    assert same(snapshot(model, optimizer), before)


def test_measure_step_takes_every_option_a_measurement_runs_and_refuses_a_runs_objects():
    """Derived from the fields: a new option reaches measure_step unless it is a run's object (run_state)."""
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for field in dataclasses.fields(accumlib.CycleOptions):
        if field.name == "loss_fn":
            continue
        chosen = OPTION_SAMPLES[field.name](optimizer)
        if field.metadata["run_state"]:
            with pytest.raises(TypeError, match=f"^measure_step got .*{field.name}"):
                memory.measure_step(net, X[:8], Y[:8], optimizer=optimizer, **chosen)
        else:
            assert memory.measure_step(net, X[:8], Y[:8], optimizer=optimizer, **chosen).peak > 0
