"""Issue 7: each bug real training code shipped is measurably wrong; accumlib's loop is right."""

import pytest
import torch

import accumlib
from accumlib.lessons import data, models, pitfalls

X, Y = data.digits(100, flat=True, dtype=torch.float64)  # 100 = 8 cycles of 12 + 4 left over


def fresh():
    model = models.mlp(dtype=torch.float64)
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


gap = accumlib.parameter_gap


@pytest.fixture(scope="module")
def full_batch():
    model, opt = fresh()
    accumlib.train(model, (X, Y), opt, micro_batch_size=12, accum_steps=1, epochs=2, measure_memory=False)
    return model


@pytest.mark.parametrize("last_cycle", pitfalls.LAST_CYCLE)
def test_every_classic_last_cycle_variant_misses_the_full_batch_and_accumlib_does_not(full_batch, last_cycle):
    model, opt = fresh()
    pitfalls.classic_train(model, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2, last_cycle=last_cycle)
    assert gap(model, full_batch) > 1e-3
    right, opt = fresh()
    accumlib.train(right, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2)
    assert gap(right, full_batch) <= 1e-10


def test_the_weighted_last_cycle_trains_exactly_like_accumlib_and_the_full_batch(full_batch):
    model, opt = fresh()
    pitfalls.classic_train(model, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2, last_cycle="weighted")
    assert gap(model, full_batch) <= 1e-10


def test_weighted_is_exact_also_when_the_last_micro_batch_is_short():
    """98 samples in micro-batches of 4: the last micro-batch has 2 samples and sits in a full-length cycle."""
    reference, opt = fresh()
    accumlib.train(reference, (X[:98], Y[:98]), opt, micro_batch_size=12, accum_steps=1, epochs=2)
    outcomes = {}
    for last_cycle in ("weighted", "divide-by-steps"):
        model, opt = fresh()
        pitfalls.classic_train(
            model, (X[:98], Y[:98]), opt, micro_batch_size=4, accum_steps=3, epochs=2, last_cycle=last_cycle
        )
        outcomes[last_cycle] = gap(model, reference)
    assert outcomes["weighted"] <= 1e-10 < 1e-3 < outcomes["divide-by-steps"]


def test_classic_loop_is_exact_when_nothing_is_left_over():
    """The classic recipe itself is right on full cycles: the bugs are only where the lesson says."""
    X96, Y96 = X[:96], Y[:96]
    classic, opt = fresh()
    pitfalls.classic_train(classic, (X96, Y96), opt, micro_batch_size=4, accum_steps=3, epochs=2)
    reference, opt = fresh()
    accumlib.train(reference, (X96, Y96), opt, micro_batch_size=12, accum_steps=1, epochs=2)
    assert gap(classic, reference) <= 1e-10


def first_step_change(cycle_samples=12, **switches):
    """The weight change of the first optimizer step (one cycle of data, 3 x 4, lr 0.5), flattened."""
    model, opt = fresh()
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    pitfalls.classic_train(
        model, (X[:cycle_samples], Y[:cycle_samples]), opt, micro_batch_size=4, accum_steps=3, **switches
    )
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before


def test_without_the_division_the_first_sgd_step_is_accum_steps_times_as_long():
    right, wrong = first_step_change(), first_step_change(divide=False)
    assert torch.allclose(wrong, 3 * right, rtol=1e-10, atol=1e-15)


def test_zeroing_every_micro_batch_steps_with_the_last_micro_batch_alone():
    model, opt = fresh()
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))  # classic_train's first epoch, seed 0
    last = order[8:]
    model.zero_grad()
    (torch.nn.functional.cross_entropy(model(X[last]), Y[last]) / 3).backward()
    expected = -0.5 * torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.allclose(first_step_change(zero_every_micro_batch=True), expected, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize(
    "switches",
    [dict(divide=False), dict(zero_every_micro_batch=True), dict(step_every_micro_batch=True)],
    ids=lambda s: next(iter(s)),
)
def test_each_bug_switch_misses_the_full_batch_run(switches):
    reference, opt = fresh()
    accumlib.train(reference, (X[:96], Y[:96]), opt, micro_batch_size=12, accum_steps=1, epochs=2)
    model, opt = fresh()
    log = pitfalls.classic_train(model, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3, epochs=2, **switches)
    assert gap(model, reference) > 1e-3
    assert log.steps == (48 if "step_every_micro_batch" in switches else 16)


def recorded_inputs(run) -> list[torch.Tensor]:
    """The inputs a fresh model is called with while `run(model)` trains it."""
    model = models.mlp(dtype=torch.float64)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    run(model)
    return seen


def test_classic_train_visits_the_same_micro_batches_in_the_same_order_as_accumlib_train():
    def classic(model):
        pitfalls.classic_train(
            model,
            (X, Y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            epochs=2,
            seed=7,
            last_cycle="weighted",
        )

    def reference(model):
        accumlib.train(
            model,
            (X, Y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            epochs=2,
            seed=7,
            measure_memory=False,
        )

    mine, theirs = recorded_inputs(classic), recorded_inputs(reference)
    assert len(mine) == len(theirs) == 50
    assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


def test_on_step_sees_each_step_with_its_true_mean_loss_like_accumlib():
    model, opt = fresh()
    steps = []
    log = pitfalls.classic_train(
        model, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2, last_cycle="weighted", on_step=steps.append
    )
    reference, opt = fresh()
    history = accumlib.train(reference, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2, measure_memory=False)
    assert [s.step for s in steps] == list(range(1, 19)) and log.steps == 18
    assert [s.samples_seen for s in steps] == [r.samples_seen for r in history]
    assert [(s.micro_batches, s.samples) for s in steps] == [(r.micro_batches, r.samples) for r in history]
    # train sums each cycle's float32 losses on the device (no host read per micro-batch): float32 rounding apart
    assert [s.loss for s in steps] == pytest.approx([r.loss for r in history], rel=1e-6)


def test_on_step_loss_covers_only_the_micro_batches_whose_gradient_the_step_applied():
    steps = []
    model, opt = fresh()
    log = pitfalls.classic_train(
        model, (X, Y), opt, micro_batch_size=4, accum_steps=3, epochs=2, last_cycle="leak", on_step=steps.append
    )
    assert [s.micro_batches for s in steps[7:10]] == [3, 4, 3]  # epoch 1's tail leaks into epoch 2's first step
    assert steps[8].loss == pytest.approx(sum(log.true_losses[24:28]) / 4, rel=1e-12)
    steps.clear()
    model, opt = fresh()
    log = pitfalls.classic_train(
        model, (X, Y), opt, micro_batch_size=4, accum_steps=3, zero_every_micro_batch=True, on_step=steps.append
    )
    assert {s.micro_batches for s in steps} == {1}
    assert [s.loss for s in steps] == pytest.approx(log.true_losses[2:24:3], rel=1e-12)


def test_an_exception_from_on_step_propagates_after_that_step():
    def stop_at_second(step):
        if step.step == 2:
            raise accumlib.StopTraining

    model, opt = fresh()
    with pytest.raises(accumlib.StopTraining):
        pitfalls.classic_train(model, (X, Y), opt, micro_batch_size=4, accum_steps=3, on_step=stop_at_second)
    reference, opt = fresh()
    accumlib.train(
        reference, (X, Y), opt, micro_batch_size=4, accum_steps=3, on_step=stop_at_second, measure_memory=False
    )
    assert gap(model, reference) <= 1e-10  # two steps taken, as accumlib stopped by the same callback
    untrained, _ = fresh()
    assert gap(model, untrained) > 1e-3


def test_scheduler_stepped_per_micro_batch_runs_accum_steps_times_too_fast():
    model, opt = fresh()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    with pytest.warns(UserWarning, match="before `optimizer.step\\(\\)`"):  # PyTorch notices, too late
        log = pitfalls.classic_train(
            model,
            (X[:96], Y[:96]),
            opt,
            micro_batch_size=4,
            accum_steps=3,
            scheduler=scheduler,
            scheduler_per_micro_batch=True,
        )
    # 3 scheduler steps per optimizer step, all taken before it: the first step already runs at the 4th value
    assert log.step_lrs == pytest.approx([0.5 * 0.9 ** (3 * (i + 1)) for i in range(8)])
    model, opt = fresh()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    history = accumlib.train(model, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3, scheduler=scheduler)
    assert [r.lr for r in history] == pytest.approx([0.5 * 0.9**i for i in range(8)])


def test_clipping_inside_the_micro_batch_loop_differs_from_clipping_the_accumulated_gradient():
    clipped_full, opt = fresh()
    accumlib.train(clipped_full, (X[:96], Y[:96]), opt, micro_batch_size=12, accum_steps=1, clip_grad_norm=0.05)
    per_micro, opt = fresh()
    pitfalls.classic_train(
        per_micro,
        (X[:96], Y[:96]),
        opt,
        micro_batch_size=4,
        accum_steps=3,
        clip_grad_norm=0.05,
        clip_per_micro_batch=True,
    )
    assert gap(per_micro, clipped_full) > 1e-3
    once, opt = fresh()
    accumlib.train(once, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3, clip_grad_norm=0.05)
    assert gap(once, clipped_full) <= 1e-10


def amp_run(cycles=4, scaler=None, **switches):
    """classic_train with fp16 autocast and a GradScaler on `cycles` cycles of 3 x 4; returns (log, weight change)."""
    Xf, Yf = data.digits(12 * cycles, flat=True)
    model = models.mlp()
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    log = pitfalls.classic_train(
        model,
        (Xf, Yf),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=3,
        scaler=scaler or torch.amp.GradScaler("cpu"),
        **switches,
    )
    return log, torch.cat([p.detach().flatten() for p in model.parameters()]) - before


def test_unscaling_twice_in_a_cycle_is_an_error_and_once_per_cycle_works():
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        amp_run(unscale_per_micro_batch=True)
    log, _ = amp_run()
    assert log.steps == 4


def test_updating_the_scaler_after_every_micro_batch_alone_is_an_error():
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
        amp_run(update_per_micro_batch=True)


def test_unscale_and_update_per_micro_batch_run_silently_and_shrink_the_gradient_by_the_scale():
    """The "fix" PyTorch's unscale_ error invites: every unscale_ divides the part already unscaled again."""
    _, right = amp_run(cycles=1)
    log, silent = amp_run(cycles=1, unscale_per_micro_batch=True, update_per_micro_batch=True)
    assert log.steps == 1
    ratio = (silent.norm() / right.norm()).item()
    assert 0 < ratio < 1 / 2**16  # the last micro-batch's share, divided by the scale 65536
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)  # the scale doubles at each update() without infs
    amp_run(cycles=1, scaler=scaler, unscale_per_micro_batch=True, update_per_micro_batch=True)
    assert scaler.get_scale() == 2.0**16 * 2**4  # 3 updates per micro-batch + 1 after the step
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    amp_run(cycles=1, scaler=scaler)
    assert scaler.get_scale() == 2.0**17  # once per step


def test_stepping_the_scaler_every_micro_batch_runs_silently():
    log, _ = amp_run(step_every_micro_batch=True)
    assert log.steps == 12


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(divide="no"), "divide must be True or False"),
        (dict(zero_every_micro_batch=1), "zero_every_micro_batch must be True or False"),
        (dict(last_cycle="weighed"), "last_cycle must be one of"),
        (dict(accum_steps=0), "accum_steps must be a positive integer"),
        (dict(micro_batch_size=101), "micro_batch_size=101 is larger than the dataset"),
        (dict(seed=1.5), "seed must be an integer"),
        (dict(on_step="print"), "on_step must be a function"),
        (dict(update_per_micro_batch=True), "need scaler="),
        (dict(clip_grad_norm=0), "clip_grad_norm must be a positive"),
    ],
    ids=lambda v: str(v)[:30],
)
def test_bad_arguments_are_refused_before_any_weight_changes(bad, match):
    model, opt = fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    arguments = dict(micro_batch_size=4, accum_steps=3) | bad
    with pytest.raises((TypeError, ValueError), match=match):
        pitfalls.classic_train(model, (X, Y), opt, **arguments)
    assert gap(model, before) == 0 and all(p.grad is None for p in model.parameters())


def test_logging_the_scaled_loss_shrinks_it_by_accum_steps():
    model, opt = fresh()
    log = pitfalls.classic_train(model, (X[:96], Y[:96]), opt, micro_batch_size=4, accum_steps=3)
    for scaled, true in zip(log.scaled_losses, log.true_losses, strict=True):
        assert scaled == pytest.approx(true / 3, rel=1e-12)
    histories = []
    for m, k in [(4, 3), (2, 6)]:
        model, opt = fresh()
        histories.append(
            [r.loss for r in accumlib.train(model, (X[:96], Y[:96]), opt, micro_batch_size=m, accum_steps=k)]
        )
    assert histories[0] == pytest.approx(histories[1], abs=1e-12)  # accumlib logs the true loss, whatever k


def test_zeroing_at_the_start_of_each_cycle_is_not_a_bug():
    """The seed's place for zero_grad() (before the backward() of a cycle's first micro-batch) trains exactly as
    zeroing after each step does, with a short last cycle too (leak: nothing zeroes it before the next epoch's first
    cycle, which now zeroes it); a flag that is not a bool is refused."""
    X, y = data.digits(44, flat=True, dtype=torch.float64)  # 11 micro-batches of 4: cycles of 3 leave 2
    runs = []
    for at_start in (False, True):
        model = models.mlp(dtype=torch.float64)
        steps = []
        pitfalls.classic_train(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            epochs=2,
            last_cycle="weighted",
            zero_at_cycle_start=at_start,
            on_step=steps.append,
        )
        runs.append((model, steps))
    (after, steps_after), (start, steps_start) = runs
    assert accumlib.parameter_gap(after, start) == 0 and steps_after == steps_start and len(steps_after) == 8
    with pytest.raises(ValueError, match="nothing can leak into it"):
        pitfalls.classic_train(
            models.mlp(dtype=torch.float64),
            (X, y),
            torch.optim.SGD(models.mlp().parameters()),
            micro_batch_size=4,
            accum_steps=3,
            zero_at_cycle_start=True,
            last_cycle="leak",
        )
    with pytest.raises(TypeError, match="zero_at_cycle_start must be True or False"):
        pitfalls.classic_train(
            models.mlp(dtype=torch.float64),
            (X, y),
            torch.optim.SGD(models.mlp().parameters()),
            micro_batch_size=4,
            accum_steps=3,
            zero_at_cycle_start=1,
        )
