"""accumlib.records: StepRecord (one optimizer step) and History (the run's records, why it stopped, its notes);
StopTraining's run: test_loop.py."""

import dataclasses

import pytest
import torch
from torch import nn

import accumlib

X = torch.randn(50, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
Y = torch.randint(0, 3, (50,), generator=torch.Generator().manual_seed(1))


def run(**kwargs):
    torch.manual_seed(0)
    model = nn.Linear(6, 3).double()
    return accumlib.train(
        model,
        (X, Y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        micro_batch_size=4,
        accum_steps=3,
        device="cpu",
        **kwargs,
    )


def test_history_columns_for_plotting_and_memory_only_when_asked():
    history = run()  # 50 = 4 cycles of 12 + one cycle of 2 samples
    columns = history.columns()
    assert columns["step"] == [1, 2, 3, 4, 5]
    assert columns["samples_seen"] == [12, 24, 36, 48, 50]
    assert columns["micro_batches"] == [3, 3, 3, 3, 1]
    assert columns["peak_memory_bytes"] == [None] * 5  # measure_memory is off by default
    assert columns["samples_per_second"] == [r.samples / r.seconds for r in history]
    measured = run(measure_memory=True)
    peaks = [r.peak_memory_bytes for r in measured]
    assert peaks[0] == peaks[1] == peaks[2] == peaks[3] > peaks[4] > 0  # full cycles alike; the last is smaller


def test_history_is_a_sequence_of_frozen_records():
    history = run(max_steps=2)
    assert len(history) == 2 and list(history) == history.records and history[-1] is history.records[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        history[0].loss = 0.0
