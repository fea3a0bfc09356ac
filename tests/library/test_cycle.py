"""accumlib.cycle: one optimizer step from a cycle of micro-batches (`accumulate_and_step`, `CycleResult`,
`NonFiniteError`). Here: a cycle's step equals one hand-written step on the whole batch, and its seeded backward
the six-line recipe's gradient bit for bit; the scheduler, clipping, the AMP scaler and zero_grad once per step; a
disabled GradScaler is no scaler; a weight-0 micro-batch is not run; a parameter without a gradient counts nothing;
the norms moved to the loss's device before the one host read; a NaN or infinite loss or gradient skips the step
(the model as found) or raises, and a scaler's overflow is skipped; the old argument order refused; what a step
leaves (.grad freed) and what it reads on the host (tensor weights once, not per micro-batch). Some of these run the
cycle through train, which only drives it. Elsewhere: the cycle's options in one object (test_options.py); what it
is given, refused (test_cycle_checks.py); what it puts back (test_restore.py); train driving it (test_loop.py); DDP
and FSDP2 (test_sharded.py).

"Nothing changed" compares every weight and buffer exactly (torch.equal): a refusal computes nothing, so nothing may
differ in any digit. float64 where a step is compared with another computation of it.
"""

import copy
import math

import pytest
import torch
import found
from found import SMALL, X64, Y64, linear, nan_gradient_on_label_99, nan_gradient_run
from states import identical, same

import accumlib
from accumlib.timing import HostReads
from builders import data, models

max_param_diff = accumlib.parameter_gap


# --- one step: the recipe's gradient, its once-per-step work, its non-finite rule --------------------------


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


# --- a non-finite loss or gradient: the step skipped (the model as found) or raised; a scaler's overflow skipped ---


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


# --- accumulate_and_step in 0.x's order ------------------------------------------------------------------------


def test_accumulate_and_step_in_the_old_order_is_refused_by_name_before_anything_changes():
    """accumlib 0.x took (model, optimizer, micro_batches, loss_weights); 1.0 takes the data before the optimizer,
    as train does: the old order is refused naming the new one, with the model and the optimizer as found."""
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    with pytest.raises(
        TypeError,
        match=r"accumulate_and_step takes \(model, micro_batches, optimizer, loss_weights\): the optimizer comes after "
        r"the data, as in train\(model, data, optimizer\); got an optimizer \(SGD\) as micro_batches",
    ):
        accumlib.accumulate_and_step(model, optimizer, SMALL[:2], [0.5, 0.5])
    accumlib.set_language("hi")
    try:  # in the learner's language, as every refusal
        with pytest.raises(TypeError, match="optimizer data के बाद आता है"):
            accumlib.accumulate_and_step(model, optimizer, SMALL[:2], [0.5, 0.5])
    finally:
        accumlib.set_language("en")
    assert same((model.state_dict(), optimizer.state_dict()), before)
    assert all(p.grad is None for p in model.parameters())
    assert not accumlib.accumulate_and_step(model, SMALL[:2], optimizer, [0.5, 0.5]).skipped  # the new order steps
    assert not same(model.state_dict(), before[0])


# --- what a step leaves, and what it reads on the host ----------------------------------------------------------
# found.setup: a BatchNorm CNN, Adam with state, and a .grad left by the caller on every parameter; found.cycle(n):
# n micro-batches of 8 samples.


def test_after_a_step_the_gradients_are_freed():
    """What a step leaves, as its docstring says: .grad None (read grad_norm from the result), so a next cycle
    holds no second copy of the gradients."""
    model, optimizer = found.setup()
    result = accumlib.accumulate_and_step(model, found.cycle(), optimizer, [0.25] * 4)
    assert not result.skipped and result.grad_norm > 0
    assert all(p.grad is None for p in model.parameters())


def test_tensor_weights_are_read_once_not_per_micro_batch():
    counts = {}
    for n in (2, 6):
        model, _adam = found.setup()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # Adam's own step reads its step count per tensor
        with HostReads() as reads:
            accumlib.accumulate_and_step(model, found.cycle(n), optimizer, [torch.tensor(1 / n)] * n)
        counts[n] = reads.count
    assert counts[2] == counts[6] == 2  # the weights' one read and the cycle's one read (loss and norm)
