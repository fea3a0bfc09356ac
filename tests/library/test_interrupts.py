"""accumlib.interrupts: a SIGINT (Ctrl-C) that arrives while a step is made waits for the step's end; between the
steps of a run it is delivered at once; the handler found is put back.

Whole runs (issue 23, case 3): whatever interrupts train, every optimizer step applied to the weights has its record
and no record exists for a step not applied; no step is torn. Real SIGINTs (os.kill of this process, Python's own
handler raising KeyboardInterrupt) are delivered at chosen points (a micro-batch's loss, inside the optimizer's step
through its pre- and post-hooks, inside the scheduler's step, on_step) and, from a thread, at times spread over a
whole run; exceptions are raised in the scheduler, on_step, a Dataset and loss_fn. After each run the weights must
equal those of an uninterrupted run after exactly as many steps as there are records, and Adam's step count of every
parameter must equal that number (a torn step advances one without the other). The float64 CPU runs are
deterministic, so "equal" is torch.equal. The tests print how many interrupts were delivered and how many records
were checked (pytest -s shows it).
"""

import os
import signal
import threading
import time

import pytest
import torch

import accumlib
from accumlib.interrupts import STEP
from builders import data, models


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
    later steps of the process held Ctrl-C for no run: the whole-run tests below failed at random under xdist)."""
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


# --- whole runs: every applied step recorded, none torn ---------------------------------------------------------

X, Y = data.digits(48, flat=True, dtype=torch.float64)  # micro-batch 4 x accum_steps 2: 6 optimizer steps
STEPS = 6


def build(scheduler_class=torch.optim.lr_scheduler.LambdaLR):
    model = models.mlp().double()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = scheduler_class(optimizer, lambda step: 0.9**step)
    return model, optimizer, scheduler


def reference() -> list[list[torch.Tensor]]:
    """The weights of an uninterrupted run after 0, 1, ..., STEPS steps."""
    model, optimizer, scheduler = build()
    weights = [[p.detach().clone() for p in model.parameters()]]
    accumlib.train(
        model,
        (X, Y),
        optimizer,
        micro_batch_size=4,
        accum_steps=2,
        scheduler=scheduler,
        shuffle=False,
        on_step=lambda record: weights.append([p.detach().clone() for p in model.parameters()]),
    )
    assert len(weights) == STEPS + 1
    return weights


REFERENCE = reference()


def interrupt() -> None:
    """A real SIGINT to this process: Python's handler raises KeyboardInterrupt at the next bytecode."""
    os.kill(os.getpid(), signal.SIGINT)


def check(model, optimizer, records) -> int:
    """The model is the uninterrupted run's after len(records) steps, and Adam counted exactly that many."""
    applied = len(records)
    assert [r.step for r in records] == list(range(1, applied + 1))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), REFERENCE[applied], strict=True)), applied
    counts = {float(state["step"]) for state in optimizer.state.values()} or {0.0}
    assert counts == {float(applied)}, (counts, applied)  # a torn step: the count advanced, the weights not
    return applied


def run(**hooks):
    """train with the run's hooks; returns (model, optimizer, history or the exception's, whether it stopped)."""
    scheduler_class = hooks.pop("scheduler_class", torch.optim.lr_scheduler.LambdaLR)
    model, optimizer, scheduler = build(scheduler_class)
    if "pre" in hooks:
        optimizer.register_step_pre_hook(hooks.pop("pre"))
    if "post" in hooks:
        optimizer.register_step_post_hook(hooks.pop("post"))
    data_ = hooks.pop("data", (X, Y))
    try:
        history = accumlib.train(
            model, data_, optimizer, micro_batch_size=4, accum_steps=2, scheduler=scheduler, shuffle=False, **hooks
        )
    except Exception as error:  # train attaches the records so far
        return model, optimizer, error.history, error
    return model, optimizer, history, None


def at_step(step: int, action):
    """A hook that runs action() during the given optimizer step (1-based), counting the optimizer's steps."""
    calls = []

    def hook(*args):
        calls.append(None)
        if len(calls) == step:
            action()

    return hook


def test_a_sigint_at_every_chosen_point_leaves_every_applied_step_recorded_and_none_torn(capsys):
    delivered = checked = 0
    for step in range(1, STEPS + 1):
        points = {
            "inside optimizer.step (pre-hook)": dict(pre=at_step(step, interrupt)),
            "inside optimizer.step (post-hook)": dict(post=at_step(step, interrupt)),
            "on_step": dict(on_step=lambda record, s=step: interrupt() if record.step == s else None),
        }
        calls = []

        def loss_at(first_micro_batch_of_step, calls=calls):
            def loss_fn(output, target):
                calls.append(None)
                if len(calls) == first_micro_batch_of_step:
                    interrupt()
                return torch.nn.functional.cross_entropy(output, target)

            return loss_fn

        points["a micro-batch's loss_fn (first)"] = dict(loss_fn=loss_at(2 * step - 1))
        points["a micro-batch's loss_fn (last)"] = dict(loss_fn=loss_at(2 * step, calls=[]))

        at = step  # (a class body cannot read `step`: it defines a method of that name)

        class Interrupting(torch.optim.lr_scheduler.LambdaLR):
            def step(self, *args, s=at, **kwargs):
                super().step(*args, **kwargs)
                if self.last_epoch == s:  # inside scheduler.step, after it changed the learning rate
                    interrupt()

        points["inside scheduler.step"] = dict(scheduler_class=Interrupting)
        for where, hooks in points.items():
            model, optimizer, history, error = run(**hooks)
            assert error is None and history.stopped == "KeyboardInterrupt", where
            delivered += 1
            applied = check(model, optimizer, history.records)
            checked += applied
            # a SIGINT inside the step (or after it) stops after that step; one in a micro-batch stops before it
            assert applied == (step - 1 if "loss_fn" in where else step), (where, step, applied)
    with capsys.disabled():
        print(f"\nSIGINT at chosen points: {delivered} interrupts delivered, {checked} records checked")
    assert delivered == 6 * STEPS


def test_sigints_from_a_thread_at_times_spread_over_a_run(capsys):
    """A thread sends SIGINT at one of 40 moments spread over a run: after its k-th optimizer step (k = 0 to 4; 0: as
    train starts) and a fraction of a step later (0 to 7/8 of an uninterrupted run's mean step time). One that
    arrives while train checks its arguments (nothing changed yet) or after it returned raises KeyboardInterrupt
    outside it: counted apart, the run's records checked all the same. The moments follow the run's own steps, not
    the clock alone, so a slower or busier machine moves none of them past the run (they once did, with wall-clock
    times measured on a first run: 3 of 40 delivered under load)."""
    started = time.perf_counter()
    run()
    step_time = (time.perf_counter() - started) / STEPS
    delivered = checked = late = 0  # a run whose signal came after train returned still has its records checked
    for i in range(40):
        after, offset = i % (STEPS - 1), step_time * (i // (STEPS - 1)) / 8
        model, optimizer, scheduler = build()
        holder, stepped = [], threading.Event()

        def on_step(record, holder=holder, stepped=stepped, after=after):
            holder.append(record)
            if len(holder) == after:
                stepped.set()

        def send(stepped=stepped, offset=offset):
            stepped.wait(timeout=120)
            time.sleep(offset)
            interrupt()

        if after == 0:
            stepped.set()
        thread = threading.Thread(target=send)
        try:
            thread.start()
            holder.append(
                accumlib.train(
                    model,
                    (X, Y),
                    optimizer,
                    micro_batch_size=4,
                    accum_steps=2,
                    scheduler=scheduler,
                    shuffle=False,
                    on_step=on_step,
                )
            )
            thread.join()
            time.sleep(0.01)  # a signal sent just now is handled here, not in the next run
        except KeyboardInterrupt:
            late += 1  # during train's checks, before anything changed, or after train returned
            thread.join()
        records = [r for r in holder if isinstance(r, accumlib.StepRecord)]  # what on_step saw
        if holder and isinstance(holder[-1], accumlib.History):  # train returned: its records (on_step may miss one)
            history = holder[-1]
            assert history.records[: len(records)] == records and len(history.records) - len(records) <= 1
            records = history.records
            delivered += history.stopped == "KeyboardInterrupt"
        checked += check(model, optimizer, records)
    with capsys.disabled():
        print(
            f"\nSIGINT from a thread: {delivered} interrupts delivered during training, {late} outside it, "
            f"{checked} records checked"
        )
    assert delivered >= 20  # every moment after a step but the last falls inside the run: 32 of the 40


class Failing(Exception):
    pass


def fail():
    raise Failing("raised on purpose")


def keyboard_interrupt():
    raise KeyboardInterrupt


@pytest.mark.parametrize("raise_", [fail, keyboard_interrupt], ids=["an exception", "KeyboardInterrupt"])
def test_an_error_inside_scheduler_step_keeps_the_record_of_the_step_just_applied(raise_):
    for at in (1, 3):

        class Raising(torch.optim.lr_scheduler.LambdaLR):
            def step(self, *args, s=at, **kwargs):
                super().step(*args, **kwargs)
                if self.last_epoch == s:
                    raise_()

        model, optimizer, history, error = run(scheduler_class=Raising)
        assert check(model, optimizer, history.records) == at
        if raise_ is fail:
            assert isinstance(error, Failing) and error.cycle_result.skipped is False
        else:
            assert error is None and history.stopped == "KeyboardInterrupt"


def test_errors_in_on_step_a_dataset_and_loss_fn_leave_records_equal_to_steps_applied():
    model, optimizer, history, error = run(on_step=lambda record: fail() if record.step == 2 else None)
    assert isinstance(error, Failing) and check(model, optimizer, history.records) == 2

    class Broken(torch.utils.data.Dataset):
        def __len__(self):
            return len(X)

        def __getitem__(self, i):
            if i == 21:  # in step 3's second micro-batch (samples 20-23)
                fail()
            return X[i], Y[i]

    model, optimizer, history, error = run(data=Broken())
    assert isinstance(error, Failing) and check(model, optimizer, history.records) == 2

    calls = []

    def loss_fn(output, target):
        calls.append(None)
        if len(calls) == 8:  # step 4's second micro-batch
            fail()
        return torch.nn.functional.cross_entropy(output, target)

    model, optimizer, history, error = run(loss_fn=loss_fn)
    assert isinstance(error, Failing) and check(model, optimizer, history.records) == 3


def test_a_sigint_inside_a_direct_accumulate_and_step_arrives_after_the_whole_step():
    """Outside train, the step is still one unit: the KeyboardInterrupt comes once the step (and the scheduler's)
    is complete, never between Adam's step count and its weights."""
    model, optimizer, scheduler = build()
    optimizer.register_step_pre_hook(lambda *args: interrupt())
    with pytest.raises(KeyboardInterrupt):
        accumlib.accumulate_and_step(
            model, list(zip(X[:8].split(4), Y[:8].split(4), strict=True)), optimizer, [0.5, 0.5], scheduler=scheduler
        )
    assert check(model, optimizer, [accumlib.StepRecord(1, 0, 8, 2, 8, 0.0, 0.0, None, 1.0, None)]) == 1
    assert scheduler.last_epoch == 1  # the scheduler stepped too: the unit was not cut
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler given back


def test_a_handler_that_on_step_installs_holds_and_is_left_installed():
    """train installs its holding handler once for the run; a SIGINT handler that the learner's code installs
    during the run is displaced again at the next step (a SIGINT inside that step waits for the step and then
    reaches it) and is the one left installed after the run; the handler found before the run comes back after a
    run that nobody changed."""
    received, optimizers = [], []

    def handler(signum, frame):  # Adam's step count when the SIGINT reaches it
        received.append({float(state["step"]) for state in optimizers[0].state.values()})

    def on_step(record):
        if record.step == 2:
            signal.signal(signal.SIGINT, handler)

    def pre(optimizer, *args):
        optimizers[:] = [optimizer]
        at_four(optimizer, *args)

    at_four = at_step(4, interrupt)
    model, optimizer, history, error = run(on_step=on_step, pre=pre)
    try:
        assert error is None and history.stopped is None
        assert received == [{4.0}]  # after step 4, not inside it (3.0) where the SIGINT was sent
        assert check(model, optimizer, history.records) == STEPS
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    run()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
