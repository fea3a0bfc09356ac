"""accumlib.memory: the physics of peak memory, fit_batch, and OutOfMemory under a simulated card."""
import pytest
import torch

import accumlib
from accumlib import data, memory, models

X, Y = data.digits(256)
XF, YF = data.digits(256, flat=True)


def test_activation_bytes_are_proportional_to_micro_batch_size():
    per_sample = [memory.measure_step(models.cnn(), X[:m], Y[:m]).activations / m for m in (8, 16, 32, 64, 128)]
    assert max(per_sample) / min(per_sample) < 1.05


def test_weights_gradients_and_state_do_not_depend_on_micro_batch_or_accum_steps():
    net = models.cnn()
    adam = torch.optim.Adam(net.parameters())
    reports = {(m, k): memory.measure_step(net, X[:m], Y[:m], optimizer=adam, accum_steps=k)
               for m, k in [(8, 1), (64, 1), (8, 8)]}
    full_gradient = 4 * sum(p.numel() for p in net.parameters())
    for (m, k), r in reports.items():
        assert r.parameters == full_gradient
        assert r.optimizer_state == 2 * full_gradient + 4 * len(list(net.parameters()))  # exp_avg, exp_avg_sq, step
        assert 0 < r.gradients <= full_gradient  # at the peak, never more than one gradient
    assert reports[8, 8].gradients == full_gradient  # accumulating keeps the whole gradient alive through the cycle
    assert net.parameters().__next__().grad is None and not adam.state  # the real model and optimizer untouched


def test_peak_of_accumulation_is_that_of_one_micro_batch_not_the_effective_batch():
    net = models.cnn()
    small, accumulated, big = (memory.measure_step(net, X[:m], Y[:m], accum_steps=k) for m, k in [(16, 1), (16, 8), (128, 1)])
    assert accumulated.peak <= 1.1 * small.peak
    assert big.peak > 2.5 * accumulated.peak


def test_when_weights_and_adam_state_dominate_accumulation_barely_helps():
    wide = models.wide_mlp()
    adam = torch.optim.Adam(wide.parameters())
    one = memory.measure_step(wide, XF[:16], YF[:16], optimizer=adam, accum_steps=8)
    full = memory.measure_step(wide, XF[:128], YF[:128], optimizer=adam)
    assert one.peak > 0.95 * full.peak  # saving under 5% of the peak
    assert one.activations < 0.01 * one.peak
    assert one.parameters + one.gradients + one.optimizer_state > 0.6 * one.peak  # the rest: Adam's temporaries


def test_cpu_measurement_is_deterministic_and_fake_mode_agrees_without_computing():
    net = models.cnn(norm="batch")
    a = memory.measure_step(net, X[:32], Y[:32])
    b = memory.measure_step(net, X[:32], Y[:32])
    fake = memory.measure_step(net, X[:32], Y[:32], fake=True)
    assert a == b
    assert (fake.peak, fake.activations, fake.parameters) == (a.peak, a.activations, a.parameters)
    assert a.method == memory.TRACKER and fake.method == memory.FAKE
    assert fake.categories() == a.categories()


@pytest.mark.parametrize("m,k", [(1, 1), (1, 4), (8, 1), (64, 4)])
def test_categories_are_what_was_alive_at_the_peak_and_add_up_to_it(m, k):
    r = memory.measure_step(models.cnn(norm="batch"), X[:m], Y[:m], optimizer=torch.optim.Adam(models.cnn().parameters()),
                            accum_steps=k)
    assert all(value >= 0 for value in r.categories().values())
    assert sum(r.categories().values()) == r.peak  # the tracker's own peak, not a sum by definition


def test_history_records_carry_the_cpu_peak():
    net = models.cnn()
    h = accumlib.train(net, (X[:100], Y[:100]), torch.optim.SGD(net.parameters(), lr=0.1), micro_batch_size=8,
                       accum_steps=4, measure_memory=True)
    peaks = [r.peak_memory_bytes for r in h]
    assert peaks[0] == peaks[1] == peaks[2] > peaks[3] > 0  # the last cycle (4 samples) is smaller
    big = models.cnn()
    h_big = accumlib.train(big, (X[:100], Y[:100]), torch.optim.SGD(big.parameters(), lr=0.1), micro_batch_size=32,
                           accum_steps=1, measure_memory=True)
    assert h_big[0].peak_memory_bytes > 1.5 * peaks[0]


def test_fit_batch_finds_the_largest_fitting_micro_batch():
    net = models.cnn()
    budget = memory.measure_step(net, X[:40], Y[:40], fake=True).peak
    plan = memory.fit_batch(net, (X[:1], Y[:1]), 256, budget)
    assert plan.largest_fitting == 40
    assert (plan.micro_batch_size, plan.accum_steps) == (32, 8)
    assert plan.peak_bytes <= budget
    with pytest.raises(accumlib.OutOfMemory, match="even one sample needs"):
        memory.fit_batch(net, (X[:1], Y[:1]), 256, 1000)


def test_training_over_budget_raises_before_any_change_and_a_smaller_micro_batch_works():
    net = models.cnn()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    budget = memory.measure_step(net, X[:16], Y[:16], accum_steps=4, fake=True).peak
    with pytest.raises(accumlib.OutOfMemory) as info:
        accumlib.train(net, (X, Y), opt, micro_batch_size=64, accum_steps=1, memory_budget=budget)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert info.value.available_bytes == budget and info.value.needed_bytes > budget
    assert f"{budget:,} bytes" in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    history = accumlib.train(net, (X, Y), opt, micro_batch_size=16, accum_steps=4, memory_budget=budget,
                             measure_memory=True)
    assert len(history) == 4
    # the loop's own bookkeeping (a loss accumulator, scalar shares) adds a few bytes to the step's estimate
    assert all(budget <= r.peak_memory_bytes <= budget + 64 for r in history)


def test_time_config_reports_median_step_time():
    report = accumlib.time_config(models.mlp(), (XF, YF), micro_batch_size=8, accum_steps=4, warmup=1, repeats=5)
    assert len(report.step_seconds) == 5 and report.seconds_per_step > 0
    assert report.effective_batch == 32
    assert report.samples_per_second == pytest.approx(32 / report.seconds_per_step)
    with pytest.raises(ValueError, match="exceeds the 256 samples"):
        accumlib.time_config(models.mlp(), (XF, YF), micro_batch_size=64, accum_steps=8)
