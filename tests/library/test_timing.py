"""accumlib.timing: whole steps of train, and a pass's time taken apart into fixed overhead and per-sample compute
(the passes of train's own cycle); the count of host reads (HostReads); bad input to time_config and decompose_time
refused naming the parameter, with the caller's model and optimizer untouched (refusals.py)."""

import statistics

import pytest
import refusals
import torch
from peaks import batchnorm
from torch import nn

import accumlib
from accumlib import timing
from accumlib.timing import HostReads
from builders import data, models

X, Y = data.digits(256)
XF, YF = data.digits(256, flat=True)


@pytest.fixture(scope="module")
def small():
    return timing.decompose_time(models.cnn(), (X, Y), repeats=5)


def test_time_config_reports_median_step_time():
    report = accumlib.time_config(models.mlp(), (XF, YF), micro_batch_size=8, accum_steps=4, warmup=0, repeats=5)
    assert len(report.step_seconds) == 5 and report.seconds_per_step == statistics.median(report.step_seconds) > 0
    assert report.effective_batch == 32
    with pytest.raises(ValueError, match="exceeds the 256 samples"):
        accumlib.time_config(models.mlp(), (XF, YF), micro_batch_size=64, accum_steps=8)


def test_every_pass_of_every_split_is_timed_and_summarised_by_its_median(small):
    assert [p.micro_batch_size for p in small.passes] == [4, 8, 16, 32, 64]
    for p in small.passes:
        assert len(p.all_seconds) == (64 // p.micro_batch_size) * 5  # accum_steps passes per step, 5 timed rounds
        assert p.seconds == statistics.median(p.all_seconds) > 0
    for s in small.steps:
        assert len(s.all_seconds) == 5 and s.seconds == statistics.median(s.all_seconds)
    assert small.clock == timing.THREAD_CPU and small.threads == 1


def test_the_line_is_the_least_squares_fit_of_the_medians(small):
    sizes = torch.tensor([float(p.micro_batch_size) for p in small.passes], dtype=torch.float64)
    medians = torch.tensor([p.seconds for p in small.passes], dtype=torch.float64)
    design = torch.stack([torch.ones_like(sizes), sizes], dim=1)
    intercept, slope = torch.linalg.lstsq(design, medians[:, None]).solution.flatten().tolist()
    assert small.overhead_seconds == pytest.approx(intercept, rel=1e-9)
    assert small.seconds_per_sample == pytest.approx(slope, rel=1e-9)
    assert sum(p.residual for p in small.passes) == pytest.approx(0, abs=1e-12)  # least squares with an intercept
    for s in small.steps:
        assert s.predicted_seconds == pytest.approx(s.overhead_seconds + s.compute_seconds + small.optimizer_seconds)
        assert s.compute_seconds == pytest.approx(small.seconds_per_sample * 64)  # the same arithmetic in every split


def test_a_pass_has_a_fixed_cost_that_dominates_small_micro_batches_and_fades_with_large_ones(small):
    assert small.overhead_seconds > 0 and small.seconds_per_sample > 0
    assert small.overhead_share(4) > 0.5 > small.overhead_share(64)
    shares = [small.overhead_share(p.micro_batch_size) for p in small.passes]
    assert shares == sorted(shares, reverse=True)


def test_the_fit_predicts_the_time_of_each_effective_batch(small):
    for s in small.steps:  # measured, not derived from the fit: a whole step, zeroing to optimizer step
        assert s.predicted_seconds == pytest.approx(s.seconds, rel=0.35)
    assert small.steps[-1].seconds > 2 * small.steps[0].seconds  # 16 passes of 4 against 1 pass of 64, here


def test_more_arithmetic_per_sample_makes_the_fixed_cost_a_smaller_share(small):
    larger = timing.decompose_time(
        models.cnn(channels=(64, 128)), (X, Y), effective_batch=16, accum_steps=(1, 4, 16), repeats=3
    )
    assert larger.seconds_per_sample > 3 * small.seconds_per_sample
    assert larger.overhead_share(4) < small.overhead_share(4)


def test_timing_leaves_model_random_state_and_threads_as_they_were():
    net = models.cnn(norm="batch")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    timing.decompose_time(
        net,
        (X, Y),
        effective_batch=8,
        accum_steps=(1, 2),
        repeats=1,
        warmup=0,
        optimizer_fn=lambda p: torch.optim.Adam(p),
    )
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state()) and torch.get_num_threads() == threads
    assert next(net.parameters()).grad is None


def test_decompose_time_without_loss_fn_takes_the_models_own_loss_as_time_config_does():
    """The library's one default loss, as train takes it: a model returning {"loss": ...} is timed, not refused."""

    class OwnLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = models.mlp()

        def forward(self, x):
            return {"loss": self.net(x).square().mean()}

    split = timing.decompose_time(OwnLoss(), (XF, YF), effective_batch=8, accum_steps=(1, 2), repeats=1, warmup=0)
    assert [p.micro_batch_size for p in split.passes] == [4, 8]
    report = accumlib.time_config(OwnLoss(), (XF, YF), micro_batch_size=4, accum_steps=2, warmup=0, repeats=1)
    assert len(report.step_seconds) == 1 and report.effective_batch == 8


# --- HostReads: every read of a tensor's value on the host is counted (the loop's one read per step: test_loop.py) -


def test_the_counter_sees_every_kind_of_read():
    t, i = torch.tensor(2.0), torch.tensor(1)
    with HostReads() as reads:
        t.item(), t.tolist(), float(t), bool(t), int(t), [0, 1][i]
    assert reads.count == 6


# --- bad input, refused naming the parameter, with the caller's model and optimizer untouched (refusals.py) ------


@pytest.mark.parametrize("case", list(refusals.TIMING))
def test_bad_input_is_refused_naming_the_parameter_and_nothing_changes(case):
    refusals.check(refusals.TIMING[case])


# --- one recipe (issue 19): decompose_time times train's own cycle ----------------------------------------------

X96, Y96 = data.digits(96, flat=True)


def test_decompose_time_times_trains_cycle():
    """Its passes are the cycle's: each timed step has accum_steps passes, each one forward and backward of the
    cycle (counted through loss_fn), and the model it times is trained by the cycle's weights 1/accum_steps."""
    calls = []

    def counting(output, target):
        calls.append(len(target))
        return nn.functional.cross_entropy(output, target)

    result = timing.decompose_time(
        batchnorm(), (X96, Y96), effective_batch=16, accum_steps=(1, 4), loss_fn=counting, repeats=2, warmup=0
    )
    assert calls == [16, 4, 4, 4, 4, 4, 4, 4, 4, 16]  # two rounds, ABBA: 1, 4 then 4, 1
    assert [len(p.all_seconds) for p in result.passes] == [8, 2]  # micro-batch 4: 2 rounds x 4; 16: 2 x 1
