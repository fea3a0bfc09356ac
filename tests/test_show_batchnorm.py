"""accumlib.lessons.show.batchnorm (lesson 7): every finding's wording follows the measurement it is given; measured on small
runs of the lesson's BatchNorm CNN, and on hand-made results where a branch needs data the CNN does not give."""
import dataclasses
import re

import pytest
import torch

import accumlib
from accumlib import batchnorm
from accumlib.lessons import data, models
from accumlib.batchnorm import LayerDeviation
from accumlib.lessons.show import batchnorm as show

X, Y = data.digits(256)
HELD_OUT = tuple(t[256:384] for t in data.digits(384))


def test_deviation_says_how_much_further_small_micro_batches_stray(capsys):
    net = models.cnn(norm="batch")
    totals = show.deviation({m: batchnorm.micro_batch_deviation(net, X[:64], m) for m in (4, 16, 64)}, batch=64)
    assert totals[4] > totals[16] > totals[64] > 0
    out = capsys.readouterr().out
    assert f"Micro-batches of 4 stray {totals[4] / totals[64]:.1f} times as far" in out


def test_deviation_does_not_claim_a_difference_it_did_not_measure(capsys):
    same = [LayerDeviation("1", 0.01, 0.02)]
    show.deviation({2: same, 64: same}, batch=64)
    assert "Micro-batches of 2 stray no further from the statistics of the whole batch of 64" in capsys.readouterr().out


def test_gradient_gaps_call_exact_only_what_rounding_explains(capsys):
    net = models.cnn(norm="batch")
    gaps = {name: accumlib.gradient_gap(model, torch.nn.functional.cross_entropy, X[:64], Y[:64], 8)
            for name, model in (("BatchNorm", net), ("GroupNorm", batchnorm.to_groupnorm(net)))}
    assert show.gradient_gaps(gaps, micro_batch_size=8, accum_steps=8) == {"BatchNorm": False, "GroupNorm": True}
    out = capsys.readouterr().out
    assert "GroupNorm: below 1e-05: accumulation is exact up to float32 rounding." in out
    # two significant digits: float32 results move in the third or fourth from one CPU or thread count to another
    assert f"BatchNorm: {gaps['BatchNorm']:#.2g}: accumulation is not exact." in out


@pytest.fixture(scope="module")
def causes():
    fresh = models.cnn(norm="batch", seed=1)
    result = batchnorm.divergence_causes(fresh, (X, Y), micro_batch_size=4, accum_steps=8)
    moved = {n: batchnorm.running_average_moved(fresh, n)
             for n in (result.updates_one_batch, result.updates_accumulated)}
    return result, moved


def test_causes_name_the_update_count_and_how_far_a_running_average_moves(causes, capsys):
    result, moved = causes
    assert (result.updates_accumulated, result.updates_one_batch) == (64, 8)
    assert show.causes(result, moved) == "update_count"
    out = capsys.readouterr().out
    assert ("Of the three, the number of updates alone makes about as large a difference as all causes "
            "together") in out
    assert "after 8 updates at momentum 0.1, a running average has moved 57.0% of the way" in out  # 1 - 0.9 ** 8
    assert "(43.0% of the start remains)" in out


def test_causes_without_a_dominant_one_only_name_the_largest(causes, capsys):
    result, moved = causes
    even = dataclasses.replace(result, noise=result.update_count, weights=result.update_count)
    show.causes(even, moved)
    out = capsys.readouterr().out
    assert "alone accounts" not in out and "The largest cause is the noise of micro-batch statistics" in out


def test_causes_need_the_moves_of_both_runs(causes):
    result, moved = causes
    with pytest.raises(ValueError, match="moved must hold batchnorm.running_average_moved\\(model, 64\\)"):
        show.causes(result, {8: moved[8]})


@pytest.fixture(scope="module")
def remedies():
    return batchnorm.compare_remedies(models.cnn(norm="batch", seed=1), (X, Y), HELD_OUT, micro_batch_size=4,
                                      accum_steps=8)


def test_remedies_say_what_each_fixes_as_measured(remedies, capsys):
    findings = show.remedies(remedies)
    assert findings.reestimate_kept_weights and findings.groupnorm_exact
    assert findings.reestimate_lowered_error == all(
        after.evaluation.statistics_error_total < before.evaluation.statistics_error_total
        for before, after in ((remedies.batchnorm_accumulated, remedies.batchnorm_reestimated),
                              (remedies.batchnorm_one_batch, remedies.batchnorm_one_batch_reestimated)))
    out = capsys.readouterr().out
    # rounding-level gaps are not printed digit by digit; the column is numeric, right-aligned
    assert re.search(r"\nGroupNorm, 4 × 8 +< 1e-05  ", out)
    loss = remedies.batchnorm_accumulated.evaluation.loss  # float32 results print to two significant digits
    assert re.search(rf"\nBatchNorm, 4 × 8 .* {loss:#.2g}  ", out) and f"{loss:.3f}" not in out
    assert "none kept" in out
    higher = remedies.groupnorm_accumulated.evaluation.loss > remedies.batchnorm_reestimated.evaluation.loss
    assert findings.groupnorm_higher_loss == higher
    assert ("GroupNorm makes accumulation exact, not the model better" in out) == higher


def test_remedies_call_groupnorm_better_only_when_its_held_out_loss_is_not_higher(remedies, capsys):
    worse = dataclasses.replace(remedies.groupnorm_accumulated, evaluation=dataclasses.replace(
        remedies.groupnorm_accumulated.evaluation, loss=remedies.batchnorm_reestimated.evaluation.loss + 1))
    assert show.remedies(dataclasses.replace(remedies, groupnorm_accumulated=worse)).groupnorm_higher_loss
    assert "GroupNorm makes accumulation exact, not the model better" in capsys.readouterr().out
    better = dataclasses.replace(worse, evaluation=dataclasses.replace(worse.evaluation, loss=0.0))
    assert not show.remedies(dataclasses.replace(remedies, groupnorm_accumulated=better)).groupnorm_higher_loss
    assert "is not higher than re-estimated BatchNorm's" in capsys.readouterr().out
