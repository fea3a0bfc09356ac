"""Where a cycle comes from: `train`'s data ((X, y) tensors, a Dataset or a loader) made into cycles of
micro-batches (`_Cycle`), each micro-batch's form checked (`_check_batch`) and moved to the device as its turn comes.

`_source` picks the producer: `_Indexed` splits (X, y) or a Dataset into micro-batches in an order drawn from the
seed (`_Plan`), `_Loader` takes a loader's batches `accum_steps` at a time. Under DDP each process takes its share
and the busiest process's count of micro-batches, the others padding theirs with weight-0 micro-batches.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator as _Iterator, Mapping
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, default_collate

from . import checkpoint as checkpoints
from ._validate import Shown
from .cycle import Inputs
from .failures import _told
from .i18n import _, ngettext


class _Cycle(NamedTuple):
    """One optimizer step's data, as the loop gets it from a source."""

    epoch: int
    micro_batches: object  # what accumulate_and_step iterates: (inputs, target) pairs on the device, with len()
    sizes: list[int]  # this process's samples per micro-batch (0: a padding micro-batch, weight 0)
    samples: int  # the cycle's samples, all processes together
    layout: tuple  # the micro-batches' shapes: cycles of one layout have the same peak bytes
    raw: Callable  # raw() gives the cycle's real micro-batches as the data gives them (what count is called on)


def _source(data, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes):
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
                with checkpoints.random_states_kept():  # a Dataset that augments draws nothing the run would draw
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


def _tensors(value):
    """The tensors inside a batch, nested in tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _refuse_meta(batch) -> None:
    if any(t.device.type == "meta" for t in _tensors(batch)):
        raise ValueError(
            _(
                "data holds tensors on the meta device (shapes without values): there is nothing to train "
                "on; load the data on 'cpu' or 'cuda'"
            )
        )


def _check_batch(batch, name: str, sample: bool = False) -> int | None:
    """A micro-batch's (or, `sample`, a Dataset sample's) form, refused naming `name` unless it is (x, y) or a dict;
    returns a micro-batch's samples (the first dimension of y, or of its first tensor that has one)."""
    pair = isinstance(batch, (tuple, list)) and len(batch) == 2
    if not (pair or isinstance(batch, Mapping)):
        raise TypeError(
            _(
                "{name} must be (x, y), (inputs, y) with a tuple or dict of inputs, or a dict of model "
                "inputs, got {value!r} of type {type}"
            ).format(name=name, value=Shown(batch), type=type(batch).__name__)
        )
    _refuse_meta(batch)
    if sample:
        return None
    first = (
        batch[1]
        if pair and isinstance(batch[1], torch.Tensor) and batch[1].dim()
        else next((t for t in _tensors(batch) if t.dim()), None)
    )
    if first is None:
        raise TypeError(
            _("{name} holds no tensor with a batch dimension: its samples cannot be counted").format(name=name)
        )
    return len(first)


def _to(value, device: torch.device):
    """`value` with every tensor inside (nested in tuples, lists and dicts) moved to `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {key: _to(item, device) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        items = [_to(item, device) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a namedtuple too
    return value


def _as_pair(batch):
    """A micro-batch as accumulate_and_step takes it, (model input, loss_fn target): tensor x as it is, other inputs
    as cycle.Inputs (the model is called with them unpacked); a dict batch is both the inputs and the target."""
    if type(batch) is tuple and len(batch) == 2 and isinstance(batch[0], torch.Tensor):
        return batch  # (x, y) with a tensor x, as (X, y) data gives it: as it is
    if isinstance(batch, Mapping):
        return Inputs((), batch), batch
    x, y = batch
    if isinstance(x, Mapping):
        return Inputs((), x), y
    if isinstance(x, (tuple, list)):
        return Inputs(tuple(x), {}), y
    return x, y


class _Indexed:
    """Cycles of (X, y) tensors or a Dataset: micro-batches of micro_batch_size samples in an order from `seed`."""

    def __init__(self, samples, micro_batch_size, accum_steps, world, rank, seed, shuffle, device, notes):
        if micro_batch_size > samples.n:
            raise ValueError(
                _("micro_batch_size={value} is larger than the dataset ({n} samples); valid range: 1 to {n}").format(
                    value=micro_batch_size, n=samples.n
                )
            )
        self.samples, self.micro, self.device = samples, micro_batch_size, device
        self.move = samples.device != device  # (X, y) elsewhere, or a Dataset (its device is known once fetched)
        self.pairs = samples.dataset is None and not self.move  # (X, y) on the device: (x, y) pairs as fetched
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

    def check_epochs(self, epochs) -> None:
        pass  # (X, y) and a Dataset can be read again and again

    def steps(self, epochs: int | None) -> int | None:
        return None if epochs is None else epochs * math.ceil(self.samples.n / self.effective)

    def example(self):
        """A full micro-batch (x, y), for memory_budget's check before the run; None unless both are tensors.
        Fetched under its own random state: a Dataset that augments randomly draws for the run as without it."""
        with checkpoints.random_states_kept():
            x, y = self.samples.fetch(list(range(self.micro)))
        return (x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else None

    def cycles(self, epochs: int | None):
        for epoch, cycle_samples, indices, sizes in self.plan(epochs):
            raw = functools.partial(_real_batches, self.samples.fetch, indices, sizes)  # built only when called
            yield _Cycle(epoch, _MicroBatches(self, indices), sizes, cycle_samples, tuple(sizes), raw)


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


class _MicroBatches:
    """A cycle's micro-batches, fetched (and moved to the device) one at a time as the loop reaches them."""

    __slots__ = ("source", "indices")

    def __init__(self, source: _Indexed, indices: list):
        self.source, self.indices = source, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        source = self.source
        if source.pairs:
            return map(source.samples.fetch, self.indices)
        return (
            _as_pair(_to(batch, source.device) if source.move else batch)
            for batch in map(source.samples.fetch, self.indices)
        )


class _Loader:
    """Cycles of a loader's batches, `accum_steps` at a time, held until their step (see `train`)."""

    def __init__(self, data, accum_steps, world, rank, device, notes):
        self.data, self.accum_steps, self.world, self.rank, self.device, self.notes = (
            data,
            accum_steps,
            world,
            rank,
            device,
            notes,
        )
        self.once = isinstance(data, _Iterator)  # a generator, say: read once
        try:
            self.length = len(data)
        except TypeError:  # no len(): a stream, or a DataLoader over an IterableDataset
            self.length = None
        if world > 1:  # the run's steps are the busiest process's (the others pad): alike on every process, so
            # none refuses alone what depends on them (resume_from_step, a OneCycleLR); one all-reduce, before the run
            lengths = torch.tensor([self.length or 0, self.length is None], dtype=torch.float64, device=device)
            dist.all_reduce(lengths, op=dist.ReduceOp.MAX)
            longest, unknown = lengths.tolist()
            self.length = None if unknown else int(longest)
        if self.length == 0 and world == 1:  # under DDP the first cycle's all-reduce says it, to every process
            raise ValueError(_("data gave no batch in epoch {epoch}: it is empty").format(epoch=0))
        # a list's batches, each checked before the run (one in a step that resume_from_step passes over too); under
        # DDP the refusal waits for the first cycle's all-reduce, which stops every process with it
        self.refused = None
        if isinstance(data, list):
            try:
                for i, batch in enumerate(data):
                    _check_batch(batch, _("data[{i}] (batch {i} of the list)").format(i=i))
            except (TypeError, ValueError) as error:
                if world == 1:
                    raise
                self.refused = error

    def check_epochs(self, epochs) -> None:
        if self.once and epochs is not None and epochs > 1:
            raise ValueError(
                _(
                    "epochs={value}: data is an iterator of type {type}, which can be read only once; give "
                    "epochs=1, or data that can be read again (a DataLoader, a list)"
                ).format(value=epochs, type=type(self.data).__name__)
            )

    def steps(self, epochs: int | None) -> int | None:
        if self.length is None or epochs is None or self.length == 0:  # 0: under DDP, the first cycle says it
            return None
        return epochs * math.ceil(self.length / self.accum_steps)

    def _busiest(
        self, batches: int, samples: int, failed: bool = False, empty: bool = False
    ) -> tuple[int, int, list[int], list[int]]:
        """(the most batches any process holds in this cycle, the cycle's samples over all processes, the ranks of
        the processes that failed fetching or checking their batches, the ranks of those that never had a batch),
        from one all-reduce (one host read) of every process's counts: a process that stops, stops every process,
        none waits for it."""
        world = self.world
        counts = torch.zeros(1 + 3 * world, dtype=torch.float64, device=self.device)
        counts[0], counts[1 + self.rank] = samples, batches
        counts[1 + world + self.rank], counts[1 + 2 * world + self.rank] = float(failed), float(empty)
        dist.all_reduce(counts)
        total, *per_process = counts.tolist()
        failures, empties = per_process[world : 2 * world], per_process[2 * world :]
        return (
            int(max(per_process[:world])),
            int(total),
            [rank for rank, f in enumerate(failures) if f],
            [rank for rank, e in enumerate(empties) if e],
        )

    def cycles(self, epochs: int | None):
        pad = None  # one of this process's batches, for a padding micro-batch (weight 0: see _Plan)
        made = 0  # cycles given so far, all epochs
        for epoch in range(epochs) if epochs is not None else itertools.count():
            if self.once and epoch:
                return
            sampler = getattr(self.data, "sampler", None)
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)  # a DistributedSampler's new order for this epoch
            batches, cycle = iter(self.data), 0
            while True:
                try:
                    if self.refused is not None:  # a list's bad batch: every process stops at the first cycle
                        raise self.refused
                    held = list(itertools.islice(batches, self.accum_steps))  # this cycle's batches, until its step
                    sizes = [
                        _check_batch(
                            b,
                            _("data's batch {i} of epoch {epoch}").format(i=cycle * self.accum_steps + i, epoch=epoch),
                        )
                        for i, b in enumerate(held)
                    ]
                except Exception as error:  # under DDP the other processes learn of it in the counts' all-reduce
                    if self.world > 1:  # and stop too, with its words, instead of waiting for this one
                        self._busiest(0, 0, failed=True)
                        _told(error, [self.rank])
                    raise
                pad = held[-1] if held else pad
                if self.world == 1:
                    busiest, samples, failures, empties = len(held), sum(sizes), [], []
                else:
                    busiest, samples, failures, empties = self._busiest(len(held), sum(sizes), empty=pad is None)
                if failures:
                    why = _told(None, failures)
                    raise ValueError(
                        ngettext(
                            "the process of rank {ranks} failed fetching or checking its batches for step {step} "
                            "(epoch "
                            "{epoch}): {reasons}. This process (rank {rank}) stops with it, before this step changes "
                            "anything",
                            "the processes of ranks {ranks} failed fetching or checking their batches for step {step} "
                            "(epoch {epoch}): {reasons}. This process (rank {rank}) stops with them, before this step "
                            "changes anything",
                            len(failures),
                        ).format(
                            ranks=", ".join(map(str, failures)), step=made + 1, epoch=epoch, rank=self.rank, reasons=why
                        )
                    )
                if busiest == 0:  # the epoch has ended on every process
                    if cycle == 0:
                        raise ValueError(_("data gave no batch in epoch {epoch}: it is empty").format(epoch=epoch))
                    break
                if empties:  # every process stops: the one without a batch says so, the others which it is
                    raise ValueError(
                        _(
                            "data gave this process (rank {rank}) no batch while another process has "
                            "some: give every process a share of the data (a DistributedSampler)"
                        ).format(rank=self.rank)
                        if pad is None
                        else ngettext(
                            "data gave the process of rank {ranks} no batch while this one (rank {rank}) has some: "
                            "give "
                            "every process a share of the data (a DistributedSampler)",
                            "data gave the processes of ranks {ranks} no batch while this one (rank {rank}) has some: "
                            "give every process a share of the data (a DistributedSampler)",
                            len(empties),
                        ).format(ranks=", ".join(map(str, empties)), rank=self.rank)
                    )
                padding = busiest - len(held)
                if epoch == 0 and cycle == 0 and busiest < self.accum_steps:
                    self.notes.append(
                        _(
                            "accum_steps={k} is more than the {n} batches of an epoch of data: every "
                            "epoch is one step of {n} micro-batches"
                        ).format(k=self.accum_steps, n=busiest)
                    )
                moved = _Moved(held + [pad] * padding, self.device)
                layout = tuple(tuple(tuple(t.shape) for t in _tensors(b)) for b in held)
                yield _Cycle(epoch, moved, sizes + [0] * padding, samples, layout, functools.partial(iter, held))
                made += 1
                if busiest < self.accum_steps:  # the loader has ended, on every process
                    break
                cycle += 1


class _Moved:
    """A held cycle's batches, each moved to the device as the loop reaches it."""

    def __init__(self, batches: list, device: torch.device):
        self.batches, self.device = batches, device

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            yield _as_pair(_to(batch, self.device))
