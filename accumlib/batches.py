"""What the loop gets from where its cycles come from: `_Producer`, the one interface it asks (its cycles, their
number, an example micro-batch, how to make micro-batches smaller, whether a cycle is fetched as it is made), with two
kinds behind it (`source._Indexed`: (X, y) tensors and Datasets; `loader._Loader`: a loader's batches); `_Cycle`,
one optimizer step's data; `_MicroBatches`, the one place a micro-batch is moved to the device and made (model input,
target) (`_as_pair`); and a batch's form, checked (`_check_batch`: (x, y), (inputs, y) or a dict, its samples counted).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from typing import Callable, NamedTuple

import torch

from ._validate import Shown
from .cycle import Inputs
from .i18n import _
from .random_states import random_states_kept


class _Cycle(NamedTuple):
    """One optimizer step's data, as the loop gets it from a `_Producer`."""

    epoch: int
    micro_batches: _MicroBatches  # what accumulate_and_step iterates: (inputs, target) pairs on the device
    sizes: list[int]  # this process's samples per micro-batch (0: a padding micro-batch, weight 0)
    samples: int  # the cycle's samples, all processes together
    layout: tuple  # the micro-batches' shapes: cycles of one layout have the same peak bytes
    raw: Callable  # raw() gives the cycle's real micro-batches as the data gives them (what count is called on)

    def real(self, weights: list[float]) -> tuple[list, list[float]]:
        """The cycle's real micro-batches, for a trace of it (memory_budget's, measure_memory's).

        Args:
            weights: the loss weight of each micro-batch, padding included.

        Returns:
            The micro-batches as pairs, not moved (a trace moves its copies), without DDP's padding, and their
            weights. Fetched again under their own random state: a Dataset that draws leaves the run's draws as
            they were.
        """
        with random_states_kept():
            batches = [_as_pair(batch) for batch in self.raw()]  # a loader's 0-row batches too, in order
        # strict=False: raw() stops before the padding micro-batches (size 0) that end sizes under DDP
        return (
            [batch for batch, size in zip(batches, self.sizes, strict=False) if size],
            [weight for weight, size in zip(weights, self.sizes, strict=True) if size],
        )


class _Producer(abc.ABC):
    """Where a run's cycles come from, all the loop and the checkpoint ask of the data.

    Args:
        accum_steps: micro-batches per cycle.
        world, rank: the processes and this one's rank (a cycle's share per process, padded to the busiest's).
        device: where the micro-batches go.
        notes: the run's notes, for what the data makes of the run (one short step per epoch, say).
    """

    fetches_ahead = False  # a cycle's batches fetched as the cycle is made, drawing from the run's random states

    def __init__(self, accum_steps: int, world: int, rank: int, device: torch.device, notes: list[str]):
        self.accum_steps, self.world, self.rank, self.device, self.notes = accum_steps, world, rank, device, notes

    def check_epochs(self, epochs: int | None) -> None:  # noqa: B027 - data read again and again takes any
        """Refuses, naming it, a number of `epochs` the data cannot give."""

    @abc.abstractmethod
    def steps(self, epochs: int | None) -> int | None:
        """Returns: the run's optimizer steps over `epochs`, or None when they are not known before the run."""

    def example(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Returns: a full micro-batch (x, y) of tensors, for memory_budget's check before the run, or None: then
        each cycle is checked as it comes."""
        return None

    @abc.abstractmethod
    def cycles(self, epochs: int | None) -> Iterator[_Cycle]:
        """Returns: the run's cycles over `epochs` (None: without end), in order."""

    @abc.abstractmethod
    def advice(self) -> str:
        """Returns: how to make a micro-batch smaller, in the words memory_budget's refusal ends with."""


class _MicroBatches:
    """A cycle's micro-batches, as accumulate_and_step iterates them: each fetched, moved to the device and made
    (model input, target) as the loop reaches it.

    Args:
        items: what `fetch` takes, one per micro-batch (padding included).
        fetch: a micro-batch from its item; None: the items are the batches (a loader's, held).
        device: where each batch is moved; None: `fetch` gives (x, y) pairs on the device, taken as they are.
    """

    __slots__ = ("items", "fetch", "device")

    def __init__(self, items: list, fetch: Callable | None, device: torch.device | None):
        self.items, self.fetch, self.device = items, fetch, device

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        batches = iter(self.items) if self.fetch is None else map(self.fetch, self.items)
        if self.device is None:
            return batches
        return (_as_pair(_to(batch, self.device)) for batch in batches)


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
