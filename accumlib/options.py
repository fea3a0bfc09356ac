"""The cycle's options, each declared once: `CycleOptions`, what `accumulate_and_step` and `train` both take (as
`options=` or as keywords), each field with its default, its check and its line of documentation (`_option`), from
which the class's `Args:` are written. `accumlib.cycle` runs a cycle with them.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.optim.lr_scheduler import OneCycleLR

from ._validate import boolean, function, one_of, positive_number
from .i18n import _


def _option(default, doc: str, run_state: bool = False):
    """A `CycleOptions` field: its default and what it means, in one line of `doc` (run_state: an object of the run,
    which a measurement on copies leaves out: `CycleOptions.measured`)."""
    return field(default=default, metadata={"doc": doc, "run_state": run_state})


@dataclass(frozen=True, kw_only=True)
class CycleOptions:
    """How every cycle runs, for `accumulate_and_step` and `train` alike: pass `options=CycleOptions(...)`, or the
    same names as keywords of either (one or the other, never both). Keyword-only, frozen, checked once when built:
    each refusal names the option, the value and what is valid. `memory.measure_step` takes those a measurement on
    copies runs (not the scaler and the scheduler, a run's objects).

    Args:
    """

    loss_fn: Callable | None = _option(
        None,
        (
            "loss_fn(output, target) -> the micro-batch's loss, a scalar tensor. None: the model's own (its output's "
            "`.loss` or 'loss' key, as a Hugging Face model given labels returns), else cross_entropy(output, target)."
        ),
    )
    clip_grad_norm: float | None = _option(
        None,
        (
            "clip the accumulated gradient to this L2 norm, once per step; the norm (the result's grad_norm, before "
            "clipping) and clipping cover exactly the optimizer's parameters."
        ),
    )
    amp: bool | str = _option(
        False,
        (
            "mixed precision, the forward passes under torch.autocast: False; 'bf16'; 'fp16' (with a GradScaler: "
            "`scaler`, or in train a new one); True (fp16 on CUDA, bf16 elsewhere). bf16 is refused on a CUDA GPU "
            "without native bf16 (a T4: accumlib.devices.supports_bf16)."
        ),
    )
    scaler: torch.amp.GradScaler | None = _option(
        None,
        (
            "a GradScaler (fp16): unscale, step and update once per step; train refuses one without amp. A disabled "
            "one (GradScaler(enabled=False), PyTorch's enabled=use_amp) is no scaler, refused with amp 'fp16' or True."
        ),
        run_state=True,
    )
    scheduler: object = _option(
        None,
        (
            "a learning-rate scheduler built on the optimizer, stepped once per step taken (a ReduceLROnPlateau with "
            "the step's loss); in train a OneCycleLR must have total_steps for every step of the run."
        ),
        run_state=True,
    )
    ddp_no_sync: bool = _option(
        True,
        (
            "under DDP or FSDP2 (compiled or not), synchronise the gradients only in the last micro-batch's backward "
            "(DDP's no_sync(), FSDP2's set_requires_gradient_sync)."
        ),
    )
    on_nonfinite: str = _option(
        "skip",
        (
            "a NaN/inf loss or gradient norm 'skip's the step (the model, its buffers, the optimizer and .grad left as "
            "found) or 'raise's NonFiniteError; with a scaler only a non-finite loss raises (an overflow is its "
            "routine)."
        ),
    )
    check_gradients: bool = _option(
        True,
        (
            "read the gradient's L2 norm every step, so a NaN/inf gradient under a finite loss is caught too; False "
            "leaves it out unless clipping or a scaler needs it (grad_norm None; one reduction per parameter tensor "
            "less, and such a gradient reaches the weights)."
        ),
    )

    def __post_init__(self) -> None:
        if self.loss_fn is not None:
            function("loss_fn", self.loss_fn)
        if self.clip_grad_norm is not None:
            object.__setattr__(self, "clip_grad_norm", positive_number("clip_grad_norm", self.clip_grad_norm))
        one_of("amp", self.amp, (False, True, "fp16", "bf16"))
        if self.scaler is not None and not isinstance(self.scaler, torch.amp.GradScaler):
            raise TypeError(
                _("scaler must be a torch.amp.GradScaler, got {value!r} of type {type}").format(
                    value=self.scaler, type=type(self.scaler).__name__
                )
            )
        if self.scaler is not None and not self.scaler.is_enabled():  # GradScaler(enabled=use_amp), use_amp False
            if self.amp in ("fp16", True):
                raise ValueError(
                    _(
                        "scaler is disabled (GradScaler(enabled=False)) but amp={value!r} asks for mixed "
                        "precision, whose fp16 needs an enabled one: pass an enabled GradScaler (or, to "
                        "train, none: train makes one), or amp=False"
                    ).format(value=self.amp)
                )
            object.__setattr__(self, "scaler", None)  # a disabled scaler is no scaler: it scales and skips nothing
        scheduler = self.scheduler
        if scheduler is not None and (
            not callable(getattr(scheduler, "step", None)) or not hasattr(scheduler, "optimizer")
        ):
            raise TypeError(
                _(
                    "scheduler must be a learning-rate scheduler (torch.optim.lr_scheduler) built on the "
                    "optimizer, got {value!r} of type {type}"
                ).format(value=scheduler, type=type(scheduler).__name__)
            )
        boolean("ddp_no_sync", self.ddp_no_sync)
        one_of("on_nonfinite", self.on_nonfinite, ("skip", "raise"))
        boolean("check_gradients", self.check_gradients)

    @classmethod
    def of(cls, options: CycleOptions | None, keywords: dict, where: str) -> CycleOptions:
        """The options an entry point (`where`) was given: `options`, or the same options as `keywords`; refused by
        name when both are given, when a keyword is no option, or when `options` is no CycleOptions."""
        unknown = sorted(set(keywords) - set(cls.__dataclass_fields__))
        if unknown:
            raise TypeError(
                _("{where}() got an unexpected keyword argument {names}; the cycle's options are {valid}").format(
                    where=where, names=", ".join(map(repr, unknown)), valid=", ".join(cls.__dataclass_fields__)
                )
            )
        if options is None:
            return cls(**keywords)
        if not isinstance(options, cls):
            raise TypeError(
                _("options must be an accumlib.CycleOptions, got {value!r} of type {type}").format(
                    value=options, type=type(options).__name__
                )
            )
        if keywords:
            raise TypeError(
                _(
                    "{where}() got {names} both as a keyword and in options=: give each option once, "
                    "inside CycleOptions(...) or as a keyword without options="
                ).format(where=where, names=", ".join(map(repr, sorted(keywords))))
            )
        return options

    def check_scheduler(self, optimizer: torch.optim.Optimizer, steps: int | None = 0) -> None:
        """The scheduler must step `optimizer`, and a OneCycleLR must last for the `steps` optimizer steps of the
        run (None: a run whose steps are not known before it starts, which a OneCycleLR cannot last)."""
        scheduler = self.scheduler
        if scheduler is None:
            return
        if scheduler.optimizer is not optimizer:
            raise ValueError(
                _(
                    "scheduler was built on another optimizer: it would change that optimizer's learning "
                    "rate, not this one's; build it on the optimizer you pass to train"
                )
            )
        if steps is None and isinstance(scheduler, OneCycleLR):
            raise ValueError(
                _(
                    "scheduler: a OneCycleLR must last for every optimizer step of the run, and this "
                    "run's steps are not known before it starts (data has no len()); give max_steps (and "
                    "build the OneCycleLR with total_steps=max_steps)"
                )
            )
        if isinstance(scheduler, OneCycleLR) and scheduler.last_epoch + steps > scheduler.total_steps:
            raise ValueError(
                _(
                    "scheduler: this OneCycleLR has {left} of its total_steps={total} left, but this run "
                    "takes {steps} optimizer steps; build it with total_steps={steps}"
                ).format(left=scheduler.total_steps - scheduler.last_epoch, total=scheduler.total_steps, steps=steps)
            )

    def measured(self) -> CycleOptions:
        """These options as a measurement of the cycle runs them on copies of the model and optimizer: without the
        scheduler (built on the real optimizer, it would step it) and the scaler (its scale would change; what it
        adds is a few scalars), with autocast (its lower-precision activations are what an amp step holds)."""
        return dataclasses.replace(self, **{f.name: None for f in dataclasses.fields(self) if f.metadata["run_state"]})


# CycleOptions' Args: written from its fields, so that each option's words live once, where it is declared
if CycleOptions.__doc__:  # None under python -OO
    CycleOptions.__doc__ = (
        CycleOptions.__doc__.rstrip()
        + "\n"
        + "".join(
            textwrap.fill(f"{f.name}: {f.metadata['doc']}", 116, initial_indent=" " * 8, subsequent_indent=" " * 12)
            + "\n"
            for f in dataclasses.fields(CycleOptions)
        )
        + "    "
    )
