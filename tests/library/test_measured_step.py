"""accumlib.measured_step: one step measured on the copies it is given; here the copies themselves (the optimizer's,
the micro-batches') and the wording of a model's failure. What a step's peak is made of: test_memory.py."""

import copy

import pytest
import torch
from torch import nn

from accumlib import measured_step


def test_the_optimizers_copy_holds_the_copies_of_its_parameters_with_each_groups_settings():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    head = torch.optim.AdamW([{"params": model[1].parameters(), "lr": 0.3}], lr=0.01, weight_decay=0.5)
    copied = copy.deepcopy(model)
    clone = measured_step._clone_optimizer(head, model, copied)
    assert type(clone) is torch.optim.AdamW and len(clone.param_groups) == 1
    group = clone.param_groups[0]
    assert [id(p) for p in group["params"]] == [id(p) for p in copied[1].parameters()]  # the head alone
    assert group["lr"] == 0.3 and group["weight_decay"] == 0.5
    sgd = measured_step._clone_optimizer(None, model, copied)  # none given: SGD over every trainable parameter
    assert type(sgd) is torch.optim.SGD and len(sgd.param_groups[0]["params"]) == 4


def test_a_tensor_found_twice_in_a_micro_batch_is_copied_once():
    t = torch.arange(4.0)
    copied = measured_step._copied({"input_ids": t, "labels": t, "mask": None}, lambda x: x.clone())
    assert copied["input_ids"] is copied["labels"] and copied["input_ids"] is not t and copied["mask"] is None
    first, again, other = measured_step._on([(t, t), (t, t), (t + 1, t)], lambda x: x.clone())
    assert first is not again and first[0] is first[1] and torch.equal(other[0], t + 1)


def test_a_failure_of_the_model_is_worded_naming_x_and_y_and_chained():
    x, y = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    with pytest.raises(
        ValueError,
        match=r"x \(shape \(2, 3\), torch.float32\) and y \(shape \(2,\), torch.int64\) "
        r"with loss_fn failed: mat1 and mat2",
    ) as refused:
        with measured_step.explained_failure(x, y):
            nn.Linear(5, 1)(x)
    assert isinstance(refused.value.__cause__, RuntimeError)
    with pytest.raises(torch.OutOfMemoryError):  # the card's refusal passes through as it is
        with measured_step.explained_failure(x, y):
            raise torch.OutOfMemoryError("CUDA out of memory")
