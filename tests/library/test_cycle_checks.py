"""accumlib.cycle_checks: what a cycle is given, refused by name before anything changes."""

import pytest
import torch
from torch import nn

from accumlib import cycle_checks

MODEL = nn.Linear(3, 2)


def test_an_optimizer_the_cycle_cannot_step_is_refused_naming_why():
    with pytest.raises(ValueError, match=r"^optimizer is a LBFGS, whose step\(\) needs a closure"):
        cycle_checks._check_optimizer(MODEL, torch.optim.LBFGS(MODEL.parameters()))
    with pytest.raises(ValueError, match=r"^optimizer holds none of the model's trainable parameters"):
        cycle_checks._check_optimizer(MODEL, torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.1))
    held = torch.optim.SGD(MODEL.parameters(), lr=0.1)
    assert cycle_checks._check_optimizer(MODEL, held) == list(MODEL.parameters())


def test_loss_weights_are_finite_non_negative_and_within_the_parameters_dtype():
    cycle_checks._check_weights([0.5, torch.tensor(0.5), 0])
    with pytest.raises(ValueError, match=r"^loss_weights\[1\] is -0\.5: "):
        cycle_checks._check_weights([0.5, -0.5])
    with pytest.raises(ValueError, match=r"^loss_weights\[0\] is tensor\(inf\)"):
        cycle_checks._check_weights([torch.tensor(float("inf"))])
    with pytest.raises(ValueError, match=r"more than the largest float16 \(65504\)"):
        cycle_checks._check_weights([1e5], torch.float16)


def test_a_micro_batch_without_samples_or_off_the_models_device_is_refused():
    with pytest.raises(ValueError, match=r"^micro_batches\[1\] holds a tensor of shape \(0, 3\), without samples"):
        cycle_checks._check_micro_batches(MODEL, [(torch.zeros(2, 3), torch.zeros(2)), (torch.zeros(0, 3), None)])
    with pytest.raises(ValueError, match=r"^micro_batches\[0\] holds a tensor on meta but the model is on cpu"):
        cycle_checks._check_micro_batches(MODEL, [(torch.zeros(2, 3, device="meta"), None)])
