"""accumlib.losses: the loss a micro-batch backpropagates, loss_fn's or the model's own, refused by name unless it
is a floating-point scalar with a gradient; through train, a model's own broken loss (a Hugging Face style model
computing it from labels) is named as the model's, not as loss_fn's, before the step."""

import copy
from types import SimpleNamespace

import pytest
import torch

from found import X, Y
from torch import nn

import accumlib
from accumlib import losses

OUTPUT = torch.randn(4, 3, requires_grad=True)
TARGET = torch.tensor([0, 1, 2, 0])


def test_without_loss_fn_the_loss_is_the_models_own_else_cross_entropy():
    own = (OUTPUT**2).mean()
    assert losses._own_loss({"loss": own, "logits": OUTPUT}, None) is own  # a Hugging Face dict
    assert losses._own_loss(SimpleNamespace(loss=own), None) is own  # a ModelOutput's attribute
    assert torch.equal(losses._own_loss(OUTPUT, TARGET), torch.nn.functional.cross_entropy(OUTPUT, TARGET))


@pytest.mark.parametrize(
    "loss, error, words",
    [
        (0.5, TypeError, "must be a scalar tensor, got 0.5 of type float"),
        (torch.ones(2, requires_grad=True), ValueError, "must be a scalar, got a tensor of shape (2,)"),
        (torch.tensor(1), TypeError, "is a tensor of torch.int64, which has no gradient"),
        (torch.tensor(1.0), ValueError, "has no gradient (requires_grad=False)"),
    ],
)
def test_a_broken_own_loss_is_refused_naming_where_it_came_from(loss, error, words):
    with pytest.raises(error) as info:
        losses._own_loss({"loss": loss}, None)
    assert str(info.value).startswith("the model's own loss (output['loss']; no loss_fn was given)")
    assert words in str(info.value)


def test_an_output_without_loss_and_no_loss_fn_says_what_to_do():
    with pytest.raises(TypeError, match=r"^the model returned dict without a loss .* give loss_fn\(output, target\)"):
        losses._own_loss({"logits": OUTPUT}, TARGET)


def test_loss_fn_must_return_a_scalar_with_a_gradient():
    assert losses._scalar_loss(OUTPUT.sum()) is not None
    with pytest.raises(TypeError, match=r"^loss_fn must return a scalar tensor, got 1\.0 of type float"):
        losses._scalar_loss(1.0)
    with pytest.raises(ValueError, match=r"^loss_fn returned a tensor without a gradient"):
        losses._scalar_loss(OUTPUT.detach().sum())


DEFAULT_WITHOUT_GRADIENT = (
    "the default loss (cross-entropy of the model's output; no loss_fn was given) has no gradient (requires_grad=False)"
)


def test_the_default_loss_without_a_gradient_is_named_as_the_default_not_as_loss_fn():
    with pytest.raises(ValueError) as info:
        losses._own_loss(OUTPUT.detach(), TARGET)
    assert str(info.value).startswith(DEFAULT_WITHOUT_GRADIENT) and "frozen" in str(info.value)


def test_a_model_frozen_by_on_step_is_refused_naming_the_default_loss_with_step_1_kept():
    """No loss_fn: an on_step that freezes every parameter makes step 2's cross-entropy gradient-free; the refusal
    names the default loss and the freezing (not loss_fn, which the user never gave), step 1's record travels with
    it and the weights are as step 1 left them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3, dtype=torch.float64)
    x = torch.randn(8, 6, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    after_step_1 = []

    def freeze(record):
        after_step_1.append(copy.deepcopy(model.state_dict()))
        model.requires_grad_(False)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError) as refused:
        accumlib.train(model, (x, y), optimizer, micro_batch_size=4, accum_steps=1, on_step=freeze, device="cpu")
    assert str(refused.value).startswith(DEFAULT_WITHOUT_GRADIENT) and "on_step that freezes" in str(refused.value)
    assert [r.step for r in refused.value.history] == [1]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in after_step_1[0].items())


class OwnLoss(nn.Module):
    """A model that computes its own loss from labels (as a Hugging Face model does), in one of the broken forms."""

    def __init__(self, kind: str, key: bool):
        super().__init__()
        self.layer, self.kind, self.key = nn.Linear(64, 10), kind, key

    def forward(self, x, labels):
        per_sample = nn.functional.cross_entropy(self.layer(x.flatten(1)), labels, reduction="none")
        loss = {
            "a vector": per_sample,
            "a float": 0.5,
            "detached": per_sample.mean().detach(),
            "an integer tensor": labels.sum(),
            "a tensor without grad": per_sample.mean(),
        }[self.kind]
        if self.kind == "a tensor without grad":
            self.requires_grad_(False)  # frozen from here on, as an on_step that freezes the model leaves it
        return {"loss": loss} if self.key else type("Output", (), {"loss": loss})()


@pytest.mark.parametrize("key", [True, False], ids=["output['loss']", "output.loss"])
@pytest.mark.parametrize(
    "kind, error, message",
    [
        ("a vector", ValueError, "must be a scalar, got a tensor of shape (4,): reduce it in the model"),
        (
            "a float",
            TypeError,
            "must be a scalar tensor, got 0.5 of type float: let the model return the tensor itself",
        ),
        (
            "detached",
            ValueError,
            "has no gradient (requires_grad=False): the model computed it outside its parameters'",
        ),
        ("an integer tensor", TypeError, "is a tensor of torch.int64, which has no gradient"),
        ("a tensor without grad", ValueError, "has no gradient (requires_grad=False)"),
    ],
)
def test_a_models_own_broken_loss_is_named_as_the_models_not_as_loss_fn(kind, error, message, key):
    """Without loss_fn, the model's own loss is refused naming it (the user passed no loss_fn), before the step."""
    torch.manual_seed(0)
    model = OwnLoss(kind, key)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = copy.deepcopy(model.state_dict())
    where = "output['loss']" if key else "output.loss"
    batches = [{"x": X[i : i + 4], "labels": Y[i : i + 4]} for i in range(0, 8, 4)]
    with pytest.raises(error) as refused:
        accumlib.train(model, batches, optimizer, accum_steps=2, device="cpu")
    assert str(refused.value).startswith(f"the model's own loss ({where}; no loss_fn was given) {message}")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), before.values(), strict=True))
