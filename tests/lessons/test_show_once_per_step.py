"""accumlib.lessons.show.once_per_step (lesson 8): its findings follow the measured runs, and the gradients it reports
are the ones the optimizer steps really used."""

import pytest
import torch

import accumlib
from accumlib.lessons import data, models, pitfalls
from accumlib.lessons.show import once_per_step

X, Y = data.digits(48, flat=True)


def fresh():
    model = models.mlp()
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    """The findings are printed; the figures are not what these tests look at."""
    monkeypatch.setattr(once_per_step, "figure", lambda plot: plot)


def test_schedule_finding_names_the_step_the_fast_schedule_reaches_the_last_rate_and_its_climb(capsys):
    def scheduled(per_micro_batch):
        model, optimizer = fresh()
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=8)
        return pitfalls.classic_train(
            model,
            (X, Y),
            optimizer,
            micro_batch_size=4,
            accum_steps=3,
            epochs=2,
            scheduler=scheduler,
            scheduler_per_micro_batch=per_micro_batch,
        ).step_lrs

    rates = once_per_step.schedules(scheduled)
    printed = capsys.readouterr().out
    assert len(rates[False]) == len(rates[True]) == 8  # 48 samples, 12 per step, 2 epochs
    # the cosine stepped 3 times per optimizer step reaches the right schedule's last rate (step 8) by step 3
    assert min(i for i, lr in enumerate(rates[True], 1) if lr <= rates[False][-1] + 1e-12) == 3
    assert (
        f"falls to {rates[False][-1]:.3f} by step 3 instead of step 8, then climbs back to "
        f"{max(rates[True][2:]):.3f}" in printed
    )
    assert (
        "PyTorch warned while the scheduler stepped after every micro-batch: Detected call of "
        "`lr_scheduler.step()` before `optimizer.step()`." in printed
    )
    assert "PyTorch warned while the scheduler stepped once per optimizer step" not in printed


@pytest.mark.parametrize(
    "fast, finding",
    [
        ([0.9, 0.1, 0.1, 0.1], "falls to 0.100 by step 2 instead of step 4."),
        ([0.9, 0.2, 0.1, 0.4], "falls to 0.100 by step 3 instead of step 4, then climbs back to 0.400."),
        (
            [0.9, 0.8, 0.7, 0.6],
            "never falls to 0.100, the last learning rate of the schedule stepped once per optimizer step (step 4).",
        ),
    ],
)
def test_schedule_finding_wording_follows_the_rates(capsys, fast, finding):
    right = [1.0, 0.6, 0.3, 0.1]
    once_per_step.schedules(lambda per_micro_batch: fast if per_micro_batch else right, shown_steps=4)
    assert finding in capsys.readouterr().out


def test_clipping_reports_the_gradients_the_steps_used_the_right_one_being_the_clipped_cycle_gradient(capsys):
    max_norm = 0.05

    def clipped(per_micro_batch):
        model, optimizer = fresh()
        pitfalls.classic_train(
            model,
            (X, Y),
            optimizer,
            micro_batch_size=4,
            accum_steps=3,
            clip_grad_norm=max_norm,
            clip_per_micro_batch=per_micro_batch,
        )
        return model

    gradients = once_per_step.clipping(clipped, max_norm=max_norm)
    printed = capsys.readouterr().out
    # the first cycle's full-batch gradient, computed here independently, clipped to max_norm
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))  # classic_train's order, seed 0
    model, _ = fresh()
    first = order[:12]
    torch.nn.functional.cross_entropy(model(X[first]), Y[first]).backward()
    full = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
    assert full.norm() > max_norm  # so clipping acts
    assert torch.allclose(gradients[False][0], full * max_norm / full.norm(), atol=1e-6)
    # clipped inside the loop: the allowed length, another direction
    assert gradients[True][0].norm().item() == pytest.approx(max_norm, rel=1e-4)
    share = ((gradients[True][0] - gradients[False][0]).norm() / gradients[False][0].norm()).item()
    assert share > 0.05
    assert f"differs from the right one by {share:.0%} of the right one's length" in printed
    assert len(gradients[False]) == len(gradients[True]) == 4


def test_scaler_mistakes_two_raise_one_trains_silently_with_a_vanishing_gradient(capsys):
    def amp_run(**mistake):
        model = models.mlp()
        pitfalls.classic_train(
            model,
            (X, Y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            scaler=torch.amp.GradScaler("cpu"),
            **mistake,
        )

    outcomes = once_per_step.scaler_mistakes(amp_run)
    printed = capsys.readouterr().out
    assert [type(o.error).__name__ if o.error else None for o in outcomes] == [
        None,
        "RuntimeError",
        "AssertionError",
        None,
    ]
    right, silent = outcomes[0], outcomes[3]
    assert len(right.step_norms) == len(silent.step_norms) == 4
    ratio = silent.step_norms[0] / right.step_norms[0]
    assert ratio < 1e-4  # about (the last micro-batch's share) / 65536
    assert f"step 1's gradient is {ratio:.1e} times the right one" in printed
    rows = {line.split("  ")[0]: line for line in printed.splitlines()}
    assert "PyTorch raises RuntimeError" in rows["unscale_()"] and "PyTorch raises AssertionError" in rows["update()"]
    assert "trains, silently" in rows["unscale_(), update()"]
    assert "AssertionError: No inf checks were recorded prior to update." in printed


def test_pytorch_messages_stay_as_pytorch_words_them_with_their_meaning_in_hindi(capsys):
    """PyTorch speaks English in every language: the lesson shows its message as it is and, in Hindi, what it means
    (review item L8-4); in English the message is shown alone, and an unknown message is never glossed."""

    def amp_run(**mistake):
        model = models.mlp()
        pitfalls.classic_train(
            model,
            (X, Y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            micro_batch_size=4,
            accum_steps=3,
            scaler=torch.amp.GradScaler("cpu"),
            **mistake,
        )

    try:
        accumlib.set_language("hi")
        once_per_step.scaler_mistakes(amp_run)
        hindi = capsys.readouterr().out
        assert once_per_step.pytorch_says("some other message.") == "some other message."
    finally:
        accumlib.set_language("en")
    once_per_step.scaler_mistakes(amp_run)
    english = capsys.readouterr().out
    for message in (
        "unscale_() has already been called on this optimizer since the last update().",
        "No inf checks were recorded prior to update.",
    ):
        assert f"Error: {message}\n" in english  # the message alone, ending its line
        line = next(line for line in hindi.splitlines() if message in line)
        assert line.startswith(("RuntimeError: ", "AssertionError: ")) and "(यानी: " in line and line.endswith(")")


def test_the_float32_zeros_are_the_entries_no_sample_reaches(capsys):
    # lesson 8's 40.5% of exact zeros in float32: not underflow, the pixels and hidden units no sample reaches
    from accumlib.lessons import data, models

    X, y = data.digits(12, flat=True)
    model = models.mlp()
    torch.nn.functional.cross_entropy(model(X), y).mul(1e-6).backward()
    float32 = torch.cat([p.grad.flatten() for p in model.parameters()]) == 0
    fresh = models.mlp()  # the same initial weights
    assert torch.equal(once_per_step.unreached(fresh, X), float32) and 0.3 < float32.double().mean() < 0.5
    tiny = float32.clone()
    tiny[~float32] = torch.arange(int((~float32).sum())) % 2 == 0  # every other reached entry rounded to 0
    assert once_per_step.zeros_explained({"float32": float32, "tiny": tiny}, fresh, X) == {
        "float32": 0,
        "tiny": int(tiny.sum() - float32.sum()),
    }
    printed = capsys.readouterr().out
    assert f"No sample reaches {float32.double().mean().item():.1%} of the entries" in printed
    assert "gradient is 0 in every type. Rounded to 0 beyond those: float32 0, tiny " in printed
