"""Checkpoints of a `train` run: one file that lets a stopped run go on as if it had never stopped, bit for bit.

`train(..., checkpoint=PATH, checkpoint_every=N)` writes PATH every N optimizer steps and when the run ends (done,
max_steps, StopTraining, Ctrl-C). The file holds the model's, optimizer's, scheduler's and GradScaler's states, the
step, the records, where the sample order stands, and every random state a run draws from (torch's on the CPU and on
each CUDA device, NumPy's and Python's `random`), for each process. If PATH exists when `train` starts, the run goes
on from it. A write goes to a temporary file in PATH's folder, is flushed to the disk, then renamed over PATH: an
interrupted write leaves the previous file whole. The file is read with `torch.load(weights_only=True)`, so it
holds only tensors, numbers, strings and containers of them, and a file that would run code when read is refused
without running it; it is refused too, naming it and what differs, when it is damaged, truncated or from another
run, before anything changes.

Under DistributedDataParallel every process sends its random states to process 0, which writes the file; every
process reads it. The model-and-optimizer part of the file is `WholeState`'s; a sharded model (FSDP2), whose state
lives in pieces on every process, has `ShardedState`'s: every process saves its pieces with
`torch.distributed.checkpoint` into a folder beside the file, which names it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ._validate import positive_int
from .checkpoint_file import FORMAT, VERSION, _load, _storable, _write_atomically
from .checkpoint_parts import ShardedState, WholeState, _parts
from .i18n import _
from .random_states import _captured, _plain, _random_states, _set_random_states, random_states_kept

__all__ = ["check", "Checkpoint", "NONE", "WholeState", "ShardedState", "random_states_kept", "FORMAT", "VERSION"]


def check(checkpoint, checkpoint_every, resume_from_step: int) -> tuple[Path | None, int | None]:
    """train's `checkpoint` (a path whose folder exists) and `checkpoint_every` (a positive integer, with a
    checkpoint), checked by name before anything runs."""
    if checkpoint is not None and resume_from_step:
        raise ValueError(
            _(
                "resume_from_step={value} was given with checkpoint: a run goes on from its checkpoint "
                "file by itself; give one or the other"
            ).format(value=resume_from_step)
        )
    if checkpoint is None:
        if checkpoint_every is not None:
            raise ValueError(
                _(
                    "checkpoint_every={value!r} was given without checkpoint: give checkpoint=PATH, the "
                    "file to write every {value!r} steps"
                ).format(value=checkpoint_every)
            )
        return None, None
    if isinstance(checkpoint, bytes) or not isinstance(checkpoint, (str, os.PathLike)) or not os.fspath(checkpoint):
        raise TypeError(
            _("checkpoint must be a file path (a str or a pathlib.Path), got {value!r} of type {type}").format(
                value=checkpoint, type=type(checkpoint).__name__
            )
        )
    path = Path(checkpoint)
    if not path.parent.is_dir():
        raise ValueError(
            _("checkpoint={value!r}: its folder {folder!r} does not exist; create it first").format(
                value=os.fspath(checkpoint), folder=str(path.parent)
            )
        )
    if path.is_dir():
        raise ValueError(
            _("checkpoint={value!r} is a folder; give the path of a file in it, such as {example!r}").format(
                value=os.fspath(checkpoint), example=str(path / "run.pt")
            )
        )
    every = None if checkpoint_every is None else positive_int("checkpoint_every", checkpoint_every)
    return path, every


class Checkpoint:
    """A run's checkpoint file: read (and compared with the run) in train's checks, written as the run goes.

    train calls `read` in its checks, `restore` once the run starts, `cycles` around the run's cycles (it puts the
    random states back where the stopped run left them, and notes where each epoch started), `stepped` after each
    step (and its on_step) and `ended` when the run ends."""

    def __init__(
        self,
        path: Path,
        every: int | None,
        model,
        optimizer,
        scheduler,
        scaler,
        record,
        device,
        run: dict,
        rank: int,
        parts: WholeState | None = None,
    ):
        self.path, self.every, self.world, self.rank, self.device = path, every, run["processes"], rank, device
        self.model, self.optimizer, self.scheduler, self.scaler, self.record = (
            model,
            optimizer,
            scheduler,
            scaler,
            record,
        )
        self.parts = parts or _parts(model, self.path)
        self.run = run  # what fixes the cycles, their order and weights: accum_steps, micro_batch_size, seed, ...
        self.layout = {
            **self.parts.layout(model, optimizer),
            "scheduler": _kind(scheduler),
            "scaler": scaler is not None,
        }
        for name, value in (("scheduler", scheduler), ("scaler", scaler)):
            if value is not None:
                _storable(name, value.state_dict())
        _storable("optimizer", {"param_groups": optimizer.state_dict()["param_groups"]})
        self.saved = None  # the file's contents, once read and compared with this run
        self.written = 0  # the step the file holds
        self.epoch = None  # (the index of the cycle that began the current epoch, the random states just before)
        self.finished = False  # the file holds every step of this run: nothing is left to train

    @property
    def step(self) -> int:
        """The steps the file's run took (0 without a file)."""
        return self.written

    def read(self, steps: int | None) -> None:
        """The file, if it exists, checked whole and compared with this run (`steps`: its optimizer steps, when
        known): refused, naming the file and each difference, before anything changes."""
        exists = self.path.exists()
        failure, saved = None, None
        try:
            if exists:
                saved = _load(self.path, self.record, self.parts)
                differences = self._differences(saved)
                if differences:
                    raise ValueError(
                        _(
                            "checkpoint {path!r} is from another run, so this run does not go on from it "
                            "(nothing was changed): {differences}; give another checkpoint path, or "
                            "delete the file to start afresh"
                        ).format(path=str(self.path), differences="; ".join(differences))
                    )
                if steps is not None and saved["step"] > steps:
                    raise ValueError(
                        _(
                            "checkpoint {path!r} holds {step} optimizer steps, more than the {steps} of "
                            "this run (nothing was changed): give epochs or max_steps for {step} steps or "
                            "more, or another checkpoint path"
                        ).format(path=str(self.path), step=saved["step"], steps=steps)
                    )
        except Exception as error:
            failure = error
        step = -1 if saved is None else saved["step"]
        if self.world > 1:  # every process reads the same file, or none goes on
            flags = torch.tensor([float(failure is not None), step, -step], dtype=torch.float64, device=self.device)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            failed, highest, lowest = flags.tolist()
            if failure is None and failed:
                raise ValueError(
                    _(
                        "checkpoint {path!r}: another process could not go on from it (its own error "
                        "says why); this process stops with it, before anything changes"
                    ).format(path=str(self.path))
                )
            if failure is None and highest != -lowest:
                raise ValueError(
                    _(
                        "checkpoint {path!r}: the processes found different files (steps {a} and {b}; "
                        "-1: no file): give every process the same file, in a folder that every machine "
                        "shares"
                    ).format(path=str(self.path), a=int(-lowest), b=int(highest))
                )
        if failure is not None:
            raise failure
        if saved is not None:
            self.saved, self.written = saved, saved["step"]
            self.finished = self.written == steps

    def _differences(self, saved: dict) -> list[str]:
        """What differs between the file's run and this one, in words (empty: the same run)."""
        differences = []
        for name, here in self.run.items():
            there = saved["run"].get(name)
            if there != here:
                differences.append(
                    _("{name} is {there!r} in the file, {here!r} here").format(name=name, there=there, here=here)
                )
        there, here = saved["layout"], self.layout
        mine = {name: (shape, dtype) for name, shape, dtype in here["model"]}
        theirs = {name: (shape, dtype) for name, shape, dtype in there["model"]}
        for name in sorted(mine.keys() ^ theirs.keys())[:3]:
            differences.append(
                (
                    _("the model's {name!r} is only in the file")
                    if name in theirs
                    else _("the model's {name!r} is not in the file")
                ).format(name=name)
            )
        for name in [n for n in mine if n in theirs and mine[n] != theirs[n]][:3]:
            differences.append(
                _(
                    "the model's {name!r} has shape {there} and dtype {there_dtype} in the file, shape "
                    "{here} and dtype {here_dtype} here"
                ).format(
                    name=name,
                    there=tuple(theirs[name][0]),
                    there_dtype=theirs[name][1],
                    here=tuple(mine[name][0]),
                    here_dtype=mine[name][1],
                )
            )
        for name in ("optimizer", "scheduler", "scaler"):
            if there[name] != here[name]:
                differences.append(
                    _("the {name} is {there} in the file, {here} here").format(
                        name=name, there=there[name], here=here[name]
                    )
                )
        if there["groups"] != here["groups"] and there["optimizer"] == here["optimizer"]:
            differences.append(
                _("the optimizer's parameter groups hold {there} in the file, {here} here").format(
                    there=there["groups"], here=here["groups"]
                )
            )
        return differences

    def restore(self, history) -> None:
        """The file's states into the model, the optimizer, the scheduler and the scaler, and its records into
        `history` (the random states are put back by `cycles`, where the stopped run left them)."""
        saved = self.saved
        if saved is None:
            return
        self.parts.load(self.model, self.optimizer, saved)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(saved["scheduler"])
        if self.scaler is not None:
            self.scaler.load_state_dict(saved["scaler"])
        history.records[:0] = [self.record(**record) for record in saved["records"]]
        history.notes.append(
            _("went on from checkpoint {path!r} after its step {step}").format(path=str(self.path), step=self.written)
        )

    def cycles(self, source, epochs: int | None):
        """The run's cycles, as `source` (a `batches._Producer`) gives them over `epochs`. Resumed, the random states
        are put back where the stopped run's last epoch began, then after the last cycle it took, so the next draws
        what the uninterrupted run drew. A source that fetches ahead (a loader) draws where each epoch begins (a
        shuffling DataLoader its order, its workers their seeds) and the resumed run fetches and drops the cycles
        the stopped run took: its random states are taken before each cycle (well under a millisecond), and kept
        from each epoch's first; (X, y) and a Dataset draw nothing there."""
        saved, cycles, epoch, before = self.saved, iter(source.cycles(epochs)), None, None
        for index in itertools.count():
            if saved is not None and index == saved["epoch_start"]:
                _set_random_states(saved["epoch_random"][self.rank])
            if saved is not None and index == saved["step"]:
                _set_random_states(saved["random"][self.rank])
            if source.fetches_ahead:
                before = _captured()
            cycle = next(cycles, None)
            if cycle is None:
                return
            if cycle.epoch != epoch:
                epoch, self.epoch = cycle.epoch, (index, before)
            yield cycle

    def stepped(self, history) -> None:
        """After a step and its on_step: the file written every `every` steps."""
        if self.every is not None and len(history) % self.every == 0:
            self._write(history)

    def ended(self, history) -> None:
        """The run has ended (done, max_steps, StopTraining, Ctrl-C): the file written unless it holds this step. A
        failed write's error carries the records, as train's errors do."""
        if len(history) != self.written:
            try:
                self._write(history)
            except Exception as error:
                error.history = history
                raise

    def _write(self, history) -> None:
        """Process 0 writes the file, with every process's random states; every process learns whether it did."""
        now = _random_states()
        states = {"random": now, "epoch_random": now if self.epoch[1] is None else _plain(self.epoch[1])}
        gathered = [states]
        if self.world > 1:
            gathered = [None] * self.world if self.rank == 0 else None
            dist.gather_object(states, gathered, dst=0)
        failure = None
        try:
            if self.rank == 0 or self.parts.collective:
                payload = {
                    "format": FORMAT,
                    "version": VERSION,
                    "run": self.run,
                    "layout": self.layout,
                    "step": len(history),
                    "epoch_start": self.epoch[0],
                    **self.parts.state(self.model, self.optimizer),
                    "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
                    "scaler": None if self.scaler is None else self.scaler.state_dict(),
                    "records": [dataclasses.asdict(record) for record in history.records],
                }
                if self.rank == 0:
                    payload["random"] = [g["random"] for g in gathered]
                    payload["epoch_random"] = [g["epoch_random"] for g in gathered]
                    _write_atomically(self.path, payload)
        except BaseException as error:  # Ctrl-C too: the other processes still learn of it
            failure = error
        if self.world > 1:
            flag = torch.tensor([float(failure is not None)], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if failure is None and flag.item():
                raise RuntimeError(
                    _(
                        "checkpoint {path!r}: another process failed writing it (its own error says "
                        "why); the file holds the last step written before"
                    ).format(path=str(self.path))
                )
        if failure is not None:
            raise failure
        self.written = len(history)


class _NoCheckpoint:
    """A run without a checkpoint: what train calls, doing nothing."""

    step, finished = 0, False

    def read(self, steps) -> None:
        pass

    def restore(self, history) -> None:
        pass

    def cycles(self, source, epochs: int | None):
        return source.cycles(epochs)

    def stepped(self, history) -> None:
        pass

    def ended(self, history) -> None:
        pass


NONE = _NoCheckpoint()


def _kind(value) -> str | None:
    return None if value is None else f"{type(value).__module__}.{type(value).__qualname__}"
