"""benchmarks/run.py: each section's measurement runs against the library as it is now (the benchmark reaches into
accumlib's rooms to time its pieces one by one, so a change there must not leave it broken until the next
`make bench`). What is asserted is that each piece runs and what it reports, never how fast."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_pieces_of_a_step_are_timed_with_the_library_s_own_code(bench):
    extras = bench.accumlib_extras_microseconds(torch.device("cpu"), repeats=2)
    assert len(extras) == 9 and all(math.isfinite(us) for us in extras.values())
    assert any(name.startswith("zeroing") for name in extras)  # the saving over torch's zero_grad, counted
    assert sum("cycle._read" in name for name in extras) == 2  # the read with the default check, and without


@pytest.mark.parametrize("model_name", ["CNN", "MLP"])
def test_section_1_pairs_each_accumlib_step_with_hand_written_steps_beside_it(bench, model_name):
    pairs = bench.adjacent_steps(torch.device("cpu"), 16, 1, False, model_name)
    steps = 1792 // 64 - 1  # every step but the first, which has no step before it
    assert {name: len(values) for name, values in pairs.items()} == dict.fromkeys(
        ["accumlib", "hand-written again", "hand-written seconds", "accumlib seconds over hand-written"], steps
    )
    checked = bench.adjacent_steps(torch.device("cpu"), 16, 1, False, model_name, ("hand-written", bench.CHECKED))
    assert {name: len(values) for name, values in checked.items()} == dict.fromkeys(
        [
            "accumlib",
            bench.CHECKED,
            "hand-written seconds",
            "accumlib seconds over hand-written",
            f"{bench.CHECKED} seconds over hand-written",
        ],
        steps,
    )
    assert all(ratio > 0 for ratio in pairs["accumlib"])


def test_the_checked_hand_written_step_steps_on_finite_gradients_and_skips_a_nan(bench):
    """Section 1's 'hand-written, checked' column is the six-line recipe with accumlib's finite check: it steps when
    the loss and the gradients are finite and leaves the weights as they were when one is NaN, zeroing either way."""
    X = torch.randn(8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.tensor([0, 1] * 4)
    for poisoned in (False, True):
        model = torch.nn.Linear(3, 2, dtype=torch.float64)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        before = [p.detach().clone() for p in model.parameters()]
        data = X.clone()
        if poisoned:
            data[5, 1] = math.nan  # the second micro-batch's loss and gradients are NaN
        bench.checked_step(model, optimizer, data, y, torch.arange(8), m=4, k=2)
        unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
        assert unchanged == poisoned
        assert all(p.grad is None for p in model.parameters())
