"""The GPU run, prepared: what the course and accumlib do on a CUDA GPU, checked in one go (under five minutes on
a CUDA machine). On a machine without one it runs what the CPU can and says what it skipped and why.

    python benchmarks/gpu_check.py                  # every check this machine can run; a table at the end
    python benchmarks/gpu_check.py --json out.json  # the same, and the results as JSON
    python benchmarks/gpu_check.py --notebooks      # also execute the lessons on the CPU (nbval already does)

The checks, each on the device `accumlib.lessons.devices.pick()` chooses (ACCUMLIB_DEVICE, else CUDA, else CPU):
1. lessons: every notebook of notebooks/en (the ten lessons and the dashboards) executed top to bottom in a fresh
   kernel with ACCUMLIB_DEVICE set to that device; an error in any cell fails it (outputs are not compared: they
   are the CPU's). On the CPU this is `make test`'s nbval run, skipped here unless --notebooks.
2. memory: one training step measured by the CPU tracker (live tensor storages) and, on CUDA, by the allocator
   (torch.cuda.max_memory_allocated) for the same model, batch and optimizer; the allocator's bytes include its
   rounding to 512-byte blocks and cuBLAS/cuDNN workspaces, the CUDA context is in neither.
3. fit_batch: the plan for an effective batch of 512 under a 32 MiB budget, trained with memory_budget= (on CUDA
   a real cap, as the budget is at least budget.CUDA_CAP_MINIMUM: torch.cuda.set_per_process_memory_fraction),
   and the next larger micro-batch refused.
4. amp: fp16 autocast with a GradScaler and bf16 autocast without one (where the device supports bf16), against
   float32: every logged loss finite, steps the scaler skipped, final loss.
5. host reads: reads of a tensor's value on the host per optimizer step (a TorchFunctionMode counter, any device);
   on CUDA also the synchronisations torch.cuda.set_sync_debug_mode("warn") reports.
6. overhead: accumlib.train against the hand-written six-line loop on the same 64 steps, alternating, the
   median ratio of 10 rounds (CUDA: wall time after synchronize; CPU: process time at one thread).
7. small cards: lessons 1 and 5's simulated cards (2 MiB, 0.5 MiB: below the allocator's granularity, so no hard
   cap) on the device: for each batch, check_fits's trace (on CUDA in the allocator's 512-byte blocks) against the
   allocator's measured peak (measure_step) and its requested bytes; the verdict "fits the card" must be the same
   by both, lesson 5's plan must train under memory_budget with a recorded step peak (the allocator's, over what
   the step did not hold) within the card, and the next plan must be refused.
8. one device: accumlib.train(device=None) honours ACCUMLIB_DEVICE; the quiz experiments, the three dashboards'
   computations and the exercise checkers that measure run on the device without a device mismatch.
9. examples: examples/causal_lm.py (DDP and FSDP2) and examples/image_batchnorm.py (DDP, FSDP2, SyncBatchNorm)
   started by torchrun on the GPUs (one process per GPU, at most 2) with nccl; each must exit 0 and say what it checks
   (the LM: every process holds the same weights). On the CPU, tests/library/test_torchrun.py runs them with gloo.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import accumlib  # noqa: E402
from accumlib import memory  # noqa: E402
from accumlib.timing import HostReads  # noqa: E402
from accumlib.lessons import data, devices, models  # noqa: E402

MIB = 2**20
CHECKS = []


def check(function):
    """Register a check: it returns (status, lines), status "ok", "FAILED" or "skipped"."""
    CHECKS.append(function)
    return function


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device) -> float:
    """Wall time after a synchronize on CUDA; this process's CPU time on the CPU (others' load inflates it less)."""
    sync(device)
    return time.perf_counter() if device.type == "cuda" else time.process_time()


@check
def lessons(device: torch.device, options) -> tuple[str, list[str]]:
    """Every notebook of notebooks/en executed in a fresh kernel on `device`."""
    if device.type == "cpu" and not options.notebooks:
        return "skipped", [
            "on the CPU, `make test` (nbval) runs every lesson and compares its outputs; "
            "pass --notebooks to execute them here too"
        ]
    try:
        import nbclient
        import nbformat
    except ImportError as error:
        return "skipped", [f"nbclient/nbformat missing ({error}): pip install -r requirements.txt"]
    os.environ[devices.VARIABLE] = str(device)  # the kernels inherit it
    notebooks = sorted((ROOT / "notebooks" / "en").glob("*.ipynb"))

    def run(path: Path) -> tuple[str, str]:
        nb = nbformat.read(path, as_version=4)
        started = time.perf_counter()
        try:
            nbclient.NotebookClient(
                nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
            ).execute()
        except nbclient.exceptions.CellExecutionError as error:
            cell = next(
                (
                    i
                    for i, c in enumerate(nb.cells)
                    if c.get("cell_type") == "code"
                    and any(o.get("output_type") == "error" for o in c.get("outputs", []))
                ),
                "?",
            )
            return "FAILED", f"{path.name}: cell {cell}: {error.ename}: {str(error.evalue)[:200]}"
        except Exception as error:  # noqa: BLE001 - a kernel that died or timed out is a result too
            return "FAILED", f"{path.name}: {type(error).__name__}: {str(error)[:200]}"
        return "ok", f"{path.name}: every cell ran ({time.perf_counter() - started:.0f} s)"

    workers = max(1, min(4, (os.cpu_count() or 2) // 2))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run, notebooks))
    failed = [line for status, line in results if status != "ok"]
    return ("FAILED" if failed else "ok"), [line for _status, line in results]


@check
def allocator_against_tracker(device: torch.device, options) -> tuple[str, list[str]]:
    """One step of the lessons' CNN on 64 digits: the CPU tracker's peak and, on CUDA, the allocator's."""
    X, y = data.digits(64)
    model = models.cnn()
    cpu = memory.measure_step(copy.deepcopy(model), X, y, device="cpu")
    lines = [f"CPU tracker ({cpu.method}): peak {cpu.peak:,} bytes in {cpu.peak_phase}"]
    if device.type != "cuda":
        return "skipped", lines + ["no CUDA device: the allocator's peak is not measured"]
    cuda = memory.measure_step(copy.deepcopy(model).to(device), X.to(device), y.to(device), device=device)
    lines.append(
        f"CUDA allocator ({cuda.method}): peak {cuda.peak:,} bytes in {cuda.peak_phase}: "
        f"{cuda.peak / cpu.peak:.2f}x the tracker, {cuda.peak - cpu.peak:+,} bytes"
    )
    ok = cuda.peak >= cpu.peak  # the allocator holds at least the live tensors (rounded up to blocks)
    return ("ok" if ok else "FAILED"), lines


@check
def fit_batch_under_a_real_cap(device: torch.device, options) -> tuple[str, list[str]]:
    """fit_batch's plan for 512 samples per step in 32 MiB, trained under that budget; the next size refused."""
    X, y = data.digits(512)
    budget = 32 * MIB  # at least budget.CUDA_CAP_MINIMUM (20 MiB): a cap a real card can honour

    def build():  # a wider CNN: one batch of 512 needs more than the budget, so the plan accumulates
        return models.cnn(channels=(64, 128))

    model = build().to(device)  # planned where it trains: on CUDA the trace counts the allocator's 512-byte blocks
    plan = memory.fit_batch(model, (X[:1], y[:1]), target_batch=512, budget_bytes=budget)
    lines = [
        f"plan: {plan.micro_batch_size} x {plan.accum_steps}, peak {plan.peak_bytes:,} bytes of {budget:,} "
        f"(the next larger micro-batch, {plan.next_micro_batch_size}, needs {plan.next_peak_bytes or 0:,})"
    ]
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    history = accumlib.train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=plan.micro_batch_size,
        accum_steps=plan.accum_steps,
        epochs=1,
        memory_budget=budget,
        measure_memory=True,
        device=device,
    )
    peaks = [r.peak_memory_bytes for r in history if r.peak_memory_bytes is not None]
    lines.append(
        f"trained under memory_budget={budget:,} on {device}: {len(history)} steps, peak "
        f"{max(peaks):,} bytes"
        + (f", allocator reserved at most {torch.cuda.max_memory_reserved(device):,}" if device.type == "cuda" else "")
    )
    refused = plan.next_micro_batch_size is None
    if plan.next_micro_batch_size is not None:
        try:
            bigger = build().to(device)
            accumlib.train(
                bigger,
                (X, y),
                torch.optim.SGD(bigger.parameters(), lr=0.05),
                micro_batch_size=plan.next_micro_batch_size,
                accum_steps=512 // plan.next_micro_batch_size,
                memory_budget=budget,
                device=device,
            )
        except accumlib.OutOfMemory as error:
            refused = True
            lines.append(f"next size refused: {str(error)[:160]}")
    ok = refused and max(peaks) <= budget
    return ("ok" if ok else "FAILED"), lines


@check
def amp(device: torch.device, options) -> tuple[str, list[str]]:
    """fp16 with a GradScaler and bf16 without one, against float32, on the same steps."""
    X, y = data.digits(768, flat=True)
    lines, ok = [], True
    modes = [("float32", False), ("fp16 + GradScaler", "fp16")]
    bf16 = devices.supports_bf16(device)  # native bf16: the CPU, a CUDA GPU of compute capability 8.0 on
    modes += [("bf16", "bf16")] if bf16 else []
    for label, mode in modes:
        model = models.mlp().to(device)
        try:
            history = accumlib.train(
                model,
                (X, y),
                torch.optim.SGD(model.parameters(), lr=0.5),
                micro_batch_size=16,
                accum_steps=4,
                epochs=2,
                amp=mode,
                device=device,
            )
        except Exception as error:  # noqa: BLE001 - reported as the check's result
            ok = False
            lines.append(f"{label}: {type(error).__name__}: {str(error)[:160]}")
            continue
        finite = all(math.isfinite(r.loss) for r in history)
        skipped = sum(r.skipped for r in history)
        ok &= finite and skipped < len(history) // 2
        lines.append(
            f"{label}: {len(history)} steps, {skipped} skipped, every loss finite: "
            f"{'yes' if finite else 'no'}, final loss {history[-1].loss:.3f}"
        )
    if not bf16:
        lines.append("bf16: skipped, this GPU has no native bf16 (accumlib.devices.supports_bf16)")
    return ("ok" if ok else "FAILED"), lines


@check
def host_reads(device: torch.device, options) -> tuple[str, list[str]]:
    """Host reads per optimizer step of accumlib.train; on CUDA, the syncs the sync debug mode reports."""
    X, y = data.digits(512, flat=True)
    model = models.mlp().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    accumlib.train(model, (X[:64], y[:64]), optimizer, micro_batch_size=8, accum_steps=4, device=device)  # warm-up
    with HostReads() as reads:
        history = accumlib.train(model, (X, y), optimizer, micro_batch_size=8, accum_steps=4, device=device)
    lines = [
        f"host reads: {reads.count} for {len(history)} steps of 4 micro-batches ({reads.count / len(history):.1f} "
        f"per step)"
    ]
    ok = reads.count / len(history) < 4  # fewer than one per micro-batch
    if device.type != "cuda":
        return ("ok" if ok else "FAILED"), lines + ["CUDA sync debug mode: skipped, no CUDA device"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            history = accumlib.train(model, (X, y), optimizer, micro_batch_size=8, accum_steps=4, device=device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    lines.append(
        f"CUDA syncs reported by set_sync_debug_mode('warn'): {syncs} for {len(history)} steps "
        f"({syncs / len(history):.1f} per step)"
    )
    return ("ok" if ok and syncs / len(history) < 4 else "FAILED"), lines


@check
def overhead(device: torch.device, options) -> tuple[str, list[str]]:
    """accumlib.train against the hand-written loop on the same 64 steps, 10 alternating rounds."""
    X, y = (t.repeat(4, *[1] * (t.dim() - 1)).to(device) for t in data.digits(1024, flat=True))
    m, k = 16, 4

    def hand_written(model, optimizer):
        for step, (xb, yb) in enumerate(zip(X.split(m), y.split(m), strict=True)):
            loss = torch.nn.functional.cross_entropy(model(xb), yb) / k
            loss.backward()
            if (step + 1) % k == 0:
                optimizer.step()
                optimizer.zero_grad()

    def library(model, optimizer):
        accumlib.train(model, (X, y), optimizer, micro_batch_size=m, accum_steps=k, shuffle=False, device=device)

    ratios = []
    for round_ in range(11):
        seconds = {}
        for name, loop in (
            (("hand", hand_written), ("train", library)) if round_ % 2 else (("train", library), ("hand", hand_written))
        ):
            model = models.mlp().to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
            started = clock(device)
            loop(model, optimizer)
            seconds[name] = clock(device) - started
        if round_:  # the first round warms up
            ratios.append(seconds["train"] / seconds["hand"])
    ratio = statistics.median(ratios)
    what = "wall time after synchronize" if device.type == "cuda" else "CPU time of this process"
    return "ok", [
        f"accumlib.train / hand-written loop, {len(X) // (m * k)} steps of {k} x {m}: median {ratio:.2f}x "
        f"over {len(ratios)} rounds ({what}; from {min(ratios):.2f}x to {max(ratios):.2f}x)"
    ]


@check
def small_cards(device: torch.device, options) -> tuple[str, list[str]]:
    """Lessons 1 and 5's cards: the trace's verdict against the allocator's, and lesson 5's plan trained."""
    lines, ok = [], True
    X, y = (t.to(device) for t in data.digits())
    card = 2 * MIB  # lesson 1's card
    for size in (8, 16, 32, 64, 128, 256, 512):
        batch = memory.batch_of((X, y), size)
        traced = memory.measure_step(models.cnn().to(device), *batch, fake=True).peak
        line = f"lesson 1, batch {size}: trace {traced:,} bytes ({'fits' if traced <= card else 'does not fit'})"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            requested = torch.cuda.memory_stats(device).get("requested_bytes.all.current", 0)
            measured = memory.measure_step(models.cnn().to(device), *batch).peak
            asked = torch.cuda.memory_stats(device).get("requested_bytes.all.peak", 0) - requested
            same = (traced <= card) == (measured <= card)
            ok &= same
            line += (
                f"; allocator {measured:,} ({measured - traced:+,}: cuDNN's workspaces and unsplit blocks), "
                f"requested {asked:,}; the same verdict: {'yes' if same else 'NO'}"
            )
        lines.append(line)
    plan = memory.fit_batch(models.cnn().to(device), (X[:1], y[:1]), target_batch=256, budget_bytes=2**19)
    lines.append(
        f"lesson 5, 0.5 MiB card: plan {plan.micro_batch_size} x {plan.accum_steps}, trace "
        f"{plan.peak_bytes:,} bytes; next {plan.next_micro_batch_size} needs {plan.next_peak_bytes or 0:,}"
    )
    model = models.cnn().to(device)
    history = accumlib.train(
        model,
        (X[:256], y[:256]),
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=plan.micro_batch_size,
        accum_steps=plan.accum_steps,
        memory_budget=plan.budget_bytes,
        measure_memory=True,
        device=device,
    )
    recorded = max(r.peak_memory_bytes for r in history)
    within = recorded <= plan.budget_bytes
    ok &= within
    lines.append(
        f"trained: {len(history)} step, recorded step peak {recorded:,} bytes "
        f"({'within' if within else 'OVER'} the card's {plan.budget_bytes:,})"
    )
    if plan.next_micro_batch_size is not None:
        try:
            bigger = models.cnn().to(device)
            accumlib.train(
                bigger,
                (X[:256], y[:256]),
                torch.optim.SGD(bigger.parameters(), lr=0.05),
                micro_batch_size=plan.next_micro_batch_size,
                accum_steps=256 // plan.next_micro_batch_size,
                memory_budget=plan.budget_bytes,
                device=device,
            )
            ok = False
            lines.append("the next plan was NOT refused")
        except accumlib.OutOfMemory as error:
            lines.append(f"the next plan refused: {str(error)[:120]}")
    if device.type != "cuda":
        lines.append("no CUDA device: the allocator's side is not measured (the CPU's bytes are the trace's)")
    return ("ok" if ok else "FAILED"), lines


@check
def one_device(device: torch.device, options) -> tuple[str, list[str]]:
    """train(device=None) honours ACCUMLIB_DEVICE; quiz, dashboards and checkers run on the device."""
    from accumlib.lessons import exercises, widgets
    from accumlib.lessons.quiz import experiments

    lines, ok = [], True
    with mock.patch.dict(os.environ, {devices.VARIABLE: "cpu"}):  # put back as it was, whatever happens
        model = models.mlp()
        X, y = data.digits(64, flat=True)
        accumlib.train(model, (X, y), torch.optim.SGD(model.parameters(), lr=0.1), micro_batch_size=8, accum_steps=2)
        on = next(model.parameters()).device
        ok &= on.type == "cpu"
        lines.append(f"train(device=None) with {devices.VARIABLE}=cpu trained on {on}")

    class Job:  # a dashboard computation that is never stale
        def check(self):
            pass

    runs = {f"quiz: {name}": (lambda run=run: run(device)) for name, (run, _message) in experiments.RUNS.items()}
    for name in ("LossDashboard", "MemoryDashboard", "BatchNormDashboard"):

        def compute(name=name):
            board = getattr(widgets, name)(device=device)
            board.compute(board.current_settings(), Job())

        runs[f"dashboard: {name}"] = compute
    with mock.patch.dict(os.environ, {devices.VARIABLE: str(device)}):  # the checkers' device: devices.pick()'s
        runs["checker: memory_plan"] = lambda: exercises.memory_plan.verdict(8, 32)
        runs["checker: batchnorm_split"] = lambda: exercises.batchnorm_split.verdict(lambda fits, batch: (1, batch))
        runs["checker: time_cost"] = lambda: exercises.time_cost.verdict(1)
        for label, run in runs.items():
            began = time.perf_counter()
            try:
                result = run()
                verdict = getattr(result, "text", None)
                bad = verdict is not None and ("device" in verdict and "expected" in verdict)
                ok &= not bad
                lines.append(
                    f"{label}: ran on {device} ({time.perf_counter() - began:.1f} s)"
                    + (f": {verdict.splitlines()[0][:100]}" if bad else "")
                )
            except Exception as error:  # noqa: BLE001 - reported as the check's result
                ok = False
                lines.append(f"{label}: {type(error).__name__}: {str(error)[:160]}")
    return ("ok" if ok else "FAILED"), lines


@check
def examples(device: torch.device, options) -> tuple[str, list[str]]:
    """The examples under torchrun with nccl, one process per GPU (at most 2): DDP, FSDP2, SyncBatchNorm."""
    if device.type != "cuda":
        return "skipped", ["no CUDA device: tests/library/test_torchrun.py runs the examples with gloo on the CPU"]
    import subprocess

    processes = min(2, torch.cuda.device_count())
    runs = [
        ("causal_lm.py", []),
        ("causal_lm.py", ["--fsdp2"]),
        ("image_batchnorm.py", []),
        ("image_batchnorm.py", ["--fsdp2"]),
        ("image_batchnorm.py", ["--sync-bn"]),
    ]
    lines, ok = [], True
    for script, arguments in runs:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
            str(ROOT / "examples" / script),
            *arguments,
        ]
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=environment, check=False)
            output = (done.stdout.strip().splitlines() or [""])[-1]
            good = done.returncode == 0 and "nccl" in output and "NO" not in output
            failure = "" if good else f" (exit {done.returncode}: {done.stderr.strip()[-300:]})"
        except subprocess.TimeoutExpired:
            good, output, failure = False, "", " (not done within 240 s)"
        ok &= good
        lines.append(f"{script} {' '.join(arguments)}: {output}{failure}")
    return ("ok" if ok else "FAILED"), lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--notebooks", action="store_true", help="execute the lessons on the CPU too")
    options = parser.parse_args()
    device = devices.pick()
    torch.manual_seed(0)
    name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(
        f"gpu_check on {device}{name}; torch {torch.__version__}, CUDA "
        f"{torch.version.cuda or 'none (a CPU build)'}; threads {torch.get_num_threads()}"
    )
    if device.type != "cuda":
        print("No CUDA device: the GPU-only parts are skipped, each with its reason.")
    results, started = [], time.perf_counter()
    for function in CHECKS:
        began = time.perf_counter()
        try:
            status, lines = function(device, options)
        except Exception as error:  # noqa: BLE001 - one failed check must not hide the others
            status, lines = "FAILED", [f"{type(error).__name__}: {error}", *traceback.format_exc().splitlines()[-3:]]
        results.append(
            {
                "check": function.__name__,
                "status": status,
                "seconds": round(time.perf_counter() - began, 1),
                "lines": lines,
            }
        )
        print(f"\n[{status}] {function.__name__} ({results[-1]['seconds']} s): {function.__doc__.splitlines()[0]}")
        for line in lines:
            print(f"    {line}")
    total = time.perf_counter() - started
    print(f"\n{'check':<28}{'status':<10}seconds")
    for result in results:
        print(f"{result['check']:<28}{result['status']:<10}{result['seconds']}")
    print(f"total {total:.0f} s on {device}")
    if options.json:
        options.json.write_text(
            json.dumps({"device": str(device), "torch": torch.__version__, "results": results}, indent=1) + "\n"
        )
    return 1 if any(r["status"] == "FAILED" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
