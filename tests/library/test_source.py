"""accumlib.source: where a cycle comes from. (X, y) tensors and a Dataset give the same cycles; each epoch's
order covers every sample once, shared out over processes with padding of weight 0 (a batch's form:
test_batches.py; a loader's cycles: test_loader.py); an effective batch larger than the data said in the run's
notes (issue 23, case 10)."""

import pytest
import torch
from found import DIGITS, bn_model
from torch import nn

import accumlib
from accumlib import source

X = torch.randn(50, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
Y = torch.randint(0, 3, (50,), generator=torch.Generator().manual_seed(1))


def trained(data):
    torch.manual_seed(0)
    model = nn.Linear(6, 3).double()
    accumlib.train(
        model,
        data,
        torch.optim.SGD(model.parameters(), lr=0.5),
        micro_batch_size=4,
        accum_steps=3,
        epochs=2,
        device="cpu",
    )
    return model


def test_dataset_input_matches_tensor_tuple():
    assert accumlib.parameter_gap(trained((X, Y)), trained(torch.utils.data.TensorDataset(X, Y))) == 0


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_is_in_exactly_one_micro_batch_of_one_process_per_epoch(world):
    """50 samples, micro-batches of 4, accum_steps 3: each cycle's samples shared out over `world` processes, each
    process padded to the busiest one's count with size-0 micro-batches; an epoch covers every sample once."""
    samples = source._Samples((X, Y))
    plans = [list(source._Plan(samples, 4, 3, world, rank, 7, True, 2)) for rank in range(world)]
    for epoch in range(2):
        seen = []
        for plan in plans:
            for cycle_epoch, _samples, indices, sizes in plan:
                if cycle_epoch == epoch:
                    seen += [int(i) for idx, size in zip(indices, sizes, strict=True) if size for i in idx]
                    assert [len(idx) for idx, size in zip(indices, sizes, strict=True) if size] == [
                        s for s in sizes if s
                    ]
        assert sorted(seen) == list(range(50))
    assert len({len(plan) for plan in plans}) == 1  # every process takes the same number of cycles
    for cycles in zip(*plans, strict=True):  # and of micro-batches in each, padding included
        assert len({len(sizes) for _e, _s, _i, sizes in cycles}) == 1
        assert sum(sum(sizes) for _e, _s, _i, sizes in cycles) == cycles[0][1]  # the cycle's samples, all processes


# --- issue 23, case 10: sizes said out loud ----------------------------------------------------------------------


def test_case_10_an_effective_batch_larger_than_the_data_is_said_in_the_notes():
    """4 x 8 = 32 samples per step over 20 samples: accepted (the lessons' dashboards compare such runs with the
    whole data), one step of 20 samples per epoch, and said in the history's notes."""
    model = bn_model()
    history = accumlib.train(
        model,
        (DIGITS[0][:20], DIGITS[1][:20]),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=8,
        epochs=2,
    )
    assert [r.samples for r in history] == [20, 20]
    assert len(history.notes) == 1
    assert all(word in history.notes[0] for word in ("4", "8", "32", "20 samples", "one step"))
    fitting = accumlib.train(
        model,
        (DIGITS[0][:20], DIGITS[1][:20]),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=5,
    )
    assert fitting.notes == []
