"""What accumulation costs, and what accumlib adds on top: one run, ratios measured side by side.

    .venv/bin/python benchmarks/run.py            # prints a table, writes benchmarks/results.json
    .venv/bin/python benchmarks/run.py --quick    # fewer repeats, no nbval suite

Every time is the median over repeats after a warm-up, and configurations are interleaved, in alternating order
(ABBA...), so that drift of the machine and position in the round hit them alike. Ratios, not absolute times, are the result.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import accumlib
from accumlib import data, memory, models, widgets

ROOT = Path(__file__).resolve().parents[1]


def hand_written(model, X, y, optimizer, m, k, generator):
    """The six-line recipe: the baseline accumlib is measured against."""
    optimizer.zero_grad()
    for step, idx in enumerate(torch.randperm(len(X), generator=generator).split(m)):
        loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx]) / k
        loss.backward()
        if (step + 1) % k == 0:
            optimizer.step()
            optimizer.zero_grad()


def with_accelerate(model, X, y, optimizer, m, k, generator):
    """Hugging Face Accelerate's accumulate() on the same micro-batches."""
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=k, cpu=X.device.type == "cpu")
    model, optimizer = accelerator.prepare(model, optimizer)
    for idx in torch.randperm(len(X), generator=generator).split(m):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def with_accumlib(measure_memory):
    def run(model, X, y, optimizer, m, k, generator):
        accumlib.train(model, (X, y), optimizer, micro_batch_size=m, accum_steps=k, seed=int(generator.initial_seed()),
                       measure_memory=measure_memory, device=X.device)
    return run


def step_seconds(loops: dict, build, X, y, m: int, k: int, repeats: int) -> dict[str, list[float]]:
    """Each loop's seconds per optimizer step, one epoch of (X, y) per round on a fresh build(), rounds interleaved
    in alternating order (ABBA: no loop always runs first); the first round is a warm-up.

    len(X) must be a multiple of m * k, so every loop does the same work (the six-line recipe skips a last,
    incomplete cycle).
    """
    steps = len(X) // (m * k)
    times = {name: [] for name in loops}
    for repeat in range(repeats + 1):
        order = list(loops.items())
        for name, loop in (order if repeat % 2 else order[::-1]):
            model = build().to(X.device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            synchronize(X.device)
            started = time.perf_counter()
            loop(model, X, y, optimizer, m, k, torch.Generator().manual_seed(repeat))
            synchronize(X.device)
            if repeat:
                times[name].append((time.perf_counter() - started) / steps)
    return times


def paired_ratios(loops: dict, m: int, k: int, repeats: int, device: torch.device) -> dict[str, list[float]]:
    """Per round, each loop's time per step over the first loop's in the same round (CNN on 1,792 digits)."""
    X, y = (t.to(device) for t in data.digits(1792))
    times = step_seconds(loops, lambda: models.cnn(seed=0), X, y, m, k, repeats)
    first = next(iter(times.values()))
    return {name: [a / b for a, b in zip(t, first)] for name, t in times.items()}


def fixed_cost_microseconds(loops: dict, repeats: int, device: torch.device) -> dict[str, float]:
    """Median microseconds per step (8 x 4) with a trivial Linear(4, 2): what is left is the loops' bookkeeping."""
    X = torch.randn(1792, 4, generator=torch.Generator().manual_seed(0)).to(device)
    y = (X[:, 0] > 0).long()
    times = step_seconds(loops, lambda: torch.nn.Linear(4, 2), X, y, 8, 4, repeats)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return q1, median, q3


def accumulation_cost(repeats: int, device: torch.device) -> list[dict]:
    X, y = data.digits()
    rows = []
    for k in (1, 2, 4, 8, 16):
        m = 64 // k
        timing = accumlib.time_config(models.cnn(), (X, y), micro_batch_size=m, accum_steps=k, warmup=3,
                                      repeats=repeats, device=device)
        peak = memory.measure_step(models.cnn(), X[:m], y[:m], accum_steps=k, device=device)
        rows.append({"accum_steps": k, "micro_batch_size": m, "seconds": timing.seconds_per_step,
                     **{f"{name}_bytes": value for name, value in peak.categories().items()}, "peak_bytes": peak.peak})
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

    plan = {widgets.LossDashboard: [("accum_steps", 2), ("micro_batch_size", 4), ("accum_steps", 6),
                                    ("forget_division", True), ("micro_batch_size", 16), ("accum_steps", 3),
                                    ("batchnorm", True)],
            widgets.MemoryDashboard: [("accum_steps", 2), ("micro_batch_size", 4), ("accum_steps", 6),
                                      ("budget", 1.0), ("micro_batch_size", 16), ("accum_steps", 3),
                                      ("micro_batch_size", 2)],
            widgets.BatchNormDashboard: [("accum_steps", 2), ("micro_batch_size", 4), ("accum_steps", 6),
                                         ("micro_batch_size", 16), ("accum_steps", 3), ("micro_batch_size", 2),
                                         ("accum_steps", 8)]}
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


def nbval_suite_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "notebooks",
                    "--nbval-sanitize-with", "notebooks/sanitize.cfg"], cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and no nbval suite")
    args = parser.parse_args()
    repeats = 5 if args.quick else 31
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    machine = (f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
               f"{'CUDA ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU only'}")
    print(f"machine: {machine}\n")
    results = {"machine": machine}
    for device in devices:
        results[device.type] = measure(device, repeats, quick=args.quick)
    (ROOT / "benchmarks" / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\nwritten: benchmarks/results.json")


def measure(device: torch.device, repeats: int, quick: bool) -> dict:
    """Sections 1-3 on `device`; section 4 (the lessons, CPU) with the CPU."""
    print(f"== {device.type} ==")

    loops = {"hand-written": hand_written, "accumlib": with_accumlib(False),
             "accumlib (memory measured)": with_accumlib(True)}
    try:
        import accelerate  # noqa: F401  (benchmark-only extra: pip install accelerate)
        loops["accelerate"] = with_accelerate
    except ImportError:
        print("accelerate is not installed (pip install -e '.[bench]'): its row is skipped\n")
    ratios = paired_ratios(loops, m=8, k=4, repeats=repeats, device=device)
    overhead = {name: quartiles(r) for name, r in ratios.items()}
    print("1-2. time per effective batch, CNN on digits, micro-batch 8 x accum_steps 4, ratio to the hand-written")
    print(f"     loop in the same round: median (interquartile range) of {repeats} rounds")
    for name, (q1, median, q3) in overhead.items():
        print(f"   {name:<28} {median:5.2f}x ({q1:.2f}-{q3:.2f})")

    fixed = fixed_cost_microseconds({name: loops[name] for name in ("hand-written", "accumlib")}, repeats, device)
    print(f"   fixed cost per optimizer step with a trivial model (4 micro-batches): hand-written "
          f"{fixed['hand-written']:.0f} us, accumlib {fixed['accumlib']:.0f} us "
          f"(+{fixed['accumlib'] - fixed['hand-written']:.0f} us)")

    cost = accumulation_cost(repeats, device)
    print("\n3. cost of accumulation at a fixed effective batch of 64 (ratios to accum_steps = 1)")
    print(f"   {'accum_steps':>11} {'micro':>5} {'time':>6} {'peak':>6} {'activations':>12} {'params+grads':>13}")
    for r in cost:
        print(f"   {r['accum_steps']:>11} {r['micro_batch_size']:>5} {r['time_ratio']:5.2f}x {r['peak_ratio']:5.2f}x "
              f"{r['activations_bytes']:>12,} {r['parameters_bytes'] + r['gradients_bytes']:>13,}")

    result = {"overhead_ratio": {k: dict(zip(("q1", "median", "q3"), v)) for k, v in overhead.items()},
              "fixed_cost_microseconds": fixed, "accumulation_cost": cost}
    if device.type != "cpu":
        return result
    response = responsiveness(3 if quick else 7)
    print("\n4. slider change to redrawn figure (median seconds)")
    for name, seconds in response.items():
        print(f"   {name:<20} {seconds:.2f} s")
    suite = None if quick else nbval_suite_seconds()
    if suite is not None:
        print(f"   whole nbval notebook suite: {suite:.0f} s")
    return {**result, "slider_seconds": response, "nbval_suite_seconds": suite}


if __name__ == "__main__":
    main()
