"""Ctrl-C (SIGINT) held while a step is made: `STEP`, one per thread, makes the optimizer step, the scaler's
and scheduler's steps and (in `train`) the step's record one unit that a SIGINT waits for, so a step is never torn
and never left without its record. `train` installs its handler once per run (`STEP.run()`)."""

from __future__ import annotations

import _signal
import signal
import threading

_SIGINT = signal.SIGINT  # a module constant: no enum lookup at every step


class _Unit:
    """One step's block of `_Step` (see there): SIGINT held from __enter__; an error after `result` is set (the
    optimizer has stepped) carries it as `cycle_result`, and inside `until_recorded` waits for the record."""

    __slots__ = ("step", "result")

    def __init__(self, step: _Step):
        self.step, self.result = step, None

    def __enter__(self) -> _Unit:
        step = self.step
        step.install()  # unless a run installed it (and nobody replaced it since): until the unit is released
        step.held = True
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        step, swallowed = self.step, False
        if error is not None and self.result is not None:  # the step was applied: whoever catches this records it
            error.cycle_result = self.result
            if step.depth:
                step.error, swallowed = error, True  # raised once the step's record is made
        if not step.depth:
            step.release()
        return swallowed


class _Recorded:
    """`_Step.until_recorded`'s block: on leaving it the held SIGINT, or an error after the step, is raised."""

    __slots__ = ("step",)

    def __init__(self, step: _Step):
        self.step = step

    def __enter__(self) -> None:
        self.step.depth += 1

    def __exit__(self, kind, error, traceback) -> None:
        step = self.step
        step.depth -= 1
        waiting, step.error = step.error, None
        if not step.depth:
            step.release()
        if waiting is not None:
            raise waiting


class _Running:
    """`_Step.run`'s block: the holding handler installed once for all the block's steps (main thread only)."""

    __slots__ = ("step",)

    def __init__(self, step: _Step):
        self.step = step

    def __enter__(self) -> None:
        step = self.step
        step.install()
        step.runs += 1

    def __exit__(self, kind, error, traceback) -> None:
        step = self.step
        step.runs -= 1
        if not step.runs:
            previous = step.previous
            step.uninstall()
            if not step.held and step.pending is not None:  # a SIGINT that came while this block gave it back
                pending, step.pending = step.pending, None
                _deliver(previous, *pending)


_MAIN_THREAD = threading.main_thread().ident  # only the main thread receives signals


class _Step(threading.local):
    """The optimizer step, the scaler's and scheduler's steps and (in `train`) the step's record, as one unit.

    A SIGINT (Ctrl-C) that arrives inside waits and is delivered once the unit closes, so a step is never torn and
    never left without its record (main thread only: only it receives signals). An error raised inside after the
    optimizer step (a scheduler's) carries the step's result as `cycle_result`; inside `until_recorded` it is
    raised after the record too. One per thread: a dashboard's training thread has its own.

    The holding handler (`handler`) is installed by the first unit and given back when the unit closes; inside a
    `run()` block (train's whole run) it stays installed between the steps, where a SIGINT is passed straight on to
    the handler it displaced, so that a step costs no handler swaps.
    """

    def __init__(self):
        self.depth = 0  # open `until_recorded` blocks of this thread
        self.runs = 0  # open `run` blocks of this thread
        self.held = False  # inside a unit: a SIGINT waits for its end
        self.previous = None  # the SIGINT handler that `handler` displaced, while it is installed
        self.pending = None  # (signal number, frame) of a SIGINT that arrived meanwhile
        self.error = None  # an error raised after the optimizer step, waiting for the step's record
        self.handler = self.hold  # the one bound method installed (its identity tells whether it still is)
        self.recorded = _Recorded(self)  # `until_recorded`'s block, reused: its state is `depth`
        self.main = (
            threading.get_ident() == _MAIN_THREAD
        )  # only the main thread receives signals (__init__ runs per thread)

    def unit(self) -> _Unit:
        """The step's block: a context manager whose `result` the block sets once the optimizer has stepped."""
        return _Unit(self)

    def until_recorded(self) -> _Recorded:
        """`train`: the unit lasts until this block (the cycle and its record) ends."""
        return self.recorded

    def run(self) -> _Running:
        """`train`: the holding handler stays installed for the whole block, between its units too."""
        return _Running(self)

    def install(self) -> None:
        """The holding handler in place of the current one, unless it is already installed (main thread only)."""
        if not self.main:
            return
        previous = _signal.getsignal(_SIGINT)  # the C function: no enum conversion
        if previous is self.handler:
            return
        if previous is not None:  # None: a handler installed outside Python; left alone
            _signal.signal(_SIGINT, self.handler)
            self.previous = previous

    def uninstall(self) -> None:
        previous = self.previous  # kept until the handler is given back: a SIGINT meanwhile still reaches it
        if previous is not None and _signal.getsignal(_SIGINT) is self.handler:  # not replaced meanwhile
            _signal.signal(_SIGINT, previous)
        self.previous = None

    def hold(self, signum, frame) -> None:
        # inside a unit, or inside this module's own bookkeeping (a KeyboardInterrupt raised there would leave the
        # handler installed or the counts wrong): it waits, and the block that is ending delivers it
        if self.held or _in_bookkeeping(frame):
            self.pending = (signum, frame)
        else:  # between the steps of a run: at once, as the displaced handler would
            _deliver(self.previous, signum, frame)

    def release(self) -> None:
        self.held = False
        previous = self.previous
        if not self.runs:
            self.uninstall()
        pending, self.pending = self.pending, None
        if pending is not None:
            _deliver(previous, *pending)


def _in_bookkeeping(frame) -> bool:
    """Whether a signal that landed in `frame` came while this module counts or swaps handlers (one of its frames on
    the stack; the handler it delivers to, under `_deliver`, is not this module's)."""
    while frame is not None:
        if frame.f_code is _deliver.__code__:
            return False
        if frame.f_code.co_filename == __file__:
            return True
        frame = frame.f_back
    return False


def _deliver(handler, signum, frame) -> None:
    """What `handler` (a SIGINT handler as signal.getsignal gives it) does with a SIGINT."""
    if callable(handler):
        handler(signum, frame)  # Python's default handler raises KeyboardInterrupt here, after the unit
    elif handler == signal.SIG_DFL:
        raise KeyboardInterrupt


STEP = _Step()
