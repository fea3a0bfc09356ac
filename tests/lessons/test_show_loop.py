"""accumlib.lessons.show.loop (lesson 3): the findings follow the runs: the same weights or not, what a misplaced line
did, and which micro-batches a step condition steps after."""

import pytest
import torch

import accumlib
from accumlib.lessons import data, models, pitfalls
from accumlib.lessons.show import loop

X, Y = data.digits(48, flat=True, dtype=torch.float64)  # 12 micro-batches of 4: 4 cycles of 3


def fresh():
    model = models.mlp(dtype=torch.float64)
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


@pytest.fixture(scope="module")
def library():
    model, optimizer = fresh()
    history = accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=3, measure_memory=False)
    return model, history


def classic(**mistake):
    model, optimizer = fresh()
    steps = []
    pitfalls.classic_train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=3, on_step=steps.append, **mistake)
    return model, steps


def test_same_weights_says_equal_only_when_they_are(library, capsys):
    model, history = library
    hand, _ = classic()
    same = loop.same_weights(hand, model, history)
    assert same <= loop.ROUNDING
    out = capsys.readouterr().out
    assert (
        "end with exactly the same weights, bit for bit"
        if same == 0
        else "end with the same weights: they differ by at most"
    ) in out and "4 optimizer steps, each of 3 micro-batches and 12 samples" in out
    other, _ = fresh()
    gap = loop.same_weights(other, model, history)
    assert gap > 1e-3 and f"different weights: they differ by up to {gap:.2e}" in capsys.readouterr().out


def test_misplaced_names_what_each_mistake_did(library, capsys):
    runs = {
        "": classic(),
        "zero_every_micro_batch": classic(zero_every_micro_batch=True),
        "step_every_micro_batch": classic(step_every_micro_batch=True),
        "divide": classic(divide=False),
    }
    gaps = loop.misplaced(runs, library[0], accum_steps=3)
    out = capsys.readouterr().out
    assert gaps[""] <= loop.ROUNDING < 1e-3 < min(gaps[name] for name in runs if name)
    assert "zero_grad() before every backward(): every step's gradient holds 1 micro-batch, not 3: 4 steps" in out
    assert "step() after every micro-batch: every step's gradient holds 1 micro-batch, not 3: 12 steps" in out
    assert "no division: every step holds its 3 micro-batches, yet the weights are off" in out
    with pytest.raises(ValueError, match="runs: unknown mistakes \\['clip'\\]"):
        loop.misplaced({"clip": runs[""]}, library[0], accum_steps=3)


def test_step_schedule_counts_what_each_condition_steps(capsys):
    steps = range(10)
    held = loop.step_schedule(
        {
            "(step + 1) % 4 == 0": [s for s in steps if (s + 1) % 4 == 0],
            "step % 4 == 0": [s for s in steps if s % 4 == 0],
        },
        10,
        4,
    )
    out = capsys.readouterr().out
    assert held == {"(step + 1) % 4 == 0": [4, 4], "step % 4 == 0": [1, 4, 4]}
    assert (
        "(step + 1) % 4 == 0: the last 2 micro-batches get no step in this epoch: they join the next epoch's first "
        "step (lesson 4); only after the last epoch are they never applied."
    ) in out
    assert "step % 4 == 0: the first step comes after 1 micro-batch, not 4." in out
    assert "step % 4 == 0: the last micro-batch gets no step in this epoch" in out
    loop.step_schedule({"right": [3, 7, 11]}, 12, 4)
    out = capsys.readouterr().out  # a right condition: its table row alone, no finding line repeating it
    assert out.splitlines()[1].split() == ["right", "4,", "8,", "12", "4,", "4,", "4", "0"] and "right:" not in out
    with pytest.raises(ValueError, match="must list increasing step values from 0 to 11"):
        loop.step_schedule({"wrong": [3, 12]}, 12, 4)


def test_zeroing_places_zeroing_at_the_cycles_start_trains_like_zeroing_after_the_step(capsys):
    """Lesson 0: the seed's `if step % accum_steps == 0: zero_grad()` and zeroing after the step, one epoch each on a
    copy of the model: the same weights, bit for bit (nothing touches .grad in between)."""
    model = models.mlp(dtype=torch.float64)
    before = [p.detach().clone() for p in model.parameters()]
    assert loop.zeroing_places(model, (X, Y), micro_batch_size=4, accum_steps=3) == 0
    assert "the same weights after 4 steps, bit for bit" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
