"""Leave the model as found: what a cycle changes before its step (the .grad of the optimizer's parameters, the
buffers a forward pass updates, BatchNorm's running statistics) set aside and put back when the step is skipped or
fails (`_Kept`, `_BuffersKept`); every module's training/eval mode put back after a run (`_ModesKept`)."""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
from torch.nn.modules.batchnorm import _NormBase

from .i18n import _


class _BuffersKept:
    """Context manager: a copy of the buffers the forward pass changes; restore() puts them back, as does an error.

    Copied: the running statistics of a norm layer that updates them (BatchNorm in training mode), and any buffer
    a cycle was seen to change before (by its version counter). Any other buffer (a causal mask, a positional
    table) is not copied, only its version noted: one that changes during a block that is put back cannot be, and a
    warning names it (it is copied from then on).
    """

    def __init__(self, model: torch.nn.Module):
        self.saved, self.watched, self.model = [], [], model
        modules = [model]
        for module in modules:  # the list grows as it is walked: model.buffers() without building names, 3x faster
            if module is None:  # a child slot set to None
                continue
            if module._buffers:  # most modules have none
                updates = isinstance(module, _NormBase) and module.training and module.track_running_stats
                for buffer in module._buffers.values():
                    if buffer is None:
                        continue
                    if updates or _CHANGED.get(id(buffer), _dead)() is buffer:
                        self.saved.append((buffer, buffer.clone()))
                    else:
                        self.watched.append((buffer, buffer._version))
            if module._modules:  # a leaf has none
                modules.extend(module._modules.values())

    def __enter__(self) -> _BuffersKept:
        return self

    def restore(self) -> None:
        with torch.no_grad():
            for buffer, saved in self.saved:
                buffer.copy_(saved)
        changed = [buffer for buffer, version in self.watched if buffer._version != version]
        for buffer in changed:
            _CHANGED[id(buffer)] = weakref.ref(buffer, functools.partial(_forget, id(buffer)))
        if changed:
            names = [name for name, b in self.model.named_buffers() if any(b is c for c in changed)]
            warnings.warn(
                _(
                    "the forward pass changed the buffer(s) {names}, which were not copied before this "
                    "cycle, so they could not be put back; from the next cycle on they are"
                ).format(names=", ".join(names)),
                RuntimeWarning,
                stacklevel=3,
            )

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and not self.done:
            self.restore()

    done = False  # True once a step has used what the block built: nothing is put back then


def _dead():
    return None


def _forget(key: int, ref: weakref.ref) -> None:
    """A buffer of _CHANGED is being freed: its entry goes with it (before its id can name another buffer)."""
    if _CHANGED.get(key) is ref:
        del _CHANGED[key]


_CHANGED: dict[int, weakref.ref] = {}  # buffers seen to change in a forward pass although no norm layer's statistics


class _Kept(_BuffersKept):
    """`_BuffersKept`, and the .grad of the optimizer's parameters set aside (None during the block): restore()
    gives back the .grad found, stepped() frees the block's with the optimizer's own zero_grad(set_to_none=True)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]):
        super().__init__(model)
        self.optimizer, self.params = optimizer, params
        # the .grad found, where there is one (after a step there is none: nothing to set aside, nothing to set)
        self.grads = []
        for p in params:
            if p.grad is not None:
                self.grads.append((p, p.grad))
                p.grad = None  # once per cycle: from here on, every backward() adds into .grad

    def restore(self) -> None:
        super().restore()
        for p in self.params:
            p.grad = None  # what the block's backward() made
        for p, grad in self.grads:
            p.grad = grad  # what the call found

    def stepped(self) -> None:
        self.done = True
        # the step's zeroing, once: the optimizer's own (a sharded or fused optimizer's override runs too); torch's
        # own zero_grad(set_to_none=True) sets every .grad to None inside a profiler label, which costs more than
        # the rest of the zeroing (about 30 us a step on the CPU): done here without the label
        zero_grad = self.optimizer.zero_grad
        if getattr(zero_grad, "__func__", None) is _TORCH_ZERO_GRAD:
            for p in self.params:
                p.grad = None
        else:
            zero_grad(set_to_none=True)


_TORCH_ZERO_GRAD = torch.optim.Optimizer.zero_grad  # what an optimizer that does not override zero_grad runs


class _ModesKept:
    """Put back every module's training/eval mode as found, whatever happens in the block. A class, not a generator:
    a generator's exit sets the error's __traceback__, which a frozen dataclass exception refuses."""

    def __init__(self, model: torch.nn.Module):
        self.modes = [(module, module.training) for module in model.modules()]

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exception) -> None:
        for module, training in self.modes:
            module.training = training
