"""What accumulation costs, and what accumlib adds on top: one run, ratios measured side by side.

    .venv/bin/python benchmarks/run.py            # prints the tables, writes benchmarks/results.json
    .venv/bin/python benchmarks/run.py --quick    # 2 epochs of adjacent steps, 5 rounds, no nbval suite
    .venv/bin/python benchmarks/run.py --quick --epochs 10 --rounds 31   # the full measurements, no nbval suite
    .venv/bin/python benchmarks/run.py --section 1   # section 1 alone (the overhead table): printed, and stored in
                                                     # benchmarks/results.json in place of the stored run's section 1

accumlib's overhead is measured step by step: train's on_step runs a hand-written step (and a second one, and an
Accelerate step) on twin models right after each of its own optimizer steps, in alternating order, so every pair
of adjacent steps sees the machine alike; the table gives the median ratio and its interquartile range. (Whole
epochs in paired rounds, tried first, drift too much on a shared 2-core machine: a loop against itself moved by
+-5%.) The fixed cost with a trivial model still compares whole epochs, in ABBA order. On the CPU a time is the CPU
time of this process (time.process_time) at one thread: other programs on the machine inflate it less than wall
time. On CUDA it is wall time after a synchronize.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import accumlib
from accumlib import batches, cycle, interrupts, loss_weights, memory, restore, sharded, source
from accumlib.timing import HostReads
from accumlib.lessons import data, ddp_lab, models, widgets

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbval_suites  # noqa: E402  (benchmarks/nbval_suites.py: the notebook suite before and after the Hindi edition)

ROOT = Path(__file__).resolve().parents[1]
ACCUM_STEPS = (1, 2, 4, 8, 16)
EFFECTIVE_BATCH = 64
UNCHECKED = "check_gradients=False"  # section 1's column of accumlib.train(..., check_gradients=False)
CHECKED = "hand-written, checked"  # section 1's column of the hand-written step with accumlib's finite check


def hand_written_step(model, optimizer, X, y, idx, m, k):
    """One optimizer step of the six-line recipe: k micro-batches of m samples of X[idx], loss / k, one step."""
    for part in idx.split(m):
        loss = torch.nn.functional.cross_entropy(model(X[part]), y[part]) / k
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def checked_step(model, optimizer, X, y, idx, m, k):
    """The six-line recipe with accumlib's finite check written into it: the cycle's loss and its gradients' norm
    read in one transfer after the last backward(), the step taken only when both are finite. What the check costs a
    loop of one's own, measured beside accumlib's (whose default is this check)."""
    total = None
    for part in idx.split(m):
        loss = torch.nn.functional.cross_entropy(model(X[part]), y[part]) / k
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    norms = torch._foreach_norm(
        [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    )
    loss, *norms = torch.stack([total, *norms]).tolist()
    if math.isfinite(loss) and math.isfinite(math.hypot(*norms)):
        optimizer.step()
    optimizer.zero_grad()


def accelerate_step(accelerator, model, optimizer, X, y, idx, m):
    """One optimizer step with Hugging Face Accelerate's accumulate() on the same micro-batches."""
    for part in idx.split(m):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(X[part]), y[part])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def hand_written(model, X, y, optimizer, m, k, generator):
    """The six-line recipe over one epoch: the baseline accumlib is measured against."""
    for idx in torch.randperm(len(X), generator=generator).split(m * k):
        hand_written_step(model, optimizer, X, y, idx, m, k)


def with_accelerate(model, X, y, optimizer, m, k, generator):
    """Accelerate's accumulate() over one epoch."""
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=k, cpu=X.device.type == "cpu")
    model, optimizer = accelerator.prepare(model, optimizer)
    for idx in torch.randperm(len(X), generator=generator).split(m * k):
        accelerate_step(accelerator, model, optimizer, X, y, idx, m)


def with_accumlib(measure_memory):
    def run(model, X, y, optimizer, m, k, generator):
        accumlib.train(
            model,
            (X, y),
            optimizer,
            micro_batch_size=m,
            accum_steps=k,
            seed=int(generator.initial_seed()),
            measure_memory=measure_memory,
            device=X.device,
        )

    return run


def clock(device: torch.device) -> float:
    """Seconds: this process's CPU time on the CPU; wall time, once the device has finished, on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return time.process_time()


def step_seconds(loops: dict, build, X, y, m: int, k: int, rounds: int) -> dict[str, list[float]]:
    """Each loop's seconds per optimizer step, one epoch of (X, y) per round on a fresh build(), rounds interleaved
    in alternating order (ABBA: no loop always runs first); a first round warms up and is not counted.

    len(X) must be a multiple of m * k, so every loop does the same work (the six-line recipe skips a last,
    incomplete cycle).
    """
    steps = len(X) // (m * k)
    times = {name: [] for name in loops}
    for repeat in range(rounds + 1):
        order = list(loops.items())
        for name, train_loop in order if repeat % 2 else order[::-1]:
            model = build().to(X.device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            started = clock(X.device)
            train_loop(model, X, y, optimizer, m, k, torch.Generator().manual_seed(repeat))
            if repeat:
                times[name].append((clock(X.device) - started) / steps)
    return times


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


# section 1's models: the CNN (a step of a few ms) and the issue's small MLP (a step of about 0.5 ms, where what a
# step adds weighs most); each builds its model from a seed and takes the digits as its data
MODELS = {
    "CNN": (lambda: models.cnn(seed=0), lambda: data.digits(1792)),
    "MLP": (lambda: models.mlp(hidden=128, seed=0), lambda: data.digits(1792, flat=True)),
}


HAND_WRITTEN_TWINS = ("hand-written", "hand-written again")  # the twins of section 1's pairs, by default


def adjacent_steps(
    device: torch.device,
    k: int,
    epochs: int,
    accelerate: bool,
    model_name: str = "CNN",
    twins_asked: tuple[str, ...] = HAND_WRITTEN_TWINS,
    **train_options,
) -> dict[str, list[float]]:
    """Per optimizer step of accumlib.train (after the first; with train_options), its time over that of a
    hand-written step taken right after it; likewise each other twin of `twins_asked` (after "hand-written", the
    base: "hand-written again", a second hand-written step, the machine's noise in an A/A comparison; CHECKED, the
    hand-written step with accumlib's finite check) and an Accelerate step.

    train's on_step runs the other loops' steps on twin models (the same CNN, the same micro-batch sizes), in an
    order that alternates from step to step, so each pair of steps sees the machine alike. accumlib's step is the
    time from the end of one on_step to the start of the next: the whole driver, fetching included.
    """
    build, digits = MODELS[model_name]
    X, y = (t.to(device) for t in digits())
    m = EFFECTIVE_BATCH // k
    batches = torch.randperm(len(X), generator=torch.Generator().manual_seed(1)).split(EFFECTIVE_BATCH)
    steps = {"hand-written": hand_written_step, "hand-written again": hand_written_step, CHECKED: checked_step}
    twins = {}
    for name in twins_asked:
        model = build().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        twins[name] = functools.partial(steps[name], model, optimizer, X, y, m=m, k=k)
    if accelerate:
        from accelerate import Accelerator

        accelerator = Accelerator(gradient_accumulation_steps=k, cpu=device.type == "cpu")
        model = build().to(device)
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05))
        twins["accelerate"] = functools.partial(accelerate_step, accelerator, model, optimizer, X, y, m=m)
    times = {name: [] for name in ["accumlib", *twins]}
    last = []

    def on_step(record):
        now = clock(device)
        taken = {"accumlib": now - last[-1]} if last else {}
        names = list(twins) if record.step % 2 else list(twins)[::-1]
        for name in names:
            started = clock(device)
            twins[name](batches[record.step % len(batches)])
            taken[name] = clock(device) - started
        if last:
            for name, seconds in taken.items():
                times[name].append(seconds)
        last.append(clock(device))

    model = build().to(device)
    accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=m,
        accum_steps=k,
        epochs=epochs,
        on_step=on_step,
        device=device,
        **train_options,
    )
    base = times.pop("hand-written")
    return {name: [a / b for a, b in zip(t, base, strict=True)] for name, t in times.items()} | {
        "hand-written seconds": base,
        **{
            f"{name} seconds over hand-written": [a - b for a, b in zip(times[name], base, strict=True)]
            for name in ("accumlib", CHECKED)
            if name in times
        },
    }


def traced_cycle_cost(device: torch.device, k: int = 4) -> tuple[int, float]:
    """measure_memory=True on one epoch at (64 / k, k): how many cycles were traced, and a traced cycle's wall time
    over the median cycle's."""
    X, y = (t.to(device) for t in data.digits(1792))
    model = models.cnn(seed=0).to(device)
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=EFFECTIVE_BATCH // k,
        accum_steps=k,
        measure_memory=True,
        device=device,
    )
    seconds = [r.seconds for r in history]
    traced = 1 if device.type == "cpu" else len(seconds)  # one layout here: every cycle has k full micro-batches
    return traced, seconds[0] / statistics.median(seconds)


def host_reads(loops: dict, device: torch.device) -> dict[int, dict]:
    """Per accum_steps: each loop's host reads per optimizer step over one epoch, and accumlib's reads between
    the micro-batches of a cycle (per micro-batch), counted with a TorchFunctionMode."""
    X, y = (t.to(device) for t in data.digits(1792))
    table = {}
    for k in ACCUM_STEPS:
        m, steps = EFFECTIVE_BATCH // k, len(X) // EFFECTIVE_BATCH
        row = {}
        for name, train_loop in loops.items():
            model = models.cnn(seed=0).to(device)
            with HostReads() as reads:
                train_loop(model, X, y, torch.optim.SGD(model.parameters(), lr=0.05), m, k, torch.Generator())
            row[name] = reads.count / steps
        at_micro_batch = []

        def counting_loss(output, target, *, at_micro_batch=at_micro_batch):  # called in this iteration's train
            at_micro_batch.append(reads.count)
            return torch.nn.functional.cross_entropy(output, target)

        model = models.cnn(seed=0).to(device)
        with HostReads() as reads:
            accumlib.train(
                model,
                (X, y),
                torch.optim.SGD(model.parameters(), lr=0.05),
                micro_batch_size=m,
                accum_steps=k,
                loss_fn=counting_loss,
                device=device,
            )
        inside = sum(b - a for i, (a, b) in enumerate(itertools.pairwise(at_micro_batch)) if (i + 1) % k)
        row["accumlib, between micro-batches"] = inside / len(at_micro_batch)
        table[k] = row
    return table


def fixed_cost_microseconds(loops: dict, rounds: int, device: torch.device) -> dict[str, float]:
    """Median microseconds per step (8 x 4) with a trivial Linear(4, 2): what is left is the loops' bookkeeping."""
    X = torch.randn(1792, 4, generator=torch.Generator().manual_seed(0)).to(device)
    y = (X[:, 0] > 0).long()
    times = step_seconds(loops, lambda: torch.nn.Linear(4, 2), X, y, 8, 4, rounds)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def accumlib_extras_microseconds(device: torch.device, repeats: int = 200) -> dict[str, float]:
    """What accumlib's cycle does per optimizer step that the hand-written loop does not, at accum_steps 1 on the
    MLP of section 1b, each piece (the library's own code) timed alone right after a forward and backward pass of the
    MLP at micro-batch 64 (as in a real step: caches hold the pass, not this code), in microseconds: the median over
    `repeats`, less that of timing nothing. On the CPU a piece is timed by the wall clock (time.perf_counter), not
    this process's CPU time as section 1 is: reading that is a system call, which for pieces of a few microseconds
    costs more than they do and leaves the caches colder."""
    build, digits = MODELS["MLP"]
    X, y = (t[:64].to(device) for t in digits())
    model = build().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    params = list(model.parameters())
    checked, unchecked = accumlib.CycleOptions(), accumlib.CycleOptions(check_gradients=False)
    indexed = source._Indexed(source._Samples((X, y)), 64, 1, 1, 0, 0, False, device, [])
    order = [torch.arange(64)]  # the cycle's one micro-batch of indices, as the sample order gives it

    stepped = restore._Kept.__new__(restore._Kept)  # a cycle's kept .grad at its step: stepped() zeroes
    stepped.optimizer, stepped.params = optimizer, params

    def unit():  # Ctrl-C held around the step (train's run has installed the handler: STEP.run() below)
        with interrupts.STEP.unit() as step:
            step.result = None

    pieces = {
        "nothing": lambda loss: None,
        "set-up: the parameters, alone or DDP/FSDP2, which micro-batches run": lambda loss: (
            [p for group in optimizer.param_groups for p in group["params"]],
            cycle._runs([1.0], sharded.cycle_sync(model, True)),
        ),
        "set aside: the .grad found, the buffers a forward changes (restore._Kept)": lambda loss: restore._Kept(
            model, optimizer, params
        ),
        "the micro-batch: its loss detached, the cycle's total (cycle._weighted)": lambda loss: cycle._weighted(
            loss, 1.0, None, None, False
        ),
        "the one host read: the loss and the gradient norm (cycle._read, the default check)": lambda loss: cycle._read(
            optimizer, params, loss.detach(), checked, None
        ),
        "  of which the loss alone (cycle._read with check_gradients=False)": lambda loss: cycle._read(
            optimizer, params, loss.detach(), unchecked, None
        ),
        "Ctrl-C held around the step (interrupts.STEP.unit, in a run)": lambda loss: unit(),
        "zeroing in place": lambda loss: stepped.stepped(),
        "torch's zero_grad": lambda loss: optimizer.zero_grad(),
        "loss weights, micro-batch view (Python)": lambda loss: (
            loss_weights._loss_weights("samples", "mean", [64], 64, 1, 1),
            batches._MicroBatches(order, indexed.samples.fetch, indexed.moved_to),
        ),
        "the cycle's result and the step's record (frozen dataclasses)": lambda loss: (
            accumlib.CycleResult(0.0, 0.0, 0.05, False),
            accumlib.StepRecord(1, 0, 64, 1, 64, 0.0, 0.0, 0.0, 1.0, None),
        ),
    }
    timer = time.perf_counter if device.type == "cpu" else functools.partial(clock, device)
    times = {name: [] for name in pieces}
    with interrupts.STEP.run():
        for repeat in range(repeats):
            for name, piece in list(pieces.items()) if repeat % 2 else list(pieces.items())[::-1]:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(X), y)
                loss.backward()
                started = timer()
                piece(loss)
                times[name].append(timer() - started)
    nothing = statistics.median(times.pop("nothing"))
    extras = {name: (statistics.median(t) - nothing) * 1e6 for name, t in times.items()}
    # the hand-written loop zeroes too: accumlib's zeroing (every .grad None without torch's profiler label)
    # adds only what it takes over torch's zero_grad()
    in_place, torchs = extras.pop("zeroing in place"), extras.pop("torch's zero_grad")
    extras["zeroing (.grad None in place, less the hand-written loop's zero_grad())"] = in_place - torchs
    return extras


def ddp_job_seconds() -> float:
    """Wall seconds of lesson 9's DDP job: compare_no_sync with 2 processes, 100 digits, 4 x 3 x 2, 2 epochs."""
    X, y = data.digits(100, flat=True, dtype=torch.float64)
    started = time.perf_counter()
    ddp_lab.compare_no_sync(
        functools.partial(models.mlp, dtype=torch.float64), (X, y), micro_batch_size=4, accum_steps=3, epochs=2
    )
    return time.perf_counter() - started


def accumulation_cost(repeats: int, device: torch.device) -> list[dict]:
    X, y = data.digits()
    rows = []
    for k in ACCUM_STEPS:
        m = EFFECTIVE_BATCH // k
        timing = accumlib.time_config(
            models.cnn(), (X, y), micro_batch_size=m, accum_steps=k, warmup=3, repeats=repeats, device=device
        )
        peak = memory.measure_step(models.cnn(), X[:m], y[:m], accum_steps=k, device=device)
        rows.append(
            {
                "accum_steps": k,
                "micro_batch_size": m,
                "seconds": timing.seconds_per_step,
                **{f"{name}_bytes": value for name, value in peak.categories().items()},
                "peak_bytes": peak.peak,
            }
        )
    for row in rows:
        row["time_ratio"] = row["seconds"] / rows[0]["seconds"]
        row["peak_ratio"] = row["peak_bytes"] / rows[0]["peak_bytes"]
    return rows


def responsiveness(changes: int, rounds: int = 3) -> dict[str, float]:
    """Median seconds from a control's change to the dashboard's final figure: what a learner waits for.

    Each round shows a fresh dashboard (its first run, in the cell, is not counted), then changes its controls one at
    a time, as a learner would, each to a setting not seen before in that round (so nothing the change affects
    comes from a cache), waiting for the final figure after each: `changes` changes per round. The time of a change
    runs from the control's new value to the last figure assigned to the figure area (dashboard.runs[-1].seconds),
    rendering included. The median is over every change of every round.
    """
    import contextlib  # here, not at the top: this function is the dashboards' part of the file
    import io

    plan = {
        widgets.LossDashboard: [
            ("accum_steps", 2),
            ("micro_batch_size", 4),
            ("accum_steps", 6),
            ("forget_division", True),
            ("micro_batch_size", 16),
            ("accum_steps", 3),
            ("batchnorm", True),
        ],
        widgets.MemoryDashboard: [
            ("accum_steps", 2),
            ("micro_batch_size", 4),
            ("accum_steps", 6),
            ("budget", 1.0),
            ("micro_batch_size", 16),
            ("accum_steps", 3),
            ("micro_batch_size", 2),
        ],
        widgets.BatchNormDashboard: [
            ("accum_steps", 2),
            ("micro_batch_size", 4),
            ("accum_steps", 6),
            ("micro_batch_size", 16),
            ("accum_steps", 3),
            ("micro_batch_size", 2),
            ("accum_steps", 8),
        ],
    }
    result = {}
    for cls, steps in plan.items():
        seconds = []
        for _ in range(rounds):
            dashboard = cls()
            with contextlib.redirect_stdout(io.StringIO()):
                dashboard.show()
            for name, value in steps[:changes]:
                switches = getattr(dashboard, "switches", {})
                (switches[name] if name in switches else getattr(dashboard, name)).value = value
                dashboard.wait()
                seconds.append(dashboard.runs[-1].seconds)
        result[cls.__name__] = statistics.median(seconds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds (unless --rounds), no nbval suite")
    parser.add_argument("--rounds", type=int, help="paired rounds of the fixed cost (default 31, --quick 5)")
    parser.add_argument("--epochs", type=int, help="epochs of adjacent steps per accum_steps (default 10, --quick 2)")
    parser.add_argument(
        "--section",
        type=int,
        choices=[1],
        help="run this section alone, print it and store it in benchmarks/results.json in place of "
        "the stored run's (the other sections are left as they are)",
    )
    args = parser.parse_args()
    rounds = args.rounds or (5 if args.quick else 31)
    epochs = args.epochs or (2 if args.quick else 10)
    torch.set_num_threads(1)  # one thread: CPU time is the loop's work, with no idle-spinning second thread in it
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    machine = (
        f"{platform.machine()}, {torch.get_num_threads()} thread, torch {torch.__version__}, "
        f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU only'}"
    )
    print(f"machine: {machine}\n")
    results, load = {"machine": machine}, os.getloadavg()  # the machine's load (1, 5, 15 min) as the run starts
    for device in devices:
        results[device.type] = measure(device, rounds, epochs, quick=args.quick, only_first=args.section == 1)
    if args.section:  # the stored run's other sections kept; which run section 1 comes from, said with it
        path = ROOT / "benchmarks" / "results.json"
        stored = json.loads(path.read_text()) if path.exists() else {}
        for device in devices:
            stored.setdefault(device.type, {}).update(results[device.type])
        stored["section_1_run"] = {
            "machine": machine,
            "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "load_average_at_start": list(load),
            "load_average_at_end": list(os.getloadavg()),
        }
        path.write_text(json.dumps(stored, indent=2) + "\n")
        print("\nsection 1 alone: stored in benchmarks/results.json (section_1_run); the other sections as they were")
        return
    (ROOT / "benchmarks" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\nwritten: benchmarks/results.json")


def overhead_table(device: torch.device, epochs: int, accelerate: bool, model_name: str, number: str) -> dict:
    """Section 1 for one of `MODELS`: printed, and returned by accum_steps (quartiles of each ratio, the median
    hand-written step and the median microseconds accumlib's step takes over the hand-written one beside it)."""
    pairs = {}
    for k in ACCUM_STEPS:
        pairs[k] = adjacent_steps(device, k, epochs, accelerate, model_name)
        # the same, without the gradient norm of the finite check: what that check costs, measured in place
        pairs[k][UNCHECKED] = adjacent_steps(device, k, epochs, False, model_name, check_gradients=False)["accumlib"]
        # the hand-written step with the same check, beside a hand-written one (two twins, as above): the check's cost
        checked = adjacent_steps(device, k, epochs, False, model_name, ("hand-written", CHECKED))
        pairs[k][CHECKED] = checked[CHECKED]
        pairs[k]["checked seconds over hand-written"] = checked[f"{CHECKED} seconds over hand-written"]
    compared = [name for name in pairs[1] if not name.endswith("seconds") and "over" not in name]
    count = len(pairs[1]["accumlib"])
    print(f"{number}. time of an optimizer step over the hand-written step taken right after it, {model_name} on 1,792")
    print(f"   digits, effective batch {EFFECTIVE_BATCH}: median (interquartile range) over {count} pairs of adjacent")
    print("   steps. 'hand-written again' is a second hand-written step: how far this machine's noise alone moves a")
    print(f"   ratio; '{CHECKED}' is the hand-written step with accumlib's finite check written into it (the")
    print(f"   loss and the gradients' norm read once, the step taken when both are finite); '{UNCHECKED}' is")
    print("   accumlib without the gradient norm of that check (the loss alone checked). 'us/step' is the median of")
    print("   what accumlib's step takes over the hand-written one beside it, 'check us' what the checked one takes")
    print(
        f"   {'accum_steps':>11} {'micro':>5} {'hand-written':>13} {'us/step':>8} {'check us':>8}"
        + "".join(f" {n:>22}" for n in compared)
    )
    table = {}
    for k, row in pairs.items():
        added = statistics.median(row["accumlib seconds over hand-written"]) * 1e6
        check = statistics.median(row["checked seconds over hand-written"]) * 1e6
        table[k] = {name: dict(zip(("q1", "median", "q3"), quartiles(row[name]), strict=True)) for name in compared}
        table[k] |= {
            "hand_written_seconds_per_step": statistics.median(row["hand-written seconds"]),
            "accumlib_microseconds_over_hand_written": added,
            "checked_microseconds_over_hand_written": check,
        }
        print(
            f"   {k:>11} {EFFECTIVE_BATCH // k:>5} {table[k]['hand_written_seconds_per_step'] * 1e3:>8.2f} ms "
            f"{added:>+8.0f} {check:>+8.0f}"
            + "".join(
                f"  {table[k][n]['median']:5.3f}x ({table[k][n]['q1']:.3f}-{table[k][n]['q3']:.3f})" for n in compared
            )
        )
    print()
    return table


def measure(device: torch.device, rounds: int, epochs: int, quick: bool, only_first: bool = False) -> dict:
    """Sections 1-4 on `device`; section 5 (the lessons, the DDP job: CPU) with the CPU; only section 1 with
    only_first."""
    print(f"== {device.type} ==")
    loops = {"hand-written": hand_written, "accumlib": with_accumlib(False)}
    try:
        import accelerate  # noqa: F401  (benchmark-only extra: pip install -e '.[bench]')

        loops["accelerate"] = with_accelerate
    except ImportError:
        print("accelerate is not installed (pip install -e '.[bench]'): its column is skipped\n")
    overhead = {}
    for number, model_name in enumerate(MODELS):
        overhead[model_name] = overhead_table(device, epochs, "accelerate" in loops, model_name, f"1{'ab'[number]}")
    traced, slower = traced_cycle_cost(device)
    print(
        f"   measure_memory=True traces {traced} cycle(s) of an epoch (one per micro-batch layout), each "
        f"{slower:.1f}x a normal cycle's time"
    )
    if only_first:
        return {
            "overhead_ratio": overhead,
            "memory_measured": {"traced_cycles_per_epoch": traced, "traced_cycle_over_median": slower},
        }

    reads = host_reads(
        {name: loops[name] for name in ("hand-written", "accumlib", "accelerate") if name in loops}, device
    )
    columns = list(next(iter(reads.values())))
    print("\n2. host reads (item, tolist, float, bool, int, index) per optimizer step; the last column: accumlib's")
    print("   between the micro-batches of a cycle, per micro-batch")
    print(f"   {'accum_steps':>11}" + "".join(f" {c:>{max(len(c), 12)}}" for c in columns))
    for k, row in reads.items():
        print(f"   {k:>11}" + "".join(f" {row[c]:>{max(len(c), 12)}.2f}" for c in columns))

    fixed = fixed_cost_microseconds({name: loops[name] for name in ("hand-written", "accumlib")}, rounds, device)
    print(
        f"\n3. fixed cost per optimizer step with a trivial Linear(4, 2) (8 x 4): hand-written "
        f"{fixed['hand-written']:.0f} us, accumlib {fixed['accumlib']:.0f} us "
        f"(+{fixed['accumlib'] - fixed['hand-written']:.0f} us)"
    )
    extras = accumlib_extras_microseconds(device)
    alone = "  of which the loss alone (cycle._read with check_gradients=False)"
    print("   what accumlib's cycle adds per optimizer step at accum_steps 1, each piece timed alone right after a")
    print(
        f"   backward pass (the MLP of 1b, micro-batch 64): "
        f"{sum(us for name, us in extras.items() if name != alone):.0f} us in all"
    )
    for name, microseconds in extras.items():
        print(f"   {microseconds:>8.1f} us  {name}")

    cost = accumulation_cost(rounds, device)
    print(f"\n4. cost of accumulation at a fixed effective batch of {EFFECTIVE_BATCH} (ratios to accum_steps = 1)")
    print(f"   {'accum_steps':>11} {'micro':>5} {'time':>6} {'peak':>6} {'activations':>12} {'params+grads':>13}")
    for r in cost:
        print(
            f"   {r['accum_steps']:>11} {r['micro_batch_size']:>5} {r['time_ratio']:5.2f}x {r['peak_ratio']:5.2f}x "
            f"{r['activations_bytes']:>12,} {r['parameters_bytes'] + r['gradients_bytes']:>13,}"
        )

    result = {
        "overhead_ratio": overhead,
        "memory_measured": {"traced_cycles_per_epoch": traced, "traced_cycle_over_median": slower},
        "host_reads": reads,
        "fixed_cost_microseconds": fixed,
        "accumlib_extra_microseconds_per_step": extras,
        "accumulation_cost": cost,
    }
    if device.type != "cpu":
        return result
    ddp = ddp_job_seconds()
    print(f"\n5. lesson 9's DDP job (compare_no_sync: 2 processes, both no_sync settings): {ddp:.1f} s")
    response = responsiveness(3 if quick else 7)
    print("   slider change to redrawn figure (median seconds)")
    for name, seconds in response.items():
        print(f"   {name:<20} {seconds:.2f} s")
    suites = None if quick else nbval_suites.measure(2)  # ABBA: one run of each swings by 10%
    if suites is not None:
        print("\n6. " + nbval_suites.report(suites))
    return {**result, "ddp_job_seconds": ddp, "slider_seconds": response, "nbval_suites": suites}


if __name__ == "__main__":
    main()
