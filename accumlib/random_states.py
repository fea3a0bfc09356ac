"""Every random state a run draws from (torch's on the CPU and on each CUDA device, NumPy's, Python's): taken,
made plain for a checkpoint (tensors and numbers, which torch.load(weights_only=True) reads), and put back."""

from __future__ import annotations

import contextlib
import random
import sys

import torch


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
