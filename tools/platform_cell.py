"""Put (or refresh) the Colab/Kaggle set-up cell at the top of every English lesson notebook. Idempotent.

    python tools/platform_cell.py            # notebooks/en/*.ipynb; then `python tools/editions.py build` for hi
    python tools/platform_cell.py --check    # exit 1 if a notebook lacks the current cell

The cell follows fast.ai's book: it tests for the platform's directory (/content on Colab, /kaggle on Kaggle) and
does nothing anywhere else, so local runs, Binder and nbval are unchanged (its stored output is empty). There, it
installs accumlib with the lessons' extra only when `import accumlib` would fail; pip keeps what the platform
already has where it satisfies the pins (torch, numpy, ipywidgets). $ACCUMLIB_INSTALL replaces the requirement
(a fork, a wheel). The cell has the id and tag "platform-setup"; its outputs and execution count are cleared.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CELL_ID = "platform-setup"
SOURCE = '''\
# Colab and Kaggle only: install accumlib and the lessons' stack if they are missing (elsewhere this does nothing)
import importlib.util, os, subprocess, sys
if any(os.path.isdir(d) for d in ("/content", "/kaggle")) and importlib.util.find_spec("accumlib") is None:
    requirement = os.environ.get("ACCUMLIB_INSTALL", "accumlib[lessons] @ git+https://github.com/accumlib/accumlib")
    print("installing", requirement)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], check=True)'''


def setup_cell():
    cell = nbformat.v4.new_code_cell(SOURCE, metadata={"tags": [CELL_ID]})
    cell.id = CELL_ID
    return cell


def refreshed(notebook) -> bool:
    """Put the current cell first in `notebook` (replacing an older one); True if anything changed."""
    old = [i for i, cell in enumerate(notebook.cells) if cell.get("id") == CELL_ID]
    if old == [0] and notebook.cells[0] == setup_cell():
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
