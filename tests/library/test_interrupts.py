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


def _sigint_at(code, line: int):
    """A trace function that sends this process a SIGINT when `code` reaches `line` (once): the signal's handler
    then runs between that line's bytecodes, as a Ctrl-C that lands there would."""
    import os
    import sys

    sent = []

    def trace(frame, event, arg):
        if frame.f_code is code and event == "line" and frame.f_lineno == line and not sent:
            sent.append(line)
            os.kill(os.getpid(), signal.SIGINT)
        return trace

    sys.settrace(trace)
    return sent


@pytest.mark.parametrize("where", ["if not step.runs:", "step.uninstall()"])
def test_a_sigint_while_a_run_gives_the_handler_back_is_delivered_after_it(where):
    """A Ctrl-C that lands inside the run's own exit, between the count going to 0 and the handler given back, is
    raised once the handler is back (before: KeyboardInterrupt raised there left the holding handler installed, and
    later steps of the process held Ctrl-C for no run: test_sigint failed at random under xdist)."""
    import inspect
    import sys

    from accumlib.interrupts import _Running

    lines, first = inspect.getsourcelines(_Running.__exit__)
    line = first + next(i for i, text in enumerate(lines) if text.strip() == where)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    try:
        with pytest.raises(KeyboardInterrupt):
            with STEP.run():
                sent = _sigint_at(_Running.__exit__.__code__, line)
    finally:
        sys.settrace(None)
    assert sent == [line]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back, then the Ctrl-C raised
    assert (STEP.runs, STEP.pending) == (0, None)
