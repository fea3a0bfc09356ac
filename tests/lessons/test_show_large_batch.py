"""accumlib.lessons.show.large_batch (lesson 1): the findings follow the measurements: which run wins per step and per
sample, from which batch size on a step does not fit, what each step of an accumulating run really held."""

import dataclasses
import itertools

import pytest
import torch

import accumlib
from accumlib import memory
from accumlib.lessons import data, models
from accumlib.lessons.show import large_batch

X, Y = data.digits(64, flat=True)


def histories(lr: float, sizes=(4, 32), epochs: int = 2) -> dict:
    runs = {}
    for size in sizes:
        model = models.mlp(seed=0)
        runs[size] = accumlib.train(
            model,
            (X, Y),
            torch.optim.SGD(model.parameters(), lr=lr),
            micro_batch_size=size,
            accum_steps=1,
            epochs=epochs,
            measure_memory=False,
        )
    return runs


def title(plot) -> str:
    return plot.figure.axes[0].get_title().replace("\n", " ")


def test_compare_batches_measures_per_step_and_per_sample(capsys):
    runs = histories(lr=0.5)
    found = large_batch.compare_batches(runs)
    out = capsys.readouterr().out
    assert (found.small, found.large, found.samples) == (4, 32, 128)
    assert found.steps == {4: 32, 32: 4} and found.compared_steps == 4
    small_losses = [r.loss for r in runs[4]][:4]
    assert found.jumps[4] == pytest.approx(sum(abs(b - a) for a, b in itertools.pairwise(small_losses)) / 3)
    assert found.last_epoch_loss[32] == pytest.approx(sum(r.loss for r in runs[32] if r.epoch == 1) / 2)
    assert "first 4 steps" in out and "With 8 times as many steps" in out
    assert found.small_ends_lower and "the small batches end lower" in out
    assert f"jumps {found.jump_ratio:.1f} times as much" in title(found.plot)
    assert f"{found.jumps[4]:.3f}" in found.plot.alt and f"{found.jumps[32]:.3f}" in found.plot.alt


def test_compare_batches_says_so_when_the_small_batches_do_not_end_lower(capsys):
    found = large_batch.compare_batches(histories(lr=2.0))  # too large a step for batches of 4
    out = capsys.readouterr().out
    assert not found.small_ends_lower
    assert "the small batches do not end lower" in out and "the small batches end lower" not in out


def test_compare_batches_refuses_runs_on_different_samples():
    runs = histories(lr=0.5)
    runs[32] = histories(lr=0.5, sizes=(32,), epochs=1)[32]
    with pytest.raises(ValueError, match="histories: both runs must see the same samples"):
        large_batch.compare_batches(runs)


@pytest.fixture(scope="module")
def reports():
    digits = data.digits()
    return [memory.measure_step(models.cnn(), *memory.batch_of(digits, size)) for size in (8, 16, 32, 64)]


def test_memory_finding_names_the_first_size_that_does_not_fit(reports, capsys):
    budget = (reports[1].peak + reports[2].peak) // 2  # 8 and 16 fit, 32 and 64 do not
    found = large_batch.memory_by_batch(reports, budget)
    out = capsys.readouterr().out
    assert found.fitting == [8, 16] and found.first_too_large == 32
    assert "Batches of up to 16 samples fit" in out and "from 32 samples on" in out
    assert "from 32 samples on" in title(found.plot) and "from 32 samples on" in found.plot.alt
    assert f"{reports[2].peak:,}" in out and out.count(" no\n") == 2
    factor = reports[-1].activations / reports[0].activations
    assert f"the activations grow {factor:.2f} times" in out


def test_memory_finding_when_everything_or_nothing_fits(reports, capsys):
    everything = large_batch.memory_by_batch(reports, reports[-1].peak)
    assert everything.first_too_large is None
    assert "Every batch measured, up to 64 samples, fits" in capsys.readouterr().out
    nothing = large_batch.memory_by_batch(reports, reports[0].peak - 1)
    assert nothing.fitting == [] and "Not even a batch of 8 samples fits" in capsys.readouterr().out


def test_memory_finding_claims_no_threshold_when_the_peaks_do_not_grow(reports, capsys):
    # a size that fits after one that does not (peaks swapped): no "from N samples on"
    swapped = [
        reports[0],
        dataclasses.replace(reports[1], peak=reports[3].peak),
        reports[2],
        dataclasses.replace(reports[3], peak=reports[1].peak),
    ]
    found = large_batch.memory_by_batch(swapped, (reports[1].peak + reports[2].peak) // 2)
    out = capsys.readouterr().out
    assert found.fitting == [8, 64] and found.first_too_large is None
    assert "Batches of 8, 64 samples fit" in out and "samples on" not in out + title(found.plot)


def test_accumulated_reports_what_each_step_held_and_its_peak(capsys):
    digits = data.digits(100)
    model = models.cnn()
    history = accumlib.train(
        model,
        digits,
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=8,
        accum_steps=4,
        measure_memory=True,
    )
    peak = max(r.peak_memory_bytes for r in history)
    assert large_batch.accumulated(history, peak) == [(3, 32, 4), (1, 4, 1)]
    out = capsys.readouterr().out
    assert "4 optimizer steps for 100 samples." in out and "The last step has only 4 samples" in out
    assert f"{peak:,} bytes, stays within" in out
    large_batch.accumulated(history, peak - 1)
    assert "is more than the" in capsys.readouterr().out
    unmeasured = accumlib.train(
        model,
        digits,
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=8,
        accum_steps=4,
        measure_memory=False,
    )
    with pytest.raises(ValueError, match="measure_memory=True"):
        large_batch.accumulated(unmeasured, peak)


def test_brief_findings_leave_out_the_tables_and_keep_the_findings(reports, capsys):
    """Lesson 0 reads the finding and the figure, not the table: brief=True prints the same finding, no table."""
    budget = (reports[1].peak + reports[2].peak) // 2
    full = large_batch.memory_by_batch(reports, budget)
    long = capsys.readouterr().out
    brief = large_batch.memory_by_batch(reports, budget, brief=True)
    short = capsys.readouterr().out
    assert short.splitlines()[0] == long.splitlines()[len(reports) + 1] and "peak of one step" not in short
    assert brief.fitting == full.fitting and brief.plot.alt == full.plot.alt
    digits = data.digits(64)
    model = models.cnn()
    history = accumlib.train(
        model,
        digits,
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=8,
        accum_steps=4,
        measure_memory=True,
    )
    assert large_batch.accumulated(history, 2**30, brief=True) == [(2, 32, 4)]
    out = capsys.readouterr().out
    assert "samples per step" not in out and out.startswith("2 optimizer steps for 64 samples.\nThe peak memory")
