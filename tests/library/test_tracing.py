"""accumlib.tracing: where a step is measured (a fake copy, a real one, an FSDP2 model itself); here the fake copy's
placement and the naming of a line that cannot be traced. The measurements through it: test_memory.py."""

import copy

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode

from accumlib import tracing


def test_a_fake_copy_is_placed_where_the_step_will_run_and_a_shared_weight_stays_one_parameter():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4))
    model[2].weight = model[0].weight
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with FakeCopyMode(mode):
        copied = copy.deepcopy(model)
    tracing._fake_on(copied, torch.device("cuda"), mode)  # a CPU build of torch holds fake 'cuda' tensors
    assert copied[0].weight is copied[2].weight and isinstance(copied[0].weight, nn.Parameter)
    assert {t.device.type for t in [*copied.parameters(), *copied.buffers()]} == {"cuda"}
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"cpu"}  # the model stays


def reads_a_value(t):
    return t.sum().item()  # the line a trace cannot run


def test_a_step_that_reads_a_value_names_the_users_line():
    with FakeTensorMode():
        try:
            reads_a_value(torch.ones(3))
        except Exception as error:  # FakeTensorMode's DataDependentOutputException
            untraceable = tracing._Untraceable(error)
    assert untraceable.what == "DataDependentOutputException"
    assert __file__ in untraceable.line and "t.sum().item()" in untraceable.line
