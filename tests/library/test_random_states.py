"""accumlib.random_states: every random state a run draws from (torch's, NumPy's, Python's) taken as tensors and
numbers, which torch.load(weights_only=True) reads back, and put back exactly."""

import io
import random

import numpy as np
import pytest
import torch

from accumlib import random_states as randomness


def seed_everything(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def draws():
    """One number from each generator: equal draws mean equal states."""
    return torch.rand(1).item(), np.random.randn(), random.random()


def test_the_random_states_go_into_the_file_as_tensors_and_numbers_and_come_back():
    """NumPy's and Python's states are not pickled objects: they are turned into tensors and numbers, and back."""
    seed_everything(4)
    np.random.randn()  # a cached Gaussian in NumPy's state, too
    states = randomness._random_states()
    expected = draws(), draws()
    seed_everything(5)
    buffer = io.BytesIO()
    torch.save(states, buffer)
    buffer.seek(0)
    randomness._set_random_states(torch.load(buffer, weights_only=True))
    assert (draws(), draws()) == expected


def test_random_states_kept_puts_every_state_back_on_an_error_too():
    seed_everything(6)
    expected = draws()
    seed_everything(6)
    with pytest.raises(RuntimeError, match="inside"):
        with randomness.random_states_kept():
            draws()  # what a Dataset's fetch for train's checks draws
            raise RuntimeError("inside")
    assert draws() == expected
