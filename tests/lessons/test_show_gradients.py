"""accumlib.lessons.show.gradients (lesson 2): what an accumulated gradient is called follows what it measures: equal
to the full-batch gradient, a multiple of it, or neither; gradient_gap's table; SGD against Adam without the
division."""

import pytest
import torch

import accumlib
from accumlib.lessons import data, models, pitfalls
from accumlib.lessons.quiz import experiments
from accumlib.lessons.show import gradients

LOSS = torch.nn.functional.cross_entropy
X, Y = data.digits(32, flat=True, dtype=torch.float64)


def accumulate(model, divide: bool = True, zero_inside: bool = False) -> list[torch.Tensor]:
    model.zero_grad()
    for xs, ys in zip(X.split(8), Y.split(8), strict=True):
        if zero_inside:
            model.zero_grad()
        (LOSS(model(xs), ys) / (4 if divide else 1)).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def model():
    return models.mlp(dtype=torch.float64)


@pytest.fixture(scope="module")
def full_batch(model):
    return [g.clone() for g in torch.autograd.grad(LOSS(model(X), Y), list(model.parameters()))]


def test_compare_tells_equal_multiple_and_neither_apart(model, full_batch, capsys):
    equal = gradients.compare(accumulate(model), full_batch)
    assert equal.equal and equal.ratio == pytest.approx(1)
    assert "equals the full-batch gradient" in capsys.readouterr().out
    four = gradients.compare(accumulate(model, divide=False), full_batch)
    assert not four.equal and four.proportional and four.ratio == pytest.approx(4)
    assert f"{four.largest_difference:.4f}" in capsys.readouterr().out.split("largest difference is ")[1]
    last_only = gradients.compare(accumulate(model, zero_inside=True), full_batch)
    assert not last_only.proportional and "it is not a multiple of it" in capsys.readouterr().out


def test_compare_refuses_gradients_of_another_model(full_batch):
    with pytest.raises(ValueError, match="accumulated and full_batch must hold one gradient per parameter"):
        gradients.compare(full_batch[:2], full_batch)


def test_gap_table_sees_k_times_the_gradient_only_where_accumulation_is_exact(model, full_batch, capsys):
    gaps = {
        k: {n: accumlib.gradient_gap(model, X, Y, accum_steps=k, loss_fn=LOSS, normalize=n) for n in ("steps", "none")}
        for k in (2, 4, 8)
    }
    assert gradients.gap_table(gaps, full_batch) is True
    out = capsys.readouterr().out
    assert "every gap is float rounding" in out and "each gap is accum_steps - 1 times" in out
    bound = gradients.ROUNDING * max(g.abs().max().item() for g in full_batch)  # printed instead of rounding digits
    assert out.count(f"< {bound:.1e}") == 3 and f"(at most {bound:.1e})" in out
    assert "\n          8" in out and "7.000" in out
    # BatchNorm: each micro-batch normalised on its own, so neither column is what the full batch gives
    digits = data.digits(32, dtype=torch.float64)
    batchnorm = models.cnn(norm="batch", dtype=torch.float64)
    full = torch.autograd.grad(LOSS(batchnorm(digits[0]), digits[1]), list(batchnorm.parameters()))
    gaps = {
        k: {
            n: accumlib.gradient_gap(batchnorm, *digits, accum_steps=k, loss_fn=LOSS, normalize=n)
            for n in ("steps", "none")
        }
        for k in (2, 4)
    }
    assert gradients.gap_table(gaps, full) is False
    out = capsys.readouterr().out
    assert "some gaps are larger than float rounding" in out and "not all accum_steps - 1 times" in out


def test_sgd_and_adam_reads_the_quiz_experiment(capsys):
    result = experiments.no_division_sgd_adam()
    share = gradients.sgd_and_adam(result)
    out = capsys.readouterr().out
    assert share == {"sgd": result["sgd"] / result["sgd_moved"], "adam": result["adam"] / result["adam_moved"]}
    assert "same weights as dividing with a 4 times larger learning rate" in out
    assert f"differ by {share['adam']:.1%} of how far they moved: the factor of 4 largely cancels" in out
    # the wording follows the numbers: an Adam difference as large as its movement does not "largely cancel"
    gradients.sgd_and_adam({**result, "adam": result["adam_moved"], "sgd_larger_lr": 1e-3})
    out = capsys.readouterr().out
    assert "does not cancel here" in out and "does not give the same weights" in out
    with pytest.raises(ValueError, match="it lacks \\['sgd_larger_lr'\\]"):
        gradients.sgd_and_adam({k: v for k, v in result.items() if k != "sgd_larger_lr"})


def test_logged_losses_the_true_step_loss_is_what_accumlib_records_for_any_split(capsys):
    def fresh():
        model = models.mlp(dtype=torch.float64)
        return model, torch.optim.SGD(model.parameters(), lr=0.5)

    model, optimizer = fresh()
    log = pitfalls.classic_train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=3)
    histories = {}
    for m, k in ((4, 3), (2, 6)):
        model, optimizer = fresh()
        histories[m, k] = accumlib.train(model, (X, Y), optimizer, micro_batch_size=m, accum_steps=k)
    mean = gradients.logged_losses(log, histories, accum_steps=3)
    assert all(h[0].loss == pytest.approx(mean, rel=1e-6) for h in histories.values())
    assert log.scaled_losses[0] == pytest.approx(log.true_losses[0] / 3)
    assert f"mean of its micro-batches' losses: {mean:.4f}" in capsys.readouterr().out


def test_one_cycle_says_what_grad_holds_for_the_seeds_loop_and_its_two_mistakes(capsys):
    """Lesson 0: the cycle as written, zeroed before every backward(), and without the division, each on a float64 copy
    of a float32 CNN that stays untouched (its weights and its .grad)."""
    model = models.cnn()
    before = [p.detach().clone() for p in model.parameters()]
    digits = data.digits(32)
    exact = gradients.one_cycle(model, *digits, accum_steps=4)
    assert exact.equal and "4 backward() calls added up in .grad: the full-batch gradient" in capsys.readouterr().out
    wiped = gradients.one_cycle(model, *digits, accum_steps=4, zero_every_micro_batch=True)
    out = capsys.readouterr().out
    assert not wiped.proportional and "the last micro-batch's gradient alone" in out and "the other 3 were wiped" in out
    four = gradients.one_cycle(model, *digits, accum_steps=4, divide=False)
    assert four.proportional and four.ratio == pytest.approx(4) and ".grad is 4.000 times" in capsys.readouterr().out
    # both mistakes at once: neither the full-batch gradient nor the last micro-batch's share of it
    both = gradients.one_cycle(model, *digits, accum_steps=4, divide=False, zero_every_micro_batch=True)
    assert not both.proportional and "the last micro-batch's gradient alone" in capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters()) and next(model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="a multiple of accum_steps=3"):
        gradients.one_cycle(model, *digits, accum_steps=3)
