"""accumlib.lessons.show.last_cycle (lesson 4): the weights of a short last cycle, which treatments of it match one
batch per cycle, and the weight of a token in a mean of means against a count over the cycle, all as measured."""

import pytest
import torch

import accumlib
from accumlib.lessons import data, models, pitfalls
from accumlib.lessons.show import last_cycle

X, Y = data.digits(50, flat=True, dtype=torch.float64)  # micro-batches of 4, cycles of 3: 4 full cycles, then 2 samples


def fresh():
    model = models.mlp(dtype=torch.float64)
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


def test_weights_of_the_short_last_cycle(capsys):
    sizes = [len(part) for part in X.split(4)]
    cycles = last_cycle.weights(sizes, accum_steps=3)
    out = capsys.readouterr().out
    assert cycles[-1] == [2] and len(cycles) == 5
    assert (
        "50 samples in micro-batches of at most 4: 13 micro-batches. They make 5 cycles of up to 3 micro-batches."
    ) in out
    assert "\n    5              1        2  1/3                          1\n" in out
    assert (
        "its step gets 33% of the gradient one batch of those 2 samples gives; weighted by their samples, 100%."
    ) in out
    last_cycle.weights([4, 4, 4, 4, 2], accum_steps=3)  # a last cycle of 4 and 2 samples: 4/6 and 2/6 of it
    out = capsys.readouterr().out
    assert "1/3, 1/3, 1/3" in out and "2/3, 1/3" in out and "its step gets 67% of the gradient" in out
    last_cycle.weights([4] * 9, accum_steps=3)
    assert "Every cycle is full" in capsys.readouterr().out
    last_cycle.weights([3], accum_steps=3)  # one micro-batch: singular, not "1 micro-batches, 1 cycles"
    assert (
        "3 samples in micro-batches of at most 3: 1 micro-batch. They make 1 cycle of up to 3 micro-batches."
        in capsys.readouterr().out
    )
    with pytest.raises(ValueError, match="sizes must list the samples of each micro-batch"):
        last_cycle.weights([4, 0], accum_steps=3)


def test_last_cycles_finds_only_the_weighted_loops_exact(capsys):
    reference, optimizer = fresh()
    accumlib.train(reference, (X, Y), optimizer, micro_batch_size=12, accum_steps=1, epochs=2, measure_memory=False)
    runs = {}
    for treatment in pitfalls.LAST_CYCLE_CHOICES:
        model, optimizer = fresh()
        steps = []
        pitfalls.classic_train(
            model,
            (X, Y),
            optimizer,
            micro_batch_size=4,
            accum_steps=3,
            epochs=2,
            last_cycle=treatment,
            on_step=steps.append,
        )
        runs[treatment] = (model, steps)
    model, optimizer = fresh()
    history = accumlib.train(
        model, (X, Y), optimizer, micro_batch_size=4, accum_steps=3, epochs=2, measure_memory=False
    )
    gaps = last_cycle.last_cycles(runs, reference, library=(model, history))
    out = capsys.readouterr().out
    assert max(gaps["weighted"], gaps["accumlib.train"]) <= last_cycle.ROUNDING
    assert min(gaps[name] for name in pitfalls.LAST_CYCLE) > 1e-3
    assert (
        f"Only weighted and accumlib.train give the weights of training with one batch per cycle, up to rounding "
        f"(at most {last_cycle.ROUNDING:.1e})" in out
    )
    # their rows print the rounding bound, not the rounding's digits (those change with the CPU and the threads)
    assert out.count(f"< {last_cycle.ROUNDING:.1e}") == sum(gaps[name] <= last_cycle.ROUNDING for name in gaps)
    assert "\nleak                           8  3, 4  " in out  # the leaked tail makes a step of 4 micro-batches
    assert "\ndrop                           8  3  " in out and "\nweighted                      10  1, 3  " in out
    last_cycle.last_cycles({"drop": runs["drop"]}, reference, library=(runs["drop"][0], history))
    assert "None of them gives" in capsys.readouterr().out


def test_token_weights_of_the_first_cycle(capsys):
    _, targets = data.token_sequences(48, seed=1)
    found = last_cycle.token_weights(targets, micro_batch_size=4, accum_steps=5)
    out = capsys.readouterr().out
    counts = [data.count_tokens(part) for part in targets[:20].split(4)]
    # either way every token of the cycle together weighs 1; a mean of means gives tokens of a short micro-batch more
    assert sum(n * w for n, w in zip(counts, found["mean"], strict=True)) == pytest.approx(1)
    assert found["count"] == [1 / sum(counts)] * 5
    ratio = max(counts) / min(counts)
    assert f"({min(counts)} tokens) weighs {ratio:.1f} times as much as one of micro-batch" in out
    assert f"every token weighs the same: 1/{sum(counts)}." in out


def test_tokens_compares_each_normalisation_with_the_reference(capsys):
    tokens, targets = data.token_sequences(24, seed=1)

    def run(micro_batch_size, accum_steps, **loss):
        model = models.sequence_model(dtype=torch.float64)
        accumlib.train(
            model,
            (tokens, targets),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=micro_batch_size,
            accum_steps=accum_steps,
            measure_memory=False,
            **loss,
        )
        return model

    by_tokens = dict(loss_fn=models.token_loss_sum, loss_reduction="sum", normalize="count", count=data.count_tokens)
    gaps = last_cycle.tokens(
        {"mean": run(4, 3, loss_fn=models.token_loss_mean), "count": run(4, 3, **by_tokens)}, run(12, 1, **by_tokens)
    )
    out = capsys.readouterr().out
    assert gaps["count"] <= last_cycle.ROUNDING < 1e-4 < gaps["mean"]
    assert f"mean of micro-batch means: off by up to {gaps['mean']:.1e}." in out
    assert (
        f"sum / tokens in the cycle: the weights of one batch per cycle, up to rounding (at most "
        f"{last_cycle.ROUNDING:.1e})." in out
    )
    assert f"< {last_cycle.ROUNDING:.1e}" in out and f"{gaps['mean']:.1e}" in out.splitlines()[1]
