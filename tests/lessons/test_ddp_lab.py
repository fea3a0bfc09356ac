"""DDP for real, run once: 2 gloo processes, one job, every run the lesson and the library need, checked here.

The runs: the lesson's pair (with and without no_sync()), normalize="count" with padding micro-batches, and the
classic normalize="steps" (with check_gradients=False: its one read carries the loss alone). Each is compared with
one process training on the same cycles in float64.
"""

import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import accumlib
from accumlib.lessons import data, ddp_lab, models

X, Y = data.digits(100, flat=True, dtype=torch.float64)  # 100 = 4 cycles of 4 x 3 x 2 = 24, then 4 samples
TOKENS_X, TOKENS_Y = data.token_sequences(57, seed=1)  # 24 + 24 + 9: the last cycle shards 5 + 4 samples
MLP = functools.partial(models.mlp, dtype=torch.float64)
SEQUENCE = functools.partial(models.sequence_model, dtype=torch.float64)
BY_COUNT = dict(loss_fn=models.token_loss_sum, loss_reduction="sum", normalize="count", count=data.count_tokens)
RUNS = [
    ddp_lab.DDPRun(MLP, (X, Y), 4, 3, epochs=2, no_sync=False),
    ddp_lab.DDPRun(MLP, (X, Y), 4, 3, epochs=2, no_sync=True),
    ddp_lab.DDPRun(SEQUENCE, (TOKENS_X, TOKENS_Y), 4, 3, epochs=2, train_options=BY_COUNT),
    ddp_lab.DDPRun(MLP, (X[:96], Y[:96]), 4, 3, epochs=2, train_options=dict(normalize="steps", check_gradients=False)),
]


PROC = Path("/proc/self/smaps_rollup").exists()  # Linux: what the processes hold and who started whom
needs_proc = pytest.mark.skipif(not PROC, reason="reads the processes from /proc (Linux)")


def job_processes(launcher: int) -> dict[int, list[int]]:
    """The job's processes below `launcher`: {the job's parent: its ranks}, from /proc's parent links."""
    parents = {}
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"accumlib.lessons.ddp_lab" in command:
            parents[int(entry.name)] = parent
    return {pid: [rank for rank, up in parents.items() if up == pid] for pid, up in parents.items() if up == launcher}


def memory(pid: int) -> dict[str, int]:
    """A process's /proc/PID/smaps_rollup in kB."""
    lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    return {line.split(":")[0]: int(line.split()[1]) for line in lines}


@pytest.fixture(scope="module")
def job():
    progress, seen = [], {}

    def on_progress(done, total):
        progress.append((done, total))
        if done == 5 and PROC:  # mid-job: the job's parent and its ranks are running
            seen.update({rank: memory(rank) for ranks in job_processes(os.getpid()).values() for rank in ranks})

    started = time.perf_counter()
    results = ddp_lab.launch(RUNS, world_size=2, on_progress=on_progress)
    return results, progress, time.perf_counter() - started, seen


def one_process(builder, data_, m, k, **options):
    model = builder()
    history = accumlib.train(
        model,
        data_,
        torch.optim.SGD(model.parameters(), lr=0.5),
        micro_batch_size=m,
        accum_steps=k,
        epochs=2,
        **options,
    )
    return model, history


@pytest.mark.slow
def test_no_sync_all_reduces_once_per_step_and_both_match_one_process(job):
    (without, with_no_sync, *_), *_ = job
    assert without.allreduces == (3, 3, 3, 3, 1) * 2  # every backward all-reduces; the short cycle has one
    assert with_no_sync.allreduces == (1,) * 10
    assert without.micro_batches == with_no_sync.micro_batches == (3, 3, 3, 3, 1) * 2
    single, history = one_process(MLP, (X, Y), 24, 1)
    for result in (without, with_no_sync):
        assert accumlib.parameter_gap(result.state, single) <= 1e-10
        assert result.losses == pytest.approx([r.loss for r in history], abs=1e-12)  # mean over both processes


@pytest.mark.slow
def test_count_normalisation_with_padding_micro_batches_matches_one_process(job):
    count_run = job[0][2]
    # rank 0 holds 5 of the last cycle's 9 sequences (micro-batches of 4 and 1); rank 1 holds 4 and a padding one
    assert count_run.micro_batches == (3, 3, 2) * 2
    single, history = one_process(SEQUENCE, (TOKENS_X, TOKENS_Y), 24, 1, **BY_COUNT)
    assert accumlib.parameter_gap(count_run.state, single) <= 1e-10
    assert count_run.losses == pytest.approx([r.loss for r in history], abs=1e-12)  # padding adds no loss


@pytest.mark.slow
def test_steps_normalisation_counts_every_process_micro_batch_once(job):
    """Classic loss / accum_steps over 2 processes: the gradient of one process with 2 x accum_steps micro-batches
    (and the loss averaged over the processes when it is read without the gradient norm)."""
    steps_run = job[0][3]
    single, history = one_process(MLP, (X[:96], Y[:96]), 4, 6, normalize="steps")
    assert accumlib.parameter_gap(steps_run.state, single) <= 1e-10
    assert steps_run.losses == pytest.approx([r.loss for r in history], abs=1e-12)


@pytest.mark.slow
def test_fsdp2_trains_as_ddp_and_one_process_and_each_process_measures_what_it_holds():
    """Lesson 9's second job: the same training under DDP and under FSDP2 (fully_shard per layer) equals one process
    in float64, and each process's measure_step (taken in the job, before training) is what it holds: under DDP the
    one-process step plus DDP's gradient bucket, under FSDP2 half the weights (the 64-64-10 MLP's rows split
    evenly); the measurement, a real step under FSDP2, is undone (the weights still match)."""
    results = ddp_lab.compare_fsdp2(MLP, (X, Y), micro_batch_size=4, accum_steps=3, epochs=2)
    single, history = one_process(MLP, (X, Y), 24, 1)
    weights = sum(p.numel() * p.element_size() for p in single.parameters())
    alone = accumlib.measure_step(
        MLP(), X[:4], Y[:4], optimizer=torch.optim.SGD(single.parameters(), lr=0.5), accum_steps=3
    )
    for wrap, result in results.items():
        assert result.wrap == wrap and result.micro_batches == (3, 3, 3, 3, 1) * 2
        assert accumlib.parameter_gap(result.state, single) <= 1e-10
        assert result.losses == pytest.approx([r.loss for r in history], abs=1e-12)
        assert len(result.memory) == 2 and all(isinstance(r, accumlib.MemoryReport) for r in result.memory)
    assert results["ddp"].allreduces == (1,) * 10 and results["fsdp2"].allreduces == ()
    for report in results["ddp"].memory:
        assert report.peak == alone.peak + weights and report.gradients == alone.gradients + weights
        assert report.parameters == weights
    shards = [report.parameters for report in results["fsdp2"].memory]
    assert shards == [weights // 2] * 2
    assert len({report.peak for report in results["fsdp2"].memory}) == 1  # the busiest process's, on every one
    assert all(sum(r.categories().values()) == r.peak for wrap in results for r in results[wrap].memory)


def test_progress_reaches_every_step_of_every_run_in_order(job):
    _results, progress, *_ = job
    total = 10 + 10 + 6 + 8
    assert progress == [(done, total) for done in range(total + 1)]


@pytest.mark.slow
@pytest.mark.skipif(not ddp_lab._FORK, reason="the ranks are forked on Linux only (fresh processes elsewhere)")
def test_the_ranks_share_the_pages_of_their_parent(job):
    """The ranks are forked from one process that imported torch, torch._dynamo (DistributedDataParallel imports
    it) and the job: its pages stay shared, and each rank's own pages are what training writes. Measured here: about
    200 MB shared and 14 MB private per rank; each rank importing torch itself had 0 shared and over 100 MB private
    (the same 200 MB, twice). A rank copying most of its parent (a module DDP imports that the parent did not, a
    collection writing every object) brings its private part near its shared part and fails."""
    *_, seen = job
    assert len(seen) == 2, seen  # both ranks were running at step 5
    for rank in seen.values():
        assert rank["Private_Dirty"] * 4 < rank["Shared_Dirty"], rank


@pytest.mark.slow
def test_a_failing_process_stops_the_job_at_once_with_its_error():
    """Rank 1's builder fails; rank 0 waits for it in DDP's first broadcast and is stopped, not left hanging."""
    fails_on_rank_1 = functools.partial(
        eval, "__import__('torch').nn.Linear(64, 10) if __import__('os').environ['RANK'] == '0' else 1 / 0"
    )
    started = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        ddp_lab.run_ddp(fails_on_rank_1, data.digits(40, flat=True), micro_batch_size=4, accum_steps=2)
    assert time.perf_counter() - started < 60  # gloo's own timeout would be 30 minutes
    message = str(info.value)
    assert "ZeroDivisionError: division by zero" in message and "exit codes [" in message
    assert message.split("exit codes [")[1].split("]")[0].split(", ")[1] == "1"  # rank 1's own failure
    assert not PROC or not job_processes(os.getpid())  # every process of the job has gone


LAUNCHER = """
import functools, os
from accumlib.lessons import ddp_lab
from accumlib.lessons import data

stuck = functools.partial(eval, "__import__('time').sleep(600)")  # every rank hangs in its builder
print(os.getpid(), flush=True)
ddp_lab.run_ddp(stuck, data.digits(40, flat=True), micro_batch_size=4, accum_steps=2, timeout=600)
"""


@pytest.mark.slow
@needs_proc
def test_the_job_ends_with_the_process_that_launched_it():
    """A kernel killed mid-job (SIGKILL: no finally runs in it) leaves no DDP process behind. The ranks are stuck
    (in their builders here; in a collective they would wait for gloo's 30-minute timeout), so neither the progress
    pipe nor gloo tells them: the job's parent sees its launcher has gone and stops them."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(ddp_lab.__file__).parents[2])},
    )
    try:
        assert int(launcher.stdout.readline()) == launcher.pid
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and [len(ranks) for ranks in job_processes(launcher.pid).values()] != [2]:
            time.sleep(0.1)
        processes = job_processes(launcher.pid)
        assert [len(ranks) for ranks in processes.values()] == [2], processes  # the job's parent and its 2 ranks
        pids = [pid for parent, ranks in processes.items() for pid in (parent, *ranks)]
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 60  # the ranks' builders sleep 600 s
    while time.monotonic() < deadline and [pid for pid in pids if running(pid)]:
        time.sleep(0.1)
    assert not [pid for pid in pids if running(pid)]


def running(pid: int) -> bool:
    """Alive (not gone, not a zombie waiting for a parent to collect it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(
    "change,error,names",
    [
        (dict(micro_batch_size=0), ValueError, ["micro_batch_size", "0"]),
        (dict(no_sync="yes"), TypeError, ["no_sync", "'yes'"]),
        (dict(data=[X, Y]), TypeError, ["data", "list"]),
        (dict(builder=models.mlp()), TypeError, ["builder"]),
        (dict(train_options=dict(seed=3)), ValueError, ["train_options", "seed"]),
        (dict(wrap="fsdp"), ValueError, ["wrap", "'fsdp'", "'ddp'", "'fsdp2'"]),
        (dict(measure_memory=1), TypeError, ["measure_memory", "1"]),
    ],
)
def test_bad_runs_are_refused_before_any_process_starts(change, error, names):
    arguments = dict(builder=MLP, data=(X, Y), micro_batch_size=4, accum_steps=3) | change
    with pytest.raises(error) as info:
        ddp_lab.DDPRun(**arguments)
    assert all(name in str(info.value) for name in names)


@pytest.mark.parametrize(
    "arguments,error,names",
    [
        (dict(runs=[]), TypeError, ["runs", "DDPRun"]),
        (dict(runs=[dict(micro_batch_size=4)]), TypeError, ["runs", "DDPRun"]),
        (dict(world_size=0), ValueError, ["world_size", "0"]),
        (dict(timeout=-1), ValueError, ["timeout", "-1"]),
        (dict(on_progress="bar"), TypeError, ["on_progress", "'bar'"]),
    ],
)
def test_bad_jobs_are_refused_before_any_process_starts(arguments, error, names):
    with pytest.raises(error) as info:
        ddp_lab.launch(**(dict(runs=RUNS[:1]) | arguments))
    assert all(name in str(info.value) for name in names)


def main_builder():
    return models.mlp(dtype=torch.float64)


main_builder.__module__ = "__main__"  # as a function defined in a notebook cell is


def nested_builder():
    def build():
        return models.mlp()

    return build


@pytest.mark.parametrize(
    "change, name, words",
    [
        (dict(builder=main_builder), "builder", "is defined in __main__ (a notebook cell or the script being run)"),
        (dict(builder=functools.partial(main_builder)), "builder", "is defined in __main__"),
        (dict(builder=lambda: models.mlp()), "builder", "is a lambda or a function defined inside another function"),
        (dict(builder=nested_builder()), "builder", "is a lambda or a function defined inside another function"),
        (dict(train_options=dict(loss_fn=lambda out, y: out.sum())), "train_options['loss_fn']", "is a lambda"),
    ],
)
def test_a_function_the_jobs_processes_cannot_import_is_refused_before_any_process_starts(change, name, words):
    """Before: the job failed with "Can't get attribute 'main_builder' on <module 'accumlib.distributed'>" (now
    accumlib.lessons.ddp_lab)."""
    with pytest.raises(TypeError) as refused:
        ddp_lab.DDPRun(**(dict(builder=MLP, data=(X, Y), micro_batch_size=4, accum_steps=3) | change))
    message = str(refused.value)
    assert message.startswith(f"{name}=") and words in message and "define it" in message and "module" in message


class Payload:
    """Unpickled, it writes a file: what a planted job.pt would do (pickle keeps exec and its argument only)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('it ran')",)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "no signature",
        "another key's signature",
        "no key",
        "no key, signed with the empty key",
        "a short key, signed with it",
        "changed after signing",
        "signed with the job's key",
    ],
)
def test_a_folder_launch_did_not_make_is_refused_and_its_pickle_never_runs(tmp_path, case):
    """`python -m accumlib.lessons.ddp_lab FOLDER` unpickles a job.pt only when it carries the signature of the key
    launch() gives its own processes (an HMAC of the file, a key of 32 random bytes): a planted folder's pickle never
    runs, also when it is signed with the key a process without one would use (none) or with a short key."""
    import hmac

    job, marker = tmp_path / "job", tmp_path / "ran.txt"
    job.mkdir()
    torch.save([Payload(marker)], job / "job.pt")
    ours, theirs = "ab" * 32, "cd" * 32
    if case == "no key, signed with the empty key":
        ours = ""  # anyone can compute an HMAC with an empty key
    elif case == "a short key, signed with it":
        ours = "ab"
    pickled = (job / "job.pt").read_bytes()
    env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": str(Path(ddp_lab.__file__).parents[2])}
    env.pop(ddp_lab._KEY, None)
    if case != "no signature":
        (job / "job.sig").write_text(
            hmac.new(
                bytes.fromhex(theirs if case == "another key's signature" else ours), pickled, "sha256"
            ).hexdigest()
        )
    if not case.startswith("no key"):
        env[ddp_lab._KEY] = ours
    if case == "changed after signing":
        (job / "job.pt").write_bytes(pickled + b"\0")
    done = subprocess.run(
        [sys.executable, "-m", "accumlib.lessons.ddp_lab", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if case == "signed with the job's key":  # the control: what launch() writes is unpickled, payload and all
        assert marker.read_text() == "it ran"
        return
    assert done.returncode != 0 and not marker.exists()
    assert (
        f"PermissionError: {job} is not a job that accumlib.lessons.ddp_lab.launch() started: its job.pt is not "
        f"signed with the key launch() gives its own processes ({ddp_lab._KEY})"
    ) in done.stderr


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX: a process is probed with os.kill(pid, 0)")
def test_the_job_folder_of_a_launcher_that_is_gone_is_collected_by_the_next_launch(tmp_path, monkeypatch):
    """A kernel killed with SIGKILL leaves its job folder (the pickled job and its data); the next launch() removes
    the folders whose launcher.pid names no living process, and keeps the others."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    folders = {name: tmp_path / f"accumlib-ddp-{name}" for name in ("gone", "alive", "no pid", "other name")}
    for folder in folders.values():
        folder.mkdir()
        (folder / "job.pt").write_bytes(b"the job")
    (folders["gone"] / "launcher.pid").write_text(ended.stdout.strip())  # a process that has ended and been reaped
    (folders["alive"] / "launcher.pid").write_text(str(os.getpid()))
    folders["other name"].rename(tmp_path / "other-name")
    (tmp_path / "other-name" / "launcher.pid").write_text(ended.stdout.strip())
    ddp_lab._collect_stale()
    assert not folders["gone"].exists()
    assert folders["alive"].exists() and folders["no pid"].exists() and (tmp_path / "other-name").exists()
