"""What `train` returns and records: one `StepRecord` per optimizer step, gathered in a `History`; and
`StopTraining`, which an `on_step` callback raises to end a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator


class StopTraining(Exception):
    """Raise from an `on_step` callback to end training; `train` returns the history so far."""


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step did. Losses are unscaled means over the cycle (independent of accum_steps)."""

    step: int  # optimizer steps so far, 1-based (a resumed run goes on from the stopped run's count)
    epoch: int  # 0-based
    samples_seen: int  # samples processed so far, all processes together
    micro_batches: int  # micro-batches in this cycle (fewer in a last, incomplete cycle)
    samples: int  # samples in this cycle, all processes together
    # the loss the step's gradient belongs to: the mean per sample over the cycle (per loss term with
    # normalize="count"); with normalize="steps" the sum of micro-batch losses / accum_steps, which equals the mean
    # per sample on a full cycle of equal micro-batches and is too small on a short last cycle, as its gradient is
    loss: float
    lr: float  # learning rate of the first parameter group when the step was taken
    # L2 norm of the accumulated gradient of the optimizer's parameters, before clipping; None when it was not read
    # (check_gradients=False, without clipping or a GradScaler)
    grad_norm: float | None
    seconds: float  # wall time of the cycle, seconds
    peak_memory_bytes: int | None  # peak bytes during the cycle (CUDA allocator / CPU live tensors)
    skipped: bool = False  # True when a NaN/inf loss or gradient made this step leave the model untouched
    # True when the cycle had nothing to learn from: no samples (0-row batches), or no loss terms with
    # normalize="count". No step: the model, optimizer, scheduler and scaler untouched; loss NaN, grad_norm None
    empty: bool = False

    @property
    def samples_per_second(self) -> float:
        """Throughput of this step: samples / wall seconds."""
        return self.samples / self.seconds


@dataclass
class History:
    """One `StepRecord` per optimizer step, plus why training ended early (if it did) and what train noticed.

    When training fails (an exception from your loss, callback or scheduler, NonFiniteError, OutOfMemory), the
    exception carries the history so far as its `history` attribute.
    """

    records: list[StepRecord] = field(default_factory=list)
    stopped: str | None = None  # "StopTraining" or "KeyboardInterrupt" when training ended early
    # what the run did that you may not have meant, in words (an effective batch larger than the data, say)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        return self.records[i]

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self.records)

    def columns(self) -> dict[str, list]:
        """The records as plain columns, one list per field (and samples_per_second), ready for plotting."""
        names = [*StepRecord.__dataclass_fields__, "samples_per_second"]
        return {name: [getattr(r, name) for r in self.records] for name in names}
