"""train(checkpoint=PATH): a run stopped at any step goes on from its file as if it had never stopped, bit for bit.

The model has Dropout, the Dataset augments each sample from torch's, NumPy's and Python's random numbers, the order
is shuffled: a resumed run must restore every random state as well as the model, optimizer, scheduler and scaler
to give the uninterrupted run's weights and records. Every run is float64 on the CPU (or a float32 model under fp16
autocast with a GradScaler), deterministic, so "equal" is torch.equal. A file that is damaged, truncated, from
another run or that would run code is refused, naming the file and what differs, with nothing changed: weights,
optimizer state, random states and the file itself.
"""

import os
import pickle
import random
import signal

import numpy as np
import pytest
import torch
from torch import nn

import accumlib
from accumlib import checkpoint as checkpoints, checkpoint_parts
from found import stop_at
from states import stable_records

generator = torch.Generator().manual_seed(0)
X = torch.randn(40, 5, generator=generator, dtype=torch.float64)
Y = torch.randint(0, 3, (40,), generator=generator)
STEPS = 12  # 3 epochs of 40 samples in cycles of 4 x 3 = 12: 12, 12, 12, 4


class Augmented(torch.utils.data.Dataset):
    """Each sample with noise drawn from torch's, NumPy's and Python's global random states (torchvision style)."""

    def __init__(self, dtype=torch.float64):
        self.dtype = dtype

    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        noise = 0.1 * torch.randn(5, dtype=torch.float64) + 0.01 * np.random.randn() + 0.01 * random.random()
        return (X[i] + noise).to(self.dtype), Y[i]


def build(seed, dtype=torch.float64):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 3)).to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)


def seed_everything(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def random_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def same_random_states(a, b):
    return torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


DATA = {
    "Dataset": lambda dtype=torch.float64: Augmented(dtype),
    "DataLoader": lambda dtype=torch.float64: torch.utils.data.DataLoader(Augmented(dtype), batch_size=4, shuffle=True),
}


def options(data, amp=False):
    indexed = dict(micro_batch_size=4, seed=3) if data == "Dataset" else {}
    return dict(accum_steps=3, epochs=3, device="cpu", amp=amp, **indexed)


def run(data, seed=1, amp=False, **extra):
    """A fresh model trained from global seed 10: (model, optimizer, scheduler, scaler, history)."""
    dtype = torch.float32 if amp else torch.float64
    model, optimizer, scheduler = build(seed, dtype)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) if amp else None
    seed_everything(10)
    history = accumlib.train(
        model, DATA[data](dtype), optimizer, scheduler=scheduler, scaler=scaler, **options(data, amp), **extra
    )
    return model, optimizer, scheduler, scaler, history


def equal_states(a, b):
    """Two state dicts (nested: an optimizer's) equal, every tensor torch.equal."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal_states(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal_states(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.fixture(scope="module")
def uninterrupted():
    return {(data, amp): run(data, amp=amp) for data in DATA for amp in (False, "fp16")}


@pytest.mark.parametrize("amp", [False, "fp16"], ids=["float64", "fp16-with-a-scaler"])
@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("how", ["max_steps", "StopTraining"])
def test_a_run_stopped_at_step_3_goes_on_bit_for_bit(uninterrupted, tmp_path, data, how, amp):
    """Stopped at step 3 (of 12, in epoch 0), then resumed into a freshly initialised model under another global
    seed: the weights, the optimizer's, scheduler's and scaler's states and the records (less wall seconds) equal
    the uninterrupted run's."""
    path = tmp_path / "run.pt"
    stop = dict(max_steps=3) if how == "max_steps" else dict(on_step=stop_at(3))
    *_, stopped = run(data, amp=amp, checkpoint=path, **stop)
    assert len(stopped) == 3 and stopped.stopped == (None if how == "max_steps" else "StopTraining")
    model, optimizer, scheduler, scaler = uninterrupted[data, amp][:4]
    history = uninterrupted[data, amp][4]
    dtype = torch.float32 if amp else torch.float64
    fresh, fresh_optimizer, fresh_scheduler = build(7, dtype)  # other weights; another global seed below
    fresh_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2) if amp else None
    assert not equal_states(fresh.state_dict(), model.state_dict())
    seed_everything(99)
    resumed = accumlib.train(
        fresh,
        DATA[data](dtype),
        fresh_optimizer,
        scheduler=fresh_scheduler,
        scaler=fresh_scaler,
        checkpoint=path,
        **options(data, amp),
    )
    assert len(history) == STEPS
    assert stable_records(resumed) == stable_records(history)
    assert equal_states(fresh.state_dict(), model.state_dict())
    assert equal_states(fresh_optimizer.state_dict(), optimizer.state_dict())
    assert fresh_scheduler.state_dict() == scheduler.state_dict()
    if amp:
        assert fresh_scaler.state_dict() == scaler.state_dict()
        assert scaler.get_scale() != 2.0**10  # the scale has moved: the scaler's state matters
    assert torch.load(path, weights_only=True)["step"] == STEPS  # written again when the run ended


@pytest.mark.parametrize("stop", [4, 5, 7])  # at the end of epoch 0, at the start of epoch 1, within epoch 1
def test_a_shuffled_loader_goes_on_bit_for_bit_across_epochs(uninterrupted, tmp_path, stop):
    """A DataLoader(shuffle=True) draws its order when each epoch starts: the file keeps the random states of
    that moment too, and the resumed run fetches and drops the epoch's cycles the stopped run took."""
    path = tmp_path / "run.pt"
    run("DataLoader", checkpoint=path, max_steps=stop)
    model, *_, history = uninterrupted["DataLoader", False]
    fresh, fresh_optimizer, fresh_scheduler = build(7)
    seed_everything(99)
    resumed = accumlib.train(
        fresh,
        DATA["DataLoader"](),
        fresh_optimizer,
        scheduler=fresh_scheduler,
        checkpoint=path,
        **options("DataLoader"),
    )
    assert stable_records(resumed) == stable_records(history)
    assert equal_states(fresh.state_dict(), model.state_dict())


def test_the_file_is_written_every_checkpoint_every_steps_and_at_the_end(tmp_path):
    """on_step runs before the step's write: it sees the file of the last multiple of checkpoint_every."""
    path = tmp_path / "run.pt"
    seen = []
    run(
        "Dataset",
        checkpoint=path,
        checkpoint_every=np.int64(2),
        max_steps=5,
        on_step=lambda record: seen.append(torch.load(path, weights_only=True)["step"] if path.exists() else None),
    )
    assert seen == [None, None, 2, 2, 4]
    assert torch.load(path, weights_only=True)["step"] == 5
    assert os.listdir(tmp_path) == ["run.pt"]  # no temporary file left


def test_a_finished_run_given_its_checkpoint_again_is_restored_without_training(uninterrupted, tmp_path):
    path = tmp_path / "run.pt"
    run("Dataset", checkpoint=path)
    model, *_, history = uninterrupted["Dataset", False]
    fresh, fresh_optimizer, fresh_scheduler = build(7)
    again = accumlib.train(
        fresh,
        Augmented(),
        fresh_optimizer,
        scheduler=fresh_scheduler,
        checkpoint=path,
        on_step=lambda record: pytest.fail("a finished run trains no step"),
        **options("Dataset"),
    )
    assert stable_records(again) == stable_records(history)
    assert equal_states(fresh.state_dict(), model.state_dict())


def test_ctrl_c_during_a_step_writes_the_checkpoint_and_the_run_goes_on_from_it(uninterrupted, tmp_path):
    """A real SIGINT during step 3's optimizer step waits for the step's end (accumlib.cycle's Ctrl-C handling);
    the run then ends with the file holding step 3."""
    path = tmp_path / "run.pt"
    model, optimizer, scheduler = build(1)
    steps = []

    def interrupt(optimizer_, args, kwargs):
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    optimizer.register_step_pre_hook(interrupt)
    seed_everything(10)
    stopped = accumlib.train(
        model, Augmented(), optimizer, scheduler=scheduler, checkpoint=path, checkpoint_every=10, **options("Dataset")
    )
    assert stopped.stopped == "KeyboardInterrupt" and len(stopped) == 3
    assert torch.load(path, weights_only=True)["step"] == 3
    fresh, fresh_optimizer, fresh_scheduler = build(7)
    resumed = accumlib.train(
        fresh, Augmented(), fresh_optimizer, scheduler=fresh_scheduler, checkpoint=path, **options("Dataset")
    )
    reference, *_, history = uninterrupted["Dataset", False]
    assert stable_records(resumed) == stable_records(history)
    assert equal_states(fresh.state_dict(), reference.state_dict())


def test_an_interrupted_write_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    """The write of step 4 is interrupted halfway through (Ctrl-C inside torch.save), and so is the write train
    tries when the interrupted run ends: the file still holds step 2, whole, and no temporary file is left."""
    path = tmp_path / "run.pt"
    save, calls = torch.save, []

    def interrupted_save(payload, file, *args, **kwargs):
        if "records" not in payload:  # train's check that the scheduler's state can be stored, before the run
            return save(payload, file, *args, **kwargs)
        calls.append(payload["step"])
        if len(calls) == 1:
            return save(payload, file, *args, **kwargs)
        file.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        run("Dataset", checkpoint=path, checkpoint_every=2)
    monkeypatch.undo()
    assert calls == [2, 4, 4]
    assert os.listdir(tmp_path) == ["run.pt"]
    assert torch.load(path, weights_only=True)["step"] == 2


def test_a_failed_last_write_raises_with_the_records_and_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "run.pt"
    write = checkpoints._write_atomically

    def disk_full(path_, payload):
        if payload["step"] == STEPS:
            raise OSError(28, "No space left on device")
        write(path_, payload)

    monkeypatch.setattr(checkpoints, "_write_atomically", disk_full)
    with pytest.raises(OSError, match="No space left") as failure:
        run("Dataset", checkpoint=path, checkpoint_every=5)
    assert len(failure.value.history) == STEPS
    assert torch.load(path, weights_only=True)["step"] == 10 and os.listdir(tmp_path) == ["run.pt"]


def flip_a_byte(path):
    """One bit pattern changed in the middle of the file's largest tensor (torch.load alone would load it)."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        largest = max(archive.infolist(), key=lambda info: info.file_size)
        record = archive.read(largest)
    data = bytearray(path.read_bytes())
    data[data.find(record) + len(record) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


class Payload:
    """A pickle that would create a file when loaded (the marker's path) if anything unpickled it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def code_running_checkpoint(path):
    saved = torch.load(path, weights_only=True)
    saved["records"] = Payload(path.parent / "ran")
    torch.save(saved, path)


def code_running_pickle(path):
    path.write_bytes(pickle.dumps(Payload(path.parent / "ran")))


CHANGES = {  # (how the file or the run differs, what the refusal must name)
    "damaged": (flip_a_byte, {}, ["damaged", "checksum"]),
    "truncated": (truncate, {}, ["damaged, truncated"]),
    "a code-running torch file": (code_running_checkpoint, {}, ["weights_only=True", "none of their code ran"]),
    "a code-running plain pickle": (code_running_pickle, {}, ["not a file torch.save wrote"]),
    "another model": (None, dict(hidden=9), ["'0.weight'", "(9, 5)", "(8, 5)"]),
    "another optimizer": (None, dict(optimizer=torch.optim.AdamW), ["torch.optim.adam.Adam", "AdamW"]),
    "another accum_steps": (None, dict(accum_steps=2), ["accum_steps is 3 in the file, 2 here"]),
    "another micro_batch_size": (None, dict(micro_batch_size=5), ["micro_batch_size is 4 in the file, 5 here"]),
    "another seed": (None, dict(seed=4), ["seed is 3 in the file, 4 here"]),
    "another normalize": (None, dict(normalize="steps"), ["normalize is 'samples' in the file, 'steps' here"]),
    "another loss_reduction": (None, dict(loss_reduction="sum"), ["loss_reduction is 'mean' in the file, 'sum' here"]),
    "no scheduler": (None, dict(scheduler=False), ["scheduler is torch.optim.lr_scheduler.StepLR in the file, None"]),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_bad_or_foreign_file_is_refused_naming_it_with_nothing_changed(tmp_path, change):
    path = tmp_path / "run.pt"
    run("Dataset", checkpoint=path, max_steps=3)
    spoil, differs, names = CHANGES[change]
    if spoil is not None:
        spoil(path)
    before = path.read_bytes()
    torch.manual_seed(7)
    hidden = differs.pop("hidden", 8)
    model = nn.Sequential(nn.Linear(5, hidden), nn.Dropout(0.3), nn.ReLU(), nn.Linear(hidden, 3)).double()
    optimizer = differs.pop("optimizer", torch.optim.Adam)(model.parameters(), lr=0.01)
    scheduler = None if differs.pop("scheduler", True) is False else torch.optim.lr_scheduler.StepLR(optimizer, 2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    seed_everything(5)
    randoms = random_states()
    with pytest.raises(ValueError) as refusal:
        accumlib.train(
            model, Augmented(), optimizer, scheduler=scheduler, checkpoint=path, **{**options("Dataset"), **differs}
        )
    message = str(refusal.value)
    assert repr(str(path)) in message and "nothing was changed" in message
    for name in names:
        assert name in message, (name, message)
    assert equal_states(model.state_dict(), weights) and not optimizer.state
    assert scheduler is None or scheduler.last_epoch == 0
    assert same_random_states(random_states(), randoms)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["run.pt"]  # nothing ran: no "ran" file
    if "code-running" in change:  # the control: unpickled, the file does run its code
        if change.endswith("plain pickle"):
            pickle.loads(path.read_bytes())  # noqa: S301 (the point: it runs code)
        else:
            torch.load(path, weights_only=False)
        assert (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    "checkpoint, every, error, names",
    [
        (123, None, TypeError, ["checkpoint", "123", "str or a pathlib.Path"]),
        (b"run.pt", None, TypeError, ["checkpoint", "b'run.pt'"]),
        ("", None, TypeError, ["checkpoint", "''"]),
        ("{missing}/run.pt", None, ValueError, ["checkpoint", "does not exist"]),
        ("{folder}", None, ValueError, ["checkpoint", "is a folder", "run.pt"]),
        ("{folder}/run.pt", 0, ValueError, ["checkpoint_every", "positive integer", "0"]),
        ("{folder}/run.pt", 1.5, TypeError, ["checkpoint_every", "1.5"]),
        ("{folder}/run.pt", True, TypeError, ["checkpoint_every", "True"]),
        (None, 2, ValueError, ["checkpoint_every=2", "without checkpoint"]),
    ],
)
def test_bad_checkpoint_arguments_are_refused_by_name_before_anything_runs(tmp_path, checkpoint, every, error, names):
    if isinstance(checkpoint, str):
        checkpoint = checkpoint.format(folder=tmp_path, missing=tmp_path / "missing")
    model, optimizer, _ = build(1)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error) as refusal:
        accumlib.train(
            model, Augmented(), optimizer, checkpoint=checkpoint, checkpoint_every=every, **options("Dataset")
        )
    for name in names:
        assert name in str(refusal.value), (name, str(refusal.value))
    assert equal_states(model.state_dict(), weights) and os.listdir(tmp_path) == []


def test_a_file_past_the_run_s_end_is_refused_with_nothing_changed(tmp_path):
    path = tmp_path / "run.pt"
    run("Dataset", checkpoint=path, max_steps=5)
    before = path.read_bytes()
    model, optimizer, scheduler = build(7)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="holds 5 optimizer steps, more than the 3 of this run"):
        accumlib.train(
            model, Augmented(), optimizer, scheduler=scheduler, checkpoint=path, max_steps=3, **options("Dataset")
        )
    assert equal_states(model.state_dict(), weights) and not optimizer.state and path.read_bytes() == before


def test_resume_from_step_with_a_checkpoint_is_refused(tmp_path):
    model, optimizer, _ = build(1)
    with pytest.raises(ValueError, match="resume_from_step=2 was given with checkpoint"):
        accumlib.train(
            model, Augmented(), optimizer, checkpoint=tmp_path / "run.pt", resume_from_step=2, **options("Dataset")
        )


class Schedule:
    """An lr_lambda object: LambdaLR's state_dict() keeps its attributes, here an object weights_only cannot load."""

    def __init__(self):
        self.helper = Payload("unused")

    def __call__(self, step):
        return 0.9**step


def test_a_state_that_a_checkpoint_cannot_hold_is_refused_before_the_run(tmp_path):
    model, optimizer, _ = build(1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule())
    with pytest.raises(ValueError, match="the scheduler's state_dict\\(\\) holds something a checkpoint cannot"):
        accumlib.train(
            model, Augmented(), optimizer, scheduler=scheduler, checkpoint=tmp_path / "run.pt", **options("Dataset")
        )
    assert os.listdir(tmp_path) == [] and not optimizer.state


def test_the_refusal_speaks_hindi(tmp_path):
    path = tmp_path / "run.pt"
    run("Dataset", checkpoint=path, max_steps=1)
    truncate(path)
    model, optimizer, scheduler = build(1)
    accumlib.set_language("hi")
    try:
        with pytest.raises(ValueError) as refusal:
            accumlib.train(model, Augmented(), optimizer, scheduler=scheduler, checkpoint=path, **options("Dataset"))
    finally:
        accumlib.set_language("en")
    assert repr(str(path)) in str(refusal.value)
    assert any("\u0900" <= c <= "\u097f" for c in str(refusal.value))  # Devanagari


WORKER = """
import gc, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, sys.argv[1])
import accumlib, test_checkpoint as t

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, path = dist.get_rank(), os.path.join(sys.argv[2], "ddp.pt")


def data(kind):
    if kind == "Dataset":
        return t.Augmented()
    sampler = torch.utils.data.DistributedSampler(t.Augmented(), shuffle=True, seed=2)  # this process's share
    return torch.utils.data.DataLoader(t.Augmented(), batch_size=4, sampler=sampler)


def run(kind, seed, **extra):
    model, optimizer, scheduler = t.build(seed)
    t.seed_everything(10 + rank)  # each process draws its own Dropout masks and noise: each one's states are kept
    history = accumlib.train(DistributedDataParallel(model), data(kind), optimizer, scheduler=scheduler,
                             **t.options(kind), **extra)
    return model, optimizer, history


try:
    results = {}
    for kind in ("Dataset", "DataLoader"):
        path = os.path.join(sys.argv[2], f"{kind}.pt")
        model, optimizer, history = run(kind, 1)
        stopped = run(kind, 1, checkpoint=path, max_steps=3)[2]
        resumed, resumed_optimizer, again = run(kind, 7, checkpoint=path)  # its own seeding is overridden
        results[kind] = dict(stopped=len(stopped), steps=len(history),
                             records=t.stable_records(again) == t.stable_records(history),
                             weights=t.equal_states(resumed.state_dict(), model.state_dict()),
                             optimizer=t.equal_states(resumed_optimizer.state_dict(), optimizer.state_dict()))
    torch.save(results, os.path.join(sys.argv[2], f"result{rank}.pt"))
finally:
    gc.collect()  # DDP's reducer sits in reference cycles: freed before the process group (no abort at exit)
    dist.destroy_process_group()
"""


@pytest.mark.slow  # two processes
def test_two_ddp_processes_go_on_bit_for_bit_and_another_number_of_processes_is_refused(tmp_path):
    """Two gloo processes, each drawing its own random numbers, training on (X, y) split by train and on loaders
    of their own (a DistributedSampler each, augmenting in the main process): process 0 writes the file with both
    processes' random states, both read it, and both end with the uninterrupted run's weights and records. One
    process refuses the file, naming the number of processes."""
    from test_pipeline import run_on_two_processes

    run_on_two_processes(WORKER, tmp_path, str(tmp_path), timeout=240)
    for rank in range(2):
        results = torch.load(tmp_path / f"result{rank}.pt", weights_only=True)
        assert results["Dataset"] == dict(stopped=3, steps=6, records=True, weights=True, optimizer=True), rank
        # 20 samples per process in batches of 4: 5 batches, 2 steps an epoch (3 + 2 batches); stopped in epoch 1,
        # whose first step's batches the resumed run fetches (augmenting them) and drops
        assert results["DataLoader"] == dict(stopped=3, steps=6, records=True, weights=True, optimizer=True), rank
    path = tmp_path / "Dataset.pt"
    assert torch.load(path, weights_only=True)["step"] == 6
    model, optimizer, scheduler = build(1)
    with pytest.raises(ValueError, match="processes is 2 in the file, 1 here"):
        accumlib.train(model, Augmented(), optimizer, scheduler=scheduler, checkpoint=path, **options("Dataset"))


def docs_code():
    """The Python blocks of docs/checkpoints.md, in order."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_the_docs_first_example_writes_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    model, optimizer, scheduler = build(1)
    namespace = dict(accumlib=accumlib, model=model, data=Augmented(), optimizer=optimizer, scheduler=scheduler)
    exec(docs_code()[0], namespace)
    assert torch.load("runs/digits.pt", weights_only=True)["step"] == len(namespace["history"]) == 6


class Plain(torch.utils.data.Dataset):
    """X, Y as they are: a Dataset that draws no random number."""

    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        return X[i], Y[i]


def shuffled_loader(dataset, workers=0):
    return torch.utils.data.DataLoader(
        dataset, batch_size=4, shuffle=True, num_workers=workers, generator=torch.Generator().manual_seed(5)
    )


RECIPES = {  # the data, built afresh for each run, and train's options
    "an augmenting Dataset": (Augmented, options("Dataset")),
    "a seeded DataLoader": (lambda: shuffled_loader(Plain()), options("DataLoader")),
    "a seeded DataLoader augmenting in its worker": (
        lambda: shuffled_loader(Augmented(), workers=1),
        options("DataLoader"),
    ),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_docs_resume_from_step_recipe_is_bit_for_bit(recipe):
    """The docs' own code, run as written: stopped at step 3, resumed under another global seed into a model built
    afresh (other initial weights), it ends on the uninterrupted run's weights and records."""
    make, train_options = RECIPES[recipe]
    helpers, usage = docs_code()[1:3]
    stopping, resuming = usage.split("# later:")
    reference, reference_optimizer, reference_scheduler = build(1)
    seed_everything(10)
    history = accumlib.train(reference, make(), reference_optimizer, scheduler=reference_scheduler, **train_options)
    namespace = dict(accumlib=accumlib, options=train_options)
    exec(helpers, namespace)
    model, optimizer, scheduler = build(1)
    seed_everything(10)
    exec(
        stopping,
        {**namespace, "model": model, "optimizer": optimizer, "scheduler": scheduler, "data": make()},
        namespace,
    )
    model, optimizer, scheduler = build(7)
    seed_everything(99)
    namespace.update(model=model, optimizer=optimizer, scheduler=scheduler, data=make())
    exec("# later:" + resuming, namespace)
    assert stable_records(namespace["history"]) + stable_records(namespace["rest"]) == stable_records(history)
    assert equal_states(model.state_dict(), reference.state_dict())


def test_skipped_steps_in_a_row_are_counted_across_the_stop(tmp_path):
    """max_skipped_steps=3: steps 2 and 3 are skipped (NaN inputs) before the stop, so the resumed run raises
    NonFiniteError at step 4, as the uninterrupted run does."""
    nan = X.clone()
    nan[12:] = float("nan")  # step 1 (samples 0-11) is finite, every later step skipped
    settings = dict(micro_batch_size=4, accum_steps=3, epochs=3, shuffle=False, device="cpu", max_skipped_steps=3)
    model, optimizer, _ = build(1)
    with pytest.raises(accumlib.NonFiniteError) as uninterrupted:
        accumlib.train(model, (nan, Y), optimizer, **settings)
    assert len(uninterrupted.value.history) == 4
    path = tmp_path / "run.pt"
    model, optimizer, _ = build(1)
    accumlib.train(model, (nan, Y), optimizer, checkpoint=path, max_steps=3, **settings)
    model, optimizer, _ = build(1)
    with pytest.raises(accumlib.NonFiniteError) as resumed:
        accumlib.train(model, (nan, Y), optimizer, checkpoint=path, **settings)

    def steps(history):
        return [(r.step, r.samples_seen, r.skipped) for r in history]  # (a NaN loss equals no other NaN)

    assert (
        steps(resumed.value.history)
        == steps(uninterrupted.value.history)
        == [(1, 12, False)] + [(2, 24, True), (3, 36, True), (4, 40, True)]
    )


class SideFile(checkpoint_parts.WholeState):
    """A model-and-optimizer form of its own, as a sharded one would be: the states in a file of their own beside
    the checkpoint, which names it."""

    def state(self, model, optimizer):
        side = model.side  # the folder or file a sharded form would write
        torch.save(super().state(model, optimizer), side)
        return {"side": side}

    def problem(self, saved):
        return None if isinstance(saved.get("side"), str) else "'side'"

    def load(self, model, optimizer, saved):
        super().load(model, optimizer, torch.load(saved["side"], weights_only=True))


def test_the_model_and_optimizer_part_is_a_seam_another_form_plugs_into(uninterrupted, tmp_path, monkeypatch):
    """accumlib.checkpoint.Checkpoint reaches the model's and optimizer's states only through its `parts`
    (WholeState's methods): a form that keeps them elsewhere resumes bit for bit too."""
    monkeypatch.setattr(checkpoint_parts, "WholeState", SideFile)  # the form _parts chooses for a model
    path = tmp_path / "run.pt"
    model, optimizer, scheduler = build(1)
    model.side = str(tmp_path / "side")
    seed_everything(10)
    accumlib.train(
        model, Augmented(), optimizer, scheduler=scheduler, checkpoint=path, max_steps=3, **options("Dataset")
    )
    assert "model" not in torch.load(path, weights_only=True)
    fresh, fresh_optimizer, fresh_scheduler = build(7)
    fresh.side = model.side
    resumed = accumlib.train(
        fresh, Augmented(), fresh_optimizer, scheduler=fresh_scheduler, checkpoint=path, **options("Dataset")
    )
    reference, *_, history = uninterrupted["Dataset", False]
    assert stable_records(resumed) == stable_records(history)
    assert equal_states(fresh.state_dict(), reference.state_dict())
