"""accumlib.gaps: gradient_gap (accumulated against full-batch gradient) and parameter_gap (two models' weights), in
float64, leaving the model as found, never hiding a NaN."""

import math

import pytest
import torch
from torch import nn

import accumlib

X = torch.randn(64, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
Y = torch.randint(0, 5, (64,), generator=torch.Generator().manual_seed(1))


def mlp(dtype=torch.float64) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5)).to(dtype)


def test_parameter_gap_compares_every_tensor_and_refuses_other_layouts():
    a, b = mlp(), mlp()
    assert accumlib.parameter_gap(a, b) == 0
    with torch.no_grad():
        b[2].bias[3] += 0.25
    assert accumlib.parameter_gap(a, b) == 0.25
    assert accumlib.parameter_gap(a.state_dict(), b) == 0.25
    with pytest.raises(ValueError, match="differ in layout"):
        accumlib.parameter_gap(a, nn.Linear(12, 5))


def test_parameter_gap_never_hides_a_nan():
    model, reference = mlp(torch.float32), mlp(torch.float32)
    with torch.no_grad():
        model[2].bias[0] = float("nan")  # the last tensor compared: Python's max() kept the earlier value
    assert math.isnan(accumlib.parameter_gap(model, reference))


def test_gradient_gap_proves_the_trick_and_leaves_the_model_alone():
    model = mlp()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    before = [p.detach().clone() for p in model.parameters()]
    loss = nn.functional.cross_entropy
    assert accumlib.gradient_gap(model, X, Y, accum_steps=4, loss_fn=loss) < 1e-14
    assert accumlib.gradient_gap(model, X[:62], Y[:62], accum_steps=4, loss_fn=loss) < 1e-14  # chunks of 16, 16, 16, 14
    without_division = accumlib.gradient_gap(model, X, Y, accum_steps=4, loss_fn=loss, normalize="none")
    full_grad_max = max(g.abs().max().item() for g in torch.autograd.grad(loss(model(X), Y), model.parameters()))
    assert without_division == pytest.approx(3 * full_grad_max, rel=1e-9)  # 4x the gradient: off by 3x
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_gradient_gap_runs_exactly_accum_steps_micro_batches():
    """9 samples in 4 micro-batches (3, 2, 2, 2), not ceil(9 / 4) = 3 per micro-batch, which gives only 3."""
    calls = []

    def counting_loss(output, target):
        calls.append(len(target))
        return nn.functional.cross_entropy(output, target)

    assert accumlib.gradient_gap(mlp(), X[:9], Y[:9], accum_steps=4, loss_fn=counting_loss) < 1e-15
    assert calls == [9, 3, 2, 2, 2]


def test_gradient_gap_in_the_old_order_is_refused_by_name_before_anything_runs():
    """accumlib 0.x took (model, loss_fn, x, y, accum_steps): 1.0 takes the data after the model, as train does."""
    model, calls = mlp(), []

    def loss(output, target):
        calls.append(len(target))
        return nn.functional.cross_entropy(output, target)

    for old in ((model, loss, X, Y, 4), (model, loss, X, Y)):
        keywords = {} if len(old) == 5 else {"accum_steps": 4}
        with pytest.raises(TypeError, match=r"gradient_gap takes \(model, x, y, \*, accum_steps, loss_fn, normalize\)"):
            accumlib.gradient_gap(*old, **keywords)
    accumlib.set_language("hi")
    try:  # in the learner's language, as every refusal
        with pytest.raises(TypeError, match=r"gradient_gap के arguments इस क्रम में हैं: \(model, x, y, \*, accum_steps"):
            accumlib.gradient_gap(model, loss, X, Y, 4)
    finally:
        accumlib.set_language("en")
    assert calls == [] and all(p.grad is None for p in model.parameters())


def test_without_loss_fn_the_gap_is_of_the_models_own_loss_as_train_takes_it():
    """The library's default loss: the output's `.loss` (a Hugging Face model given labels), else cross-entropy."""

    class OwnLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, x):  # a squared loss, which cross-entropy would not give: the gap must be of this one
            return {"loss": self.net(x).square().mean()}

    assert accumlib.gradient_gap(OwnLoss(), X, Y, accum_steps=4) < 1e-15  # cross-entropy would refuse a dict
    model = mlp()
    assert accumlib.gradient_gap(model, X, Y, accum_steps=3, normalize="none") == accumlib.gradient_gap(
        model, X, Y, accum_steps=3, loss_fn=nn.functional.cross_entropy, normalize="none"
    )
