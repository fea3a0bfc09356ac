"""Where a check runs the learner's code: a forked child process of the kernel, ended at a hard time limit.

`run(work, ...)` forks (Linux and macOS). The child inherits the kernel's whole state (the learner's function, its
tensors, the course language), runs `work()` (the check with its own, cooperative time limit: core.Watchdog) and
sends the verdict back to the kernel over a pipe as JSON: plain data only, never a pickle, so nothing the learner's
code puts on the pipe can run code in the kernel. The kernel (the parent) waits, and ends the child with SIGKILL
(it and every process it started: the child leads its own process group) when

- the learner's code has run `GRACE` seconds past the check's time limit: the cooperative limit was swallowed
  (a bare `except:` around a loop, `except BaseException`), or never arrived (SIGALRM ignored, a C loop that holds
  the interpreter lock). The child publishes when the learner's clock runs out (a shared page: `_Clock`), since
  only the learner's own time counts;
- the whole check has run `check_limit` seconds of wall time (the learner's code and the check's measurements it
  asked for: a search that measures every batch size one by one).

A child that ends without a verdict (`os._exit(3)`, a crash) is said in words too; `sys.exit()` is a verdict from
the child itself. Whatever a right or wrong answer changes in torch's global state (anomaly mode, deterministic
algorithms, the thread count, the random generators, the default dtype, a process group) stays in the child, which
is gone after the check. So do side effects on Python objects: a list the learner's function appends to is not
changed in the kernel. What the learner's code prints is passed on to the kernel's output as it comes (the first
`PRINTED` characters).

What the child must not do, and why it is safe: CUDA and MPS cannot be used in a forked child once the kernel
uses them, so the checks' own measurements on the lesson's device (`kernel_side` functions: memory peaks, BatchNorm
statistics, operation counts) are sent to the kernel, which runs them and sends back numbers; the learner's loops
run on the CPU (fingerprint.py). The child sets torch's thread count to 1 (OpenMP's threads do not survive fork),
and first runs a small matrix product with its backward pass: a child that cannot do that is not used (fork is
then unsafe on this machine), and this check and every later one run in the kernel's own process.

Without fork (Windows), or where it failed: the check runs in the kernel's process under the cooperative limit
alone (core.Watchdog: a time-out raised in the learner's code, a BaseException, so that `except Exception:` does not
catch it), which stops ordinary endless loops and `sys.exit()`, but not a bare `except:` that swallows the
time-out, an ignored SIGALRM (there is none on Windows: the time-out is then an asynchronous exception, which a C
call that never returns does not see) or `os._exit()`, and global state the answer changes stays changed.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import io
import json
import math
import mmap
import os
import select
import signal
import struct
import sys
import time
import warnings
from collections.abc import Callable

import torch

FORKS = hasattr(os, "fork") and sys.platform in ("linux", "darwin")  # where run() contains a check in a child
GRACE = 1.0  # seconds the learner's code may run on after the cooperative time limit before the child is ended
PRINTED = 100_000  # characters of the learner's output passed on per check; the rest is cut, and said so
READY_WAIT = 30.0  # seconds a fresh child may take to show that torch works in it
PROGRESS_EVERY = 5.0  # seconds between two progress reports shown while a check runs

_fork_works = FORKS  # False once a child could not run torch: checks then run in the kernel's process
_link: _Link | None = None  # in a check's child process: its line to the kernel
_local_progress: Callable | None = None  # in-process checks: where progress() reports go
_KERNEL_SIDE: dict[tuple[str, str], Callable] = {}  # (module, qualified name) -> a kernel_side function


class _Clock:
    """When the learner's time runs out, in time.monotonic() seconds (the same clock in parent and child on Linux
    and macOS), on a page shared by the kernel and the child; infinity while the learner's code does not run."""

    def __init__(self):
        self.page = mmap.mmap(-1, 8)  # anonymous and shared (MAP_SHARED): the child's writes reach the parent
        self.set(math.inf)

    def set(self, deadline: float) -> None:
        struct.pack_into("d", self.page, 0, deadline)  # one aligned 8-byte store

    def get(self) -> float:
        return struct.unpack_from("d", self.page, 0)[0]


def _write(fd: int, message: dict) -> None:
    data = json.dumps(message).encode()
    data = struct.pack("<Q", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def _read(fd: int, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


class _Link:
    """The child's end: messages to the kernel, replies from it, the learner's clock."""

    def __init__(self, to_kernel: int, from_kernel: int, clock: _Clock):
        self.to_kernel, self.from_kernel, self.clock = to_kernel, from_kernel, clock
        self.printed = 0

    def send(self, **message) -> None:
        _write(self.to_kernel, message)

    def call(self, function: Callable, args: tuple, kwargs: dict):
        self.send(kind="call", module=function.__module__, name=function.__qualname__, args=list(args), kwargs=kwargs)
        size = struct.unpack("<Q", _read(self.from_kernel, 8))[0]
        reply = json.loads(_read(self.from_kernel, size))
        if reply["ok"]:
            return _tuples(reply["result"])
        error = getattr(builtins, reply["error"], None)
        if not (isinstance(error, type) and issubclass(error, Exception)):
            error = RuntimeError
        raise error(reply["message"])


def _tuples(value):
    """JSON's lists back as the tuples the kernel-side functions return."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


class _Output(io.TextIOBase):
    """sys.stdout or sys.stderr of the child: what the learner's code prints, sent to the kernel as it comes."""

    def __init__(self, link: _Link, stream: str):
        self.link, self.stream = link, stream

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        text = str(text)
        room = PRINTED - self.link.printed
        if room > 0:
            self.link.send(kind="print", stream=self.stream, text=text[:room])
        self.link.printed += len(text)
        return len(text)


def kernel_side(function: Callable) -> Callable:
    """A check's own measurement (on the lesson's device) that runs in the kernel when called in a check's child:
    module-level functions only, with JSON-able arguments (numbers, strings, a torch.device given as its string)
    and result (numbers, strings, tuples of them)."""

    _KERNEL_SIDE[function.__module__, function.__qualname__] = function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if _link is None:
            return function(*args, **kwargs)
        return _link.call(
            function,
            tuple(str(a) if isinstance(a, torch.device) else a for a in args),
            {k: str(v) if isinstance(v, torch.device) else v for k, v in kwargs.items()},
        )

    return wrapper


def progress(**report) -> None:
    """Tell the kernel how far the check is (JSON-able values); check() shows it while a long check runs."""
    if _link is not None:
        _link.send(kind="progress", report=report)
    elif _local_progress is not None:
        _local_progress(report)


def clock_moved(deadline: float) -> None:
    """The learner's time now runs out at `deadline` (time.monotonic(); infinity: the clock stands)."""
    if _link is not None:
        _link.clock.set(deadline)


def run(work: Callable[[], dict], *, check_limit: float, on_progress: Callable[[dict], None] | None = None) -> dict:
    """work() (which returns a JSON-able dict and raises nothing) in a forked child, or in this process without fork.

    Returns work()'s dict; or {"kind": "ignored"} (the learner's code ran GRACE seconds past its time limit),
    {"kind": "overtime", "progress": the last progress report or None} (check_limit seconds of wall time), or
    {"kind": "ended", "code": exit status or None, "signal": signal number or None} (the child ended without a
    verdict), or {"kind": "crashed", "error": a type name, "message": ...} (the check itself failed, or the pipe
    carried what the check did not write). on_progress gets the latest progress report at most once per
    PROGRESS_EVERY seconds.
    """
    global _fork_works, _local_progress
    if _fork_works:
        outcome = _in_child(work, check_limit, on_progress)
        if outcome is not None:
            return outcome
        _fork_works = False
    _local_progress = on_progress
    try:
        return work()
    finally:
        _local_progress = None


def _in_child(work, check_limit, on_progress) -> dict | None:
    """run() in a forked child; None when the child could not run torch (fork unsafe here)."""
    clock = _Clock()
    to_kernel_r, to_kernel_w = os.pipe()
    from_kernel_r, from_kernel_w = os.pipe()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # nothing buffered before the fork is written twice
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "this process is multi-threaded" (the kernel's threads)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(to_kernel_r)
            os.close(from_kernel_w)
            _child(work, _Link(to_kernel_w, from_kernel_r, clock))
        finally:
            os._exit(0)
    os.close(to_kernel_w)
    os.close(from_kernel_r)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also done by the child: whichever runs first
    try:
        return _wait(pid, to_kernel_r, from_kernel_w, clock, check_limit, on_progress)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # the child and whatever it started
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(to_kernel_r)
        os.close(from_kernel_w)
        clock.page.close()


def _child(work, link: _Link) -> None:
    global _link
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # an interrupt of the kernel ends the child; the kernel cleans up
    _link = link
    torch.set_num_threads(1)  # the kernel's OpenMP threads are not in the child
    weights = torch.ones(8, 8, requires_grad=True)
    (weights @ weights).sum().backward()  # torch, its autograd engine and BLAS work here
    link.send(kind="ready")
    sys.stdout, sys.stderr = _Output(link, "out"), _Output(link, "err")
    try:
        result = work()
    except BaseException as error:  # noqa: BLE001 - the check itself failed; said by the kernel
        result = {"kind": "crashed", "error": type(error).__name__, "message": str(error)}
    link.clock.set(math.inf)
    link.send(kind="done", result=result)


def _wait(pid, messages, replies, clock: _Clock, check_limit, on_progress) -> dict | None:
    start = time.monotonic()
    ready, report, shown, buffer = False, None, (None, start), b""
    while True:
        now = time.monotonic()
        if not ready and now - start > READY_WAIT:
            return None
        if ready and now > clock.get() + GRACE:
            return {"kind": "ignored"}
        if ready and now - start > check_limit:
            return {"kind": "overtime", "progress": report}
        if on_progress is not None and report is not None and report != shown[0] and now - shown[1] >= PROGRESS_EVERY:
            shown = (report, now)
            on_progress(report)
        readable = select.select([messages], [], [], 0.05)[0]
        if not readable:
            continue
        chunk = os.read(messages, 1 << 16)
        if not chunk:  # the child ended without its verdict
            if not ready:
                return None
            _pid, status = os.waitpid(pid, 0)
            return {
                "kind": "ended",
                "code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            }
        buffer += chunk
        while len(buffer) >= 8 and len(buffer) >= 8 + struct.unpack("<Q", buffer[:8])[0]:
            size = struct.unpack("<Q", buffer[:8])[0]
            message, buffer = buffer[8 : 8 + size], buffer[8 + size :]
            try:
                message = json.loads(message)
                kind = message["kind"]
                if kind == "ready":
                    ready = True
                elif kind == "print":
                    (sys.stdout if message["stream"] == "out" else sys.stderr).write(str(message["text"]))
                elif kind == "progress":
                    report = dict(message["report"])
                elif kind == "call":
                    _write(replies, _serve(message))
                elif kind == "done":
                    return dict(message["result"])
            except (ValueError, KeyError, TypeError):  # not what the child's _write wrote: the learner's code wrote
                return {
                    "kind": "crashed",
                    "error": "RuntimeError",  # into the pipe
                    "message": "the check's process sent a message that the check did not write",
                }


def _serve(call: dict) -> dict:
    """A kernel_side function's call from the child, run here: its result or its error, as JSON-able data."""
    function = _KERNEL_SIDE.get((call["module"], call["name"]))
    if function is None:  # only the registered measurements run here, whatever the child asks
        return {"ok": False, "error": "RuntimeError", "message": f"{call['name']} is not a kernel-side function"}
    try:
        reply = {"ok": True, "result": function(*call["args"], **call["kwargs"])}
        json.dumps(reply)  # a result that JSON cannot carry is an error of the measurement, said in the child
        return reply
    except Exception as error:  # noqa: BLE001 - the check's measurement failed: the child's check says so in words
        return {"ok": False, "error": type(error).__name__, "message": str(error)}
