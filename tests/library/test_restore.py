"""accumlib.restore: what a cycle changes before its step is put back as found when it does not step; the modules'
modes after a run."""

import pytest
import torch
from torch import nn

import accumlib
from accumlib import restore


def model_with_batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))


def test_kept_puts_back_the_grad_and_the_running_statistics_found():
    model = model_with_batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    found = torch.full_like(model[0].weight, 3.0)
    model[0].weight.grad = found
    statistics = [b.clone() for b in model[1].buffers()]
    with restore._Kept(model, optimizer, list(model.parameters())) as kept:
        assert model[0].weight.grad is None  # set aside: the cycle's backward() starts from nothing
        nn.functional.cross_entropy(model(torch.randn(6, 4)), torch.zeros(6, dtype=torch.long)).backward()
        kept.restore()
    assert model[0].weight.grad is found and model[2].weight.grad is None
    assert all(torch.equal(a, b) for a, b in zip(statistics, model[1].buffers(), strict=True))


def test_an_error_in_the_block_restores_and_a_step_does_not():
    model = model_with_batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    statistics = model[1].running_mean.clone()
    with pytest.raises(RuntimeError, match="inside"), restore._Kept(model, optimizer, list(model.parameters())):
        model(torch.randn(6, 4))
        raise RuntimeError("inside")
    assert torch.equal(model[1].running_mean, statistics)
    with restore._Kept(model, optimizer, list(model.parameters())) as kept:
        nn.functional.cross_entropy(model(torch.randn(6, 4)), torch.zeros(6, dtype=torch.long)).backward()
        optimizer.step()
        kept.stepped()  # the step used them: the .grad freed, the statistics kept
    assert all(p.grad is None for p in model.parameters())
    assert not torch.equal(model[1].running_mean, statistics)


def test_modes_kept_puts_every_modules_mode_back_even_on_an_error():
    model = model_with_batchnorm().eval()
    model[1].train()  # a submodule in its own mode
    with pytest.raises(ValueError), restore._ModesKept(model):
        model.train()
        raise ValueError
    assert [m.training for m in model.modules()] == [False, False, True, False]


def test_train_leaves_the_modes_found():
    model = model_with_batchnorm()
    model[1].eval()  # frozen BatchNorm: train leaves a model in training mode as it is
    accumlib.train(
        model,
        (torch.randn(16, 4), torch.zeros(16, dtype=torch.long)),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=2,
        device="cpu",
    )
    assert [m.training for m in model.modules()] == [True, True, False, True]


def test_a_zero_grad_replaced_on_the_optimizer_itself_runs_once_per_step():
    """The step's zeroing is the optimizer's own: torch's zero_grad is done in place (every .grad None, as it does),
    but a zero_grad set on the instance (a mock counting calls, a wrapper) is called, once per step, like a
    subclass's override."""
    model = model_with_batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    torch_zero_grad = optimizer.zero_grad
    optimizer.zero_grad = lambda set_to_none=True: (calls.append(set_to_none), torch_zero_grad(set_to_none))
    batches = [(torch.randn(6, 4), torch.zeros(6, dtype=torch.long)) for _ in range(2)]
    accumlib.accumulate_and_step(model, batches, optimizer, [0.5, 0.5], loss_fn=nn.functional.cross_entropy)
    assert calls == [True] and all(p.grad is None for p in model.parameters())
    del optimizer.zero_grad  # torch's own again: every parameter's .grad is None after the step as well
    accumlib.accumulate_and_step(model, batches, optimizer, [0.5, 0.5], loss_fn=nn.functional.cross_entropy)
    assert calls == [True] and all(p.grad is None for p in model.parameters())
