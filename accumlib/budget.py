"""What a memory budget means: `OutOfMemory`, the CUDA caching allocator's blocks, and `cuda_budget`'s hard cap.

On CUDA (issue 20) a storage counts what the caching allocator gives it: its bytes rounded up to the allocator's
512-byte block (`allocation_bytes`), in the live-tensor count and so in the FakeTensorMode trace of a model on CUDA,
which is what `check_fits` (train's `memory_budget`) compares with the budget before anything changes. A simulated
card of B bytes on CUDA is thus B bytes of the step's tensors as the allocator allocates them: the peak of
`torch.cuda.max_memory_allocated` over a step, less what was allocated before it. Not counted against B, because a
real card pays them whatever the batch: the CUDA context (a few hundred MiB of driver and kernel images, outside the
allocator), cuBLAS's workspace (allocated once per stream, through the allocator; `cuda_budget` takes it before it
looks at what is reserved), the caching allocator's segments (reserved but unallocated: 2 MiB for blocks up to 1 MiB,
20 MiB or a 2 MiB multiple for larger ones), and the workspaces cuDNN takes for a convolution inside the step. A real
card of N bytes honours a budget B when N >= B + context + workspaces + one partly used segment of each pool; the
hard cap `cuda_budget` sets follows that rule, and only for budgets of at least `CUDA_CAP_MINIMUM` (below it the
allocator's own granularity, not the simulated card, would decide). The 512-byte rounding is exact for blocks up to
1 MiB (the small pool splits its segments at 512 bytes); a larger tensor may be given a cached block up to 1 MiB
larger than its rounded size, which no trace predicts. On the CPU bytes are counted as they are: the CPU's numbers
(and the lessons' stored outputs) do not change. Only `benchmarks/gpu_check.py` on a GPU confirms the CUDA rules.
"""

from __future__ import annotations

import contextlib

import torch

from .i18n import _

CUDA_BLOCK = 512  # bytes: the CUDA caching allocator rounds every block up to a multiple of this (at least one)
CUDA_SMALL_SEGMENT, CUDA_LARGE_SEGMENT = 2 * 2**20, 20 * 2**20  # what it reserves from the driver at a time
CUDA_CAP_MINIMUM = CUDA_LARGE_SEGMENT  # the smallest budget cuda_budget caps the allocator at (see cuda_budget)


def allocation_bytes(nbytes: int, device: torch.device) -> int:
    """The bytes a storage of `nbytes` takes on `device`: on CUDA the caching allocator's block (rounded up to a
    multiple of CUDA_BLOCK; an empty storage takes none), elsewhere `nbytes`."""
    if device.type != "cuda" or nbytes == 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


class OutOfMemory(torch.OutOfMemoryError):
    """A step needs more bytes than the (simulated) card has. needed_bytes, available_bytes: bytes."""

    def __init__(self, needed_bytes: int, available_bytes: int, what: str | None = None, *, advice: str | None = None):
        self.needed_bytes, self.available_bytes = needed_bytes, available_bytes
        advice = advice if advice is not None else _("use a smaller micro_batch_size and more accum_steps")
        super().__init__(
            _(
                "out of memory: {what} needs {needed:,} bytes ({needed_mib:.2f} MiB) but the budget is "
                "{available:,} bytes ({available_mib:.2f} MiB); {advice}"
            ).format(
                what=what if what is not None else _("this micro-batch"),
                needed=needed_bytes,
                needed_mib=needed_bytes / 2**20,
                available=available_bytes,
                available_mib=available_bytes / 2**20,
                advice=advice,
            )
        )


def cuda_budget(device: torch.device, memory_budget: int | None):
    """On CUDA, cap this process's caching allocator for the block where a real card could honour `memory_budget`;
    the allocator's OOM becomes OutOfMemory. Elsewhere, or without a budget, it does nothing.

    The budget itself is B bytes of the step's tensors as the allocator allocates them (512-byte blocks, see the
    module's docstring), which `check_fits` traces before training. The cap is on what the allocator reserves,
    which holds more: so it is set at what was reserved on entry (the model, cached blocks, cuBLAS's workspace,
    taken first by `_take_workspaces`) + B + one partly used segment of each pool (2 MiB + 20 MiB), and only when B
    is at least CUDA_CAP_MINIMUM (20 MiB, the large pool's segment): below that a cap would measure the allocator's
    granularity, not the simulated card, and refuse steps that check_fits found within B. The CUDA context is
    outside the allocator and never counted: a real card of N bytes offers N minus the context. cuDNN's workspaces
    inside the step are not in the trace either; the segment allowance absorbs small ones. A memory fraction the
    caller set (torch.cuda.set_per_process_memory_fraction) stays if it is tighter, and is in force again after.
    (Not run on a GPU yet: benchmarks/gpu_check.py checks these rules where there is one.)
    Where it does nothing it is a plain nullcontext (no generator, whose exit would set an error's __traceback__:
    a frozen dataclass exception would be replaced by the FrozenInstanceError of that).
    """
    if device.type != "cuda" or memory_budget is None or memory_budget < CUDA_CAP_MINIMUM:
        return contextlib.nullcontext()
    return _capped(device, memory_budget)


@contextlib.contextmanager
def _capped(device: torch.device, memory_budget: int):
    """`cuda_budget` where it caps the allocator."""
    _take_workspaces(device)
    torch.cuda.synchronize(device)
    cap = torch.cuda.memory_reserved(device) + memory_budget + CUDA_SMALL_SEGMENT + CUDA_LARGE_SEGMENT
    total = torch.cuda.get_device_properties(device).total_memory
    callers = torch.cuda.get_per_process_memory_fraction(device)  # 1.0 unless the caller capped it: put back after
    torch.cuda.set_per_process_memory_fraction(min(cap / total, callers), device)  # never looser than the caller's
    try:
        yield
    except OutOfMemory:
        raise
    except torch.OutOfMemoryError as error:
        raise OutOfMemory(torch.cuda.max_memory_allocated(device), memory_budget) from error
    finally:
        torch.cuda.set_per_process_memory_fraction(callers, device)


def _take_workspaces(device: torch.device) -> None:
    """Make cuBLAS take its workspace for the current stream now (a 1 x 1 matrix product), so that it counts as
    reserved before the cap, as a real card holds it whatever the batch."""
    one = torch.ones(1, 1, device=device)
    one @ one
