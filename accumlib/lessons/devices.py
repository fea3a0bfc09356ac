"""The one device a lesson runs on, chosen once in its first code cell: `device = devices.choose()` (`from accumlib.lessons import devices`); every
tensor, model and measurement of the lesson then uses `device`.

The choice: the `ACCUMLIB_DEVICE` environment variable where it is set ("cpu", "cuda", "cuda:1", "mps"), else the
first CUDA GPU where there is one, else the CPU. Apple's GPU (MPS) is used only when asked for
(ACCUMLIB_DEVICE=mps): accumlib measures memory with the CUDA allocator or on the CPU, not on MPS.
`make test` and `make notebooks` set ACCUMLIB_DEVICE=cpu (and hide CUDA GPUs): the stored outputs are the CPU's.
The printed line names only the device chosen, so a lesson's stored output is the same on every machine that runs
it on the CPU.
"""
from __future__ import annotations

import os
from typing import Mapping

import torch

from ..i18n import _

VARIABLE = "ACCUMLIB_DEVICE"


def pick(environ: Mapping[str, str] = os.environ) -> torch.device:
    """The device, without printing: environ[VARIABLE] if set (refused with a message if this machine lacks it),
    else CUDA if available, else the CPU."""
    asked = environ.get(VARIABLE, "").strip()
    if not asked:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(asked)
    except (RuntimeError, ValueError):
        raise ValueError(f"{VARIABLE}={asked!r} is not a device; valid: cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{VARIABLE}={asked!r} but this machine has no CUDA GPU that torch can use; unset it or "
                         f"set {VARIABLE}=cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{VARIABLE}={asked!r} but this machine has {torch.cuda.device_count()} CUDA GPU(s), "
                         f"numbered from 0")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{VARIABLE}={asked!r} but Apple's GPU (MPS) is not available here; unset it or set "
                         f"{VARIABLE}=cpu")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{VARIABLE}={asked!r}: the lessons run on cpu, cuda or mps")
    return device


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
