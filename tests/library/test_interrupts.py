"""accumlib.interrupts: a SIGINT (Ctrl-C) that arrives while a step is made waits for the step's end; between the
steps of a run it is delivered at once; the handler found is put back. (Whole runs: test_sigint.py.)"""

import signal

import pytest

from accumlib.interrupts import STEP


def test_a_sigint_inside_a_step_waits_for_its_end_and_the_handler_is_put_back():
    found = signal.getsignal(signal.SIGINT)
    events = []
    with pytest.raises(KeyboardInterrupt):
        with STEP.unit():
            signal.raise_signal(signal.SIGINT)
            events.append("the step goes on")
    assert events == ["the step goes on"] and signal.getsignal(signal.SIGINT) is found


def test_inside_a_run_the_handler_stays_installed_and_a_sigint_between_steps_arrives_at_once():
    found = signal.getsignal(signal.SIGINT)
    events = []
    with STEP.run():
        installed = signal.getsignal(signal.SIGINT)
        with STEP.unit():
            events.append("a step")
        assert signal.getsignal(signal.SIGINT) is installed is not found  # not swapped per step
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            events.append("not reached: delivered at once")
    assert events == ["a step"] and signal.getsignal(signal.SIGINT) is found


def test_an_error_after_the_step_carries_its_result():
    with pytest.raises(ValueError) as info, STEP.unit() as step:
        step.result = "the step's result"  # the optimizer has stepped
        raise ValueError("the scheduler failed")
    assert info.value.cycle_result == "the step's result"
