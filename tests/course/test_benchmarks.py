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
    assert len(extras) == 6 and all(math.isfinite(us) for us in extras.values())
    assert any(name.startswith("zeroing") for name in extras)  # the saving over torch's zero_grad, counted


@pytest.mark.parametrize("model_name", ["CNN", "MLP"])
def test_section_1_pairs_each_accumlib_step_with_hand_written_steps_beside_it(bench, model_name):
    pairs = bench.adjacent_steps(torch.device("cpu"), 16, 1, False, model_name)
    steps = 1792 // 64 - 1  # every step but the first, which has no step before it
    assert {name: len(values) for name, values in pairs.items()} == dict.fromkeys(
        ["accumlib", "hand-written again", "hand-written seconds", "accumlib seconds over hand-written"], steps
    )
    assert all(ratio > 0 for ratio in pairs["accumlib"])
