"""The lessons' peak memory as Binder counts it: a lesson run top to bottom in a fresh kernel, sampled every 20 ms.

Binder (repo2docker on Kubernetes) limits the memory of the learner's whole container: the Jupyter server, the
kernel and every process the kernel starts (lesson 9's DDP workers). Resident set sizes (RSS) count a page shared
by several processes once per process; the proportional set size (PSS, /proc/PID/smaps_rollup) splits it between
them, so the sum of PSS over the processes is what they occupy together. This script runs each notebook given with
nbclient (this process plays the Jupyter server's part, so its own PSS is counted too), sums the PSS of itself,
the kernel and all of the kernel's descendants every 20 ms, and prints the peak and when it happened (the cell).

    python benchmarks/binder_memory.py notebooks/en/*.ipynb notebooks/hi/09_ddp.ipynb > benchmarks/binder_memory.txt

Linux only (/proc). Run it with OMP_NUM_THREADS=1 as `make test` does; the numbers are this machine's and move by
a few MiB from run to run (allocator and import order), so they are rounded to 10 MiB.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

MIB = 2**20


def pss(pid: int) -> int:
    """The proportional set size of a process in bytes (0 if it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def descendants(root: int) -> list[int]:
    """`root` and every process below it, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state; the name may hold spaces
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def name(pid: int) -> str:
    """What a process runs: its command line, shortened."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return "?"
    return " ".join(Path(words[0]).name if i == 0 else w[-40:] for i, w in enumerate(words) if w)[:70]


class Sampler(threading.Thread):
    """Sums the PSS of this process and the kernel's process tree until stopped; keeps the peak and its label."""

    def __init__(self, kernel_pid: int, interval: float = 0.02):
        super().__init__(daemon=True)
        self.kernel_pid, self.interval = kernel_pid, interval
        self.label = "start"
        self.peak, self.peak_label, self.peak_processes = 0, "", []
        self.by_label: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            processes = [(pid, pss(pid)) for pid in [os.getpid(), *descendants(self.kernel_pid)]]
            for pid, _size in processes:
                if pid not in self.names:  # read once, while it runs: a forked rank has its parent's command line
                    self.names[pid] = name(pid)
            total = sum(size for _pid, size in processes)
            label = self.label
            self.by_label[label] = max(self.by_label.get(label, 0), total)
            if total > self.peak:
                self.peak, self.peak_label = total, label
                self.peak_processes = [(self.names[pid], size) for pid, size in processes]
            time.sleep(self.interval)


def measure(path: Path) -> Sampler:
    """Run one notebook in a fresh kernel started in its folder, sampling its memory; the sampler holds the result."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(path.parent)}})
    with client.setup_kernel():
        sampler = Sampler(client.km.provisioner.process.pid)
        sampler.start()
        try:
            for index, cell in enumerate(notebook.cells):
                sampler.label = f"cell {index} ({cell.get('id', '?')})"
                client.execute_cell(cell, index)
            sampler.label = "end"
            time.sleep(0.5)  # processes the last cell left behind still count
        finally:
            sampler.done.set()
            sampler.join()
    return sampler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args()
    if len(args.notebooks) > 1:  # each in a driving process of its own, as each learner's server starts clean
        import platform
        from importlib.metadata import version  # not `import torch`: this process's PSS would count it

        print(
            f"Python {platform.python_version()}, torch {version('torch')}, OMP_NUM_THREADS="
            f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs; PSS of the driving process, "
            f"the kernel and its descendants, sampled every 20 ms; one fresh driving process per notebook",
            flush=True,
        )
        import subprocess

        return max(subprocess.run([sys.executable, __file__, str(path)]).returncode for path in args.notebooks)
    path = args.notebooks[0]
    sampler = measure(path.resolve())
    print(
        f"{path}: peak {round(sampler.peak / MIB, -1):.0f} MiB PSS, during {sampler.peak_label}, "
        f"{len(sampler.peak_processes)} processes:"
    )
    for process, size in sampler.peak_processes:
        print(f"    {size / MIB:4.0f} MiB  {process}")
    print("  peak by cell:")
    for label, peak in sampler.by_label.items():
        print(f"    {label}: {peak / MIB:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
