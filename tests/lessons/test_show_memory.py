"""accumlib.lessons.show.memory (lesson 5): what it says depends on the measured bytes; measured here with the lesson's
models under FakeTensorMode (the same bytes as the CPU tracker, nothing computed)."""

import pytest
import torch

import accumlib
from accumlib import memory
from accumlib.lessons import data, models
from accumlib.lessons.show import memory as show

X, Y = data.digits(64)
XF, YF = data.digits(64, flat=True)


def cnn_report(micro_batch_size, accum_steps):
    return memory.measure_step(
        models.cnn(), X[:micro_batch_size], Y[:micro_batch_size], accum_steps=accum_steps, fake=True
    )


@pytest.fixture(scope="module")
def wide_pairs():
    wide = models.wide_mlp()
    pairs = {}
    for name, optimizer in (
        ("SGD", torch.optim.SGD(wide.parameters(), lr=0.1)),
        ("Adam", torch.optim.Adam(wide.parameters())),
    ):
        pairs[name] = (
            memory.measure_step(wide, XF, YF, optimizer=optimizer, fake=True),
            memory.measure_step(wide, XF[:8], YF[:8], optimizer=optimizer, accum_steps=8, fake=True),
        )
    return pairs


def test_categories_sort_what_shrinks_stays_and_grows_and_say_why_the_gradient_grows(capsys):
    reports = [cnn_report(64, 1), cnn_report(16, 4), cnn_report(4, 16)]
    changes = show.categories(reports)
    assert changes.shrinks == ("inputs", "activations", "activation gradients")
    # other: the scalar loss and the 1 its backward() starts from (made before backward() runs). One micro-batch
    # of weight 1 is its own sum; under accumulation the loss summed so far is a third 4-byte scalar beside them
    assert changes.stays == ("parameters",)
    assert changes.grows == ("gradients", "other")
    assert [r.categories()["other"] for r in reports] == [8, 12, 12]
    assert changes.unused == ("incoming gradients", "optimizer state", "optimizer temporaries")
    assert changes.varies == ()
    out = capsys.readouterr().out
    assert "activations: 786,432 → 49,152 bytes (16 times smaller)" in out
    assert "only the part of .grad built so far (20,520 of 39,720 bytes)" in out
    assert "9.8 times smaller, while the micro-batch is 16 times smaller" in out
    assert "Every split peaks during backward()." in out
    assert changes.plot.figure.axes[0].get_title().replace("\n", " ") == (
        "Effective batch 64: the peak falls from 1.82 MiB at 64 × 1 to 0.19 MiB at 4 × 16"
    )
    assert "peaks of {:,}, {:,}, {:,} bytes".format(*(r.peak for r in reports)) in changes.plot.alt


def test_categories_say_so_when_the_peak_does_not_fall(wide_pairs, capsys):
    one, accumulated = wide_pairs["SGD"]
    changes = show.categories([one, accumulated])
    assert "incoming gradients" in changes.grows and changes.peak_ratio < 1
    out = capsys.readouterr().out
    assert f"The peak does not fall: {one.peak:,} bytes at 64 × 1, {accumulated.peak:,} bytes at 8 × 8." in out
    assert "falls" not in changes.plot.figure.axes[0].get_title()


def test_categories_refuse_reports_of_different_effective_batches():
    with pytest.raises(ValueError, match="reports must split one effective batch.*got effective batches \\[32, 64\\]"):
        show.categories([cnn_report(64, 1), cnn_report(8, 4)])
    with pytest.raises(TypeError, match="reports must be two or more MemoryReports"):
        show.categories([cnn_report(64, 1)])


def test_accumulation_raises_the_sgd_peak_and_barely_moves_the_adam_peak(wide_pairs, capsys):
    effects = show.accumulation_effect(wide_pairs)
    sgd, adam = effects["SGD"], effects["Adam"]
    assert sgd.change == pytest.approx(51_783_836 / 35_856_988 - 1) and sgd.largest_change == "incoming gradients"
    assert sgd.accumulated.peak_phase == "backward"
    assert -1e-3 < adam.change < 0 and adam.accumulated.peak_phase == adam.one_batch.peak_phase == "step"
    assert adam.model_sized_share > 0.999
    out = capsys.readouterr().out
    assert (
        "SGD: 8 × 8 peaks 44% higher than 64 × 1. What changed most: incoming gradients, 0 → 16,785,408 bytes."
    ) in out
    assert "Adam: 8 × 8 peaks 0.014% lower than 64 × 1." in out
    assert "99.998% of the bytes are fixed by the model" in out  # not rounded up to 100.00%


def test_accumulation_effect_refuses_pairs_of_different_splits(wide_pairs):
    sgd_one, sgd_accumulated = wide_pairs["SGD"]
    adam_one, _ = wide_pairs["Adam"]
    with pytest.raises(ValueError, match="pairs must all compare the same two splits"):
        show.accumulation_effect({"SGD": (sgd_one, sgd_accumulated), "Adam": (adam_one, adam_one)})


def test_the_plan_is_said_with_the_next_larger_split_that_train_refuses(capsys):
    plan = memory.fit_batch(models.cnn(), (X[:1], Y[:1]), target_batch=256, memory_budget=2**19)
    show.plan(plan)
    out = capsys.readouterr().out
    assert "micro-batch × accum_steps = 8 × 32, peak 310,940 bytes" in out
    assert "The next larger micro-batch that divides 256, 16 × 16, would need 542,428 bytes" in out
    assert "has 15 samples, but no whole number of micro-batches of 15 makes 256" in out
    model = models.cnn()
    history = accumlib.train(
        model,
        (data.digits(256)[0], data.digits(256)[1]),
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=8,
        accum_steps=32,
        memory_budget=plan.memory_budget,
        measure_memory=False,
    )
    show.trained(history)
    assert capsys.readouterr().out == (
        "accumlib.train accepted it: 1 optimizer step of 32 micro-batches, 256 samples per step.\n"
    )


def test_a_plan_that_needs_no_accumulation_names_no_larger_split(capsys):
    show.plan(memory.fit_batch(models.cnn(), (X[:1], Y[:1]), target_batch=16, memory_budget=2**20))
    out = capsys.readouterr().out
    assert "micro-batch × accum_steps = 16 × 1" in out and "next larger" not in out and "at all" not in out


def test_categories_in_the_other_order_do_not_call_the_micro_batch_smaller(capsys):
    changes = show.categories([cnn_report(4, 16), cnn_report(64, 1)])
    assert changes.shrinks == ("gradients", "other")  # backwards: what accumulation adds falls away
    out = capsys.readouterr().out
    assert "What shrinks from 4 × 16 to 64 × 1:" in out and "micro-batch is" not in out
    assert "The peak does not fall" in out
