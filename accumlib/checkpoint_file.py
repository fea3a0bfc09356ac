"""A checkpoint's file: written atomically (a temporary file, flushed, renamed over it), read with
torch.load(weights_only=True) only when every part matches its checksum, and refused, naming the file and what is
wrong, unless it has the form `Checkpoint` writes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .i18n import _

if TYPE_CHECKING:
    from .checkpoint_parts import WholeState

FORMAT = "accumlib checkpoint"  # what the file says it is
VERSION = 1


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
