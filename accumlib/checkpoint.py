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

import contextlib
import dataclasses
import io
import itertools
import os
import pickle
import random
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import sharded
from ._validate import positive_int
from .i18n import _

FORMAT = "accumlib checkpoint"  # what the file says it is
VERSION = 1


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


def _bare(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside torch.compile's and DistributedDataParallel's wrappers: its state's names carry neither."""
    model = model._modules.get("_orig_mod", model)
    return model.module if isinstance(model, DistributedDataParallel) else model


class WholeState:
    """The model-and-optimizer part of a checkpoint as whole state dicts inside the file: one process, or DDP, where
    every process holds the same weights. `Checkpoint` uses only these four methods and `collective`, so a sharded
    model (FSDP2) plugs in a form of its own (`_parts` chooses it, or `Checkpoint(parts=...)`): its `state` saves each
    process's shards with `torch.distributed.checkpoint` into a folder of that step beside the file and returns the
    folder's name for the file, `problem` checks that name, `load` reads the shards back; `collective = True` makes
    every process call `state` (here only process 0 does)."""

    collective = False

    def layout(self, model, optimizer) -> dict:
        """What identifies the model and the optimizer: each state entry's name, shape and dtype; the optimizer's
        type and which parameters (by name) each of its groups holds."""
        bare = _bare(model)
        names = {id(p): name for name, p in bare.named_parameters()}
        return {
            "model": [[name, list(t.shape), str(t.dtype)] for name, t in bare.state_dict().items()],
            "optimizer": f"{type(optimizer).__module__}.{type(optimizer).__qualname__}",
            "groups": [
                [names.get(id(p), f"? {list(p.shape)}") for p in group["params"]] for group in optimizer.param_groups
            ],
        }

    def state(self, model, optimizer) -> dict:
        """What goes into the file for the model and the optimizer."""
        return {"model": _bare(model).state_dict(), "optimizer": optimizer.state_dict()}

    def problem(self, saved: dict) -> str | None:
        """What is wrong with the file's model-and-optimizer part (None: nothing): its tensors must be what its
        layout says."""
        model, optimizer = saved.get("model"), saved.get("optimizer")
        if not isinstance(model, dict) or not isinstance(optimizer, dict):
            return "'model', 'optimizer'"
        tensors = [[name, list(t.shape), str(t.dtype)] for name, t in model.items() if isinstance(t, torch.Tensor)]
        return None if tensors == saved["layout"]["model"] else "'model'"

    def load(self, model, optimizer, saved: dict) -> None:
        """The saved states into the model and the optimizer (their layouts already compared: nothing fails)."""
        _bare(model).load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])


class ShardedState(WholeState):
    """The model-and-optimizer part of an FSDP2 (fully_shard) run's checkpoint: every process's shards of the
    weights and of the optimizer's state, saved with `torch.distributed.checkpoint` (its state-dict helpers,
    get_state_dict / set_state_dict) into a folder beside the file, `.<file name>.shards-<token>`, a new one per
    write; the file names it. The file is written after its folder, so the file always names a whole folder; the
    folder the file named before stays until the next write, then goes. A run goes on from it on the same number of
    processes (the file's `processes` must match: another number is refused by name, before anything changes)."""

    collective = True

    def __init__(self, path: Path):
        self.path = path
        self.folders: list[str] = []  # the folders this run wrote, oldest first

    def state(self, model, optimizer) -> dict:
        import shutil

        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        token = [os.urandom(6).hex()]
        dist.broadcast_object_list(token, src=0)  # every process writes its shards into the same folder
        folder = f".{self.path.name}.shards-{token[0]}"
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=self.path.parent / folder)
        self.folders.append(folder)
        if dist.get_rank() == 0:
            for old in self.folders[:-2]:  # the file still names the one before this
                shutil.rmtree(self.path.parent / old, ignore_errors=True)
        del self.folders[:-2]
        return {"shards": folder}

    def problem(self, saved: dict) -> str | None:
        folder = saved.get("shards")
        if not isinstance(folder, str) or os.sep in folder or not (self.path.parent / folder / ".metadata").is_file():
            return "'shards' (the folder of every process's shards, beside the file)"
        return None

    def load(self, model, optimizer, saved: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(model, optimizer)  # the shapes to read each shard into
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=self.path.parent / saved["shards"])
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        self.folders = [saved["shards"]]


def _captured() -> tuple:
    """Every random state a run draws from, as the libraries give them (quick to take: `_plain` converts them):
    torch's on the CPU and on each CUDA device in use, NumPy's global one where NumPy is in use, Python's."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    numpy = sys.modules.get("numpy")
    return torch.get_rng_state(), cuda, None if numpy is None else numpy.random.get_state(), random.getstate()


def _plain(captured: tuple) -> dict:
    """Captured random states as tensors and numbers: torch.load(weights_only=True) reads them, nothing pickled."""
    torch_state, cuda, numpy_state, (version, internal, gauss) = captured
    states = {
        "torch": torch_state,
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
    }
    if cuda is not None:
        states["cuda"] = cuda
    if numpy_state is not None:
        kind, keys, position, has_gauss, cached = numpy_state
        states["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype("int64")),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "gauss": float(cached),
        }
    return states


def _parts(model, path: Path) -> WholeState:
    """The model-and-optimizer form for `model`: whole state dicts, or an FSDP2 model's shards (`ShardedState`)."""
    return ShardedState(path) if sharded.is_fsdp(model) else WholeState()


def _random_states() -> dict:
    """Every random state a run draws from (torch's on the CPU and each CUDA device, NumPy's, Python's), plain."""
    return _plain(_captured())


@contextlib.contextmanager
def random_states_kept():
    """Every random state a run draws from (torch's on the CPU and CUDA, NumPy's, Python's) put back on leaving the
    block: what happens inside (a Dataset's fetch for train's checks or memory_budget's trace) draws nothing the run
    would have drawn."""
    states = _random_states()
    try:
        yield
    finally:
        _set_random_states(states)


def _set_random_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    python = states["python"]
    random.setstate((python["version"], tuple(python["internal"].tolist()), python["gauss"]))
    if "cuda" in states and torch.cuda.is_available():  # the GPUs this machine has (a file may hold more)
        for index, state in enumerate(states["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state, index)
    if "numpy" in states:
        import numpy  # noqa: PLC0415 (NumPy held a state when the file was written: it is installed)

        saved = states["numpy"]
        numpy.random.set_state(
            (
                saved["kind"],
                saved["keys"].numpy().astype("uint32"),
                saved["position"],
                saved["has_gauss"],
                saved["gauss"],
            )
        )


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
        self.run = run  # what fixes the cycles and their sample order: accum_steps, micro_batch_size, seed, ...
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

    def cycles(self, cycles, loader: bool):
        """The run's cycles, as they come. Resumed, the random states are put back where the stopped run's last
        epoch began, then after the last cycle it took, so the next draws what the uninterrupted run drew. A
        `loader` draws where each epoch begins (a shuffling DataLoader its order, its workers their seeds) and the
        resumed run fetches and drops the cycles the stopped run took: its random states are taken before each
        cycle (well under a millisecond), and kept from each epoch's first; (X, y) and a Dataset draw nothing there."""
        saved, cycles, epoch, before = self.saved, iter(cycles), None, None
        for index in itertools.count():
            if saved is not None and index == saved["epoch_start"]:
                _set_random_states(saved["epoch_random"][self.rank])
            if saved is not None and index == saved["step"]:
                _set_random_states(saved["random"][self.rank])
            if loader:
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

    def cycles(self, cycles, loader: bool):
        return cycles

    def stepped(self, history) -> None:
        pass

    def ended(self, history) -> None:
        pass


NONE = _NoCheckpoint()


def _kind(value) -> str | None:
    return None if value is None else f"{type(value).__module__}.{type(value).__qualname__}"


def _storable(name: str, state) -> None:
    """Refuse, naming `name`, a state that torch.load(weights_only=True) could not read back (an object pickled
    whole), before the run: a checkpoint holding it could never be resumed."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            _(
                "checkpoint: the {name}'s state_dict() holds something a checkpoint cannot store (it is "
                "read with torch.load(weights_only=True), which takes tensors, numbers, strings and "
                "containers of them): {error}"
            ).format(name=name, error=_first_line(error))
        ) from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _write_atomically(path: Path, payload: dict) -> None:
    """`payload` into `path` through a temporary file in its folder, flushed to the disk, then renamed over it:
    whatever interrupts the write, `path` is the previous file or the new one, whole."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    if hasattr(os, "O_DIRECTORY"):  # the rename itself made durable (POSIX)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


FORM = {
    "format": str,
    "version": int,
    "run": dict,
    "layout": dict,
    "step": int,
    "epoch_start": int,
    "scheduler": (dict, type(None)),
    "scaler": (dict, type(None)),
    "records": list,
    "random": list,
    "epoch_random": list,
}


def _load(path: Path, record, parts: WholeState) -> dict:
    """The file's contents, refused naming the file unless it is a whole accumlib checkpoint: every part matching
    its checksum, read by torch.load(weights_only=True) (which builds no object, so runs no code), of this form."""

    def damaged(why):
        return ValueError(
            _("checkpoint {path!r} cannot be resumed: {why}; nothing was changed; delete it to start afresh").format(
                path=str(path), why=why
            )
        )

    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # every part's CRC-32: torch.load would take changed bytes as they are
    except Exception as error:
        raise damaged(
            _("it is damaged, truncated or not a file torch.save wrote ({error})").format(error=_first_line(error))
        ) from None
    if bad is not None:
        raise damaged(_("it is damaged: its part {part!r} does not match its checksum").format(part=bad))
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise damaged(
            _(
                "it holds objects that a checkpoint does not (torch.load with weights_only=True refused to "
                "build them, so none of their code ran): {error}"
            ).format(error=_first_line(error))
        ) from None
    except Exception as error:
        raise damaged(_("it is damaged ({error})").format(error=_first_line(error))) from None
    problem = _form_problem(saved, record) or parts.problem(saved)
    if problem is not None:
        raise damaged(
            _("it is not an accumlib checkpoint of this version, or it is damaged: {problem}").format(problem=problem)
        )
    return saved


def _form_problem(saved, record) -> str | None:
    """What is wrong with the form of a file's contents (None: nothing)."""
    if not isinstance(saved, dict):
        return type(saved).__name__
    for key, kind in FORM.items():
        if not isinstance(saved.get(key), kind):
            return repr(key)
    if saved["format"] != FORMAT or saved["version"] != VERSION:
        return f"{saved['format']!r} {saved['version']!r}"
    layout = saved["layout"]
    if (
        not layout.keys() >= {"model", "optimizer", "groups", "scheduler", "scaler"}
        or not isinstance(layout.get("model"), list)
        or not isinstance(layout.get("groups"), list)
        or not all(isinstance(entry, list) and len(entry) == 3 for entry in layout["model"])
    ):
        return "'layout'"
    records, fields = saved["records"], {f.name for f in dataclasses.fields(record)}
    if len(records) != saved["step"] or not all(
        isinstance(r, dict) and r.keys() == fields and r["step"] == i + 1 for i, r in enumerate(records)
    ):
        return "'records'"
    processes = saved["run"].get("processes")
    if not 0 <= saved["epoch_start"] < max(saved["step"], 1):
        return "'epoch_start'"
    for key in ("random", "epoch_random"):
        if len(saved[key]) != processes or not all(_random_form(state) for state in saved[key]):
            return repr(key)
    return None


def _random_form(state) -> bool:
    """Whether `state` has the form `_random_states` gives."""
    try:
        torch_state, python = state["torch"], state["python"]
        good = (
            torch_state.dtype == torch.uint8
            and torch_state.shape == torch.get_rng_state().shape
            and python["internal"].dtype == torch.int64
            and python["internal"].shape == (625,)
        )
        if "numpy" in state:
            good = good and state["numpy"]["keys"].shape == (624,) and isinstance(state["numpy"]["kind"], str)
        return bool(good) and all(t.dtype == torch.uint8 for t in state.get("cuda", []))
    except (TypeError, KeyError, AttributeError):
        return False
