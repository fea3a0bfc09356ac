"""accumlib.losses: the loss a micro-batch backpropagates, loss_fn's or the model's own, refused by name unless it
is a floating-point scalar with a gradient."""

from types import SimpleNamespace

import pytest
import torch

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
