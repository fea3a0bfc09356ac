"""Issue 7: each bug real training code shipped is measurably wrong; accumlib's loop is right."""
import pytest
import torch

import accumlib
from accumlib import data, models, pitfalls

X, Y = data.digits(100, flat=True, dtype=torch.float64)  # 100 = 8 cycles of 12 + 4 left over


def fresh():
    model = models.mlp(dtype=torch.float64)
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


gap = accumlib.parameter_gap


@pytest.fixture(scope="module")
def full_batch():
    model, opt = fresh()
    accumlib.train(model, (X, Y), opt, micro_batch_size=12, accum_steps=1, epochs=2)
    return model


@pytest.mark.parametrize("last_cycle", pitfalls.LAST_CYCLE)
def test_every_classic_last_cycle_variant_misses_the_full_batch_and_accumlib_does_not(full_batch, last_cycle):
    model, opt = fresh()
    pitfalls.classic_train(model, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2, last_cycle=last_cycle)
    assert gap(model, full_batch) > 1e-3
    right, opt = fresh()
    accumlib.train(right, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2)
    assert gap(right, full_batch) <= 1e-10


def test_classic_loop_is_exact_when_nothing_is_left_over():
    """The classic recipe itself is right on full cycles: the bugs are only where the lesson says."""
    X96, Y96 = X[:96], Y[:96]
    classic, opt = fresh()
    pitfalls.classic_train(classic, (X96, Y96), opt, micro_batch_size=4, accum_steps=3, epochs=2)
    reference, opt = fresh()
    accumlib.train(reference, (X96, Y96), opt, micro_batch_size=12, accum_steps=1, epochs=2)
    assert gap(classic, reference) <= 1e-10


def test_scheduler_stepped_per_micro_batch_runs_accum_steps_times_too_fast():
    model, opt = fresh()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):  # PyTorch notices, too late
        log = pitfalls.classic_train(model, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3,
                                     scheduler=scheduler, scheduler_per_micro_batch=True)
    # 3 scheduler steps per optimizer step, all taken before it: the first step already runs at the 4th value
    assert log.step_lrs == pytest.approx([0.5 * 0.9 ** (3 * (i + 1)) for i in range(8)])
    model, opt = fresh()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    history = accumlib.train(model, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3, scheduler=scheduler)
    assert [r.lr for r in history] == pytest.approx([0.5 * 0.9 ** i for i in range(8)])


def test_clipping_inside_the_micro_batch_loop_differs_from_clipping_the_accumulated_gradient():
    clipped_full, opt = fresh()
    accumlib.train(clipped_full, (X[:96], Y[:96]), opt, micro_batch_size=12, accum_steps=1, clip_grad_norm=0.05)
    per_micro, opt = fresh()
    pitfalls.classic_train(per_micro, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3, clip_grad_norm=0.05,
                           clip_per_micro_batch=True)
    assert gap(per_micro, clipped_full) > 1e-3
    once, opt = fresh()
    accumlib.train(once, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3, clip_grad_norm=0.05)
    assert gap(once, clipped_full) <= 1e-10


def test_unscaling_twice_in_a_cycle_is_an_error_and_once_per_cycle_works():
    Xf, Yf = data.digits(48, flat=True)
    model = models.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        pitfalls.classic_train(model, (Xf, Yf), opt, micro_batch_size=4, accum_steps=3,
                               scaler=torch.amp.GradScaler("cpu"), unscale_per_micro_batch=True)
    model = models.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    log = pitfalls.classic_train(model, (Xf, Yf), opt, micro_batch_size=4, accum_steps=3,
                                 scaler=torch.amp.GradScaler("cpu"))
    assert log.steps == 4


def test_logging_the_scaled_loss_shrinks_it_by_accum_steps():
    model, opt = fresh()
    log = pitfalls.classic_train(model, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3)
    for scaled, true in zip(log.scaled_losses, log.true_losses):
        assert scaled == pytest.approx(true / 3, rel=1e-12)
    histories = []
    for m, k in [(4, 3), (2, 6)]:
        model, opt = fresh()
        histories.append([r.loss for r in accumlib.train(model, (X[:96], Y[:96]), opt, micro_batch_size=m,
                                                          accum_steps=k)])
    assert histories[0] == pytest.approx(histories[1], abs=1e-12)  # accumlib logs the true loss, whatever k

