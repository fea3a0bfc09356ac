"""The one device a lesson runs on, chosen once in its first code cell: `device = devices.choose()`
(`from accumlib.lessons import devices`); every tensor, model and measurement of the lesson then uses `device`.

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
from ..i18n import N_, _

__all__ = ["VARIABLE", "pick", "supports_bf16", "describe", "choose"]


# The printed line, for each kind of page: a lesson, or the dashboards page (GPU, Apple's GPU, CPU).
_SENTENCES = {
    "lesson": (
        N_("This lesson runs on the GPU: {name} ({device})."),
        N_("This lesson runs on Apple's GPU (mps)."),
        N_("This lesson runs on the CPU."),
    ),
    "dashboards": (
        N_("These dashboards run on the GPU: {name} ({device})."),
        N_("These dashboards run on Apple's GPU (mps)."),
        N_("These dashboards run on the CPU."),
    ),
}


def _sentences(page: str) -> tuple[str, str, str]:
    if page not in _SENTENCES:
        raise ValueError(
            _("page={value!r}: valid: {valid}").format(value=page, valid=", ".join(repr(k) for k in _SENTENCES))
        )
    return _SENTENCES[page]


def describe(device: torch.device, page: str = "lesson") -> str:
    """One sentence naming the device (and the GPU's model on CUDA), for a lesson or (page="dashboards") the
    dashboards page."""
    gpu, mps, cpu = _sentences(page)
    if device.type == "cuda":
        return _(gpu).format(name=torch.cuda.get_device_name(device), device=device)
    if device.type == "mps":
        return _(mps)
    return _(cpu)


def choose(environ: Mapping[str, str] = os.environ, *, page: str = "lesson") -> torch.device:
    """Pick the device (`pick`), print which it is (for a lesson, or page="dashboards" for the dashboards page),
    and return it."""
    _sentences(page)  # a wrong page is refused before anything is chosen or printed
    device = pick(environ)
    print(describe(device, page))
    return device
