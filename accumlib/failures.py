"""Under DDP, a failure on one process stops every process: the failure flags are all-reduced before a
collective that the failed process would never reach, and each process says which rank failed and why."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .i18n import _


def _told(error: BaseException | None, failed: list[int]) -> str:
    """Under DDP, once every process knows that the processes `failed` have (an all-reduced flag): what each of them
    raised ("process 1: ValueError: ..."), gathered on every process (one all_gather_object)."""
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    return "; ".join(_("process {rank}: {error}").format(rank=rank, error=messages[rank]) for rank in failed)


def _agree(error: BaseException | None, device: torch.device) -> None:
    """Under DDP or FSDP2, before a forward or backward that communicates (which a failed process would never reach):
    one all-reduce of a failure flag per process. A process that failed (`error`) tells the others and returns (its
    caller raises its own error); the others raise, saying which process failed and why."""
    flags = torch.zeros(dist.get_world_size(), device=device)
    flags[dist.get_rank()] = error is not None
    dist.all_reduce(flags)
    failed = [rank for rank, flag in enumerate(flags.tolist()) if flag]
    if failed:
        why = _told(error, failed)
        if error is None:
            raise RuntimeError(
                _(
                    "{why}: it failed in this cycle, in a micro-batch (fetching it, its forward pass or "
                    "loss_fn); this process stops with it, before the step: its weights, optimizer and .grad "
                    "are as they were"
                ).format(why=why)
            )


class _Told:
    """`_cycle`'s block under DDP: an error raised in it before `agree()` (a micro-batch, the forward pass, loss_fn)
    is told to every process (`_agree`) before it propagates; agree() is that all-reduce when nothing failed."""

    __slots__ = ("device", "pending")

    def __init__(self, device: torch.device):
        self.device, self.pending = device, True

    def __enter__(self) -> _Told:
        return self

    def agree(self) -> None:
        self.pending = False  # an error from here on (another process's, raised by _agree) is not told again
        _agree(None, self.device)

    def __exit__(self, kind, error, traceback) -> None:
        if self.pending and isinstance(error, Exception):
            _agree(error, self.device)  # the others raise, saying why; this process raises its own error
