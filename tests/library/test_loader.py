"""accumlib.loader: cycles from a DataLoader or any iterable of batches (most of its behaviour, through train, in
test_pipeline.py: loaders with and without len(), dict batches, DDP's counts)."""

import torch
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
