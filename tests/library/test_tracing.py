"""accumlib.tracing: where a step is measured (a fake copy, a real one, an FSDP2 model itself); here the fake copy's
placement and the naming of a line that cannot be traced: measured with a real step on the CPU (train then fits the
plan), refused on the meta device (issue 23, case 7). The measurements through it: test_memory.py."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeCopyMode, FakeTensorMode

import accumlib
from accumlib import memory, tracing
from builders import data


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


# --- issue 23, case 7: a forward that branches on a value is said, naming the model's line, and measured with a
# real step (refused on the meta device) -------------------------------------------------------------------------

XF, YF = data.digits(24, flat=True)


class Branching(nn.Module):
    """A valid model whose forward reads a tensor's value, which FakeTensorMode cannot trace."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 10)

    def forward(self, x):
        if x.sum() > 0:
            return self.linear(x)
        return self.linear(-x)


def test_an_untraceable_forward_is_measured_with_a_real_step_and_its_line_named():
    model = Branching()
    with pytest.warns(
        RuntimeWarning,
        match=r"the model or loss_fn \(.*test_tracing.py, line \d+: if "
        r"x.sum\(\) > 0:\) reads a tensor's value.*measured with a real step "
        "on the CPU",
    ):
        fake = memory.measure_step(model, XF[:4], YF[:4], accum_steps=2, fake=True)
    assert fake.peak == memory.measure_step(model, XF[:4], YF[:4], accum_steps=2).peak  # exact on the CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        plan = memory.fit_batch(model, (XF[:1], YF[:1]), 8, fake.peak)
        history = accumlib.train(
            model,
            (XF, YF),
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=plan.micro_batch_size,
            accum_steps=plan.accum_steps,
            memory_budget=plan.memory_budget,
            measure_memory=True,
            device="cpu",
        )
    assert len(history) == 24 // 8 and max(r.peak_memory_bytes for r in history) <= plan.memory_budget


def test_an_untraceable_forward_on_the_meta_device_is_refused_naming_its_line():
    with torch.device("meta"):
        model = Branching()
    with pytest.raises(
        ValueError,
        match=r"line \d+: if x.sum\(\) > 0:\) reads a tensor's value.*meta device has "
        "none",
    ):
        memory.measure_step(model, XF[:4], YF[:4], fake=True)
