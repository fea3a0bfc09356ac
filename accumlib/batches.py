"""A batch as the cycle takes it, for every producer of cycles (`source`'s (X, y) tensors and Datasets, `loader`'s
batches): its form checked (`_check_batch`: (x, y), (inputs, y) or a dict, its samples counted), its tensors
(`_tensors`), moved to the device (`_to`) and made (model input, target) (`_as_pair`); `_Cycle`, one optimizer step's
data as a producer gives it to the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, NamedTuple

import torch

from ._validate import Shown
from .cycle import Inputs
from .i18n import _


class _Cycle(NamedTuple):
    """One optimizer step's data, as the loop gets it from a source."""

    epoch: int
    micro_batches: object  # what accumulate_and_step iterates: (inputs, target) pairs on the device, with len()
    sizes: list[int]  # this process's samples per micro-batch (0: a padding micro-batch, weight 0)
    samples: int  # the cycle's samples, all processes together
    layout: tuple  # the micro-batches' shapes: cycles of one layout have the same peak bytes
    raw: Callable  # raw() gives the cycle's real micro-batches as the data gives them (what count is called on)


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
