"""accumlib.train and gradient_gap: exact equivalence, once-per-step work, NaN, interruption, bad input."""
import math

import pytest
import torch

import accumlib
from accumlib import data, models

X64, Y64 = data.digits(flat=True, dtype=torch.float64)


def run(m, k, n, *, epochs=2, lr=0.5, normalize="samples", **kwargs):
    model = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    history = accumlib.train(model, (X64[:n], Y64[:n]), opt, micro_batch_size=m, accum_steps=k, epochs=epochs,
                             normalize=normalize, **kwargs)
    return model, history


max_param_diff = accumlib.parameter_gap


def test_parameter_gap_compares_every_tensor_and_refuses_other_layouts():
    a, b = models.mlp(dtype=torch.float64), models.mlp(dtype=torch.float64)
    assert accumlib.parameter_gap(a, b) == 0
    with torch.no_grad():
        b[2].bias[3] += 0.25
    assert accumlib.parameter_gap(a, b) == 0.25
    assert accumlib.parameter_gap(a.state_dict(), b) == 0.25
    with pytest.raises(ValueError, match="differ in layout"):
        accumlib.parameter_gap(a, models.cnn())


@pytest.mark.parametrize("m,k", [(4, 3), (3, 4), (1, 8), (5, 2), (16, 4)])
@pytest.mark.parametrize("n", [480, 500, 337])  # 480 divides every effective batch here; 500 and 337 do not all
def test_accumulation_equals_full_batch_in_float64(m, k, n):
    accumulated, h1 = run(m, k, n)
    full, h2 = run(m * k, 1, n)
    assert max_param_diff(accumulated, full) <= 1e-10
    assert [r.samples for r in h1] == [r.samples for r in h2]
    assert h1[-1].samples_seen == 2 * n
    for a, b in zip(h1, h2):
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
    divisible_classic, _ = run(4, 3, 48, epochs=1, normalize="steps")  # no incomplete cycle: the classic recipe is exact
    divisible_full, _ = run(12, 1, 48, epochs=1)
    assert max_param_diff(divisible_classic, divisible_full) <= 1e-10


def test_no_gradient_leaks_into_the_next_epoch():
    model, _ = run(4, 3, 50, epochs=3)
    assert all(p.grad is None for p in model.parameters())
    one_by_one = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(one_by_one.parameters(), lr=0.5)
    accumlib.train(one_by_one, (X64[:50], Y64[:50]), opt, micro_batch_size=12, accum_steps=1, epochs=3)
    assert max_param_diff(model, one_by_one) <= 1e-10


def test_gradient_gap_proves_the_trick_and_leaves_the_model_alone():
    model = models.mlp(dtype=torch.float64)
    model[0].weight.grad = torch.ones_like(model[0].weight)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = X64[:64], Y64[:64]
    loss = torch.nn.functional.cross_entropy
    assert accumlib.gradient_gap(model, loss, x, y, 4) < 1e-14
    assert accumlib.gradient_gap(model, loss, x[:62], y[:62], 4) < 1e-14  # chunks of 16, 16, 16, 14
    without_division = accumlib.gradient_gap(model, loss, x, y, 4, normalize="none")
    full_grad_max = max(g.abs().max().item() for g in torch.autograd.grad(loss(model(x), y), model.parameters()))
    assert without_division == pytest.approx(3 * full_grad_max, rel=1e-9)  # 4x the gradient: off by 3x
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


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
    history = accumlib.train(model, (X64[:100], Y64[:100]), opt, micro_batch_size=4, accum_steps=5, epochs=2,
                             scheduler=scheduler, clip_grad_norm=0.1)
    assert len(history) == 10  # 100 / 20 per epoch, 2 epochs
    assert Counting.calls == 10 and len(clip_calls) == 10
    assert [r.lr for r in history] == pytest.approx([0.5 * 0.9 ** i for i in range(10)])
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
    history = accumlib.train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.1), micro_batch_size=8,
                             accum_steps=4, amp="fp16", scaler=scaler, device="cpu")
    assert len(history) == 3
    assert scaler.calls == {"scale": 12, "unscale_": 3, "step": 3, "update": 3}
    assert all(math.isfinite(r.loss) for r in history)


def test_bf16_autocast_on_cpu_trains():
    X, y = data.digits(256, flat=True)
    model = models.mlp()
    history = accumlib.train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.5), micro_batch_size=16,
                             accum_steps=2, amp=True, epochs=3, device="cpu")
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
    history = accumlib.train(model, (X, y), opt, micro_batch_size=4, accum_steps=3, shuffle=False,
                             loss_fn=nan_on_label_99,
                             on_step=lambda r: weights_seen.append(model[0].weight.detach().clone()))
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
        accumlib.train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.5), micro_batch_size=4,
                       accum_steps=3, shuffle=False, loss_fn=nan_on_label_99, on_nonfinite="raise")
    assert all(p.grad is None for p in model.parameters())


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
    history = accumlib.train(model, (X64[:48], Y64[:48]), opt, micro_batch_size=4, accum_steps=4,
                             loss_fn=interrupting_loss, shuffle=False)
    assert len(history) == 1 and history.stopped == "KeyboardInterrupt"
    one_step = models.mlp(dtype=torch.float64)
    accumlib.train(one_step, (X64[:16], Y64[:16]), torch.optim.SGD(one_step.parameters(), lr=0.5),
                   micro_batch_size=16, accum_steps=1, shuffle=False)
    assert max_param_diff(model, one_step) <= 1e-12
    assert all(p.grad is None for p in model.parameters())


def test_same_seed_gives_bit_identical_history_and_other_seed_does_not():
    X, y = data.digits(300)
    histories = []
    for seed in (3, 3, 4):
        model = models.cnn()
        h = accumlib.train(model, (X, y), torch.optim.Adam(model.parameters()), micro_batch_size=8, accum_steps=4,
                           seed=seed, epochs=2)
        histories.append(h.deterministic())
    assert histories[0] == histories[1]
    assert histories[0] != histories[2]


def test_dataset_input_matches_tensor_tuple():
    a, _ = run(4, 3, 50)
    model = models.mlp(dtype=torch.float64)
    accumlib.train(model, torch.utils.data.TensorDataset(X64[:50], Y64[:50]),
                   torch.optim.SGD(model.parameters(), lr=0.5), micro_batch_size=4, accum_steps=3, epochs=2)
    assert max_param_diff(a, model) == 0


def test_history_columns_for_plotting():
    _, history = run(4, 3, 50, epochs=1)
    columns = history.columns()
    assert columns["step"] == [1, 2, 3, 4, 5]
    assert columns["samples_seen"] == [12, 24, 36, 48, 50]
    assert all(isinstance(b, int) and b > 0 for b in columns["peak_memory_bytes"])
    assert columns["samples_per_second"] == [r.samples / r.seconds for r in history]
    assert all(s > 0 for s in columns["seconds"])


def test_token_count_normalisation_equals_the_full_batch():
    X, y = data.token_sequences(48, seed=1)

    def fit(m, k):
        model = models.sequence_model(dtype=torch.float64)
        accumlib.train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.5), micro_batch_size=m,
                       accum_steps=k, epochs=2, loss_fn=models.token_loss_sum, normalize="count",
                       count=data.count_tokens)
        return model

    def fit_mean_of_means(m, k):
        model = models.sequence_model(dtype=torch.float64)
        accumlib.train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.5), micro_batch_size=m,
                       accum_steps=k, epochs=2, loss_fn=models.token_loss_mean)
        return model

    full = fit(20, 1)
    assert max_param_diff(fit(4, 5), full) <= 1e-10
    assert max_param_diff(fit(3, 7), fit(21, 1)) <= 1e-10
    # averaging each micro-batch's mean loss is not the full batch's token mean
    assert max_param_diff(fit_mean_of_means(4, 5), full) > 1e-4
    # ... while the count-normalised full batch is the token mean of the batch
    assert max_param_diff(fit_mean_of_means(20, 1), full) <= 1e-10


@pytest.mark.parametrize("name", ["micro_batch_size", "accum_steps"])
@pytest.mark.parametrize("bad,error", [(True, TypeError), (2.0, TypeError), ("4", TypeError), (0, ValueError),
                                       (-3, ValueError)])
def test_bad_counts_name_parameter_value_and_range(name, bad, error):
    model = models.mlp(dtype=torch.float64)
    before = [p.detach().clone() for p in model.parameters()]
    kwargs = {"micro_batch_size": 4, "accum_steps": 2, name: bad}
    with pytest.raises(error) as info:
        accumlib.train(model, (X64[:20], Y64[:20]), torch.optim.SGD(model.parameters(), lr=0.5), **kwargs)
    message = str(info.value)
    assert name in message and repr(bad) in message and "positive integer" in message
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bad_data_optimizer_and_loss():
    model = models.mlp(dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="empty"):
        accumlib.train(model, (X64[:0], Y64[:0]), opt, micro_batch_size=1, accum_steps=1)
    with pytest.raises(ValueError, match="micro_batch_size=32 is larger than the dataset \\(20 samples\\); valid range: 1 to 20"):
        accumlib.train(model, (X64[:20], Y64[:20]), opt, micro_batch_size=32, accum_steps=1)
    with pytest.raises(ValueError, match="X has 20 samples but y has 19"):
        accumlib.train(model, (X64[:20], Y64[:19]), opt, micro_batch_size=4, accum_steps=1)
    other = torch.optim.SGD(models.mlp(dtype=torch.float64).parameters(), lr=0.5)
    with pytest.raises(ValueError, match="optimizer holds none of the model's parameters"):
        accumlib.train(model, (X64[:20], Y64[:20]), other, micro_batch_size=4, accum_steps=1)
    per_sample = lambda o, t: torch.nn.functional.cross_entropy(o, t, reduction="none")
    with pytest.raises(ValueError, match="loss_fn must return a scalar, got a tensor of shape \\(4,\\)"):
        accumlib.train(model, (X64[:20], Y64[:20]), opt, micro_batch_size=4, accum_steps=2, loss_fn=per_sample)
    with pytest.raises(TypeError, match="data must be"):
        accumlib.train(model, [X64[:20]], opt, micro_batch_size=4, accum_steps=1)
    with pytest.raises(ValueError, match="normalize must be one of"):
        accumlib.train(model, (X64[:20], Y64[:20]), opt, micro_batch_size=4, accum_steps=1, normalize="tokens")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
