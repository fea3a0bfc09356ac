"""Which device to run on, chosen the same way everywhere: `accumlib.train(device=None)`, the lessons
(`accumlib.lessons.devices.choose()`) and their checkers, dashboards and experiments.

The choice (`pick`): the `ACCUMLIB_DEVICE` environment variable where it is set ("cpu", "cuda", "cuda:1", "mps"),
else the first CUDA GPU where there is one, else the CPU. Apple's GPU (MPS) is used only when asked for
(ACCUMLIB_DEVICE=mps): accumlib measures memory with the CUDA allocator or on the CPU, not on MPS. A choice this
machine cannot honour is refused with a message naming it, never replaced by another device.
"""

from __future__ import annotations

import os
from typing import Mapping

import torch

from .i18n import _

VARIABLE = "ACCUMLIB_DEVICE"


def pick(environ: Mapping[str, str] = os.environ) -> torch.device:
    """The device: environ[VARIABLE] if set (refused with a message if this machine lacks it), else CUDA if
    available, else the CPU."""
    asked = environ.get(VARIABLE, "").strip()
    if not asked:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(asked)
    except (RuntimeError, ValueError):
        raise ValueError(
            _("{variable}={value!r} is not a device; valid: cpu, cuda, cuda:N, mps").format(
                variable=VARIABLE, value=asked
            )
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            _(
                "{variable}={value!r} but this machine has no CUDA GPU that torch can use; unset it or "
                "set {variable}=cpu"
            ).format(variable=VARIABLE, value=asked)
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            _("{variable}={value!r} but this machine has {count} CUDA GPU(s), numbered from 0").format(
                variable=VARIABLE, value=asked, count=torch.cuda.device_count()
            )
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            _(
                "{variable}={value!r} but Apple's GPU (MPS) is not available here; unset it or set {variable}=cpu"
            ).format(variable=VARIABLE, value=asked)
        )
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(
            _("{variable}={value!r}: accumlib runs on cpu, cuda or mps").format(variable=VARIABLE, value=asked)
        )
    return device


def supports_bf16(device: torch.device) -> bool:
    """Whether `device` runs bfloat16 natively: on CUDA where the GPU has bf16 kernels (compute capability 8.0 on,
    Ampere and later: `torch.cuda.is_bf16_supported(including_emulation=False)`; a T4 only emulates it, slowly),
    always on the CPU; not on MPS (accumlib does not offer it there). fp16 with a GradScaler works on CPU and CUDA."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu"
