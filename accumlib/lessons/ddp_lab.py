"""Lesson 9's lab: accumulation across processes, for real: DistributedDataParallel or FSDP2 on the CPU with gloo.

`launch` starts one fresh Python process (not forked from the caller, so a Jupyter kernel stays out of it) that
imports torch, reads the job and forks `world_size` ranks from it, so they share its pages instead of each
importing torch again (on Linux; on macOS and Windows each rank is a fresh process). Each rank gets the rendezvous
environment torchrun would give it: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, on loopback only. They form one gloo
process group and run each `DDPRun` of the job in turn: every process trains DistributedDataParallel(builder()) (or,
with `wrap="fsdp2"`, builder() sharded with FSDP2's `fully_shard`) with `accumlib.train`, while a DDP communication hook
counts the gradient all-reduces of each optimizer step. Rank 0's results come back; when one rank fails the others are
stopped and its error is raised.
The job's file is signed (HMAC-SHA256) with a key launch() gives only its own processes, in their environment:
`python -m accumlib.lessons.ddp_lab FOLDER` refuses a folder launch() did not write before unpickling anything in it.
`compare_no_sync` and `compare_fsdp2` are lesson 9's jobs (one run with and one without `no_sync()`; one under DDP
and one under FSDP2, each process's memory measured), `run_ddp` a single run.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import hmac
import importlib
import io
import math
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from .._validate import Shown, boolean, function, one_of, positive_int, positive_number
from ..i18n import _
from ..memory import MemoryReport, measure_step

WRAPS = ("ddp", "fsdp2")  # how a DDPRun's processes hold the model: DistributedDataParallel, or FSDP2's fully_shard

# train() arguments a DDPRun sets itself: they cannot also come in its train_options
_SET_BY_THE_JOB = (
    "micro_batch_size",
    "accum_steps",
    "epochs",
    "seed",
    "ddp_no_sync",
    "on_step",
    "device",
    "measure_memory",
)


@dataclass(frozen=True)
class DDPRun:
    """One training run of a DDP job: every process trains DistributedDataParallel(builder()) with SGD(lr), or
    with wrap="fsdp2" builder() sharded by FSDP2 (`fully_shard` on each layer that has parameters, then on the
    whole model, as one shards a model by its blocks)."""

    builder: Callable[[], torch.nn.Module]  # picklable, no arguments: every process builds the same initial model
    data: tuple  # (X, y); each cycle's micro_batch_size * accum_steps * world_size samples are shared out by rank
    micro_batch_size: int  # per process
    accum_steps: int
    epochs: int = 1
    lr: float = 0.5
    seed: int = 0  # the sample order, as in train
    no_sync: bool = True  # all-reduce once per optimizer step (True) or after every backward() (False)
    train_options: dict = field(default_factory=dict)  # further picklable train() arguments: loss_fn, normalize, count
    wrap: str = "ddp"  # "ddp" or "fsdp2" (WRAPS)
    measure_memory: bool = False  # each process measures one step (measure_step, what it holds) before training

    def __post_init__(self):
        if isinstance(self.builder, torch.nn.Module):
            raise TypeError(
                _(
                    "builder must build the model (a function of no arguments, e.g. "
                    "functools.partial(models.mlp, dtype=torch.float64)), not be the model itself"
                )
            )
        _importable("builder", function("builder", self.builder))
        for name, value in self.train_options.items():
            if callable(value):  # loss_fn, count: unpickled in the job's processes too
                _importable(f"train_options[{name!r}]", value)
        positive_int("micro_batch_size", self.micro_batch_size)
        positive_int("accum_steps", self.accum_steps)
        positive_int("epochs", self.epochs)
        positive_number("lr", self.lr)
        boolean("no_sync", self.no_sync)
        boolean("measure_memory", self.measure_memory)
        one_of("wrap", self.wrap, WRAPS)
        if not (
            isinstance(self.data, tuple)
            and len(self.data) == 2
            and all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in self.data)
        ):
            raise TypeError(
                _("data must be a tuple (X, y) of two tensors, got {type}").format(type=type(self.data).__name__)
            )
        clashes = sorted(set(self.train_options) & set(_SET_BY_THE_JOB))
        if clashes:
            raise ValueError(
                _("train_options cannot set {names}: the run sets them itself").format(names=", ".join(clashes))
            )

    def steps(self, world_size: int) -> int:
        """Optimizer steps this run takes with `world_size` processes."""
        return self.epochs * math.ceil(len(self.data[0]) / (self.micro_batch_size * self.accum_steps * world_size))


def _importable(name: str, value) -> None:
    """A function the job's processes can unpickle: pickle sends a function as its module and name, which the job
    (a fresh Python process) imports; refused naming `name` when it cannot (defined in __main__, in a function, a
    lambda), before any process starts, instead of the job's "Can't get attribute"."""
    function = value.func if isinstance(value, functools.partial) else value
    function = function if hasattr(function, "__qualname__") else type(function)  # an object with __call__
    module, qualname = getattr(function, "__module__", None), function.__qualname__
    if module == "__main__":
        raise TypeError(
            _(
                "{name}={value!r} is defined in __main__ (a notebook cell or the script being run): the "
                "job's processes import it by its module and name, and their __main__ is not yours; "
                "define it in a module (a .py file next to the notebook) and import it from there, "
                "before the job starts"
            ).format(name=name, value=Shown(value))
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(
            _(
                "{name}={value!r} is a lambda or a function defined inside another function: the job's "
                "processes cannot import it by its name; define it at the top level of a module and "
                "import it from there, before the job starts"
            ).format(name=name, value=Shown(value))
        )


@dataclass(frozen=True)
class DDPResult:
    """What one DDPRun did, seen from rank 0."""

    world_size: int
    micro_batch_size: int
    accum_steps: int
    no_sync: bool
    allreduces: tuple[int, ...]  # gradient all-reduces on rank 0 in each optimizer step (one per bucket and sync;
    # () under FSDP2, which reduce-scatters the gradients instead)
    micro_batches: tuple[int, ...]  # micro-batches with samples in each optimizer step (rank 0's view of train)
    state: dict  # the final parameters and buffers, whole (name -> tensor; FSDP2's shards gathered)
    losses: tuple[float, ...]  # each step's loss over all processes, as train records it
    wrap: str = "ddp"  # as the run's
    memory: tuple[MemoryReport, ...] = ()  # with measure_memory: each process's measure_step report, by rank

    @property
    def steps(self) -> int:
        """Optimizer steps taken."""
        return len(self.losses)

    @property
    def allreduce_calls(self) -> int:
        """Gradient all-reduces over the whole run."""
        return sum(self.allreduces)

    @property
    def allreduce_per_step(self) -> float:
        """Mean all-reduces per optimizer step."""
        return self.allreduce_calls / self.steps


def launch(
    runs: Sequence[DDPRun],
    *,
    world_size: int = 2,
    timeout: float = 120,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[DDPResult]:
    """Run every DDPRun in one job of `world_size` CPU processes; return their results in order.

    timeout: seconds for the whole job before its processes are stopped. on_progress(steps_done, steps_total) is
    called in the caller's thread as rank 0 finishes each optimizer step (of all runs together), and once with 0
    at the start: enough to drive an ipywidgets progress bar (`bar.value, bar.max = done, total`).
    """
    world_size = positive_int("world_size", world_size)
    timeout = positive_number("timeout", timeout)
    on_progress = function("on_progress", on_progress, optional=True)
    runs = list(runs)
    if not runs or not all(isinstance(run, DDPRun) for run in runs):
        raise TypeError(_("runs must be a non-empty sequence of DDPRun, got {value!r}").format(value=runs))
    total = sum(run.steps(world_size) for run in runs)
    key = secrets.token_hex(32)  # the job's key: only its own processes get it (in their environment)
    _collect_stale()
    with tempfile.TemporaryDirectory(prefix=_PREFIX) as folder:
        job = Path(folder)
        (job / "launcher.pid").write_text(str(os.getpid()))  # whose job: gone, a later launch() collects the folder
        pickled = io.BytesIO()
        torch.save(runs, pickled)
        (job / "job.pt").write_bytes(pickled.getvalue())
        (job / "job.sig").write_text(_signature(key, pickled.getvalue()))
        for _attempt in range(2):  # a second try only when another program took the free port first
            codes, errors = _start_and_follow(job, world_size, timeout, total, on_progress, key)
            if "address already in use" not in errors.lower():
                break
        if any(codes):
            raise RuntimeError(
                _("DDP job failed (exit codes {codes}):\n{errors}").format(codes=codes, errors=errors[-3000:])
            )
        results = torch.load(job / "result.pt", weights_only=True)  # numbers, tuples and tensors: nothing runs
    return [
        DDPResult(
            world_size,
            run.micro_batch_size,
            run.accum_steps,
            run.no_sync,
            wrap=run.wrap,
            **{**result, "memory": tuple(MemoryReport(**report) for report in result["memory"])},
        )
        for run, result in zip(runs, results, strict=True)
    ]


_PREFIX = "accumlib-ddp-"  # the job folders' names in the temporary folder


def _collect_stale() -> None:
    """Remove the job folders of launch() calls whose process is gone without removing them (a kernel killed with
    SIGKILL skips TemporaryDirectory's cleanup, leaving the pickled job and its data): this user's folders only,
    whose launcher.pid names no living process. POSIX only (elsewhere os.kill(pid, 0) is no probe)."""
    if not hasattr(os, "getuid"):
        return
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            if folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / "launcher.pid").read_text())
            os.kill(pid, 0)  # raises ProcessLookupError when no process has this pid
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):  # no pid file (not ours to judge), or a process of another user: kept
            continue


def compare_no_sync(
    builder,
    data,
    *,
    world_size: int = 2,
    micro_batch_size: int,
    accum_steps: int,
    epochs: int = 1,
    lr: float = 0.5,
    seed: int = 0,
    timeout: float = 120,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[bool, DDPResult]:
    """The same DDP training without and with `no_sync()`, in one job: {False: result, True: result}."""
    runs = [
        DDPRun(builder, data, micro_batch_size, accum_steps, epochs, lr, seed, no_sync) for no_sync in (False, True)
    ]
    without, with_no_sync = launch(runs, world_size=world_size, timeout=timeout, on_progress=on_progress)
    return {False: without, True: with_no_sync}


def compare_fsdp2(
    builder,
    data,
    *,
    world_size: int = 2,
    micro_batch_size: int,
    accum_steps: int,
    epochs: int = 1,
    lr: float = 0.5,
    seed: int = 0,
    timeout: float = 120,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, DDPResult]:
    """The same training under DDP and under FSDP2 (with no_sync), in one job, each process's memory measured
    before it trains (`DDPResult.memory`): {"ddp": result, "fsdp2": result}."""
    runs = [
        DDPRun(builder, data, micro_batch_size, accum_steps, epochs, lr, seed, wrap=wrap, measure_memory=True)
        for wrap in WRAPS
    ]
    return dict(zip(WRAPS, launch(runs, world_size=world_size, timeout=timeout, on_progress=on_progress), strict=True))


def run_ddp(
    builder,
    data,
    *,
    world_size: int = 2,
    micro_batch_size: int,
    accum_steps: int,
    epochs: int = 1,
    lr: float = 0.5,
    seed: int = 0,
    no_sync: bool = True,
    timeout: float = 120,
    on_progress: Callable[[int, int], None] | None = None,
) -> DDPResult:
    """Train builder() under DDP in `world_size` CPU processes; every process builds the same initial model.

    builder: a picklable zero-argument callable returning the model (e.g. functools.partial(models.mlp, ...)).
    data: (X, y); each cycle's micro_batch_size * accum_steps * world_size samples are shared out by rank.
    timeout: seconds before the job is stopped. on_progress: as for `launch`.
    """
    run = DDPRun(builder, data, micro_batch_size, accum_steps, epochs, lr, seed, no_sync)
    return launch([run], world_size=world_size, timeout=timeout, on_progress=on_progress)[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_and_follow(
    job: Path, world_size: int, timeout: float, total: int, on_progress, key: str
) -> tuple[list, str]:
    """Start the job's processes, report rank 0's steps, stop every process if one fails or time runs out.

    One fresh Python process (the job's parent, in a session of its own) imports torch and reads the job, then forks
    the ranks: they share its pages (torch's Python objects, the job's data) instead of each holding a copy
    (`_start_rank`: fresh processes where fork() is not safe).
    Returns (exit codes by rank, the processes' stderr together).
    """
    package_root = str(Path(__file__).resolve().parents[2])  # the processes import this very accumlib
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        _KEY: key,
        "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
    }
    for name in ("RANK", "LOCAL_RANK"):  # the parent sets them in each rank
        env.pop(name, None)
    with (job / "stderr-parent.txt").open("w") as log:
        parent = subprocess.Popen(
            [sys.executable, "-m", __name__, str(job)],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(parent.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout
    try:
        if on_progress is not None:
            on_progress(0, total)
        done = 0
        while True:
            try:
                line = lines.get(timeout=0.05)
            except queue.Empty:
                line = ""
            if line is None:  # rank 0 has closed its output: it has finished (or failed)
                break
            if line == "step\n":
                done += 1
                if on_progress is not None:
                    on_progress(done, total)
            if parent.poll() not in (None, 0):  # a rank failed: the parent has stopped the others and exited
                break
            if time.monotonic() > deadline:
                raise TimeoutError(_("DDP job did not finish within timeout={timeout} s").format(timeout=timeout))
        parent.wait(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        # Stopped early (time out, interrupt, a failure) the parent and its ranks go together: they are its session.
        _kill_session(parent)
        parent.wait()
        parent.stdout.close()
    codes_file = job / "exit-codes.txt"
    codes = (
        [int(code) for code in codes_file.read_text().split()]
        if codes_file.exists()
        else [parent.returncode or 1] * world_size
    )  # it failed before starting the ranks
    errors = "\n".join(
        path.read_text()
        for path in [job / "stderr-parent.txt", *(job / f"stderr-{rank}.txt" for rank in range(world_size))]
        if path.exists()
    )
    return codes, errors


def _kill_session(process: subprocess.Popen) -> None:
    """Stop the job's parent and its ranks: its whole session where there are sessions (POSIX)."""
    if not hasattr(os, "killpg"):  # Windows has no sessions: the parent alone (its ranks finish or fail on their own)
        process.kill()
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(stream, lines: queue.Queue) -> None:
    """Copy a process's output into `lines`, line by line; None when it closes."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def _counting_allreduce(state: dict, bucket):
    state["calls"] += 1
    return allreduce_hook(None, bucket)


def _wrapped(model: torch.nn.Module, wrap: str) -> torch.nn.Module:
    """The model as the run's processes hold it: DistributedDataParallel, or FSDP2 (each layer with parameters its
    own unit, then the root)."""
    if wrap == "ddp":
        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model.children():
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    return fully_shard(model)


def _whole_state(model: torch.nn.Module) -> dict:
    """The whole weights (FSDP2: every shard gathered, a collective every process calls), detached copies."""
    state = model.module.state_dict() if isinstance(model, DistributedDataParallel) else model.state_dict()
    return {
        k: (v.full_tensor() if isinstance(v, dist.tensor.DTensor) else v).detach().clone() for k, v in state.items()
    }


def _measured_memory(model: torch.nn.Module, run: DDPRun, optimizer) -> tuple[dict, ...]:
    """Every process's measure_step of one step of the run (a micro-batch of its size, accum_steps passes), by
    rank, as plain dicts (launch reads them with weights_only); a collective every process calls."""
    x, y = (t[: run.micro_batch_size] for t in run.data)
    report = measure_step(
        model,
        x,
        y,
        optimizer=optimizer,
        loss_fn=run.train_options.get("loss_fn"),
        accum_steps=run.accum_steps,
        ddp_no_sync=run.no_sync,
    )
    reports = [None] * dist.get_world_size()
    dist.all_gather_object(reports, asdict(report))
    return tuple(reports)


def _train_rank(run: DDPRun) -> dict:
    """This process's share of one run; its DDP or FSDP objects die when it returns."""
    from ..loop import train

    model = _wrapped(run.builder(), run.wrap)
    counter = {"calls": 0}
    if run.wrap == "ddp":
        model.register_comm_hook(counter, _counting_allreduce)
    allreduces = []

    def on_step(record):
        allreduces.append(counter["calls"] - sum(allreduces))
        if dist.get_rank() == 0:
            print("step", flush=True)  # progress, read by launch()

    optimizer = torch.optim.SGD(model.parameters(), lr=run.lr)
    memory = _measured_memory(model, run, optimizer) if run.measure_memory else ()
    history = train(
        model,
        run.data,
        optimizer,
        micro_batch_size=run.micro_batch_size,
        accum_steps=run.accum_steps,
        epochs=run.epochs,
        seed=run.seed,
        ddp_no_sync=run.no_sync,
        on_step=on_step,
        measure_memory=False,
        device="cpu",
        **run.train_options,
    )
    return {
        "allreduces": tuple(allreduces) if run.wrap == "ddp" else (),
        "memory": memory,
        "micro_batches": tuple(r.micro_batches for r in history),
        "losses": tuple(r.loss for r in history),
        "state": _whole_state(model),
    }


def _worker(job: Path, runs: list) -> None:
    """One rank of a job (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set); rank 0 saves the results."""
    dist.init_process_group("gloo")
    try:
        results = [_train_rank(run) for run in runs]
        if dist.get_rank() == 0:
            torch.save(results, job / "result.pt")
        dist.barrier()
    finally:
        # DDP's reducer holds the process group and sits in reference cycles: free it before the group goes.
        gc.collect()
        dist.destroy_process_group()


def _rank(job: Path, rank: int, runs: list) -> None:
    """A forked rank: its own stderr file, output only on rank 0 (the progress), then os._exit, never a return."""
    code = 1
    try:
        with (job / f"stderr-{rank}.txt").open("w") as log:
            os.dup2(log.fileno(), 2)
        if rank:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
        os.environ["RANK"] = os.environ["LOCAL_RANK"] = str(rank)
        _worker(job, runs)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # the parent's interpreter state is not ours to shut down (gloo's threads, atexit hooks)


# Linux forks the ranks from the job's parent, sharing its pages. macOS's system libraries are not safe to use
# after fork() (Python's multiprocessing spawns there) and Windows has no fork(): there each rank is a fresh process.
_FORK = sys.platform.startswith("linux")


def _start_rank(job: Path, rank: int, runs: list):
    """A rank: a forked child's pid on Linux, a fresh process elsewhere (it reads the job itself)."""
    if _FORK:
        pid = os.fork()
        if pid == 0:
            _rank(job, rank, runs)
        return pid
    # this runs in the job's parent, whose __name__ is "__main__"; its module's name is in its spec
    return subprocess.Popen([sys.executable, "-m", __spec__.name, str(job), str(rank)], stdin=subprocess.DEVNULL)


def _exit_code(handle) -> int | None:
    """A rank's exit code (negative: the signal that stopped it), None while it runs."""
    if isinstance(handle, subprocess.Popen):
        return handle.poll()
    pid, status = os.waitpid(handle, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if pid else None


def _stop(handle) -> None:
    if isinstance(handle, subprocess.Popen):
        handle.kill()
    else:
        os.kill(handle, signal.SIGKILL)


# the environment variable that gives the job's processes its key (an environment is readable by its user alone)
_KEY = "ACCUMLIB_DDP_JOB_KEY"


def _signature(key: str, pickled: bytes) -> str:
    return hmac.new(bytes.fromhex(key), pickled, hashlib.sha256).hexdigest()


def _read_job(job: Path) -> list:
    """The job's runs, unpickled only when job.pt carries the signature of this process's key (`_KEY`): a folder
    launch() did not write, or a job.pt changed since, is refused before anything in it runs (unpickling a job
    runs code: its builders)."""
    pickled = (job / "job.pt").read_bytes()
    key = os.environ.get(_KEY, "")
    signature = (job / "job.sig").read_text() if (job / "job.sig").exists() else ""
    try:  # launch()'s keys are 32 random bytes: no key (or a short one) signs nothing, else anyone could sign
        valid = len(bytes.fromhex(key)) == 32 and hmac.compare_digest(_signature(key, pickled), signature)
    except ValueError:  # a key that is no hex
        valid = False
    if not valid:
        raise PermissionError(
            _(
                "{folder} is not a job that accumlib.lessons.ddp_lab.launch() started: its job.pt is "
                "not signed with the key launch() gives its own processes ({key}); it is not unpickled "
                "(that would run its code). Start DDP jobs with launch()"
            ).format(folder=job, key=_KEY)
        )
    return torch.load(io.BytesIO(pickled), weights_only=False, map_location="cpu")


def _parent(job: Path) -> int:
    """Read the job, start its ranks, wait for them; stop them all when one fails or this process is orphaned."""
    torch.set_num_threads(1)  # before forking: no thread pool starts in the parent
    world_size = int(os.environ["WORLD_SIZE"])
    # the builders' modules are imported here, shared by the ranks; tensors on the CPU: CUDA must not start before fork
    runs = _read_job(job) if _FORK else []
    if _FORK:
        importlib.import_module("torch._dynamo")  # DistributedDataParallel() imports it (and sympy: about 70 MB)
    launcher = os.getppid()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()  # the ranks' collections leave the parent's objects alone: their pages stay shared
    ranks = [_start_rank(job, rank, runs) for rank in range(world_size)]
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)  # rank 0 alone holds the progress pipe: it closes when rank 0 ends
    codes = [None] * world_size
    while None in codes:
        for rank, handle in enumerate(ranks):
            if codes[rank] is None:
                codes[rank] = _exit_code(handle)
        # a failed rank: the others would wait for it in their next collective. An orphan job: its kernel has gone.
        if any(codes) or os.getppid() != launcher:
            for rank, handle in enumerate(ranks):
                if codes[rank] is None:
                    _stop(handle)
        time.sleep(0.02)
    (job / "exit-codes.txt").write_text(" ".join(map(str, codes)))
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3:  # a rank started as a fresh process (not on Linux)
        _rank(Path(sys.argv[1]), int(sys.argv[2]), _read_job(Path(sys.argv[1])))
    sys.exit(_parent(Path(sys.argv[1])))
