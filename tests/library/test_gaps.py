"""accumlib.gaps: gradient_gap (accumulated against full-batch gradient) and parameter_gap (two models' weights), in
float64, leaving the model as found, never hiding a NaN; bad input refused naming the parameter, with the model
(BatchNorm buffers and a .grad included) as it was, even when loss_fn fails mid-way."""

import math

import pytest
import torch
from torch import nn

from found import ce
from states import same, snapshot

import accumlib
from builders import data, models

X = torch.randn(64, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
Y = torch.randint(0, 5, (64,), generator=torch.Generator().manual_seed(1))


X48, Y48 = data.digits(48)  # the refusals' data: 48 digit images


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


def raises_on_second_call():
    calls = []

    def loss(output, target):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("user code failed")
        return ce(output, target)

    return loss


GAP_CASES = [
    ("model-none", dict(model=None), TypeError, ["model", "None"]),
    ("loss-class", dict(loss_fn=nn.CrossEntropyLoss), TypeError, ["loss_fn", "CrossEntropyLoss()"]),
    ("loss-returns-float", dict(loss_fn=lambda o, t: ce(o, t).item()), TypeError, ["loss_fn", "float"]),
    ("x-dict", dict(x={"pixels": X48}), TypeError, ["x", "dict"]),
    ("x-list", dict(x=X48.tolist()), TypeError, ["x"]),
    ("y-number", dict(y=3), TypeError, ["y", "3"]),
    ("lengths", dict(y=Y48[:-1]), ValueError, ["x has 48", "y has 47"]),
    ("accum-steps-bool", dict(accum_steps=True), TypeError, ["accum_steps", "True"]),
    ("accum-steps-zero", dict(accum_steps=0), ValueError, ["accum_steps", "0"]),
    ("accum-steps-too-large", dict(accum_steps=49), ValueError, ["accum_steps=49", "1 to 48"]),
    ("normalize-count", dict(normalize="count"), ValueError, ["normalize", "'count'"]),
    ("normalize-false", dict(normalize=False), ValueError, ["normalize", "False"]),
    ("frozen", dict(model=models.cnn().requires_grad_(False)), ValueError, ["model", "trainable"]),
    ("loss-fails-midway", dict(loss_fn=raises_on_second_call()), RuntimeError, ["user code failed"]),
]


@pytest.mark.parametrize("case,changes,error,names", GAP_CASES, ids=[c[0] for c in GAP_CASES])
def test_gradient_gap_refuses_and_leaves_the_model_as_it_was(case, changes, error, names):
    model = models.cnn(norm="batch")
    model[0].weight.grad = torch.ones_like(model[0].weight)
    arguments = dict(model=model, loss_fn=ce, x=X48, y=Y48, accum_steps=4) | changes
    before = snapshot(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(error) as info:
        accumlib.gradient_gap(**arguments)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert same(snapshot(model, torch.optim.SGD(model.parameters(), lr=0.1)), before)  # buffers, even mid-way


def test_parameter_gap_refuses_what_it_cannot_compare():
    a = models.mlp()
    with pytest.raises(TypeError, match="model must be a torch.nn.Module or a state dict"):
        accumlib.parameter_gap(None, a)
    with pytest.raises(TypeError, match="reference must be a torch.nn.Module or a state dict"):
        accumlib.parameter_gap(a, [1, 2])
    squeezed = {k: v[:1] if k == "2.bias" else v for k, v in a.state_dict().items()}  # broadcasts silently before
    with pytest.raises(ValueError, match=r"2.bias has shape \(10,\) in model and \(1,\) in reference"):
        accumlib.parameter_gap(a, squeezed)
