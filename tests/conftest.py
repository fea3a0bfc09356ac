"""Shared by the three suites (library, lessons, course): tests/hindi.py, the glossary's checks, imports as `hindi`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


import signal  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _sigint_given_back():
    """Every test leaves Ctrl-C as it found it: the SIGINT handler, and accumlib's step guard at rest (no run, no
    unit open on this thread). A test (or the library code it runs) that leaves the guard's handler installed made
    later tests of the same process fail at random (test_interrupts.py's whole runs, under xdist)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    from accumlib.interrupts import STEP

    after, state = signal.getsignal(signal.SIGINT), (STEP.runs, STEP.depth, STEP.held)
    if after is not before or state != (0, 0, False):
        signal.signal(signal.SIGINT, before)
        STEP.runs = STEP.depth = 0
        STEP.held = False
        pytest.fail(
            f"SIGINT left as {after!r} (before: {before!r}); accumlib's step guard (runs, depth, held): {state}"
        )
