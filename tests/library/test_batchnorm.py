"""accumlib.batchnorm: what micro-batches do to BatchNorm's statistics, what its running statistics hold, and what each
remedy fixes; bad input refused naming the parameter, with the caller's models and optimizer untouched
(refusals.py)."""

import copy

import pytest
import refusals
import torch

import accumlib
from accumlib import batchnorm
from builders import data, models

X, Y = data.digits(512)


total = batchnorm.total


@pytest.fixture(scope="module")
def trained():
    net = models.cnn(norm="batch")
    accumlib.train(
        net, (X, Y), torch.optim.SGD(net.parameters(), lr=0.05), micro_batch_size=64, accum_steps=1, epochs=2
    )
    return net


def test_micro_batch_statistics_stray_more_as_micro_batch_shrinks(trained):
    drift = [total(batchnorm.micro_batch_deviation(trained, X[:256], m)) for m in (4, 16, 64)]
    assert drift[0] > 1.5 * drift[1] > 1.5 * 1.5 * drift[2] > 0
    assert [d.layer for d in batchnorm.micro_batch_deviation(trained, X[:256], 4)] == ["1", "4"]


def test_running_stats_of_micro_batch_training_diverge_from_the_full_batch_run():
    def fit(m, k):
        net = models.cnn(norm="batch")
        accumlib.train(net, (X, Y), torch.optim.SGD(net.parameters(), lr=0.05), micro_batch_size=m, accum_steps=k)
        return net

    full = fit(32, 1)
    assert total(batchnorm.running_stats_divergence(fit(4, 8), full)) > 0.05
    assert total(batchnorm.running_stats_divergence(fit(32, 1), full)) == 0


def test_groupnorm_makes_accumulation_exact_again(trained):
    loss = torch.nn.functional.cross_entropy
    assert accumlib.gradient_gap(trained, X[:64], Y[:64], accum_steps=8, loss_fn=loss) > 1e-3
    grouped = batchnorm.to_groupnorm(trained)
    assert not batchnorm.batchnorm_layers(grouped)
    # Float32 rounding only: the full batch's gradient sums 64 samples' terms in one order, 8 micro-batches of 8 in
    # another. Each addition rounds by at most eps (2**-23) of its result, so the two sums of 64 terms differ by at
    # most about 64 * eps times the largest gradient entry (the n*eps bound of a sum of n terms). Measured: 6 to 19
    # eps of it across ATEN_CPU_CAPABILITY default, avx2, avx512 and one or two threads; BatchNorm's gap is 1e4 times
    # larger. A fixed 1e-6 (8 eps of this model's largest entry, 0.50) failed at one thread with 1.13e-6.
    full = torch.autograd.grad(loss(grouped(X[:64]), Y[:64]), list(grouped.parameters()))
    rounding = 64 * torch.finfo(torch.float32).eps * max(g.abs().max().item() for g in full)
    assert accumlib.gradient_gap(grouped, X[:64], Y[:64], accum_steps=8, loss_fn=loss) < rounding < 1e-3
    assert batchnorm.batchnorm_layers(trained)  # the original keeps its BatchNorm


def test_running_statistics_is_a_snapshot(trained):
    snapshot = batchnorm.running_statistics(trained)
    assert list(snapshot) == ["1", "4"]
    assert snapshot["1"][0] is not trained[1].running_mean and torch.equal(snapshot["1"][0], trained[1].running_mean)


def test_to_groupnorm_keeps_the_dtype_of_the_model():
    grouped = batchnorm.to_groupnorm(models.cnn(norm="batch", dtype=torch.float64))
    assert {p.dtype for p in grouped.parameters()} == {torch.float64}


def test_reestimated_statistics_look_exact_only_on_the_data_they_came_from():
    net = models.cnn(norm="batch", seed=1)
    accumlib.train(net, (X, Y), torch.optim.SGD(net.parameters(), lr=0.05), micro_batch_size=4, accum_steps=8)
    batchnorm.reestimate(net, X)
    held_out = data.digits()[0][1024:]
    assert total(batchnorm.running_stats_error(net, X)) < 1e-4
    assert total(batchnorm.running_stats_error(net, held_out)) > 100 * total(batchnorm.running_stats_error(net, X))


def test_evaluate_uses_eval_mode_and_restores_the_models_modes(trained):
    net = copy.deepcopy(trained).train()
    net[1].eval()  # a model with mixed modes comes back with the same mixed modes
    before = {k: v.clone() for k, v in net.state_dict().items()}
    held_x, held_y = data.digits()[0][1024:1100], data.digits()[1][1024:1100]
    result = batchnorm.evaluate(net, held_x, held_y)
    assert net.training and not net[1].training and net[4].training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    with torch.no_grad():
        logits = net.eval()(held_x)
    assert result.loss == pytest.approx(torch.nn.functional.cross_entropy(logits, held_y).item(), rel=1e-6)
    assert result.accuracy == pytest.approx((logits.argmax(1) == held_y).double().mean().item())
    assert [d.layer for d in result.statistics_error] == ["1", "4"]


# --- bad input, refused naming the parameter, with the caller's model and optimizer untouched (refusals.py) ------


@pytest.mark.parametrize("case", list(refusals.BATCHNORM))
def test_bad_input_is_refused_naming_the_parameter_and_nothing_changes(case):
    refusals.check(refusals.BATCHNORM[case])
