"""Issue 28: an exercise check cannot be hung or killed by the learner's code (exercises/contained.py). Each attack
gets a verdict in words, and this process (the kernel) goes on with its state untouched."""

import os
import re
import signal
import textwrap
import time

import pytest
import torch

from accumlib.lessons import exercises
from accumlib.lessons.exercises import contained

pytestmark = pytest.mark.skipif(not contained.FORKS, reason="checks are contained in a child process only with fork")

LIMIT = 0.5  # seconds of the learner's code per check (the tests assert verdicts, never durations)
LOOP_ARGS = "model, optimizer, loader, loss_fn, accum_steps"


@pytest.fixture(autouse=True)
def short_limits(monkeypatch):
    for group in exercises.BY_LESSON.values():
        for exercise in group:
            monkeypatch.setattr(exercise, "time_limit", LIMIT)
    monkeypatch.setattr(contained, "_fork_works", True)


def function(code: str, name: str = "accumulate"):
    names = {"torch": torch}
    exec(textwrap.dedent(code), names)  # noqa: S102 - a learner's cell
    return names[name]


class NeverShown(int):
    """A returned number whose repr() never comes."""

    def __repr__(self):
        while True:
            pass


SWALLOWED = f"""
import time
def accumulate({LOOP_ARGS}):
    while True:
        try:
            time.sleep(0.01)
        except:  # a beginner's bare except: it catches the check's time-out too
            pass
"""
ALARM_IGNORED = f"""
import signal
def accumulate({LOOP_ARGS}):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass
"""
IN_C = f"""
import itertools
def accumulate({LOOP_ARGS}):
    sum(itertools.repeat(1))  # never returns to Python: no signal handler runs
"""
HARD_EXIT = f"""
import os
import re
def accumulate({LOOP_ARGS}):
    os._exit(3)
"""
SOFT_EXIT = f"""
import sys
def accumulate({LOOP_ARGS}):
    sys.exit()
"""


@pytest.mark.parametrize(
    "check, name, words",
    [
        (lambda: exercises.the_loop.verdict(function(SWALLOWED)), "time-limit-ignored", "bare except:"),
        (lambda: exercises.the_loop.verdict(function(ALARM_IGNORED)), "time-limit-ignored", "signal.SIGALRM"),
        (lambda: exercises.the_loop.verdict(function(IN_C)), "time-limit-ignored", "C code"),
        (lambda: exercises.largest_batch.verdict(lambda fits: NeverShown(0)), "time-limit", "0.5 seconds"),
        (lambda: exercises.memory_plan.verdict(NeverShown(0), 32), "time-limit", "0.5 seconds"),
        (lambda: exercises.the_loop.verdict(function(HARD_EXIT)), "process-ended", "exit status 3"),
        (lambda: exercises.the_loop.verdict(function(SOFT_EXIT)), "exit", "sys.exit()"),
    ],
    ids=["bare-except", "sigalrm-ignored", "c-loop", "repr-never-returns", "repr-in-plan", "os._exit", "sys.exit"],
)
def test_each_attack_gets_a_verdict_in_words_and_the_kernel_lives_on(check, name, words):
    pid, handler = os.getpid(), signal.getsignal(signal.SIGALRM)
    result = check()
    assert result.names == [name] and not result.correct, result.text
    assert words in result.text and "Traceback" not in result.text
    assert os.getpid() == pid and signal.getsignal(signal.SIGALRM) is handler  # this process, untouched
    assert exercises.the_loop.verdict(function(exercises.the_loop.solution_code.split("\n\n\n")[0])).correct


CHANGES_GLOBALS = f"""
def accumulate({LOOP_ARGS}):
    torch.autograd.set_detect_anomaly(True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    torch.set_default_dtype(torch.float64)
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_global_state_a_right_answer_changes_stays_in_the_child(monkeypatch):
    monkeypatch.setattr(exercises.the_loop, "time_limit", 15.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    before = (
        torch.is_anomaly_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch.get_default_dtype(),
    )
    rng = torch.get_rng_state()
    seen = []
    right = function(CHANGES_GLOBALS.replace("    for step", "    seen.append(1)\n    for step"))
    right.__globals__["seen"] = seen
    assert exercises.the_loop.verdict(right).correct
    after = (
        torch.is_anomaly_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_num_threads(),
        torch.get_default_dtype(),
    )
    torch.set_num_threads(threads)
    assert after == before == (False, False, 2, torch.float32)
    assert torch.equal(torch.get_rng_state(), rng)
    assert seen == []  # a side effect on the kernel's objects too: the check ran in the child


def test_what_the_learners_code_prints_reaches_the_kernels_output(capsys):
    loud = function(
        f"def accumulate({LOOP_ARGS}):\n    print('step', accum_steps)\n    import sys\n"
        f"    print('oops', file=sys.stderr)\n"
    )
    assert exercises.the_loop.verdict(loud).names == ["micro-batch-count"]
    printed = capsys.readouterr()
    assert "step 3\n" in printed.out and "oops\n" in printed.err


def test_an_endless_loop_that_prints_is_cut_and_stopped(capsys, monkeypatch):
    monkeypatch.setattr(contained, "PRINTED", 1000)
    chatty = function(f"def accumulate({LOOP_ARGS}):\n    while True:\n        print('x' * 99)\n")
    assert exercises.the_loop.verdict(chatty).names == ["time-limit"]
    assert capsys.readouterr().out == ("x" * 99 + "\n") * 10


@contained.kernel_side
def where(value: int) -> tuple[int, int]:
    """A measurement the kernel makes for the child: the process it ran in, and a number."""
    return os.getpid(), value + 1


def test_a_kernel_side_measurement_runs_in_the_kernel_and_progress_is_shown(monkeypatch):
    monkeypatch.setattr(contained, "PROGRESS_EVERY", 0.0)
    shown = []

    def work():
        contained.progress(done=1)
        kernel, two = where(1)  # the child waits for the kernel's answer: the report is shown meanwhile
        return {"kind": "verdict", "child": os.getpid(), "kernel": kernel, "two": two}

    result = contained.run(work, check_limit=60, on_progress=shown.append)
    assert result["kernel"] == os.getpid() != result["child"] and result["two"] == 2
    assert shown == [{"done": 1}]


def test_a_kernel_side_error_is_raised_in_the_child_with_its_type():
    def work():
        try:
            where("one")
        except TypeError as error:
            return {"kind": "verdict", "message": str(error)}
        return {"kind": "verdict", "message": None}

    assert "str" in contained.run(work, check_limit=60)["message"]


def test_where_fork_cannot_run_torch_the_check_runs_in_this_process(monkeypatch):
    monkeypatch.setattr(contained, "_child", lambda work, link: os._exit(1))  # a child that dies before it is ready
    assert contained.run(lambda: {"kind": "verdict", "pid": os.getpid()}, check_limit=60)["pid"] == os.getpid()
    assert contained._fork_works is False  # and so do the checks after it
    monkeypatch.setattr(exercises.the_loop, "time_limit", 15.0)  # this process's first loop: lazy set-ups count
    solution = function(exercises.the_loop.solution_code.split("\n\n\n")[0])
    assert exercises.the_loop.verdict(solution).correct


def test_the_check_limit_stops_a_check_whose_learner_clock_stands():
    def measuring_forever():  # no learner's code runs (its clock stands): only the wall-clock limit ends this
        while True:
            pass

    assert contained.run(measuring_forever, check_limit=1.0) == {"kind": "overtime", "progress": None}


COUNTING_DOWN = """
def largest_batch(fits):
    batch = 1797  # every digit
    while not fits(batch):  # right, but one measurement per size: 1,728 of them
        batch -= 1
    return batch
"""


def test_a_search_counting_down_shows_its_progress_and_is_stopped_with_a_verdict(monkeypatch, capsys):
    # the review: about 2 minutes of silence, then the verdict (the check's own measurements do not count against
    # the learner's time limit, so only the whole check's limit can end it). Each measurement here takes 10 ms (a
    # stand-in peak, linear in the batch, measured in the kernel): the 1,728 sizes of the search need over 17 s.
    from accumlib.lessons.exercises import planning

    def measured(micro_batch_size, accum_steps, device):
        time.sleep(0.01)
        return 30_000 * micro_batch_size

    monkeypatch.setattr(planning, "_measured_peak", measured)
    monkeypatch.setattr(exercises.largest_batch, "check_limit", 5.0)
    monkeypatch.setattr(exercises.largest_batch, "time_limit", 15.0)
    monkeypatch.setattr(contained, "PROGRESS_EVERY", 0.0)
    exercises.largest_batch.check(function(COUNTING_DOWN, "largest_batch"))
    printed = capsys.readouterr().out.splitlines()
    # shown once the search has measured more sizes than doubling and bisection need (22), whatever the time
    assert printed[0].startswith("Still checking: your search has measured ")
    assert int(printed[0].split("measured ")[1].split()[0]) > 22
    assert printed[-1].startswith("- Your search had measured ") and "on the 2 MiB card after 5 seconds" in printed[-1]
    last = [int(n) for n in re.search(r"the last ones: (\d+), (\d+), (\d+)\)", printed[-1]).groups()]
    assert last == [last[0], last[0] - 1, last[0] - 2] and "at most 22 measurements" in printed[-1]
