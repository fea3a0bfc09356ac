"""The library's API reference, docs/api.md, generated from the docstrings of what `accumlib` exports.

    python tools/api_docs.py          write docs/api.md
    python tools/api_docs.py --check  exit 1 when docs/api.md is stale (tests/course/test_api_docs.py does the same)

One section per public name of `accumlib.__all__` (and of the public modules an engineer imports: memory and its
rooms tracker, measured_step and budget, timing, batchnorm, sharded, devices): its signature and its
docstring as written. The website shows the file as its library section's reference (tools/site.py).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api.md"
MODULES = [
    "accumlib",
    "accumlib.memory",
    "accumlib.tracker",
    "accumlib.measured_step",
    "accumlib.budget",
    "accumlib.timing",
    "accumlib.batchnorm",
    "accumlib.sharded",
    "accumlib.devices",
]


def _public(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and getattr(v, "__module__", None) == module.__name__
            and (inspect.isclass(v) or inspect.isfunction(v))
        ]
    return list(names)


def _default(value) -> str:
    """A default as a reader writes it: a function by its name, never its address."""
    if value is os.environ:
        return "os.environ"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}".lstrip(".")
    return repr(value)


def _signature(obj) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    parts, star = [], False
    for p in signature.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        star = star or p.kind is p.VAR_POSITIONAL
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.default is not p.empty:
            text += "=" + _default(p.default)
        parts.append(text)
    return f"({', '.join(parts)})"


def _section(qualname: str, obj) -> str:
    kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
    head = f"### `{qualname}{_signature(obj) if kind != 'value' else ''}`"
    doc = inspect.getdoc(obj) or "(no docstring)"
    return f"{head}\n\n*{kind}*\n\n```text\n{doc}\n```\n"


def render() -> str:
    parts = [
        "# API reference\n",
        "Generated from the docstrings by `tools/api_docs.py`; `tests/course/test_api_docs.py` fails when it is "
        "stale.\n",
    ]
    seen: set[int] = set()
    for name in MODULES:
        module = importlib.import_module(name)
        sections = []
        for public in _public(module):
            obj = getattr(module, public)
            if id(obj) in seen or inspect.ismodule(obj) or not callable(obj):  # a value has no docstring of its own
                continue
            seen.add(id(obj))
            sections.append(_section(f"{name}.{public}", obj))
        if sections:
            summary = (inspect.getdoc(module) or "").split("\n\n")[0]
            parts.append(f"## `{name}`\n\n{summary}\n\n" + "\n".join(sections))
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/api.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        stale = not OUT.exists() or OUT.read_text(encoding="utf-8") != text
        print("docs/api.md is stale: run python tools/api_docs.py" if stale else "docs/api.md is up to date")
        return int(stale)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
