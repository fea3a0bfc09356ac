"""accumlib.batchnorm: drift grows as the micro-batch shrinks, and each remedy closes it."""
import pytest
import torch

import accumlib
from accumlib import batchnorm, data, models

X, Y = data.digits(512)


def total(deviations):
    return sum(d.mean + d.variance for d in deviations)


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
    assert accumlib.gradient_gap(grouped, loss, X[:64], Y[:64], 8) < 1e-6
    assert batchnorm.batchnorm_layers(trained)  # the original keeps its BatchNorm


def test_bad_input():
    with pytest.raises(ValueError, match="no BatchNorm"):
        batchnorm.micro_batch_deviation(models.cnn(), X[:32], 4)
    with pytest.raises(ValueError, match="micro_batch_size must be between 1 and 32"):
        batchnorm.micro_batch_deviation(models.cnn(norm="batch"), X[:32], 64)
    with pytest.raises(ValueError, match="groups=5 must divide the 16 channels"):
        batchnorm.to_groupnorm(models.cnn(norm="batch"), groups=5)
