"""accumlib.lessons.show.batchnorm (lesson 7): every finding's wording follows the measurement it is given; measured
on small runs of the lesson's BatchNorm CNN, and on hand-made results where a branch needs data the CNN does not
give."""

import dataclasses

import pytest
import torch

import accumlib
from accumlib import batchnorm
from accumlib.lessons import batchnorm_lab, data, models
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


def test_gradient_gaps_call_exact_only_what_rounding_explains_and_give_the_scale(capsys):
    net = models.cnn(norm="batch")
    gaps = {
        name: accumlib.gradient_gap(model, X[:64], Y[:64], accum_steps=8, loss_fn=torch.nn.functional.cross_entropy)
        for name, model in (("BatchNorm", net), ("GroupNorm", batchnorm.to_groupnorm(net)))
    }
    size = batchnorm_lab.gradient_size(net, torch.nn.functional.cross_entropy, X[:64], Y[:64])
    assert show.gradient_gaps(gaps, micro_batch_size=8, accum_steps=8, gradient_size=size) == {
        "BatchNorm": False,
        "GroupNorm": True,
    }
    out = capsys.readouterr().out
    assert f"one batch of 64, whose largest entry is {size:.3f}:" in out
    assert "GroupNorm: below 1e-05: accumulation is exact up to float32 rounding." in out
    assert f"BatchNorm: {gaps['BatchNorm']:.3f}, {gaps['BatchNorm'] / size:.0%} of the largest entry: " in out
    # float64 rounding is far smaller: a float32-sized gap is not exact there
    assert show.gradient_gaps({"GroupNorm": 1e-7}, 8, 8, size, precision="float64") == {"GroupNorm": False}


@pytest.fixture(scope="module")
def splits():
    X64, Y64 = data.digits(dtype=torch.float64)
    return batchnorm_lab.compare_micro_batches(
        models.cnn(norm="batch", seed=1, dtype=torch.float64),
        (X64[:256], Y64[:256]),
        (X64[1024:1280], Y64[1024:1280]),
        effective_batch=32,
        micro_batch_sizes=(2, 32),
        epochs=1,
        updates=50,
    )


def test_micro_batches_print_the_confound_the_table_and_findings_that_follow_the_numbers(splits, capsys):
    findings = show.micro_batches(splits)
    out = capsys.readouterr().out
    assert (
        "Training updated the running statistics once per micro-batch: 128 times at 2 × 16, 8 times at 32 × 1."
    ) in out
    assert f"after 50 updates a running average has moved {1 - 0.9**50:.3%} of the way" in out
    errors = [o.settled.statistics_error_total for o in splits.batchnorm]
    assert findings.noisiest_smallest == (errors[0] == max(errors))
    losses = [o.reestimated.loss for o in splits.batchnorm]
    assert findings.loss_falls_with_size == (losses[0] >= losses[1])
    assert findings.reestimate_kept_weights and findings.groupnorm_exact
    assert findings.reestimate_helped == [
        o.micro_batch_size for o in splits.batchnorm if o.reestimated.loss < o.settled.loss
    ]
    assert "none kept" in out and f"Lowest held-out loss: {findings.best}," in out


def test_on_the_lessons_digits_the_smallest_micro_batch_trains_the_worst_weights(splits):
    """The seed's caveat on lesson 7's data: with the running statistics re-estimated on the same digits (so they
    match equally well), micro-batches of 2 still do worse on held-out digits than 32 x 1: their weights."""
    small, large = splits.batchnorm
    reestimated = [o.reestimated.statistics_error_total for o in splits.batchnorm]
    assert max(reestimated) - min(reestimated) < 0.1 * min(reestimated)
    assert small.reestimated.loss > large.reestimated.loss + 0.01  # measured 2.10 against 1.95


def test_micro_batches_do_not_claim_noise_or_a_trend_they_did_not_measure(splits, capsys):
    small, large = splits.batchnorm
    quiet = dataclasses.replace(
        small,
        settled=dataclasses.replace(small.settled, statistics_error=[]),
        reestimated=dataclasses.replace(small.reestimated, loss=large.reestimated.loss - 1),
    )
    findings = show.micro_batches(dataclasses.replace(splits, batchnorm=[quiet, large]))
    out = capsys.readouterr().out
    assert not findings.noisiest_smallest and "are not the furthest" in out
    assert not findings.loss_falls_with_size and "does not fall steadily" in out


def test_skipped_cycle_says_whether_the_statistics_were_put_back(capsys):
    stats = {"1": (torch.zeros(2), torch.ones(2))}
    assert show.skipped_cycle(True, stats, {"1": (torch.zeros(2), torch.ones(2))})
    assert "exactly as before it" in capsys.readouterr().out
    assert not show.skipped_cycle(True, stats, {"1": (torch.ones(2), torch.ones(2))})
    assert "but the running statistics changed" in capsys.readouterr().out
    assert not show.skipped_cycle(False, stats, stats)


def test_a_brief_deviation_keeps_the_finding_and_the_figure_without_the_table(capsys):
    drift = {2: [LayerDeviation("1", 0.04, 0.08)], 64: [LayerDeviation("1", 0.01, 0.02)]}
    assert show.deviation(drift, batch=64, brief=True) == {2: pytest.approx(0.12), 64: pytest.approx(0.03)}
    brief = capsys.readouterr().out
    show.deviation(drift, batch=64)
    full = capsys.readouterr().out
    assert brief.startswith("Micro-batches of 2 stray 4.0 times as far") and "layer 1: mean" not in brief
    assert "layer 1: mean" in full.splitlines()[0] and brief.splitlines()[0] in full


def _with_values(splits, errors, losses):
    """`splits` with its BatchNorm rows' statistics error (one layer, mean only) and re-estimated loss replaced."""
    rows = [
        dataclasses.replace(
            o,
            settled=dataclasses.replace(o.settled, statistics_error=[batchnorm.LayerDeviation("1", e, 0.0)]),
            reestimated=dataclasses.replace(o.reestimated, loss=loss),
        )
        for o, e, loss in zip(splits.batchnorm, errors, losses, strict=True)
    ]
    return dataclasses.replace(splits, batchnorm=rows)


def test_over_seeds_calls_a_difference_a_finding_only_when_every_seed_agrees(splits, capsys):
    """Lesson 7 (N2, N3): the seeds' mean ± standard deviation, and a difference is a finding only where its sign
    holds in every seed; one seed the other way round makes it "no finding"."""
    agree = {1: _with_values(splits, [0.13, 0.06], [0.35, 0.30]), 2: _with_values(splits, [0.11, 0.05], [0.33, 0.31])}
    found = show.over_seeds(agree)
    out = capsys.readouterr().out
    assert "0.120 ± 0.014" in out and "0.340 ± 0.014" in out  # seed 1 and 2's mean ± standard deviation at 2 × 16
    error, loss = found
    assert (error.quantity, error.smaller, error.larger, error.same_sign) == ("statistics error", 2, 32, True)
    assert error.mean == pytest.approx(0.065) and error.spread == pytest.approx(0.005 * 2**0.5)
    assert (loss.quantity, loss.same_sign) == ("re-estimated loss", True) and loss.mean == pytest.approx(0.035)
    assert (
        "statistics error, 2 × 16 minus 32 × 1: +0.065 ± 0.007, the same sign in all 2 seeds: 2 × 16 is higher."
    ) in out
    split_seeds = {**agree, 3: _with_values(splits, [0.05, 0.06], [0.29, 0.30])}
    found = show.over_seeds(split_seeds)
    out = capsys.readouterr().out
    assert [f.same_sign for f in found] == [False, False]
    assert "the sign changes between seeds: no finding, the difference is within the seeds' spread." in out
    with pytest.raises(TypeError, match="two or more seeds"):
        show.over_seeds({1: splits})
