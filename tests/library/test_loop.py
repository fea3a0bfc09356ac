"""accumlib.loop (train) and the cycle it drives: exact equivalence, once-per-step work (one host read per step, none
per micro-batch), NaN and persistent skips, interruption, runs resumed with resume_from_step, the user's exceptions
as they were raised, and the valid set-ups that used to give silently wrong results. Bad input: test_run_checks.py;
the gaps: test_gaps.py; Ctrl-C over whole runs: test_interrupts.py."""

import copy
import dataclasses
import math

import pytest
import torch
from found import DIGITS, OPTIONS, bn_model, stop_at
from torch import nn

import accumlib
from accumlib.timing import HostReads
from builders import data, models
from states import stable_records

X64, Y64 = data.digits(flat=True, dtype=torch.float64)


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


class Counting(torch.optim.lr_scheduler.StepLR):
    calls = 0

    def step(self, *args, **kwargs):
        Counting.calls += 1
        return super().step(*args, **kwargs)


def test_scheduler_and_clipping_run_once_per_optimizer_step(monkeypatch):
    clip_calls = []
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: clip_calls.append(1) or real_clip(*a, **k))
    model = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = Counting(opt, step_size=1, gamma=0.9)
    Counting.calls = 0  # the constructor's own initial step() is not ours
    history = accumlib.train(
        model,
        (X64[:100], Y64[:100]),
        opt,
        micro_batch_size=4,
        accum_steps=5,
        epochs=2,
        scheduler=scheduler,
        clip_grad_norm=0.1,
    )
    assert len(history) == 10  # 100 / 20 per epoch, 2 epochs
    assert Counting.calls == 10 and len(clip_calls) == 10
    assert [r.lr for r in history] == pytest.approx([0.5 * 0.9**i for i in range(10)])
    assert all(r.grad_norm > 0.1 for r in history)  # the recorded norm is before clipping, so clipping did act


def test_clipping_acts_on_the_accumulated_gradient():
    """Clipping once after accumulation equals clipping the full-batch gradient."""
    a, _ = run(4, 5, 100, clip_grad_norm=0.05)
    b, _ = run(20, 1, 100, clip_grad_norm=0.05)
    assert max_param_diff(a, b) <= 1e-10


class CountingScaler(torch.amp.GradScaler):
    def __init__(self):
        super().__init__("cpu")
        self.calls = {"unscale_": 0, "step": 0, "update": 0, "scale": 0}

    def scale(self, outputs):
        self.calls["scale"] += 1
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls["unscale_"] += 1
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls["step"] += 1
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


def test_amp_scaler_unscale_step_update_once_per_cycle():
    X, y = data.digits(96, flat=True)
    model = models.mlp()
    scaler = CountingScaler()
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=8,
        accum_steps=4,
        amp="fp16",
        scaler=scaler,
        device="cpu",
    )
    assert len(history) == 3
    assert scaler.calls == {"scale": 12, "unscale_": 3, "step": 3, "update": 3}
    assert all(math.isfinite(r.loss) for r in history)


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


def nan_on_label_99(out, target):
    """cross-entropy, but NaN for a micro-batch holding the planted label 99."""
    value = torch.nn.functional.cross_entropy(out, target.clamp(max=9))
    return value * float("nan") if (target == 99).any() else value


def test_nan_cycle_is_skipped_and_training_continues():
    X, y = X64[:60].clone(), Y64[:60].clone()
    y[7] = 99  # a planted bad label makes one cycle's loss NaN
    model = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    weights_seen = []
    history = accumlib.train(
        model,
        (X, y),
        opt,
        micro_batch_size=4,
        accum_steps=3,
        shuffle=False,
        loss_fn=nan_on_label_99,
        on_step=lambda r: weights_seen.append(model[0].weight.detach().clone()),
    )
    assert [r.skipped for r in history] == [True, False, False, False, False]
    assert math.isnan(history[0].loss)
    assert torch.equal(weights_seen[0], models.mlp(dtype=torch.float64)[0].weight)  # untouched by the bad cycle
    assert not torch.equal(weights_seen[1], weights_seen[0])
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_nan_can_raise_instead():
    X, y = X64[:60].clone(), Y64[:60].clone()
    y[30] = 99
    model = models.mlp(dtype=torch.float64)
    with pytest.raises(accumlib.NonFiniteError, match="non-finite"):
        accumlib.train(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            shuffle=False,
            loss_fn=nan_on_label_99,
            on_nonfinite="raise",
        )
    assert all(p.grad is None for p in model.parameters())


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


def test_a_nan_gradient_under_a_finite_loss_is_skipped_by_default_and_reaches_the_weights_unchecked():
    history, weights = nan_gradient_run()
    assert math.isfinite(history[1].loss) and math.isnan(history[1].grad_norm)
    assert [r.skipped for r in history] == [False, True]
    assert torch.equal(weights[1], weights[0])  # the bad step left the weights as they were
    with pytest.raises(accumlib.NonFiniteError, match="non-finite"):
        nan_gradient_run(on_nonfinite="raise")
    unchecked, weights = nan_gradient_run(check_gradients=False)  # the loss alone is checked: the NaN gets through
    assert [(r.skipped, r.grad_norm) for r in unchecked] == [(False, None), (False, None)]
    assert torch.isnan(weights[1]).any() and torch.isfinite(weights[0]).all()
    assert [r.loss for r in unchecked] == [r.loss for r in history]  # the same losses, read without the norm
    clipped, weights = nan_gradient_run(check_gradients=False, clip_grad_norm=1.0)  # clipping computes the norm
    assert [r.skipped for r in clipped] == [False, True] and math.isnan(clipped[1].grad_norm)
    assert torch.equal(weights[1], weights[0])


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


def test_the_cycle_function_takes_exactly_one_full_batch_step():
    """accumulate_and_step over 4 micro-batches weighted 1/4 = one hand-written step on the whole batch."""
    x, y = X64[:64], Y64[:64]
    full = models.mlp(dtype=torch.float64)
    optimizer = torch.optim.SGD(full.parameters(), lr=0.5)
    loss = torch.nn.functional.cross_entropy(full(x), y)
    loss.backward()
    norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in full.parameters()])).item()
    optimizer.step()
    model = models.mlp(dtype=torch.float64)
    result = accumlib.accumulate_and_step(
        model, list(zip(x.split(16), y.split(16), strict=True)), torch.optim.SGD(model.parameters(), lr=0.5), [0.25] * 4
    )
    assert max_param_diff(model, full) <= 1e-14
    assert result.loss == pytest.approx(loss.item(), abs=1e-14) and result.grad_norm == pytest.approx(norm, rel=1e-12)
    assert (result.lr, result.skipped) == (0.5, False)
    with pytest.raises(ValueError, match="loss_weights has 3 values but micro_batches has 4"):
        accumlib.accumulate_and_step(
            model,
            list(zip(x.split(16), y.split(16), strict=True)),
            torch.optim.SGD(model.parameters(), lr=0.5),
            [1 / 3] * 3,
        )


def test_norms_on_another_device_than_the_loss_are_moved_before_the_one_read(monkeypatch):
    """A model split over devices: stacking the loss with the norms fails; they are moved to the loss's device and the
    loss, norm and step are those of a one-device run. (A CPU has one device: the first stack raises as it would.)"""
    x, y = X64[:32], Y64[:32]
    results, stacks = {}, []
    real_stack = torch.stack

    def stack_on_one_device_only(tensors, *args, **kwargs):
        stacks.append(len(tensors))
        if len(stacks) == 1:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices")
        return real_stack(tensors, *args, **kwargs)

    for split in (False, True):
        if split:
            monkeypatch.setattr(torch, "stack", stack_on_one_device_only)
        model = models.mlp(dtype=torch.float64)
        result = accumlib.accumulate_and_step(
            model,
            list(zip(x.split(8), y.split(8), strict=True)),
            torch.optim.SGD(model.parameters(), lr=0.5),
            [0.25] * 4,
        )
        results[split] = (result, [p.detach().clone() for p in model.parameters()])
    assert len(stacks) == 2 and stacks[0] == stacks[1] > 1  # the loss and the norms, tried, then moved and stacked
    assert results[True][0] == results[False][0] and not results[True][0].skipped
    assert all(torch.equal(a, b) for a, b in zip(results[True][1], results[False][1], strict=True))


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


def test_raise_with_a_grad_scaler_raises_on_a_nonfinite_loss():
    X, y = X64[:60].float(), Y64[:60].clone()
    y[30] = 99
    model = models.mlp()
    with pytest.raises(accumlib.NonFiniteError, match="non-finite loss") as info:
        accumlib.train(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            shuffle=False,
            loss_fn=nan_on_label_99,
            on_nonfinite="raise",
            amp="fp16",
            device="cpu",
        )
    assert [r.skipped for r in info.value.history] == [False, False]  # the records so far travel with the error


def test_a_grad_scaler_overflow_is_skipped_and_not_raised():
    """With a scaler, inf gradients are its routine: the step is skipped and the scale lowered, even with "raise"."""
    X, y = data.digits(192, flat=True)
    model = models.mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30)
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=8,
        accum_steps=2,
        amp="fp16",
        scaler=scaler,
        on_nonfinite="raise",
        device="cpu",
    )
    skipped = [r.skipped for r in history]
    assert skipped[0] and not skipped[-1] and skipped == sorted(skipped, reverse=True)
    assert scaler.get_scale() == 2.0**30 * 0.5 ** sum(skipped)


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


def test_an_optimizer_parameter_without_a_gradient_is_left_alone_and_counts_nothing_in_the_norm():
    """A parameter the loss does not depend on (no .grad) beside the model's: untouched, and the norm is the
    model's alone. (An optimizer holding none of the model's parameters is refused:
    tests/library/test_cycle_checks.py.)"""
    model = models.mlp(dtype=torch.float64)
    unused = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    twin = copy.deepcopy(model)
    alone = accumlib.accumulate_and_step(twin, [(X64[:8], Y64[:8])], torch.optim.SGD(twin.parameters(), lr=0.5), [1.0])
    result = accumlib.accumulate_and_step(
        model, [(X64[:8], Y64[:8])], torch.optim.SGD([unused, *model.parameters()], lr=0.5), [1.0]
    )
    assert (result.grad_norm, result.skipped) == (alone.grad_norm, False)
    assert torch.equal(unused, torch.ones(3, dtype=torch.float64)) and unused.grad is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("weights", [[0.1, 1 / 3, 0.7], [0.0, 2.0, 1 / 3]], ids=["shares", "padding-and-two"])
def test_the_cycles_seeded_backward_gives_the_six_line_recipes_gradient_bit_for_bit(dtype, weights):
    """The cycle backpropagates micro-batch i's loss with its gradient seeded with w_i (no multiply in the graph)
    and sums the weighted losses in one op per micro-batch; backward() must add exactly w_i * grad(loss_i) into
    .grad, as (loss_i * w_i).backward() does. Weights that are not powers of two (so a different rounding would
    show), 0 (a padding micro-batch) and 2 (a DDP share), in float32, float64 and bfloat16: the step from either
    gradient is equal bit for bit; the recorded loss is the sum of the weighted losses, to the dtype's rounding
    (its machine epsilon per operation, 6 of them)."""
    x, y = data.digits(48)
    x = x.to(dtype)
    micro_batches = [(x[:8], y[:8]), (x[8:24], y[8:24]), (x[24:48], y[24:48])]
    model, reference = models.cnn(seed=3).to(dtype), models.cnn(seed=3).to(dtype)
    result = accumlib.accumulate_and_step(model, micro_batches, torch.optim.SGD(model.parameters(), lr=1.0), weights)
    losses = []
    for (xs, ys), w in zip(micro_batches, weights, strict=True):
        weighted = torch.nn.functional.cross_entropy(reference(xs), ys) * w
        losses.append(weighted.item())
        weighted.backward()
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))
    assert result.loss == pytest.approx(math.fsum(losses), rel=6 * torch.finfo(dtype).eps)


def identical(a, b) -> bool:
    """Two nested structures (state dicts) equal, every tensor bit for bit (its dtype and shape too)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(identical, a, b))
    return a == b


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


def test_a_disabled_grad_scaler_is_no_scaler_in_accumulate_and_step():
    """A NaN gradient under a finite loss raises with on_nonfinite="raise" (a real scaler would take it for an
    overflow and skip), the model and .grad left as they were; a finite cycle steps as without a scaler."""
    x, y = X64[:16].clone(), Y64[:16].clone()
    y[5] = 99
    micro_batches = list(zip(x.split(8), y.split(8), strict=True))
    model = models.mlp(dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(accumlib.NonFiniteError, match="non-finite"):
        accumlib.accumulate_and_step(
            model,
            micro_batches,
            optimizer,
            [0.5, 0.5],
            loss_fn=nan_gradient_on_label_99,
            scaler=torch.amp.GradScaler("cpu", enabled=False),
            on_nonfinite="raise",
        )
    assert identical(before, model.state_dict()) and all(p.grad is None for p in model.parameters())
    y[5] = 0
    reference = copy.deepcopy(model)
    accumlib.accumulate_and_step(
        reference,
        list(zip(x.split(8), y.split(8), strict=True)),
        torch.optim.SGD(reference.parameters(), lr=0.5),
        [0.5, 0.5],
    )
    result = accumlib.accumulate_and_step(
        model,
        list(zip(x.split(8), y.split(8), strict=True)),
        optimizer,
        [0.5, 0.5],
        scaler=torch.amp.GradScaler("cpu", enabled=False),
    )
    assert not result.skipped and max_param_diff(model, reference) == 0


class CountingSGD(torch.optim.SGD):
    """An SGD whose zero_grad (as a sharded or fused optimizer's override would) notes each call's set_to_none."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.calls = [*getattr(self, "calls", []), set_to_none]
        super().zero_grad(set_to_none)


def test_the_optimizer_s_own_zero_grad_runs_once_per_step_with_set_to_none():
    """5 cycles, the second holding a NaN (skipped: the model left as found, no zeroing): 4 steps, 4 calls, each
    set_to_none=True, in train; one call per accumulate_and_step step; the weights those of plain SGD."""
    X, y = X64[:60].clone(), Y64[:60].clone()
    y[13] = 99  # the second cycle (micro-batches of 4, accum_steps 3)
    model, plain = models.mlp(dtype=torch.float64), models.mlp(dtype=torch.float64)
    optimizer = CountingSGD(model.parameters(), lr=0.5)
    history = accumlib.train(
        model, (X, y), optimizer, micro_batch_size=4, accum_steps=3, shuffle=False, loss_fn=nan_on_label_99
    )
    accumlib.train(
        plain,
        (X, y),
        torch.optim.SGD(plain.parameters(), lr=0.5),
        micro_batch_size=4,
        accum_steps=3,
        shuffle=False,
        loss_fn=nan_on_label_99,
    )
    assert [r.skipped for r in history] == [False, True, False, False, False]
    assert optimizer.calls == [True] * 4 and max_param_diff(model, plain) == 0
    optimizer.calls = []
    accumlib.accumulate_and_step(model, list(zip(X[:8].split(4), Y64[:8].split(4), strict=True)), optimizer, [0.5, 0.5])
    assert optimizer.calls == [True] and all(p.grad is None for p in model.parameters())


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


def test_accumulate_and_step_runs_no_micro_batch_of_weight_0():
    """A weight-0 micro-batch whose loss is NaN does not poison the cycle (it is not run: the step on the others,
    bit for bit); all weights 0: nothing run or changed, the result says empty."""
    x, y = X64[:12], Y64[:12]
    micro_batches = list(zip(x.split(4), y.split(4), strict=True))
    model, reference = models.mlp(dtype=torch.float64), models.mlp(dtype=torch.float64)
    calls = []

    def loss_fn(out, target):
        calls.append(len(target))
        return torch.nn.functional.cross_entropy(out, target) * (math.nan if target is micro_batches[1][1] else 1.0)

    result = accumlib.accumulate_and_step(
        model, micro_batches, torch.optim.SGD(model.parameters(), lr=0.5), [0.5, 0, 0.5], loss_fn=loss_fn
    )
    accumlib.accumulate_and_step(
        reference, [micro_batches[0], micro_batches[2]], torch.optim.SGD(reference.parameters(), lr=0.5), [0.5, 0.5]
    )
    assert not result.skipped and not result.empty and max_param_diff(model, reference) == 0
    before, calls[:] = copy.deepcopy(model.state_dict()), []
    optimizer = torch.optim.Adam(model.parameters())
    result = accumlib.accumulate_and_step(model, micro_batches, optimizer, [0, 0.0, 0], loss_fn=loss_fn)
    assert (result.empty, result.skipped, result.grad_norm, calls, optimizer.state) == (True, False, None, [], {})
    assert math.isnan(result.loss) and identical(before, model.state_dict())


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
