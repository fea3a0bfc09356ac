"""accumlib.run_checks: train's arguments checked before anything changes (most refusals, each named: the cases of
test_hostile_train.py); the device to train on refused unless it can hold the model."""

import pytest
import torch
from states import same, snapshot

import accumlib
from builders import data, models

X, Y = data.digits(48)


def trained():
    """A BatchNorm CNN and an Adam optimizer that has state, after one short run."""
    model = models.cnn(norm="batch")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    accumlib.train(model, (X[:16], Y[:16]), optimizer, micro_batch_size=8, accum_steps=1)
    return model, optimizer


def test_cuda_is_refused_where_there_is_none():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model, optimizer = trained()
    before = snapshot(model, optimizer)
    with pytest.raises(ValueError, match="device='cuda' is not available"):
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=2, device="cuda")
    assert same(snapshot(model, optimizer), before)
