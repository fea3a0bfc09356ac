"""Where a cycle comes from: `train`'s data ((X, y) tensors, a Dataset or a loader) made into cycles of
micro-batches (`batches._Cycle`), each micro-batch's form checked (`batches._check_batch`) and moved to the device as
its turn comes.

`_source` picks the producer (a `batches._Producer`, what the loop asks): `_Indexed` splits (X, y) or a Dataset into
micro-batches in an order drawn from the seed (`_Plan`), `loader._Loader` takes a loader's batches `accum_steps` at a
time. Under DDP each process takes its share and the busiest process's count of micro-batches, the others padding
theirs with weight-0 micro-batches.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from typing import Callable

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate

from .batches import _Cycle, _check_batch, _MicroBatches, _Producer, _refuse_meta
from .i18n import _
from .loader import _Loader
from .random_states import random_states_kept


def _source(data, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes) -> _Producer:
    """Where the cycles come from: (X, y) tensors or a Dataset split by micro_batch_size, or a loader's batches."""
    indexed = (
        isinstance(data, tuple)
        or isinstance(data, list)
        and bool(data)
        and all(isinstance(item, torch.Tensor) for item in data)
    )  # a list of tensors is (X, y); any other list, batches
    indexed = indexed or isinstance(data, Dataset) and not isinstance(data, IterableDataset)
    if indexed:
        samples = _Samples(data)
        if micro_batch_size is None:
            raise TypeError(
                _(
                    "micro_batch_size is missing: data given as (X, y) tensors or a Dataset is split into "
                    "micro-batches of micro_batch_size samples; give it, or pass a DataLoader whose "
                    "batches are the micro-batches"
                )
            )
        return _Indexed(samples, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes)
    if isinstance(data, (Mapping, str, bytes, torch.Tensor)) or not hasattr(data, "__iter__"):
        _refuse_dict(data, "data")
        raise TypeError(
            _("data must be (X, y) tensors, a Dataset, or a DataLoader (any iterable of batches), got {type}").format(
                type=type(data).__name__
            )
        )
    if micro_batch_size is not None:
        raise ValueError(
            _(
                "micro_batch_size={value} was given with data of type {type}, whose batches are the "
                "micro-batches: omit micro_batch_size (the loader's batch size is the micro-batch's; for "
                "a stream of samples, pass DataLoader(data, batch_size={value})), or give (X, y) tensors "
                "or a map-style Dataset"
            ).format(value=micro_batch_size, type=type(data).__name__)
        )
    return _Loader(data, accum_steps, world, rank, device, notes)


class _Samples:
    """Indexable view of `data`: a tuple (X, y) of tensors or a Dataset of (x, y) pairs or dicts."""

    def __init__(self, data):
        if isinstance(data, (tuple, list)):
            if len(data) != 2:
                raise TypeError(
                    _("data must be a Dataset or a tuple (X, y) of two tensors, got a {type} of {n} items").format(
                        type=type(data).__name__, n=len(data)
                    )
                )
            for name, tensor in zip(("data[0] (X)", "data[1] (y)"), data, strict=True):
                _refuse_dict(tensor, name)
                if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
                    raise TypeError(
                        _(
                            "data must be a tuple (X, y) of two tensors with one row per sample; {name} is {value!r}"
                        ).format(name=name, value=tensor)
                    )
            X, y = data
            if len(X) != len(y):
                raise ValueError(
                    _("data: X has {x} samples but y has {y}; they must have the same length").format(
                        x=len(X), y=len(y)
                    )
                )
            _refuse_meta(data)
            self.n, self.dataset = len(X), None
            self.device = X.device if X.device == y.device else None
            self.fetch = lambda idx: (X[idx], y[idx])
        elif isinstance(data, Dataset) and hasattr(data, "__len__"):
            self.n, self.dataset, self.device = len(data), data, None  # the device is known only once fetched
            if self.n:
                with random_states_kept():  # a Dataset that augments draws nothing the run would draw
                    _check_batch(data[0], _("data[0] (a sample)"), sample=True)
            self.fetch = lambda idx: default_collate([data[i] for i in idx])
        else:
            raise TypeError(
                _("data must be a torch Dataset with a length or a tuple (X, y) of tensors, got {type}").format(
                    type=type(data).__name__
                )
            )
        if self.n == 0:
            raise ValueError(_("data is empty: it must hold at least one sample"))

    def indices(self, order: torch.Tensor):
        """`order` as fetch() takes it: a list for a Dataset, a tensor on the data's device for (X, y)."""
        if self.dataset is not None:
            return order.tolist()
        return order.to(self.device) if self.device is not None else order


def _refuse_dict(value, name: str) -> None:
    if isinstance(value, Mapping):
        raise TypeError(
            _(
                "{name} is a dict (keys {keys}): a dict of whole tensors as data is not supported; give "
                "a DataLoader (or any iterable) of dict batches, or a Dataset of dict samples with "
                "micro_batch_size"
            ).format(name=name, keys=", ".join(repr(k) for k in list(value)[:5]))
        )


class _Indexed(_Producer):
    """Cycles of (X, y) tensors or a Dataset: micro-batches of micro_batch_size samples in an order from `seed`."""

    def __init__(self, samples, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes):
        if micro_batch_size > samples.n:
            raise ValueError(
                _("micro_batch_size={value} is larger than the dataset ({n} samples); valid range: 1 to {n}").format(
                    value=micro_batch_size, n=samples.n
                )
            )
        super().__init__(accum_steps, world, rank, device, notes)
        self.samples, self.micro = samples, micro_batch_size
        # (X, y) on the device: (x, y) pairs as fetched; (X, y) elsewhere, or a Dataset (its device is known once
        # fetched): each micro-batch moved
        self.moved_to = None if samples.dataset is None and samples.device == device else device
        self.plan = functools.partial(_Plan, samples, micro_batch_size, accum_steps, world, rank, seed, shuffle)
        self.effective = micro_batch_size * accum_steps * world
        if self.effective > samples.n:
            notes.append(
                _(
                    "the effective batch (micro_batch_size {micro} x accum_steps {k} x {world} processes = "
                    "{effective} samples) is larger than the data ({n} samples): every epoch is one step of "
                    "{n} samples"
                ).format(micro=micro_batch_size, k=accum_steps, world=world, effective=self.effective, n=samples.n)
            )

    def steps(self, epochs: int | None) -> int | None:
        return None if epochs is None else epochs * math.ceil(self.samples.n / self.effective)

    def example(self):
        """A full micro-batch (x, y), for memory_budget's check before the run; None unless both are tensors.
        Fetched under its own random state: a Dataset that augments randomly draws for the run as without it."""
        with random_states_kept():
            x, y = self.samples.fetch(list(range(self.micro)))
        return (x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else None

    def cycles(self, epochs: int | None):
        for epoch, cycle_samples, indices, sizes in self.plan(epochs):
            raw = functools.partial(_real_batches, self.samples.fetch, indices, sizes)  # built only when called
            micro_batches = _MicroBatches(indices, self.samples.fetch, self.moved_to)
            yield _Cycle(epoch, micro_batches, sizes, cycle_samples, tuple(sizes), raw)

    def advice(self) -> str:
        return _("use a smaller micro_batch_size and more accum_steps")


def _real_batches(fetch: Callable, indices: list, sizes: list[int]):
    """A cycle's real micro-batches (padding left out), fetched as they are iterated."""
    return map(fetch, [idx for idx, size in zip(indices, sizes, strict=True) if size])


class _Plan:
    """Every cycle of a run, in order: (epoch, samples in the cycle over all processes, this process's micro-batch
    indices, their sizes). Iterating again gives the same cycles: the sample order is drawn from `seed` each time.

    Each cycle takes the next micro_batch_size * accum_steps * world samples of the epoch's order (fewer at the
    end); each process takes a contiguous shard (as torch.tensor_split shares them out) and splits it into
    micro-batches. A process with fewer micro-batches than another gets padding micro-batches (one real sample,
    size 0, so loss weight 0): run only where DDP needs a backward (without no_sync(), every micro-batch's; with it,
    the last one of a process that has no other). epochs=None:
    without end.
    """

    def __init__(
        self,
        samples: _Samples,
        micro_batch_size: int,
        accum_steps: int,
        world: int,
        rank: int,
        seed: int,
        shuffle: bool,
        epochs: int | None,
    ):
        self.samples, self.micro, self.accum_steps, self.epochs = samples, micro_batch_size, accum_steps, epochs
        self.world, self.rank, self.seed, self.shuffle = world, rank, seed, shuffle

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed)
        n, m = self.samples.n, self.micro
        for epoch in range(self.epochs) if self.epochs is not None else itertools.count():
            order = self.samples.indices(torch.randperm(n, generator=generator) if self.shuffle else torch.arange(n))
            if self.world == 1:  # one process: the epoch split into micro-batches once, a cycle is a slice of them
                micro = [order[i : i + m] for i in range(0, n, m)]
                sizes = [min(m, n - i) for i in range(0, n, m)]
                for first in range(0, len(micro), self.accum_steps):
                    cycle_sizes = sizes[first : first + self.accum_steps]
                    yield epoch, sum(cycle_sizes), micro[first : first + self.accum_steps], cycle_sizes
                continue
            pad = order[:1]
            effective = m * self.accum_steps * self.world
            for start in range(0, n, effective):
                cycle_samples = min(effective, n - start)
                share, extra = divmod(cycle_samples, self.world)
                first = start + self.rank * share + min(self.rank, extra)
                end = first + share + (self.rank < extra)
                indices = [order[i : min(i + m, end)] for i in range(first, end, m)]
                sizes = [min(m, end - i) for i in range(first, end, m)]
                padding = math.ceil((share + (extra > 0)) / m) - len(indices)  # the busiest process's count
                yield epoch, cycle_samples, indices + [pad] * padding, sizes + [0] * padding
