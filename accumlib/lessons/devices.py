"""The one device a lesson runs on, chosen once in its first code cell: `device = devices.choose()` (`from accumlib.lessons import devices`); every
tensor, model and measurement of the lesson then uses `device`.

The choice is `accumlib.devices.pick()`, the one `accumlib.train(device=None)` makes: the `ACCUMLIB_DEVICE`
environment variable where it is set ("cpu", "cuda", "cuda:1", "mps"), else the first CUDA GPU where there is one,
else the CPU. Apple's GPU (MPS) is used only when asked for (ACCUMLIB_DEVICE=mps).
`make test` and `make notebooks` set ACCUMLIB_DEVICE=cpu (and hide CUDA GPUs): the stored outputs are the CPU's.
The printed line names only the device chosen, so a lesson's stored output is the same on every machine that runs
it on the CPU.
"""
from __future__ import annotations

import os
from typing import Mapping

import torch

from ..devices import VARIABLE, pick, supports_bf16  # the library's: accumlib.train(device=None) makes this choice
from ..i18n import _

__all__ = ["VARIABLE", "pick", "supports_bf16", "describe", "choose"]


def describe(device: torch.device) -> str:
    """One sentence naming the device (and the GPU's model on CUDA)."""
    if device.type == "cuda":
        return _("This lesson runs on the GPU: {name} ({device}).").format(
            name=torch.cuda.get_device_name(device), device=device)
    if device.type == "mps":
        return _("This lesson runs on Apple's GPU (mps).")
    return _("This lesson runs on the CPU.")


def choose(environ: Mapping[str, str] = os.environ) -> torch.device:
    """Pick the lesson's device (`pick`), print which it is, and return it."""
    device = pick(environ)
    print(describe(device))
    return device
