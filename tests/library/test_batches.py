"""accumlib.batches: a batch as the cycle takes it, whichever producer gives it: its form checked and its samples
counted, every tensor inside moved with its structure kept, made (model input, target)."""

import pytest
import torch

import accumlib
from accumlib import batches


def test_a_batch_that_is_no_pair_or_dict_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"^batch 3 must be \(x, y\), \(inputs, y\) .* got 'text' of type str"):
        batches._check_batch("text", "batch 3")
    assert batches._check_batch((torch.zeros(5, 2), torch.zeros(5)), "batch") == 5
    assert batches._check_batch({"input_ids": torch.zeros(3, 7)}, "batch") == 3


def test_a_batch_becomes_what_the_cycle_takes():
    x, y = torch.zeros(2, 3), torch.ones(2)
    assert batches._as_pair((x, y)) == (x, y)
    inputs, target = batches._as_pair({"input_ids": x})
    assert inputs == accumlib.Inputs((), {"input_ids": x}) and target == {"input_ids": x}
    assert batches._as_pair([(x, x), y])[0] == accumlib.Inputs((x, x), {})


def test_every_tensor_of_a_nested_batch_is_moved_and_its_structure_kept():
    """No GPU here: fake CUDA tensors (FakeTensorMode) moved to the CPU, the way a loader's batch is moved to the
    device, through dicts, lists, tuples and a namedtuple; what is not a tensor stays as it is."""
    import collections

    from torch._subclasses.fake_tensor import FakeTensorMode

    Pair = collections.namedtuple("Pair", "a b")
    with FakeTensorMode():

        def cuda(*shape):
            return torch.ones(*shape, device="cuda")

        batch = {"input_ids": cuda(2, 3), "nested": [cuda(2), (cuda(2, 1), "text")], "pair": Pair(cuda(2), 3)}
        moved = batches._to(batch, torch.device("cpu"))
    assert moved.keys() == batch.keys() and isinstance(moved["nested"], list) and isinstance(moved["pair"], Pair)
    assert moved["nested"][1][1] == "text" and moved["pair"].b == 3
    tensors = list(batches._tensors(moved))
    assert len(tensors) == 4 and all(t.device.type == "cpu" for t in tensors)
    assert [t.shape for t in tensors] == [t.shape for t in batches._tensors(batch)]
