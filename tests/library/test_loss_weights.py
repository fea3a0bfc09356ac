"""accumlib.loss_weights: each micro-batch's share of its cycle (the last-cycle rule) and count's calling rule; with
normalize="count", the cycle's loss terms counted a cycle at a time as train reaches it (issue 23, case 6)."""

import copy
import signal
import warnings

import pytest
import torch
from found import stop_at

import accumlib
from accumlib import loss_weights
from builders import data, models


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_samples_weights_make_a_short_last_cycle_one_batch_of_its_samples(reduction):
    """sizes [4, 4, 2] (a last cycle of 10 samples): a mean loss weighted by size / 10 (a sum by 1 / 10) is the mean
    over the cycle's samples; a 0-row micro-batch gets 0."""
    weights = loss_weights._loss_weights("samples", reduction, [4, 4, 2, 0], 10, 4, 1)
    assert weights == ([0.4, 0.4, 0.2, 0.0] if reduction == "mean" else [0.1, 0.1, 0.1, 0.0])


def test_steps_weights_are_the_classic_one_over_accum_steps_even_on_a_short_cycle():
    assert loss_weights._loss_weights("steps", "mean", [4, 2], 6, 4, 1) == [0.25, 0.25]  # too small: 2 of 4 ran


def test_count_weights_share_the_cycles_terms_and_ddp_multiplies_by_the_processes():
    """A mean over its terms weighs terms / total; a micro-batch without terms (or rows) 0. Under DDP (world 2) the
    gradients are averaged over processes, so each share is doubled: the processes' weights add up to the cycle."""
    one = loss_weights._loss_weights("count", "mean", [4, 4, 4], 12, 3, 1, [3.0, 0.0, 5.0], 8.0)
    assert one == [3 / 8, 0.0, 5 / 8]
    two = loss_weights._loss_weights("count", "sum", [4, 4], 16, 2, 2, [3.0, 5.0], 16.0)
    assert two == [2 / 16, 2 / 16]


def test_count_gets_the_target_and_the_old_two_argument_form_warns():
    seen = []
    target = loss_weights._of_batch(lambda y: seen.append(y) or 1)
    assert target((torch.zeros(2), "y")) == 1 and seen == ["y"]
    assert target({"labels": 1}) == 1 and seen[-1] == {"labels": 1}  # a dict batch is its own target
    with pytest.warns(DeprecationWarning, match=r"count\(x, y\) is deprecated"):
        pair = loss_weights._of_batch(lambda x, y: len(x) + len(y))
    assert pair(("ab", "c")) == 3
    with pytest.raises(
        TypeError, match=r"^count takes two arguments, count\(x, y\), the old form for \(x, y\) batches, "
    ):
        pair({"labels": "c"})  # a dict batch: the old form cannot apply, said instead of the lambda's own TypeError
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_weights._of_batch(len)  # a builtin takes the one rule, silently


def test_counts_whose_sum_float64_cannot_hold_are_refused_by_name_before_the_cycle_changes_anything():
    """Three micro-batches of 1e308 terms each: every count is finite, their total is not; refused naming count
    and the step (before: every weight count / inf = 0, and the cycle recorded as one with nothing to learn)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3, dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(12, 6, dtype=torch.float64), torch.tensor([0, 1, 2] * 4)
    batches = list(zip(x.split(4), y.split(4), strict=True))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        ValueError, match=r"^count's loss terms for step 1 \(epoch 0\) add up to more than the largest "
    ):
        accumlib.train(
            model, batches, optimizer, accum_steps=3, normalize="count", count=lambda target: 1e308, device="cpu"
        )
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), before.values(), strict=True))
    assert not optimizer.state and all(p.grad is None for p in model.parameters())


# --- issue 23, case 6: token counts are computed a cycle at a time ---------------------------------------------
# A run of 10**9 epochs starts at once, Ctrl-C while counting stops cleanly, a cycle without loss terms is not
# stepped. Comparisons of weights are exact (== 0.0) where both runs do the same operations on the same data in the
# same order.

X, Y = data.token_sequences(48, seed=3)  # token sequences for normalize="count": micro-batch 4 x 2 = 6 steps/epoch


COUNTED = dict(
    loss_fn=models.token_loss_sum,
    loss_reduction="sum",
    normalize="count",
    micro_batch_size=4,
    accum_steps=2,
    shuffle=False,
)


def counting(calls):
    """data.count_tokens, noting each call."""

    def count(y):
        calls.append(1)
        return data.count_tokens(y)

    return count


def reference(steps, **options):
    """The same run, stopped by max_steps after `steps` steps."""
    model = models.sequence_model()
    accumlib.train(
        model,
        (X, Y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        count=data.count_tokens,
        max_steps=steps,
        **(COUNTED | options),
    )
    return model


def test_case_6_a_counted_run_of_a_billion_epochs_starts_at_once():
    """Stopped by StopTraining at step 2, the run has counted 2 cycles' micro-batches: 4, not 10**9 epochs' worth."""
    calls = []
    model = models.sequence_model()
    history = accumlib.train(
        model,
        (X, Y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        count=counting(calls),
        epochs=10**9,
        on_step=stop_at(2),
        **COUNTED,
    )
    assert history.stopped == "StopTraining" and len(history) == 2
    assert len(calls) == 2 * 2
    assert accumlib.parameter_gap(model, reference(2)) == 0.0


def test_case_6_ctrl_c_while_counting_stops_cleanly():
    """A real SIGINT delivered inside count, at step 3's counting: history.stopped, the two steps taken, no more."""
    calls = []

    def interrupted(y):
        calls.append(1)
        if len(calls) == 5:  # the first micro-batch of step 3
            signal.raise_signal(signal.SIGINT)
        return data.count_tokens(y)

    model = models.sequence_model()
    history = accumlib.train(
        model, (X, Y), torch.optim.SGD(model.parameters(), lr=0.5), count=interrupted, epochs=10**9, **COUNTED
    )
    assert history.stopped == "KeyboardInterrupt"
    assert [r.step for r in history] == [1, 2]
    assert accumlib.parameter_gap(model, reference(2)) == 0.0
    assert all(p.grad is None for p in model.parameters())


def test_case_6_a_cycle_without_loss_terms_is_not_stepped_and_the_run_goes_on():
    """Counting a cycle at a time, the cycle without terms (step 2) has nothing to learn: it is recorded as empty
    (not skipped), not stepped, and the run goes on: the run without step 2's samples, bit for bit."""
    blank = Y.clone()
    blank[8:16] = data.PAD  # step 2's targets: nothing but padding
    model = models.sequence_model()
    history = accumlib.train(
        model, (X, blank), torch.optim.SGD(model.parameters(), lr=0.5), count=data.count_tokens, **COUNTED
    )
    assert [(r.step, r.empty, r.skipped) for r in history][:3] == [
        (1, False, False),
        (2, True, False),
        (3, False, False),
    ]
    assert [r.empty for r in history].count(True) == 1
    without = models.sequence_model()
    kept = torch.cat([torch.arange(8), torch.arange(16, len(X))])
    accumlib.train(
        without,
        (X[kept], blank[kept]),
        torch.optim.SGD(without.parameters(), lr=0.5),
        count=data.count_tokens,
        **COUNTED,
    )
    assert accumlib.parameter_gap(model, without) == 0.0
