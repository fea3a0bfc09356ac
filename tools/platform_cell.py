"""Put (or refresh) the Colab/Kaggle set-up cell at the top of every English lesson notebook. Idempotent.

    python tools/platform_cell.py            # notebooks/en/*.ipynb; then `python tools/editions.py build` for hi
    python tools/platform_cell.py --check    # exit 1 if a notebook lacks the current cell

The cell follows fast.ai's book: it tests for the platform's directory (/content on Colab, /kaggle on Kaggle) and
does nothing anywhere else, so local runs, Binder and nbval are unchanged (its stored output is empty). There, when
`import accumlib` would fail, it installs accumlib itself without its dependencies, and of the lessons' stack only
what is missing or older than the lowest version the lessons run with: torch 2.13, matplotlib 3.10 and ipywidgets
7.7 (Colab's 3.10 and 7.7 are kept: tests/library/test_package.py runs lesson 0, a dashboard and the quiz with them;
Hindi figures on 3.10 warn how to upgrade, accumlib.lessons.plots). Where it upgrades a package this process has already
imported it says that the runtime needs a restart. $ACCUMLIB_INSTALL replaces accumlib's requirement (a fork, a
wheel). The cell has the id and tag "platform-setup", and the tag "remove-cell" (the website leaves it out); its
outputs and execution count are cleared. What it prints is translated with its comments in each lesson's PO file
(tools/editions.py: the strings passed to print()), since it runs before accumlib and its catalogue are installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CELL_ID = "platform-setup"
SOURCE = """\
# Colab and Kaggle only: install accumlib, and what the lessons need that the platform lacks (elsewhere: nothing)
import importlib.metadata, importlib.util, os, re, subprocess, sys
if any(os.path.isdir(d) for d in ("/content", "/kaggle")) and importlib.util.find_spec("accumlib") is None:
    def version(name):  # (major, minor) of the installed package, None when it is missing
        try:
            return tuple(int(n) for n in re.findall(r"\\d+", importlib.metadata.version(name))[:2])
        except importlib.metadata.PackageNotFoundError:
            return None
    # the lowest version each package works with in the lessons (the platform's newer ones are kept), and the pin
    lowest = {"torch": ((2, 13), "torch>=2.13,<2.14"), "matplotlib": ((3, 10), "matplotlib>=3.11"),
              "ipywidgets": ((7, 7), "ipywidgets>=8")}
    missing = {name: pin for name, (low, pin) in lowest.items() if version(name) is None or version(name) < low}
    requirement = os.environ.get("ACCUMLIB_INSTALL", "accumlib @ git+https://github.com/accumlib/accumlib")
    print("installing", ", ".join([requirement, *missing.values()]))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", requirement], check=True)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing.values()], check=True)
    loaded = [name for name in missing if name in sys.modules]  # imported already: the old version stays loaded
    if loaded:
        print("Restart the runtime now (Colab: Runtime > Restart session; Kaggle: Run > Restart & clear cell "
              "outputs), then run the notebook again from the top:", ", ".join(loaded), "changed once imported")"""


def setup_cell():
    cell = nbformat.v4.new_code_cell(SOURCE, metadata={"tags": [CELL_ID, "remove-cell"]})
    cell.id = CELL_ID
    return cell


def current(cell) -> bool:
    """Whether `cell` is the current set-up cell, executed or not (execution adds a count and timing, no output)."""
    fresh = setup_cell()
    return (
        cell.get("id") == CELL_ID
        and cell.cell_type == "code"
        and cell.source == fresh.source
        and cell.metadata.get("tags") == fresh.metadata["tags"]
        and not cell.get("outputs")
    )


def refreshed(notebook) -> bool:
    """Put the current cell first in `notebook` (replacing an older one); True if anything changed."""
    old = [i for i, cell in enumerate(notebook.cells) if cell.get("id") == CELL_ID]
    if old == [0] and current(notebook.cells[0]):
        return False
    notebook.cells = [setup_cell()] + [cell for cell in notebook.cells if cell.get("id") != CELL_ID]
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report notebooks without the current cell, change none")
    parser.add_argument("folder", nargs="?", type=Path, default=ROOT / "notebooks" / "en")
    args = parser.parse_args()
    stale = []
    for path in sorted(args.folder.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        if refreshed(notebook):
            stale.append(path)
            if not args.check:
                path.write_text(nbformat.writes(notebook) + "\n", encoding="utf-8")
    for path in stale:
        print(f"{path}: {'lacks the current set-up cell' if args.check else 'set-up cell written'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
