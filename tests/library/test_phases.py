"""accumlib.phases: the parts of a cycle as PyTorch's hooks see them, for whoever measures it; the cycle itself
calls no measurer."""

import threading

import torch
from torch import nn

import accumlib
from accumlib import phases
from builders import data

X, Y = data.digits(32, flat=True)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def step(model, optimizer, k=2):
    micro_batches = list(zip(X[: 8 * k].split(8), Y[: 8 * k].split(8), strict=True))
    accumlib.accumulate_and_step(model, micro_batches, optimizer, [1 / k] * k, loss_fn=nn.functional.cross_entropy)


def test_each_part_of_a_cycle_is_marked_as_it_begins():
    """Two micro-batches: each forward pass, each backward's end, the step; inside a backward in_backward() is
    True (the hooks of a parameter run there), outside it False."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    marks, inside = [], []
    model[0].weight.register_hook(lambda grad: inside.append(phases.in_backward()))
    with phases.marked(model, optimizer, marks.append):
        marks.append(phases.in_backward())
        step(model, optimizer)
    assert marks == [False, "forward", "read", "forward", "read", "step"] and inside == [True, True]


def test_the_marks_see_their_model_alone_and_end_with_the_block():
    """A dashboard trains its own model in a thread of its own: a measurement of another model sees none of it;
    after the block, its model's cycles are not seen either."""
    model, other = mlp(), mlp()
    optimizer, others = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(other.parameters(), lr=0.1)
    marks = []
    with phases.marked(model, optimizer, marks.append):
        thread = threading.Thread(target=step, args=(other, others))
        thread.start()
        thread.join()
        assert marks == []
        step(model, optimizer, k=1)
    step(model, optimizer, k=1)
    assert marks == ["forward", "read", "step"]


class OwnLoss(nn.Module):
    """A model that returns a dict with its own loss (as a Hugging Face model does)."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, x, labels):
        logits = self.net(x)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


def test_a_model_s_own_loss_marks_the_end_of_its_backward_once():
    model = OwnLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    marks = []
    batch = accumlib.Inputs((X[:8],), {"labels": Y[:8]})
    with phases.marked(model, optimizer, marks.append):
        accumlib.accumulate_and_step(model, [(batch, None)], optimizer, [1.0])
    assert marks == ["forward", "read", "step"]
