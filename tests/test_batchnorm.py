"""accumlib.batchnorm: what micro-batches do to BatchNorm, why two runs' statistics differ, what each remedy fixes."""
import copy

import pytest
import torch

import accumlib
from accumlib import batchnorm
from accumlib.lessons import data, models

X, Y = data.digits(512)


total = batchnorm.total


@pytest.fixture(scope="module")
def trained():
    net = models.cnn(norm="batch")
    accumlib.train(net, (X, Y), torch.optim.SGD(net.parameters(), lr=0.05), micro_batch_size=64, accum_steps=1,
                   epochs=2)
    return net


def test_micro_batch_statistics_stray_more_as_micro_batch_shrinks(trained):
    drift = [total(batchnorm.micro_batch_deviation(trained, X[:256], m)) for m in (4, 16, 64)]
    assert drift[0] > 1.5 * drift[1] > 1.5 * 1.5 * drift[2] > 0
    assert [d.layer for d in batchnorm.micro_batch_deviation(trained, X[:256], 4)] == ["1", "4"]


def test_running_statistics_are_noisier_with_small_micro_batches_and_reestimation_fixes_them(trained):
    errors = [total(batchnorm.running_stats_error(batchnorm.collect_running_stats(trained, X, m), X))
              for m in (4, 16, 64)]
    assert errors[0] > errors[1] > errors[2]
    fixed = batchnorm.reestimate(batchnorm.collect_running_stats(trained, X, 4), X, batch_size=256)
    assert total(batchnorm.running_stats_error(fixed, X)) < errors[2] / 5


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
    assert accumlib.gradient_gap(trained, loss, X[:64], Y[:64], 8) > 1e-3
    grouped = batchnorm.to_groupnorm(trained)
    assert not batchnorm.batchnorm_layers(grouped)
    # Float32 rounding only: the full batch's gradient sums 64 samples' terms in one order, 8 micro-batches of 8 in
    # another. Each addition rounds by at most eps (2**-23) of its result, so the two sums of 64 terms differ by at
    # most about 64 * eps times the largest gradient entry (the n*eps bound of a sum of n terms). Measured: 6 to 19
    # eps of it across ATEN_CPU_CAPABILITY default, avx2, avx512 and one or two threads; BatchNorm's gap is 1e4 times
    # larger. A fixed 1e-6 (8 eps of this model's largest entry, 0.50) failed at one thread with 1.13e-6.
    full = torch.autograd.grad(loss(grouped(X[:64]), Y[:64]), list(grouped.parameters()))
    rounding = 64 * torch.finfo(torch.float32).eps * max(g.abs().max().item() for g in full)
    assert accumlib.gradient_gap(grouped, loss, X[:64], Y[:64], 8) < rounding < 1e-3
    assert batchnorm.batchnorm_layers(trained)  # the original keeps its BatchNorm


@pytest.mark.parametrize("momentum,updates,moved", [(0.1, 16, 1 - 0.9 ** 16), (0.5, 3, 0.875), (None, 5, 1.0)])
def test_how_far_a_running_average_moves_is_measured_with_the_layers_own_momentum(momentum, updates, moved):
    net = models.cnn(norm="batch")
    for layer in batchnorm.batchnorm_layers(net).values():
        layer.momentum = momentum
    before = {k: v.clone() for k, v in net.state_dict().items()}
    result = batchnorm.running_average_moved(net, updates)
    assert [(r.layer, r.momentum, r.updates) for r in result] == [("1", momentum, updates), ("4", momentum, updates)]
    assert all(r.moved == pytest.approx(moved, abs=1e-6) and r.remaining == pytest.approx(1 - moved) for r in result)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.fixture(scope="module")
def causes():
    return batchnorm.divergence_causes(models.cnn(norm="batch", seed=1), (X, Y), micro_batch_size=4, accum_steps=8)


def test_the_replay_reproduces_both_runs_exactly(causes):
    assert causes.replay_gap < 1e-6
    assert (causes.updates_accumulated, causes.updates_one_batch) == (128, 16)


def test_the_chain_of_causes_bounds_the_total_layer_by_layer(causes):
    for total_dev, *links in zip(causes.total_divergence, causes.noise, causes.update_count, causes.weights):
        assert total_dev.mean <= sum(d.mean for d in links) + 1e-6
        assert total_dev.variance <= sum(d.variance for d in links) + 1e-6


def test_after_one_epoch_the_divergence_is_the_number_of_updates_not_the_noise(causes):
    total, noise, count, weights = (batchnorm.total(getattr(causes, name))
                                    for name in ("total_divergence", "noise", "update_count", "weights"))
    assert count > 0.8 * total  # 16 updates leave 19% of the starting statistics; 128 leave none
    assert noise < 0.05 * total and weights < 0.1 * total
    assert weights > 0 and causes.weight_gap > 1e-3  # the gradients differ, so the weights do


def test_the_causes_are_measured_one_change_at_a_time():
    net = models.cnn(norm="batch", seed=2)
    even = batchnorm.divergence_causes(net, (X[:64], Y[:64]), micro_batch_size=4, accum_steps=4, epochs=2)
    ragged = batchnorm.divergence_causes(net, (X[:70], Y[:70]), micro_batch_size=4, accum_steps=4)  # a 6-sample tail
    assert (even.updates_accumulated, even.updates_one_batch) == (32, 8)
    assert (ragged.updates_accumulated, ragged.updates_one_batch) == (18, 5)
    assert ragged.replay_gap < 1e-6 and even.replay_gap < 1e-6


@pytest.fixture(scope="module")
def remedies():
    held_x, held_y = data.digits()[0][1024:], data.digits()[1][1024:]
    return batchnorm.compare_remedies(models.cnn(norm="batch", seed=1), (X, Y), (held_x, held_y),
                                      micro_batch_size=4, accum_steps=8)


def test_reestimation_fixes_the_statistics_eval_mode_uses_and_not_the_weights(remedies):
    assert remedies.reestimate_weight_change == 0.0
    assert remedies.batchnorm_reestimated.weight_gap == remedies.batchnorm_accumulated.weight_gap > 1e-3
    for before, after in [(remedies.batchnorm_accumulated, remedies.batchnorm_reestimated),
                          (remedies.batchnorm_one_batch, remedies.batchnorm_one_batch_reestimated)]:
        assert after.evaluation.statistics_error_total < before.evaluation.statistics_error_total
    # on held-out data the re-estimated statistics are not exact: held-out data has statistics of its own
    assert remedies.batchnorm_reestimated.evaluation.statistics_error_total > 0.01


def test_reestimated_statistics_look_exact_only_on_the_data_they_came_from():
    net = models.cnn(norm="batch", seed=1)
    accumlib.train(net, (X, Y), torch.optim.SGD(net.parameters(), lr=0.05), micro_batch_size=4, accum_steps=8)
    batchnorm.reestimate(net, X)
    held_out = data.digits()[0][1024:]
    assert total(batchnorm.running_stats_error(net, X)) < 1e-4
    assert total(batchnorm.running_stats_error(net, held_out)) > 100 * total(batchnorm.running_stats_error(net, X))


def test_with_groupnorm_accumulation_is_exact_and_eval_mode_has_no_statistics(remedies):
    assert remedies.groupnorm_accumulated.weight_gap < 1e-5
    assert remedies.groupnorm_accumulated.evaluation.loss == pytest.approx(remedies.groupnorm_one_batch.evaluation.loss,
                                                                           abs=1e-5)
    assert remedies.groupnorm_accumulated.evaluation.statistics_error == []


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
