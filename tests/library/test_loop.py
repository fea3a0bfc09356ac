"""accumlib.loop (train), the driver of the cycle: exact equivalence over whole runs and incomplete last cycles,
one host read per step and none per micro-batch, persistent skips (max_skipped_steps), interruption, runs resumed with
resume_from_step, the user's exceptions as they were raised, train(memory_budget=...) over a loader (each cycle
layout traced before it changes anything, the recorded peak of a stateful optimizer), and the valid set-ups that
used to give silently wrong results. One cycle's own step (accumulate_and_step): test_cycle.py; bad input:
test_run_checks.py; the gaps: test_gaps.py; Ctrl-C over whole runs: test_interrupts.py."""

import copy
import dataclasses
import math

import pytest
import torch
from found import DIGITS, OPTIONS, SMALL, X6, X64, Y6, Y64, bn_model, linear, nan_gradient_run, stop_at
from torch import nn

import accumlib
from accumlib import cycle, memory
from accumlib.timing import HostReads
from builders import data, models
from states import identical, same, stable_records


def run(m, k, n, *, epochs=2, lr=0.5, normalize="samples", **kwargs):
    model = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    history = accumlib.train(
        model, (X64[:n], Y64[:n]), opt, micro_batch_size=m, accum_steps=k, epochs=epochs, normalize=normalize, **kwargs
    )
    return model, history


max_param_diff = accumlib.parameter_gap


@pytest.mark.parametrize("m,k", [(4, 3), (3, 4), (1, 8), (5, 2), (16, 4)])
@pytest.mark.parametrize("n", [480, 500, 337])  # 480 divides every effective batch here; 500 and 337 do not all
def test_accumulation_equals_full_batch_in_float64(m, k, n):
    accumulated, h1 = run(m, k, n)
    full, h2 = run(m * k, 1, n)
    assert max_param_diff(accumulated, full) <= 1e-10
    assert [r.samples for r in h1] == [r.samples for r in h2]
    assert h1[-1].samples_seen == 2 * n
    for a, b in zip(h1, h2, strict=True):
        assert a.loss == pytest.approx(b.loss, abs=1e-12)  # unscaled: independent of accum_steps


def test_last_incomplete_cycle_is_stepped_and_counted():
    _, history = run(4, 3, 50, epochs=1)  # 50 = 4 cycles of 12 + one cycle of 2 samples
    assert [r.samples for r in history] == [12, 12, 12, 12, 2]
    assert [r.micro_batches for r in history] == [3, 3, 3, 3, 1]


def test_steps_normalisation_is_measurably_wrong_on_an_incomplete_last_cycle():
    full, _ = run(12, 1, 50, epochs=1)
    exact, _ = run(4, 3, 50, epochs=1)
    classic, _ = run(4, 3, 50, epochs=1, normalize="steps")
    assert max_param_diff(exact, full) <= 1e-10
    assert max_param_diff(classic, full) > 1e-3
    # no incomplete cycle: the classic recipe is exact
    divisible_classic, _ = run(4, 3, 48, epochs=1, normalize="steps")
    divisible_full, _ = run(12, 1, 48, epochs=1)
    assert max_param_diff(divisible_classic, divisible_full) <= 1e-10


def test_no_gradient_leaks_into_the_next_epoch():
    model, _ = run(4, 3, 50, epochs=3)
    assert all(p.grad is None for p in model.parameters())
    one_by_one = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(one_by_one.parameters(), lr=0.5)
    accumlib.train(one_by_one, (X64[:50], Y64[:50]), opt, micro_batch_size=12, accum_steps=1, epochs=3)
    assert max_param_diff(model, one_by_one) <= 1e-10


def test_clipping_acts_on_the_accumulated_gradient():
    """Clipping once after accumulation equals clipping the full-batch gradient."""
    a, _ = run(4, 5, 100, clip_grad_norm=0.05)
    b, _ = run(20, 1, 100, clip_grad_norm=0.05)
    assert max_param_diff(a, b) <= 1e-10


def test_bf16_autocast_on_cpu_trains():
    X, y = data.digits(256, flat=True)
    model = models.mlp()
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        micro_batch_size=16,
        accum_steps=2,
        amp=True,
        epochs=3,
        device="cpu",
    )
    assert history[-1].loss < history[0].loss


def test_stop_training_from_on_step_returns_history_so_far():
    def stop_at_three(record):
        if record.step == 3:
            raise accumlib.StopTraining

    model, history = run(4, 3, 120, epochs=1, on_step=stop_at_three)
    assert len(history) == 3 and history.stopped == "StopTraining"
    assert all(p.grad is None for p in model.parameters())


def test_keyboard_interrupt_mid_cycle_applies_no_half_accumulated_gradient():
    calls = []

    def interrupting_loss(out, target):
        calls.append(1)
        if len(calls) == 5:  # second micro-batch of the second cycle
            raise KeyboardInterrupt
        return torch.nn.functional.cross_entropy(out, target)

    model = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    history = accumlib.train(
        model, (X64[:48], Y64[:48]), opt, micro_batch_size=4, accum_steps=4, loss_fn=interrupting_loss, shuffle=False
    )
    assert len(history) == 1 and history.stopped == "KeyboardInterrupt"
    one_step = models.mlp(dtype=torch.float64)
    accumlib.train(
        one_step,
        (X64[:16], Y64[:16]),
        torch.optim.SGD(one_step.parameters(), lr=0.5),
        micro_batch_size=16,
        accum_steps=1,
        shuffle=False,
    )
    assert max_param_diff(model, one_step) <= 1e-12
    assert all(p.grad is None for p in model.parameters())


def test_same_seed_gives_bit_identical_history_and_other_seed_does_not():
    X, y = data.digits(300)
    histories = []
    for seed in (3, 3, 4):
        model = models.cnn()
        h = accumlib.train(
            model, (X, y), torch.optim.Adam(model.parameters()), micro_batch_size=8, accum_steps=4, seed=seed, epochs=2
        )
        histories.append(stable_records(h))
    assert histories[0] == histories[1]
    assert histories[0] != histories[2]


def test_token_count_normalisation_equals_the_full_batch():
    X, y = data.token_sequences(48, seed=1)

    def fit(m, k):
        model = models.sequence_model(dtype=torch.float64)
        accumlib.train(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=m,
            accum_steps=k,
            epochs=2,
            loss_fn=models.token_loss_sum,
            normalize="count",
            loss_reduction="sum",
            count=data.count_tokens,
        )
        return model

    def fit_mean_of_means(m, k):
        model = models.sequence_model(dtype=torch.float64)
        accumlib.train(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=m,
            accum_steps=k,
            epochs=2,
            loss_fn=models.token_loss_mean,
        )
        return model

    full = fit(20, 1)
    assert max_param_diff(fit(4, 5), full) <= 1e-10
    assert max_param_diff(fit(3, 7), fit(21, 1)) <= 1e-10
    # averaging each micro-batch's mean loss is not the full batch's token mean
    assert max_param_diff(fit_mean_of_means(4, 5), full) > 1e-4
    # ... while the count-normalised full batch is the token mean of the batch
    assert max_param_diff(fit_mean_of_means(20, 1), full) <= 1e-10


def test_steps_normalisation_records_the_loss_it_differentiates():
    """On a short last cycle the classic loss / accum_steps is too small: the record shows the same loss."""
    _, by_samples = run(4, 3, 50, epochs=1, lr=0.0)  # lr 0: both runs see the same weights
    _, by_steps = run(4, 3, 50, epochs=1, lr=0.0, normalize="steps")
    assert [r.loss for r in by_steps[:4]] == pytest.approx([r.loss for r in by_samples[:4]], abs=1e-12)
    assert by_steps[4].loss == pytest.approx(by_samples[4].loss / 3, abs=1e-12)  # one micro-batch of 2, over 3


def head_and_body(body_trainable):
    model = models.mlp(dtype=torch.float64)
    model[0].requires_grad_(body_trainable)
    return model, torch.optim.SGD(model[2].parameters(), lr=0.5)


def test_an_optimizer_over_the_head_trains_exactly_like_a_frozen_body():
    """Norm and clipping cover the optimizer's parameters; the body's own gradients are left as PyTorch leaves them."""
    histories = {}
    for body_trainable in (True, False):
        model, optimizer = head_and_body(body_trainable)
        histories[body_trainable] = accumlib.train(
            model, (X64[:120], Y64[:120]), optimizer, micro_batch_size=4, accum_steps=3, epochs=2, clip_grad_norm=0.05
        )
        histories[body_trainable, "model"] = model
    assert max_param_diff(histories[True, "model"], histories[False, "model"]) == 0
    assert [r.grad_norm for r in histories[True]] == [r.grad_norm for r in histories[False]]
    body = histories[True, "model"][0]
    assert body.weight.grad is not None  # never zeroed by this optimizer: PyTorch adds up every step's gradient
    assert torch.equal(body.weight, models.mlp(dtype=torch.float64)[0].weight)  # and never stepped


def test_a_skipped_step_leaves_batchnorm_statistics_exactly_as_they_were():
    X, y = data.digits(48)
    X = X.clone()
    X[13] = float("nan")  # in the second cycle (micro-batch 4, accum_steps 2, in order)
    model = models.cnn(norm="batch")
    states = []
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=2,
        shuffle=False,
        on_step=lambda r: states.append({k: v.clone() for k, v in model.state_dict().items()}),
    )
    assert [r.skipped for r in history] == [False, True, False, False, False, False]
    assert accumlib.parameter_gap(states[1], states[0]) == 0  # weights and running statistics, all untouched
    assert torch.isfinite(model.eval()(data.digits(8)[0])).all()


class RecordingPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    def step(self, metrics, epoch=None):
        self.metrics = [*getattr(self, "metrics", []), metrics]
        return super().step(metrics, epoch)


def test_reduce_lr_on_plateau_gets_each_optimizer_steps_loss():
    model = models.mlp(dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = RecordingPlateau(optimizer, patience=0, factor=0.5, threshold=10.0)  # no step counts as better
    history = accumlib.train(
        model, (X64[:96], Y64[:96]), optimizer, micro_batch_size=4, accum_steps=3, scheduler=scheduler
    )
    assert scheduler.metrics == [r.loss for r in history]
    assert [r.lr for r in history] == [0.5 * 0.5**i for i in range(8)]


def test_one_cycle_lr_with_exactly_the_runs_steps_runs_to_the_end():
    model = models.mlp(dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.5, total_steps=10)
    history = accumlib.train(
        model, (X64[:100], Y64[:100]), optimizer, micro_batch_size=4, accum_steps=5, epochs=2, scheduler=scheduler
    )
    lrs = [r.lr for r in history]
    assert len(lrs) == 10 and max(lrs) == 0.5 and lrs[-1] == min(lrs)  # warmed up to max_lr, annealed to the end


def failing_at_step(step, where):
    """A loss function or on_step callback that raises on optimizer step `step`, after the steps before it."""
    calls = []

    def loss_fn(output, target):
        calls.append(1)
        if len(calls) == 3 * (step - 1) + 2:  # the second micro-batch of that step
            raise RuntimeError("user code failed")
        return torch.nn.functional.cross_entropy(output, target)

    def on_step(record):
        if record.step == step:
            raise RuntimeError("user code failed")

    return {"loss_fn": loss_fn, "on_step": on_step}[where]


@pytest.mark.parametrize("where,recorded", [("loss_fn", 2), ("on_step", 3)])
def test_an_exception_from_user_code_carries_the_records_so_far(where, recorded):
    model = models.mlp(dtype=torch.float64)
    with pytest.raises(RuntimeError, match="user code failed") as info:
        accumlib.train(
            model,
            (X64[:96], Y64[:96]),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            **{where: failing_at_step(3, where)},
        )
    assert [r.step for r in info.value.history] == list(range(1, recorded + 1))
    assert all(p.grad is None for p in model.parameters())


def ignoring(n=48, every=3):
    """X64[:n] with every `every`-th label ignored (-100): micro-batches of 4 hold 2 to 4 counted labels."""
    y = Y64[:n].clone()
    y[::every] = -100
    return X64[:n], y


def counted(y) -> torch.Tensor:
    """The loss terms of a micro-batch, from its target: its labels that are not ignored."""
    return (y != -100).sum()


def test_a_mean_loss_fn_with_counts_said_to_be_a_mean_equals_the_full_batch_and_a_sum_does_not():
    """F.cross_entropy (a mean over the counted labels, PyTorch's default) with normalize="count": said to be a
    mean, 3 micro-batches of 4 are one step on all 12 samples' counted labels, to float64's rounding (sums of ~10
    terms of size ~1: 1e-13 leaves room); taken for a sum, it is weighted by its counts twice, far off."""
    X, y = ignoring()

    def fit(m, k, **options):
        model = models.mlp(dtype=torch.float64)
        accumlib.train(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=m,
            accum_steps=k,
            shuffle=False,
            loss_fn=torch.nn.functional.cross_entropy,
            normalize="count",
            count=counted,
            **options,
        )
        return model

    full = fit(12, 1, loss_reduction="mean")
    assert max_param_diff(fit(4, 3, loss_reduction="mean"), full) <= 1e-13
    assert max_param_diff(fit(4, 3, loss_reduction="sum"), full) > 1e-3


def test_a_loss_fn_with_counts_and_no_loss_reduction_is_refused_with_nothing_changed():
    X, y = ignoring()
    model = models.mlp(dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    accumlib.train(model, (X, y), optimizer, micro_batch_size=4, accum_steps=3, max_steps=1)  # Adam holds state
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)  # a gradient of the learner's own, left as it is
    before = copy.deepcopy((model.state_dict(), [p.grad for p in model.parameters()], optimizer.state_dict()))
    with pytest.raises(ValueError, match="loss_reduction is missing") as refused:
        accumlib.train(
            model,
            (X, y),
            optimizer,
            micro_batch_size=4,
            accum_steps=3,
            normalize="count",
            loss_fn=torch.nn.functional.cross_entropy,
            count=counted,
        )
    assert "loss_reduction='mean'" in str(refused.value) and "loss_reduction='sum'" in str(refused.value)
    after = (model.state_dict(), [p.grad for p in model.parameters()], optimizer.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(before[0].values(), after[0].values(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before[1], after[1], strict=True))
    assert identical(before[2], after[2])  # the step counts and moments, bit for bit
    # the model's own loss needs none: it is a mean
    accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=3,
        normalize="count",
        count=counted,
        max_steps=1,
    )


def test_a_disabled_grad_scaler_is_no_scaler_in_train():
    """GradScaler(enabled=use_amp) with use_amp False, PyTorch's own AMP recipe: train takes it for no scaler (the
    same run, bit for bit, and a NaN gradient raises with on_nonfinite="raise"); with fp16 it is refused."""

    def disabled():
        return torch.amp.GradScaler("cpu", enabled=False)

    plain, history = run(4, 3, 48, epochs=1)
    scaled, scaled_history = run(4, 3, 48, epochs=1, scaler=disabled())
    assert max_param_diff(scaled, plain) == 0 and stable_records(scaled_history) == stable_records(history)
    with pytest.raises(accumlib.NonFiniteError, match="non-finite"):
        nan_gradient_run(on_nonfinite="raise", scaler=disabled())
    model = models.mlp()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"scaler is disabled .* amp='fp16'"):
        accumlib.train(
            model,
            (X64[:24].float(), Y64[:24]),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            amp="fp16",
            scaler=disabled(),
            device="cpu",
        )
    assert identical(before, model.state_dict())


def linear_run(batches, accum_steps, optimizer=torch.optim.SGD):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3, dtype=torch.float64)
    history = accumlib.train(model, batches, optimizer(model.parameters(), lr=0.1), accum_steps=accum_steps)
    return model, history


def test_a_batch_of_0_rows_adds_nothing_mid_cycle_and_at_the_end():
    """A filtering collate_fn's 0-row batch: mid-cycle, the cycle is the step on its other batches, bit for bit (not
    a skipped step); at the end, its cycle has nothing to learn: recorded as empty, not stepped, no error."""
    X, y = X64[:18, :6], Y64[:18] % 3
    batches = list(zip(X.split(3), y.split(3), strict=True))
    none = (X[:0], y[:0])
    model, history = linear_run([batches[0], none, batches[1]], 3)
    others, _ = linear_run(batches[:2], 2)
    assert [(r.skipped, r.empty, r.micro_batches, r.samples) for r in history] == [(False, False, 2, 6)]
    assert max_param_diff(model, others) == 0
    model, history = linear_run(batches + [none], 3)
    plain, _ = linear_run(batches, 3)
    assert [(r.skipped, r.empty, r.samples) for r in history] == [
        (False, False, 9),
        (False, False, 9),
        (False, True, 0),
    ]
    assert max_param_diff(model, plain) == 0
    model, history = linear_run([none, none], 2)  # only 0-row batches: nothing to learn, nothing changed
    torch.manual_seed(0)
    assert [(r.empty, r.micro_batches) for r in history] == [(True, 0)]
    assert max_param_diff(model, torch.nn.Linear(6, 3, dtype=torch.float64)) == 0


class _Keywords(torch.nn.Module):
    """A model called with a dict batch's keys, model(x=..., y=...)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x, y):
        return self.linear(x)


class _DictSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"x": X8[i], "y": Y8[i]}


X8, Y8 = torch.randn(8, 6, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 3


@pytest.mark.parametrize(
    "data, micro_batch_size, advice",
    [
        ([{"x": X8[i : i + 4], "y": Y8[i : i + 4]} for i in (0, 4)], None, "give the loader a smaller batch_size"),
        (_DictSamples(), 4, "use a smaller micro_batch_size"),
    ],
    ids=["loader", "dataset of dicts"],
)
def test_a_cycle_over_memory_budget_is_refused_with_advice_for_its_kind_of_data(data, micro_batch_size, advice):
    """The refusal ends with how to make this data's micro-batches smaller: a loader's batch_size, or the
    micro_batch_size train splits (X, y) and a Dataset by; before the cycle changes anything."""
    torch.manual_seed(0)
    model = _Keywords()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(accumlib.OutOfMemory, match=f"{advice} and .*accum_steps"):
        accumlib.train(
            model,
            data,
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=micro_batch_size,
            accum_steps=2,
            memory_budget=1,
            loss_fn=lambda output, batch: torch.nn.functional.cross_entropy(output, batch["y"]),
            device="cpu",
        )
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())


# --- train(memory_budget=...) over a loader: each cycle layout traced, before it changes anything (issue 19) --
# found.linear, found.SMALL: a Linear(6, 3) and 8 batches of 4 of found.X6, Y6


def cycle_peak(model, batches):
    """The traced peak of one cycle of `batches`, as train weighs a cycle of equal micro-batches."""
    weights = [len(x) / sum(len(b[0]) for b in batches) for x, _y in batches]
    return memory.check_cycle_fits(
        model,
        batches,
        torch.optim.SGD(model.parameters(), lr=0.1),
        weights,
        options=accumlib.CycleOptions(),
        memory_budget=2**40,
        what="",
        advice="",
    ).peak


LARGE = [(X6[:32], Y6[:32]), (X6[32:64], Y6[32:64])]  # a last cycle of two batches of 32 (a padded tail, say)


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
    monkeypatch.setattr(memory, "check_cycle_fits", lambda *a, **k: traced.append(a[1]) or check(*a, **k))
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
    batches = [{"inputs": X6[i : i + 8], "labels": Y6[i : i + 8]} for i in range(0, 16, 8)]
    model, plain = OwnLoss(), linear()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    own = accumlib.CycleOptions(loss_fn=lambda output, batch: output["loss"])
    as_dicts = memory.check_cycle_fits(
        model,
        [(cycle.Inputs((), b), b) for b in batches],
        sgd(model),
        [0.5, 0.5],
        options=own,
        memory_budget=2**40,
        what="",
        advice="",
    )
    as_pairs = memory.check_cycle_fits(
        plain,
        [(b["inputs"], b["labels"]) for b in batches],
        sgd(plain),
        [0.5, 0.5],
        options=accumlib.CycleOptions(),
        memory_budget=2**40,
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
    planned = memory.measure_step(model, X6[:m], Y6[:m], optimizer=make(model.parameters()), accum_steps=k).peak
    history = accumlib.train(
        model, (X6, Y6), make(model.parameters()), micro_batch_size=m, accum_steps=k, measure_memory=True, device="cpu"
    )
    assert len(history) == 64 // (m * k) and [r.peak_memory_bytes for r in history] == [planned] * len(history)


class DictSamples(torch.utils.data.Dataset):
    """A map-style Dataset of dict samples (what a tokenised Hugging Face dataset gives)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return {"inputs": X6[i], "labels": Y6[i]}


def test_a_dataset_of_dict_samples_is_measured_cycle_by_cycle_under_the_budget():
    """Its samples are not two tensors, so no (x, y) step can be measured before the run: each cycle is traced as
    it comes, before it changes anything (it was refused before)."""
    model = OwnLoss()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    own = accumlib.CycleOptions(loss_fn=lambda output, batch: output["loss"])
    batches = [{"inputs": X6[i : i + 8], "labels": Y6[i : i + 8]} for i in (0, 8)]
    peak = memory.check_cycle_fits(
        model,
        [(cycle.Inputs((), b), b) for b in batches],
        sgd(model),
        [0.5, 0.5],
        options=own,
        memory_budget=2**40,
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
        return X6[i] + 0.1 * torch.randn(6), Y6[i]


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


# --- an exception raised in the user's code reaches the caller ------------------------------------------------

X48, Y48 = data.digits(48)


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
            (X48.flatten(1), Y48),
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
            (X48.flatten(1), Y48),
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=1,
            device="cpu",
            **{where: raising(plain)},
        )
    assert len(raised.value.history) == (1 if where == "on_step" else 0)


# --- no host synchronisation per micro-batch: the loop reads the device once per optimizer step ------------------
# Every read of a tensor's value on the host (`item`, `tolist`, `float()`, `bool()`, `int()`, use as an index) is
# counted with a TorchFunctionMode (accumlib.timing.HostReads, tested in test_timing.py). On a GPU each one makes the
# host wait until the device has caught up.


def reads_of_a_run(normalize, extras):
    """Train while recording the read count at every micro-batch and after every step."""
    if normalize == "count":
        X, y = data.token_sequences(72, seed=2)
        model = models.sequence_model()
        options = dict(loss_fn=models.token_loss_sum, loss_reduction="sum", count=data.count_tokens)
    else:
        X, y = data.digits(72, flat=True)
        model = models.mlp()
        options = {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if "scheduler" in extras:
        options["scheduler"] = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    if "plateau" in extras:
        options["scheduler"] = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    if "clipping" in extras:
        options["clip_grad_norm"] = 0.5
    if "unchecked" in extras:
        options["check_gradients"] = False
    if "bf16" in extras or "fp16" in extras:
        options["amp"] = "bf16" if "bf16" in extras else "fp16"
    loss_fn = options.pop("loss_fn", torch.nn.functional.cross_entropy)
    at_micro_batch, at_step = [], []

    def counting_loss(output, target):
        at_micro_batch.append(reads.count)
        return loss_fn(output, target)

    def on_step(record):
        at_step.append((reads.count, len(at_micro_batch), record.skipped))

    with HostReads() as reads:
        history = accumlib.train(
            model,
            (X, y),
            optimizer,
            micro_batch_size=4,
            accum_steps=5,
            epochs=2,
            normalize=normalize,
            loss_fn=counting_loss,
            device="cpu",
            on_step=on_step,
            **options,
        )
    return history, at_micro_batch, at_step


@pytest.mark.parametrize(
    "extras", [(), ("clipping", "scheduler"), ("bf16", "clipping", "plateau"), ("fp16",), ("unchecked",)]
)
@pytest.mark.parametrize("normalize", ["samples", "steps", "count"])
def test_one_read_per_optimizer_step_and_none_per_micro_batch(normalize, extras):
    history, at_micro_batch, at_step = reads_of_a_run(normalize, extras)
    assert len(history) == 8  # 72 samples / (4 x 5), 2 epochs: 3 full cycles and one of 12 samples each
    # before the first micro-batch: nothing, or the one read of the cycle's loss terms (normalize="count": the
    # counts are read a cycle at a time, before its first forward, so a long run starts at once)
    counted = normalize == "count"
    assert at_micro_batch[0] == counted
    first = 0
    reads_before = 0
    for reads_after, micro_batches_so_far, skipped in at_step:
        cycle = at_micro_batch[first:micro_batches_so_far]
        assert cycle == [cycle[0]] * len(cycle)  # no read between the micro-batches of a cycle
        # one read per step: loss and gradient norm together (the loss alone unchecked); a GradScaler's step reads
        # its own inf check; with normalize="count" one more, of the cycle's counts, before its first micro-batch
        assert cycle[0] - reads_before == counted
        assert reads_after - reads_before == (2 if "fp16" in extras and not skipped else 1) + counted
        first, reads_before = micro_batches_so_far, reads_after


# --- issue 19's silent overflow: a run whose every step is skipped raises ---------------------------------------


def nan_gradient(output, target):
    """A finite loss whose gradient is NaN on every step (sqrt's derivative at 0 is infinite, times 0): to a
    GradScaler, an overflow that no scale cures."""
    return nn.functional.cross_entropy(output, target) + torch.sqrt(output.sum() * 0)


@pytest.mark.parametrize("amp", [False, "fp16"], ids=["no-scaler", "grad-scaler"])
def test_persistent_skips_raise_naming_the_count_and_the_scale(amp):
    """240 steps' worth of data, every gradient non-finite: NonFiniteError after max_skipped_steps=50 skips (today's
    default), naming the count and, under a scaler, its scale; the 50 records travel with it."""
    model = bn_model()
    before = copy.deepcopy(model.state_dict())
    X, y = data.digits(40, flat=True)
    many = (X.repeat(48, 1), y.repeat(48))  # 1920 samples / 8 per step = 240 steps
    with pytest.raises(accumlib.NonFiniteError) as info:
        accumlib.train(
            model,
            many,
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=2,
            loss_fn=nan_gradient,
            amp=amp,
            device="cpu",
        )
    message = str(info.value)
    assert "50 optimizer steps in a row were skipped" in message and "max_skipped_steps=50" in message
    history = info.value.history
    assert len(history) == 50 and all(r.skipped for r in history)
    assert accumlib.parameter_gap(model, before) == 0.0  # no step was applied
    if amp:
        scale = 2.0**16 * 0.5**50  # the GradScaler's default initial scale, halved at each skip
        assert f"scale is now {scale:g}" in message


def test_a_few_skips_in_a_row_do_not_raise():
    calls = []

    def nan_at_first(output, target):  # the first 3 steps (6 micro-batches) NaN, then finite
        calls.append(1)
        loss = nn.functional.cross_entropy(output, target)
        return loss * math.nan if len(calls) <= 6 else loss

    model = bn_model()
    history = accumlib.train(
        model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nan_at_first, max_skipped_steps=4, **OPTIONS
    )
    assert [r.skipped for r in history] == [True, True, True, False, False]


# --- runs that stop and go on ----------------------------------------------------------------------------------
# A stopped, shuffled run resumed with `resume_from_step` gives the weights, the records and the sample order of the
# uninterrupted run, bit for bit (the same micro-batches in the same order through the same operations: nothing may
# differ, so the comparisons are exact). What the caller keeps: the model, optimizer, scheduler and scaler
# state_dict()s, and the number of steps taken (history[-1].step). Through a checkpoint file: test_checkpoint.py.


generator = torch.Generator().manual_seed(0)
X, Y = torch.randn(50, 6, generator=generator), torch.randint(0, 3, (50,), generator=generator)


STEPS_PER_EPOCH = 5  # 50 samples in cycles of 4 x 3 = 12: four of 12 and one of 2


def build(amp=False):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3) if amp else None
    return model, optimizer, scheduler, scaler


def seen_by(model):
    """Every micro-batch's first sample, as the model is called with it."""
    inputs = []
    model.register_forward_pre_hook(lambda module, args: inputs.append(args[0][0].clone()))
    return inputs


def state(model, optimizer, scheduler, scaler):
    return copy.deepcopy(
        [model.state_dict(), optimizer.state_dict(), scheduler.state_dict(), scaler.state_dict() if scaler else None]
    )


def restored(saved, amp):
    model, optimizer, scheduler, scaler = build(amp)
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    scheduler.load_state_dict(saved[2])
    if scaler:
        scaler.load_state_dict(saved[3])
    return model, optimizer, scheduler, scaler


@pytest.mark.parametrize("amp", [False, "fp16"], ids=["float32", "fp16-with-a-scaler"])
@pytest.mark.parametrize("stop", [3, STEPS_PER_EPOCH, 7])  # within epoch 0, at its end, within epoch 1
def test_a_resumed_shuffled_run_equals_the_uninterrupted_one(amp, stop):
    options = dict(micro_batch_size=4, accum_steps=3, epochs=3, seed=5, amp=amp, device="cpu")
    model, optimizer, scheduler, scaler = build(amp)
    inputs = seen_by(model)
    whole = accumlib.train(model, (X, Y), optimizer, scheduler=scheduler, scaler=scaler, **options)

    first = build(amp)
    first_inputs = seen_by(first[0])
    stopped = accumlib.train(
        first[0], (X, Y), first[1], scheduler=first[2], scaler=first[3], on_step=stop_at(stop), **options
    )
    assert stopped.stopped == "StopTraining" and stopped[-1].step == stop
    saved = state(*first)  # what a checkpoint holds
    second = restored(saved, amp)
    second_inputs = seen_by(second[0])
    resumed = accumlib.train(
        second[0],
        (X, Y),
        second[1],
        scheduler=second[2],
        scaler=second[3],
        resume_from_step=stopped[-1].step,
        **options,
    )

    assert accumlib.parameter_gap(second[0], model) == 0.0
    assert [r["step"] for r in stable_records(resumed)] == list(range(stop + 1, 3 * STEPS_PER_EPOCH + 1))
    assert stable_records(stopped) + stable_records(resumed) == stable_records(whole)
    assert all(torch.equal(a, b) for a, b in zip(first_inputs + second_inputs, inputs, strict=True))
    if amp:
        assert second[3].get_scale() == scaler.get_scale()


def test_without_resume_the_second_run_replays_epoch_0():
    """What resume_from_step fixes: a second call starts the sample order again (the 6.6e-2 of issue 19)."""
    options = dict(micro_batch_size=4, accum_steps=3, epochs=2, seed=5, device="cpu")
    model, optimizer, scheduler, _ = build()
    accumlib.train(model, (X, Y), optimizer, scheduler=scheduler, **options)
    first = build()
    accumlib.train(first[0], (X, Y), first[1], scheduler=first[2], on_step=stop_at(3), **options)
    accumlib.train(first[0], (X, Y), first[1], scheduler=first[2], **options)  # no resume_from_step
    assert accumlib.parameter_gap(first[0], model) > 1e-4


def loader(seed):
    """The caller's DataLoader, shuffled by a seeded generator: built again the same way when resuming."""
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, Y), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )


def test_a_resumed_run_over_the_caller_s_dataloader_equals_the_uninterrupted_one():
    model, optimizer, scheduler, _ = build()
    whole = accumlib.train(model, loader(7), optimizer, scheduler=scheduler, accum_steps=3, epochs=3)
    first = build()
    stopped = accumlib.train(
        first[0], loader(7), first[1], scheduler=first[2], accum_steps=3, epochs=3, on_step=stop_at(8)
    )
    second = restored(state(*first), False)
    resumed = accumlib.train(
        second[0], loader(7), second[1], scheduler=second[2], accum_steps=3, epochs=3, resume_from_step=8
    )
    assert accumlib.parameter_gap(second[0], model) == 0.0
    assert stable_records(stopped) + stable_records(resumed) == stable_records(whole)


def test_max_steps_and_a_one_cycle_lr_sized_to_it_resume_too():
    def one_cycle(optimizer):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=12)

    options = dict(micro_batch_size=4, accum_steps=3, max_steps=12, seed=2)  # epochs: as many as 12 steps take
    model, optimizer, _, _ = build()
    whole = accumlib.train(model, (X, Y), optimizer, scheduler=one_cycle(optimizer), **options)
    assert len(whole) == 12 and whole[-1].epoch == 2  # 5 + 5 + 2 steps
    first = build()
    first_scheduler = one_cycle(first[1])
    accumlib.train(first[0], (X, Y), first[1], scheduler=first_scheduler, on_step=stop_at(4), **options)
    saved = copy.deepcopy([first[0].state_dict(), first[1].state_dict(), first_scheduler.state_dict()])
    second = build()
    second_scheduler = one_cycle(second[1])  # built first, then every state loaded (PyTorch's order)
    second[0].load_state_dict(saved[0])
    second[1].load_state_dict(saved[1])
    second_scheduler.load_state_dict(saved[2])
    resumed = accumlib.train(second[0], (X, Y), second[1], scheduler=second_scheduler, resume_from_step=4, **options)
    assert len(resumed) == 8
    assert accumlib.parameter_gap(second[0], model) == 0.0


@pytest.mark.parametrize(
    "options,error,names",
    [
        (dict(resume_from_step=10), ValueError, ["resume_from_step=10", "10 optimizer steps", "0 to 9"]),
        (dict(resume_from_step=-1), ValueError, ["resume_from_step", "-1"]),
        (dict(resume_from_step=2.0), TypeError, ["resume_from_step", "2.0"]),
        (dict(max_steps=0), ValueError, ["max_steps", "0"]),
        (dict(max_steps=True), TypeError, ["max_steps", "True"]),
        (dict(max_steps=4, resume_from_step=4), ValueError, ["resume_from_step=4", "4 optimizer steps"]),
    ],
)
def test_bad_resumes_are_refused_before_anything_changes(options, error, names):
    model, optimizer, _, _ = build()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error) as info:
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=3, epochs=2, **options)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert accumlib.parameter_gap(model, before) == 0.0


def test_a_resume_past_the_end_of_a_loader_without_len_is_refused_before_anything_changes():
    model, optimizer, _, _ = build()
    before = copy.deepcopy(model.state_dict())
    stream = [(X[i : i + 4], Y[i : i + 4]) for i in range(0, 50, 4)]  # 13 batches: 5 steps of 3
    with pytest.raises(ValueError, match="resume_from_step=9 is past the end of the run: data gives 5 optimizer"):
        accumlib.train(model, iter(stream), optimizer, accum_steps=3, resume_from_step=9)
    assert accumlib.parameter_gap(model, before) == 0.0
