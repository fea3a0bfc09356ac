"""The model-and-optimizer part of a checkpoint: whole state dicts inside the file (`WholeState`: one process, or
DDP, where every process holds the same weights), or an FSDP2 model's shards in a folder beside it (`ShardedState`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import sharded


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


def _parts(model, path: Path) -> WholeState:
    """The model-and-optimizer form for `model`: whole state dicts, or an FSDP2 model's shards (`ShardedState`)."""
    return ShardedState(path) if sharded.is_fsdp(model) else WholeState()
