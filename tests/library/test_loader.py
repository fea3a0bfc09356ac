"""accumlib.loader: cycles from a DataLoader or any iterable of batches (most of its behaviour, through train, in
test_pipeline.py: loaders with and without len(), dict batches, DDP's counts); a loader shorter than accum_steps
said in the run's notes (issue 23, case 10)."""

import torch
from found import DIGITS, bn_model
from torch import nn

import accumlib


def test_a_distributed_sampler_gets_its_epoch():
    """train calls set_epoch(epoch) on a loader's sampler that has it (a DistributedSampler's new order)."""
    epochs = []

    class Sampler(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = None

        def set_epoch(self, epoch):
            epochs.append(epoch)

        def __iter__(self):
            return iter(range(6))

        def __len__(self):
            return 6

    X, y = torch.randn(6, 6), torch.zeros(6, dtype=torch.long)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=2, sampler=Sampler())
    model = nn.Linear(6, 3)
    accumlib.train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=2, epochs=3)
    assert epochs == [0, 1, 2]


# --- issue 23, case 10: sizes said out loud ----------------------------------------------------------------------


def test_case_10_a_loader_shorter_than_accum_steps_is_said_in_the_notes():
    model = bn_model()
    batches = [(DIGITS[0][i : i + 4], DIGITS[1][i : i + 4]) for i in range(0, 12, 4)]
    history = accumlib.train(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=5)
    assert [r.micro_batches for r in history] == [3]
    assert history.notes and "accum_steps=5" in history.notes[0] and "3 batches" in history.notes[0]
