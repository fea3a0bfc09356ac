"""accumlib.batches: what the loop asks of its data (`_Producer`), alike for (X, y) and a loader; a batch as the
cycle takes it, whichever producer gives it: its form checked and its samples counted, every tensor inside moved
with its structure kept, made (model input, target); data on the meta device refused naming data, whichever form
it comes in (issue 23, case 10)."""

import copy

import pytest
import torch
from found import DIGITS, bn_model

import accumlib
from accumlib import batches, source

CPU = torch.device("cpu")
X = torch.arange(30, dtype=torch.float64).reshape(10, 3)
Y = torch.arange(10)


def producer(data, micro_batch_size=None, world=1, rank=0):
    """train's producer of `data`, 2 micro-batches a cycle, in the data's order."""
    return source._source(data, micro_batch_size, 2, world, rank, 0, False, CPU, [])


def test_tensors_and_a_loader_of_the_same_micro_batches_give_the_loop_the_same_cycles():
    """The loop asks both kinds the same questions: their steps, their cycles (the same micro-batches, sizes and
    samples), an example for memory_budget (a loader has none before its cycles), how to shrink a micro-batch."""
    indexed, loader = producer((X, Y), micro_batch_size=4), producer([(X[i : i + 4], Y[i : i + 4]) for i in (0, 4, 8)])
    assert indexed.steps(3) == loader.steps(3) == 6
    for one, other in zip(indexed.cycles(2), loader.cycles(2), strict=True):
        assert (one.epoch, one.sizes, one.samples) == (other.epoch, other.sizes, other.samples)
        for (x, y), (x_, y_) in zip(one.micro_batches, other.micro_batches, strict=True):
            assert torch.equal(x, x_) and torch.equal(y, y_)
    x, y = indexed.example()
    assert torch.equal(x, X[:4]) and torch.equal(y, Y[:4]) and loader.example() is None
    assert (indexed.fetches_ahead, loader.fetches_ahead) == (False, True)  # a loader's draws come as cycles are made
    assert "micro_batch_size" in indexed.advice() and "batch_size" in loader.advice()
    assert "micro_batch_size" not in loader.advice()


def test_a_cycles_real_micro_batches_leave_out_the_padding_and_draw_nothing_from_the_run():
    """Under DDP a process with fewer samples pads its cycle (size 0, weight 0); a trace takes only its real
    micro-batches, fetched again without moving the run's random state (a Dataset that draws)."""

    class Drawing(torch.utils.data.Dataset):
        def __len__(self):
            return 9

        def __getitem__(self, i):
            return X[i] + torch.rand(3, dtype=torch.float64), Y[i]

    # 9 samples in one cycle over 2 processes: rank 1 takes samples 5 to 8, one micro-batch of 4 and one of padding
    cycle = next(iter(producer(Drawing(), micro_batch_size=4, world=2, rank=1).cycles(1)))
    assert cycle.sizes == [4, 0] and len(cycle.micro_batches) == 2
    state = torch.get_rng_state()
    pairs, weights = cycle.real([0.25, 0.0])
    assert torch.equal(torch.get_rng_state(), state)
    assert weights == [0.25] and len(pairs) == 1 and torch.equal(pairs[0][1], Y[5:9])


def test_micro_batches_are_fetched_moved_and_paired_as_the_loop_reaches_them():
    x, y = torch.zeros(2, 3), torch.ones(2)
    fetched = []
    held = batches._MicroBatches([0, 1], lambda i: fetched.append(i) or (X[i : i + 1], Y[i : i + 1]), None)
    assert len(held) == 2 and fetched == []  # nothing fetched before the loop iterates
    first = next(iter(held))
    assert fetched == [0] and torch.equal(first[0], X[:1])
    moved = list(batches._MicroBatches([{"input_ids": x}, [(x, x), y]], None, torch.device("meta")))
    (inputs, target), (pair_inputs, pair_target) = moved
    assert isinstance(inputs, accumlib.Inputs) and inputs.kwargs["input_ids"].device.type == "meta"
    assert target is inputs.kwargs  # a dict batch is both the inputs and the target
    assert pair_inputs.args[0].device.type == "meta" and pair_target.device.type == "meta"


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


# --- issue 23, case 10: data on the meta device names `data` ----------------------------------------------------


class MetaSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.empty(64, device="meta"), torch.tensor(0)


@pytest.mark.parametrize("kind", ["tensors", "dataset", "loader"])
def test_case_10_data_on_the_meta_device_names_data(kind):
    meta_x = torch.empty(40, 64, device="meta")
    given = {"tensors": (meta_x, DIGITS[1]), "dataset": MetaSamples(), "loader": [(meta_x[:4], DIGITS[1][:4])]}[kind]
    model = bn_model()
    before = copy.deepcopy(model.state_dict())
    options = dict(micro_batch_size=4) if kind != "loader" else {}
    with pytest.raises(ValueError, match="data holds tensors on the meta device"):
        accumlib.train(model, given, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=2, **options)
    assert accumlib.parameter_gap(model, before) == 0.0
