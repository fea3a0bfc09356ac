"""Issue 19: the cycle's options in one object (`accumlib.CycleOptions`), checked once, and `train(memory_budget=...)`
with a loader measured, cycle layout by cycle layout, instead of refused.

Every refusal is compared by its whole message; "nothing changed" compares every weight, buffer, .grad and the
optimizer's state exactly (torch.equal): a refusal computes nothing, so nothing may differ in any digit. Bytes on
the CPU are exact integers (live tensor storages), so the budget comparisons are exact too.
"""

import copy
import dataclasses

import pytest
import torch
from torch import nn
from states import same, snapshot

import accumlib
from accumlib import batchnorm, cycle, memory, timing

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
        accumlib.accumulate_and_step(model, optimizer, [(X[:8], Y[:8])], [1.0], **{name: value})
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
        model, opt, X[:8], Y[:8], accum_steps=2, budget_bytes=10**9, loss_fn=bad
    ),
    "fit_batch": lambda bad, model, opt: memory.fit_batch(
        model, (X[:8], Y[:8]), target_batch=16, budget_bytes=10**9, optimizer=opt, loss_fn=bad
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
    check = cycle.CycleOptions.__post_init__
    monkeypatch.setattr(cycle.CycleOptions, "__post_init__", lambda self: built.append(self) or check(self))
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
            model, optimizer, list(zip(X[:32].split(8), Y[:32].split(8), strict=True)), [0.25] * 4, **given
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
        else (lambda **kw: accumlib.accumulate_and_step(model, optimizer, [(X[:8], Y[:8])], [1.0], **kw))
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
        accumlib.accumulate_and_step(model, optimizer, [(X[:8], Y[:8])], [1.0], **disabled)
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


# --- memory_budget with a loader ------------------------------------------------------------------------------


def linear():
    torch.manual_seed(0)
    return nn.Linear(6, 3)


def cycle_peak(model, batches):
    """The traced peak of one cycle of `batches`, as train weighs a cycle of equal micro-batches."""
    weights = [len(x) / sum(len(b[0]) for b in batches) for x, _y in batches]
    return memory.check_cycle_fits(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        batches,
        weights,
        options=accumlib.CycleOptions(),
        budget_bytes=2**40,
        what="",
        advice="",
    ).peak


SMALL = [(X[i : i + 4], Y[i : i + 4]) for i in range(0, 32, 4)]  # 8 batches of 4: 4 cycles of 2 at accum_steps=2
LARGE = [(X[:32], Y[:32]), (X[32:64], Y[32:64])]  # a last cycle of two batches of 32 (a padded tail, say)


def test_a_loader_whose_last_cycle_crosses_the_budget_raises_before_that_cycle_changes_anything():
    model = linear()
    small, large = cycle_peak(model, SMALL[:2]), cycle_peak(model, LARGE)
    assert small < large  # 32-sample batches take more than 4-sample ones
    reference = linear()  # the run without the large cycle: what the weights must be when the error comes
    accumlib.train(reference, SMALL, torch.optim.SGD(reference.parameters(), lr=0.1), accum_steps=2, device="cpu")
    with pytest.raises(memory.OutOfMemory) as error:
        accumlib.train(
            model,
            SMALL + LARGE,
            torch.optim.SGD(model.parameters(), lr=0.1),
            accum_steps=2,
            memory_budget=small,
            device="cpu",
        )
    assert error.value.needed_bytes == large and error.value.available_bytes == small
    assert f"{large:,} bytes" in str(error.value) and f"budget is {small:,} bytes" in str(error.value)
    assert "step 5 (epoch 0, 2 batches, 64 samples)" in str(error.value)  # the cycle that does not fit
    assert len(error.value.history) == 4  # the four cycles that fit were trained
    assert torch.equal(model.weight, reference.weight) and torch.equal(model.bias, reference.bias)
    assert model.weight.grad is None  # nothing half-accumulated


def test_a_loader_that_fits_trains_within_the_budget_and_each_layout_is_traced_once(monkeypatch):
    model = linear()
    budget = cycle_peak(model, LARGE)
    traced = []
    check = memory.check_cycle_fits
    monkeypatch.setattr(memory, "check_cycle_fits", lambda *a, **k: traced.append(a[2]) or check(*a, **k))
    history = accumlib.train(
        model,
        SMALL + LARGE,
        torch.optim.SGD(model.parameters(), lr=0.1),
        accum_steps=2,
        memory_budget=budget,
        measure_memory=True,
        epochs=2,
        device="cpu",
    )
    assert len(history) == 10 and all(0 < r.peak_memory_bytes <= budget for r in history)
    assert [[len(x) for x, _y in batches] for batches in traced] == [[4, 4], [32, 32]]  # two layouts, two epochs


class OwnLoss(nn.Module):
    """A model that computes its own loss from a dict batch, as a Hugging Face model given labels does."""

    def __init__(self):
        super().__init__()
        self.linear = linear()

    def forward(self, inputs, labels):
        return {"loss": nn.functional.cross_entropy(self.linear(inputs), labels)}


def test_dict_batches_are_measured_once_each_though_they_are_inputs_and_target():
    """A dict batch is the model's inputs and loss_fn's target: the trace copies its tensors once (a second copy
    would count them twice), so its step peaks as the same step on (x, y) pairs does, byte for byte."""
    batches = [{"inputs": X[i : i + 8], "labels": Y[i : i + 8]} for i in range(0, 16, 8)]
    model, plain = OwnLoss(), linear()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    own = accumlib.CycleOptions(loss_fn=lambda output, batch: output["loss"])
    as_dicts = memory.check_cycle_fits(
        model,
        sgd(model),
        [(cycle.Inputs((), b), b) for b in batches],
        [0.5, 0.5],
        options=own,
        budget_bytes=2**40,
        what="",
        advice="",
    )
    as_pairs = memory.check_cycle_fits(
        plain,
        sgd(plain),
        [(b["inputs"], b["labels"]) for b in batches],
        [0.5, 0.5],
        options=accumlib.CycleOptions(),
        budget_bytes=2**40,
        what="",
        advice="",
    )
    assert as_dicts.inputs == as_pairs.inputs > 0 and as_dicts.peak == as_pairs.peak
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(memory.OutOfMemory):
        accumlib.train(model, batches, sgd(model), accum_steps=2, memory_budget=as_dicts.peak - 1, device="cpu")
    assert same(model.state_dict(), before)
    history = accumlib.train(
        model, batches, sgd(model), accum_steps=2, memory_budget=as_dicts.peak, measure_memory=True, device="cpu"
    )
    assert len(history) == 1 and history[0].peak_memory_bytes <= as_dicts.peak


# --- the recorded peak of a stateful optimizer -----------------------------------------------------------------


class Masked(nn.Module):
    """A small model with one large buffer its forward reads but never changes (a causal mask, say)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 3)
        self.register_buffer("mask", torch.ones(256, 256))

    def forward(self, x):
        return self.linear(x) * self.mask[0, :3]


@pytest.mark.parametrize(
    "make",
    [lambda p: torch.optim.Adam(p), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)],
    ids=["Adam", "SGD with momentum"],
)
@pytest.mark.parametrize("m, k", [(8, 2), (16, 2), (4, 4)])
def test_trains_recorded_peak_with_a_stateful_optimizer_is_measure_steps_from_the_first_step(make, m, k):
    """measure_step reports the heavier of a run's first step (the optimizer makes its state in it) and a later
    one; train records that same number for every full cycle of one run, the first included (before, its first
    record was the first step's alone, fewer bytes: the state did not yet live through its passes)."""
    model = Masked()
    planned = memory.measure_step(model, X[:m], Y[:m], optimizer=make(model.parameters()), accum_steps=k).peak
    history = accumlib.train(
        model, (X, Y), make(model.parameters()), micro_batch_size=m, accum_steps=k, measure_memory=True, device="cpu"
    )
    assert len(history) == 64 // (m * k) and [r.peak_memory_bytes for r in history] == [planned] * len(history)


class DictSamples(torch.utils.data.Dataset):
    """A map-style Dataset of dict samples (what a tokenised Hugging Face dataset gives)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return {"inputs": X[i], "labels": Y[i]}


def test_a_dataset_of_dict_samples_is_measured_cycle_by_cycle_under_the_budget():
    """Its samples are not two tensors, so no (x, y) step can be measured before the run: each cycle is traced as
    it comes, before it changes anything (it was refused before)."""
    model = OwnLoss()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    own = accumlib.CycleOptions(loss_fn=lambda output, batch: output["loss"])
    batches = [{"inputs": X[i : i + 8], "labels": Y[i : i + 8]} for i in (0, 8)]
    peak = memory.check_cycle_fits(
        model,
        sgd(model),
        [(cycle.Inputs((), b), b) for b in batches],
        [0.5, 0.5],
        options=own,
        budget_bytes=2**40,
        what="",
        advice="",
    ).peak
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(memory.OutOfMemory) as error:
        accumlib.train(
            model, DictSamples(), sgd(model), micro_batch_size=8, accum_steps=2, memory_budget=peak - 1, device="cpu"
        )
    assert error.value.needed_bytes == peak and "step 1 (epoch 0, 2 batches, 16 samples)" in str(error.value)
    assert same(model.state_dict(), before)
    history = accumlib.train(
        model, DictSamples(), sgd(model), micro_batch_size=8, accum_steps=2, memory_budget=peak, device="cpu"
    )
    assert len(history) == 2


class Noisy(torch.utils.data.Dataset):
    """Samples with noise drawn from torch's global generator as they are fetched (a random augmentation)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return X[i] + 0.1 * torch.randn(6), Y[i]


def test_measuring_a_stateful_optimizers_later_step_changes_nothing_of_the_run():
    """The later-step trace fetches the cycle again (under its own random state) and traces copies: the run with
    measure_memory=True trains bit for bit as the one without, dropout and a random augmentation included."""

    def run(measure_memory):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
        history = accumlib.train(
            model,
            Noisy(),
            torch.optim.Adam(model.parameters()),
            micro_batch_size=4,
            accum_steps=2,
            epochs=2,
            measure_memory=measure_memory,
            device="cpu",
        )
        return [r.loss for r in history], model.state_dict()

    (measured, weights), (plain, plain_weights) = run(True), run(False)
    assert measured == plain and same(weights, plain_weights)
