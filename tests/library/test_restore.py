"""accumlib.restore: what a cycle changes before its step is put back as found when it does not step (an error, a
KeyboardInterrupt or a real SIGINT mid-cycle, a non-finite cycle skipped or raised: .grad, weights, buffers and
optimizer as found, no NaN and no half cycle; a buffer first changed in a skipped cycle named, BatchNorm's statistics
copied, a large buffer not); the modules' modes after a run (issue 23, case 8)."""

import copy
import gc
import os
import signal

import pytest
import torch
from found import DIGITS, OPTIONS, bn_model, cycle, setup
from peaks import Masked, X, Y, batchnorm, trained_peaks
from states import state, unchanged
from torch import nn

import accumlib
from accumlib import memory, restore


def model_with_batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))


def test_kept_puts_back_the_grad_and_the_running_statistics_found():
    model = model_with_batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    found = torch.full_like(model[0].weight, 3.0)
    model[0].weight.grad = found
    statistics = [b.clone() for b in model[1].buffers()]
    with restore._Kept(model, optimizer, list(model.parameters())) as kept:
        assert model[0].weight.grad is None  # set aside: the cycle's backward() starts from nothing
        nn.functional.cross_entropy(model(torch.randn(6, 4)), torch.zeros(6, dtype=torch.long)).backward()
        kept.restore()
    assert model[0].weight.grad is found and model[2].weight.grad is None
    assert all(torch.equal(a, b) for a, b in zip(statistics, model[1].buffers(), strict=True))


def test_an_error_in_the_block_restores_and_a_step_does_not():
    model = model_with_batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    statistics = model[1].running_mean.clone()
    with pytest.raises(RuntimeError, match="inside"), restore._Kept(model, optimizer, list(model.parameters())):
        model(torch.randn(6, 4))
        raise RuntimeError("inside")
    assert torch.equal(model[1].running_mean, statistics)
    with restore._Kept(model, optimizer, list(model.parameters())) as kept:
        nn.functional.cross_entropy(model(torch.randn(6, 4)), torch.zeros(6, dtype=torch.long)).backward()
        optimizer.step()
        kept.stepped()  # the step used them: the .grad freed, the statistics kept
    assert all(p.grad is None for p in model.parameters())
    assert not torch.equal(model[1].running_mean, statistics)


def test_modes_kept_puts_every_modules_mode_back_even_on_an_error():
    model = model_with_batchnorm().eval()
    model[1].train()  # a submodule in its own mode
    with pytest.raises(ValueError), restore._ModesKept(model):
        model.train()
        raise ValueError
    assert [m.training for m in model.modules()] == [False, False, True, False]


def test_train_leaves_the_modes_found():
    model = model_with_batchnorm()
    model[1].eval()  # frozen BatchNorm: train leaves a model in training mode as it is
    accumlib.train(
        model,
        (torch.randn(16, 4), torch.zeros(16, dtype=torch.long)),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=2,
        device="cpu",
    )
    assert [m.training for m in model.modules()] == [True, True, False, True]


def test_a_zero_grad_replaced_on_the_optimizer_itself_runs_once_per_step():
    """The step's zeroing is the optimizer's own: torch's zero_grad is done in place (every .grad None, as it does),
    but a zero_grad set on the instance (a mock counting calls, a wrapper) is called, once per step, like a
    subclass's override."""
    model = model_with_batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    torch_zero_grad = optimizer.zero_grad
    optimizer.zero_grad = lambda set_to_none=True: (calls.append(set_to_none), torch_zero_grad(set_to_none))
    batches = [(torch.randn(6, 4), torch.zeros(6, dtype=torch.long)) for _ in range(2)]
    accumlib.accumulate_and_step(model, batches, optimizer, [0.5, 0.5], loss_fn=nn.functional.cross_entropy)
    assert calls == [True] and all(p.grad is None for p in model.parameters())
    del optimizer.zero_grad  # torch's own again: every parameter's .grad is None after the step as well
    accumlib.accumulate_and_step(model, batches, optimizer, [0.5, 0.5], loss_fn=nn.functional.cross_entropy)
    assert calls == [True] and all(p.grad is None for p in model.parameters())


# --- issue 23, case 5: after an error or a skip, .grad, the weights, the buffers and the optimizer are as found --
# The model has BatchNorm (buffers the forward pass changes) and the .grad found is a non-zero tensor left by the
# caller (found.setup), so "as found" is tested on something that can change.


def raising_at(i, raise_):
    calls = []

    def loss_fn(output, target):
        calls.append(None)
        if len(calls) == i:
            raise_()
        return nn.functional.cross_entropy(output, target)

    return loss_fn


def _value_error():
    raise ValueError("the user's loss_fn fails")


def _keyboard_interrupt():
    raise KeyboardInterrupt


def _sigint():
    os.kill(os.getpid(), signal.SIGINT)  # Python's handler raises KeyboardInterrupt at the next bytecode


@pytest.mark.parametrize("how", ["loss_fn raises", "KeyboardInterrupt", "SIGINT", "wrong dtype"])
def test_an_error_mid_cycle_leaves_everything_as_found(how):
    model, optimizer = setup()
    before = state(model, optimizer)
    micro_batches, loss_fn = cycle(), nn.functional.cross_entropy
    if how == "wrong dtype":
        micro_batches[2] = (micro_batches[2][0].double(), micro_batches[2][1])
    else:
        loss_fn = raising_at(
            3, {"loss_fn raises": _value_error, "KeyboardInterrupt": _keyboard_interrupt, "SIGINT": _sigint}[how]
        )
    with pytest.raises((ValueError, KeyboardInterrupt, RuntimeError)):
        accumlib.accumulate_and_step(model, micro_batches, optimizer, [0.25] * 4, loss_fn=loss_fn)
    assert unchanged(before, model, optimizer)  # two micro-batches' gradients were built, none is left


@pytest.mark.parametrize("on_nonfinite", ["skip", "raise"])
def test_a_skipped_or_raised_non_finite_cycle_leaves_no_half_cycle_and_no_nan(on_nonfinite):
    model, optimizer = setup()
    before = state(model, optimizer)
    nan_at_3 = raising_at(99, None)  # counts nothing; the NaN comes from the data

    micro_batches = cycle()
    micro_batches[2] = (torch.full_like(micro_batches[2][0], float("nan")), micro_batches[2][1])
    if on_nonfinite == "raise":
        with pytest.raises(
            accumlib.NonFiniteError,
            match="no step was taken; the weights, buffers, optimizer and the optimizer's .grad are as they were",
        ):
            accumlib.accumulate_and_step(
                model, micro_batches, optimizer, [0.25] * 4, loss_fn=nan_at_3, on_nonfinite="raise"
            )
    else:
        assert accumlib.accumulate_and_step(model, micro_batches, optimizer, [0.25] * 4, loss_fn=nan_at_3).skipped
    assert unchanged(before, model, optimizer)  # the message is true: no NaN, no half cycle in .grad
    assert not any(p.grad.isnan().any() for p in model.parameters())


# --- issue 23, case 8: train trains in training mode and puts every module's mode back -------------------------
# Comparisons of weights are exact (== 0.0) where both runs do the same operations on the same data in the same order.


def test_case_8_a_model_in_eval_mode_trains_in_training_mode_and_goes_back():
    modes = []
    left_in_eval = bn_model().eval()
    accumlib.train(
        left_in_eval,
        DIGITS,
        torch.optim.SGD(left_in_eval.parameters(), lr=0.1),
        on_step=lambda r: modes.append([m.training for m in left_in_eval.modules()]),
        **OPTIONS,
    )
    assert modes and all(all(step) for step in modes)  # every module in training mode during the run
    assert not any(m.training for m in left_in_eval.modules())  # and back in eval mode after it
    in_training = bn_model()
    accumlib.train(in_training, DIGITS, torch.optim.SGD(in_training.parameters(), lr=0.1), **OPTIONS)
    assert accumlib.parameter_gap(left_in_eval, in_training) == 0.0  # BatchNorm's statistics updated alike


def test_case_8_a_model_in_training_mode_keeps_its_eval_submodules():
    """Frozen BatchNorm (a submodule put in eval mode on purpose) stays frozen: its running statistics unchanged."""
    model = bn_model()
    model[1].eval()
    statistics = copy.deepcopy(model[1].state_dict())
    accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), **OPTIONS)
    assert not model[1].training and model.training
    assert all(torch.equal(statistics[k], v) for k, v in model[1].state_dict().items() if "running" in k)


def test_case_8_modes_are_put_back_after_an_error():
    model = bn_model().eval()

    def fails(output, target):
        raise RuntimeError("user code failed")

    with pytest.raises(RuntimeError, match="user code failed"):
        accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=fails, **OPTIONS)
    assert not any(m.training for m in model.modules())


def test_case_8_an_on_step_that_evaluates_does_not_freeze_training():
    """on_step evaluates (model.eval()) and forgets model.train(): the next steps still train in training mode."""
    modes = []
    model = bn_model()

    def evaluate(record):
        modes.append(model.training)
        model.eval()

    accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), on_step=evaluate, **OPTIONS)
    assert modes == [True] * 5
    assert model.training  # the mode train found


# --- the buffer snapshot holds only what a skipped cycle must put back (issue 19) ------------------------------


def test_the_snapshot_copies_batchnorms_statistics_and_not_a_large_buffer():
    """The peak with a 1 MiB buffer is the peak without it plus the buffer itself: no copy of it is made per
    cycle. With BatchNorm, its running statistics (2 x 32 floats and a count) are copied, and counted."""
    small, large = Masked(size=16), Masked(size=512)

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    grown = trained_peaks(large, sgd(large), 8, 4)[0] - trained_peaks(small, sgd(small), 8, 4)[0]
    assert grown == (512 * 512 - 16 * 16) * 4  # the buffer once, as it is held
    plain = batchnorm()
    frozen = batchnorm().eval()  # eval mode: the statistics are read, not changed: nothing to copy
    statistics = 2 * 32 * 4 + 8
    report = memory.measure_step(plain, X[:8], Y[:8], accum_steps=2)
    report_frozen = memory.measure_step(frozen, X[:8], Y[:8], accum_steps=2)
    assert report.parameters == report_frozen.parameters  # weights and buffers alike
    assert report.other - report_frozen.other == statistics  # the copy a skipped cycle puts back


def test_a_skipped_cycle_puts_batchnorms_statistics_back():
    model = batchnorm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    assert accumlib.accumulate_and_step(model, bad, torch.optim.SGD(model.parameters(), lr=0.1), [0.5, 0.5]).skipped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class Counting(nn.Module):
    """A forward pass that changes a buffer that is not a norm layer's statistics (a count of the forward passes)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(64, 10)
        self.register_buffer("passes", torch.zeros(()))

    def forward(self, x):
        self.passes += 1
        return self.linear(x)


def test_a_buffer_first_changed_in_a_skipped_cycle_is_named_and_kept_from_then_on():
    model = Counting()
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match="changed the buffer\\(s\\) passes, which were not copied"):
        assert accumlib.accumulate_and_step(model, bad, sgd, [0.5, 0.5]).skipped
    assert model.passes == 2  # said, not hidden: it could not be put back
    assert accumlib.accumulate_and_step(model, bad, sgd, [0.5, 0.5]).skipped  # now it is copied: no warning
    assert model.passes == 2


def test_a_buffer_remembered_as_changing_is_forgotten_with_its_model():
    from accumlib import restore

    model = Counting()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = [(torch.full_like(X[:8], float("nan")), Y[:8])]
    with pytest.warns(RuntimeWarning, match="changed the buffer\\(s\\) passes"):
        accumlib.accumulate_and_step(model, bad, sgd, [1.0])
    key = id(model.passes)
    assert restore._CHANGED[key]() is model.passes  # copied from the next cycle on
    del model, sgd
    gc.collect()
    assert key not in restore._CHANGED  # the module keeps nothing of a model that is gone


class Stacked(nn.Module):
    """Layers in a ModuleList, run in order: ModuleList.insert edits the module dict directly (no registration
    hook sees it), the path a cached module walk would miss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("grow", ["insert", "append"])
def test_a_batchnorm_added_after_the_first_step_is_put_back_by_a_skipped_cycle(grow):
    """The snapshot follows the model as it is at each cycle: a BatchNorm added after a step (inserted into a
    ModuleList, or appended to a Sequential) has its running statistics put back, exactly, by a skipped cycle."""
    if grow == "insert":
        model = Stacked()
    else:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    good = [(X[:8], Y[:8]), (X[8:16], Y[8:16])]
    assert not accumlib.accumulate_and_step(model, good, optimizer, [0.5, 0.5]).skipped
    norm = nn.BatchNorm1d(32)
    model.layers.insert(1, norm) if grow == "insert" else model.append(norm)
    if grow == "append":
        model.append(nn.Linear(32, 10))
    assert not accumlib.accumulate_and_step(model, good, optimizer, [0.5, 0.5]).skipped  # the statistics move
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert before["layers.1.running_mean" if grow == "insert" else "3.running_mean"].abs().sum() > 0
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    assert accumlib.accumulate_and_step(model, bad, optimizer, [0.5, 0.5]).skipped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_skipped_cycle_gives_back_each_grad_it_found_none_or_not():
    """.grad found on some parameters and None on others: after a skipped cycle each is the very tensor (or None)
    the call found, and its values are unchanged (backward() added into fresh gradients, not into these)."""
    model = batchnorm()
    params = list(model.parameters())
    found = [torch.full_like(p, 0.25) if i % 2 else None for i, p in enumerate(params)]
    for p, grad in zip(params, found, strict=True):
        p.grad = grad
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    assert accumlib.accumulate_and_step(model, bad, torch.optim.SGD(params, lr=0.1), [0.5, 0.5]).skipped
    assert all(p.grad is grad for p, grad in zip(params, found, strict=True))
    assert all(torch.equal(grad, torch.full_like(grad, 0.25)) for grad in found if grad is not None)
