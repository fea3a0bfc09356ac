"""The notebook suite under nbval before and after the Hindi edition, timed in one run on the same machine.

    .venv/bin/python benchmarks/nbval_suites.py              # one round: before, then now; prints the ratio
    .venv/bin/python benchmarks/nbval_suites.py --rounds 2   # ABBA order: before, now, now, before (medians)

before: the English-only suite of commit 97e5584 (its notebooks with its accumlib, from `git archive` in a
        temporary folder), run as that commit's Makefile ran it: one pytest process, default threads.
now:    both editions of this working tree (notebooks/en and notebooks/hi), as `make test` runs the notebooks:
        2 pytest-xdist workers, --dist loadfile (a notebook's cells in order in one kernel), OMP_NUM_THREADS=1.
The target of the Hindi-edition issue: now / before <= 1.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "97e5584"  # the last commit whose suite was English only
WORKERS = 2  # make test's default
NBVAL = ["--nbval", "notebooks", "--nbval-sanitize-with", "notebooks/sanitize.cfg", "-p", "no:cacheprovider", "-q"]


def checkout(commit: str, folder: Path) -> Path:
    """The files of `commit`, extracted into `folder` (no .git, no build outputs)."""
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def suites(before_tree: Path) -> dict[str, tuple[list[str], Path, dict[str, str]]]:
    """name -> (command, working folder, environment) of the two suites.

    Before: PYTHONPATH is the old tree, so pytest and every kernel it starts (same interpreter, same environment,
    cwd the notebook's folder) import the old accumlib; no OMP_NUM_THREADS, as the old Makefile set none.
    """
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONPATH")}
    return {
        "before": ([sys.executable, "-m", "pytest", *NBVAL], before_tree, {**base, "PYTHONPATH": str(before_tree)}),
        "now": (
            [sys.executable, "-m", "pytest", "-n", str(WORKERS), "--dist", "loadfile", *NBVAL],
            ROOT,
            {**base, "OMP_NUM_THREADS": "1"},
        ),
    }


def imported_accumlib(folder: Path, env: dict[str, str]) -> Path:
    """Where `import accumlib` resolves for a suite's environment (a kernel imports the same)."""
    out = subprocess.run(
        [sys.executable, "-c", "import accumlib; print(accumlib.__file__)"],
        cwd=folder / "notebooks",
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Path(out.strip()).parent


def run_suite(command: list[str], folder: Path, env: dict[str, str]) -> dict:
    """Seconds of one run, and pytest's counts (passed, failed, ...) from its summary line."""
    started = time.perf_counter()
    result = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    return {"seconds": seconds, "counts": counts, "summary": summary, "returncode": result.returncode}


def measure(rounds: int = 1) -> dict:
    """Time both suites `rounds` times each, in ABBA order (before, now, now, before, ...).

    Returns {"before": {...}, "now": {...}, "ratio": now / before of the median seconds}, each suite with its median
    seconds, every run's seconds, its notebooks and pytest's counts of the last run. Raises if the old suite would
    not import the old accumlib.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1; got {rounds}")
    with tempfile.TemporaryDirectory(prefix="accumlib-before-") as tmp:
        tree = checkout(BEFORE, Path(tmp))
        commands = suites(tree)
        where = imported_accumlib(tree, commands["before"][2])
        if where != tree / "accumlib":
            raise RuntimeError(f"the {BEFORE} suite would import accumlib from {where}, not {tree / 'accumlib'}")
        runs = {name: [] for name in commands}
        for round_ in range(rounds):
            order = ["before", "now"] if round_ % 2 == 0 else ["now", "before"]
            for name in order:
                runs[name].append(run_suite(*commands[name]))
        notebooks = {
            "before": sorted(str(p.relative_to(tree)) for p in (tree / "notebooks").rglob("*.ipynb")),
            "now": sorted(
                str(p.relative_to(ROOT))
                for p in (ROOT / "notebooks").rglob("*.ipynb")
                if ".ipynb_checkpoints" not in p.parts
            ),
        }
    result = {
        name: {
            "median_s": statistics.median(r["seconds"] for r in runs[name]),
            "runs_s": [round(r["seconds"], 1) for r in runs[name]],
            "notebooks": notebooks[name],
            "counts": runs[name][-1]["counts"],
            "summary": runs[name][-1]["summary"],
            "passed": all(r["returncode"] == 0 for r in runs[name]),
        }
        for name in runs
    }
    result["ratio"] = result["now"]["median_s"] / result["before"]["median_s"]
    return result


def report(result: dict) -> str:
    lines = []
    for name, how in (
        ("before", f"{BEFORE}, English only, serial, default threads"),
        ("now", f"both editions, {WORKERS} workers --dist loadfile, OMP_NUM_THREADS=1"),
    ):
        suite = result[name]
        verdict = "" if suite["passed"] else f"  FAILED: {suite['summary']}"
        runs = ", ".join(f"{s:.0f}" for s in suite["runs_s"])
        lines.append(
            f"   {name:<7}{suite['median_s']:6.1f} s (runs: {runs} s)  "
            f"{len(suite['notebooks']):2d} notebooks, {suite['counts'].get('passed', 0):3d} cells passed "
            f"({how}){verdict}"
        )
    lines.append(f"   ratio now / before: {result['ratio']:.2f} (target <= 1)")
    return "nbval notebook suite, median of " + f"{len(result['now']['runs_s'])} run(s) each:\n" + "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each suite, in ABBA order")
    args = parser.parse_args()
    result = measure(args.rounds)
    print(report(result))
    return 0 if result["before"]["passed"] and result["now"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
