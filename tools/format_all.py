"""`make format`: ruff's formatter over the tree, then the one thing it leaves over the line limit fixed.

    python tools/format_all.py   format, wrap the string literals left too long, format again, then `ruff check`

ruff format never splits a string literal, so a string that fitted at its old indentation can pass the limit at its
new, deeper one (E501). Such a literal, alone on its line inside brackets, is split at a space into two adjacent
literals, which Python joins back: a file is rewritten only if its syntax tree (ast.dump) is unchanged, so the
program, its messages (the gettext catalogue's msgids) and its docstrings stay as they were. What is left (a line
this cannot split) is listed, for a person to wrap, and so is a file whose syntax tree the formatter changed (a
docstring it re-indented: docs/api.md is generated from them). `make lint` then checks `ruff format --check`.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUFF = Path(sys.executable).with_name("ruff")  # the venv's ruff, beside its python
LIMIT = 120  # pyproject.toml [tool.ruff] line-length
LITERAL = re.compile(r"(?P<indent>\s*)(?P<prefix>[rRfF]{0,2})(?P<quote>[\"'])(?P<body>.*)(?P=quote)(?P<tail>[,)\]}]*)")


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), *args], cwd=ROOT, capture_output=True, text=True)


def long_lines() -> dict[Path, list[int]]:
    """{file: line numbers} of every E501 that `ruff check` reports (the project's own settings and excludes)."""
    found = json.loads(ruff("check", "--select", "E501", "--output-format", "json", ".").stdout or "[]")
    lines: dict[Path, list[int]] = {}
    for item in found:
        lines.setdefault(Path(item["filename"]), []).append(item["location"]["row"])
    return lines


def _outside_braces(body: str, index: int) -> bool:
    """Whether `index` of an f-string's body is outside every {...} replacement field ({{ and }} are text)."""
    depth, i = 0, 0
    while i < index:
        pair = body[i : i + 2]
        if pair in ("{{", "}}") and depth == 0:
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(body[i], 0)
        i += 1
    return depth == 0


def split_literal(line: str, limit: int = LIMIT) -> list[str] | None:
    """`line`, one string literal (and closing brackets or a comma) alone on it, as two or more lines of adjacent
    literals each within `limit`, split after a space; None if it is not such a line or has no such space."""
    match = LITERAL.fullmatch(line)
    if match is None:
        return None
    indent, prefix, quote, body, tail = (match[k] for k in ("indent", "prefix", "quote", "body", "tail"))
    if re.search(r"(?<!\\)" + quote, body):  # two literals on the line, or a triple-quoted one: not split
        return None
    formatted = "f" in prefix.lower()
    head = len(indent) + len(prefix) + 2  # the indentation, the prefix and both quotes around each piece
    pieces, rest = [], body
    while head + len(rest) + len(tail) > limit:
        spaces = [
            i
            for i in range(1, min(len(rest) - 1, limit - head))
            if rest[i] == " " and rest[i - 1] != "\\" and (not formatted or _outside_braces(rest, i))
        ]
        if not spaces:
            return None
        pieces.append(rest[: spaces[-1] + 1])
        rest = rest[spaces[-1] + 1 :]
    if not pieces:
        return None
    pieces.append(rest)

    def literal(piece: str) -> str:  # an f-string piece without a field is a plain string (ruff's F541)
        plain = formatted and not re.search(r"[{}]", piece)
        return f"{indent}{prefix.replace('f', '').replace('F', '') if plain else prefix}{quote}{piece}{quote}"

    return [literal(piece) for piece in pieces[:-1]] + [literal(pieces[-1]) + tail]


def wrap(path: Path, rows: list[int], limit: int = LIMIT) -> list[int]:
    """Split the literals on `rows` (1-based) of `path` where split_literal can and the syntax tree stays the same;
    return the rows left as they were."""
    source = path.read_text(encoding="utf-8")
    lines = source.split("\n")
    left = []
    for row in sorted(rows, reverse=True):  # from the bottom: the rows above keep their numbers
        pieces = split_literal(lines[row - 1], limit)
        if pieces is None:
            left.append(row)
            continue
        lines[row - 1 : row] = pieces
    changed = "\n".join(lines)
    try:
        same = ast.dump(ast.parse(changed)) == ast.dump(ast.parse(source))
    except SyntaxError:
        same = False
    if not same:  # e.g. a literal outside brackets: keep the file, a person wraps it
        return sorted(rows)
    if changed != source:
        path.write_text(changed, encoding="utf-8")
    return sorted(left)


def trees() -> dict[Path, str]:
    """{tracked Python file: its syntax tree, dumped}."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    return {ROOT / name: ast.dump(ast.parse((ROOT / name).read_text(encoding="utf-8"))) for name in listed if name}


def main() -> int:
    before = trees()
    ruff("format", ".")
    left = {path: wrap(path, rows) for path, rows in long_lines().items()}
    ruff("format", ".")  # the split literals as the formatter lays them out (it does not join them again)
    for path, rows in left.items():
        for row in rows:
            print(f"{path.relative_to(ROOT)}:{row}: too long, not split here: wrap it by hand")
    after = trees()
    for path in sorted(path for path in before if before[path] != after.get(path)):  # a docstring ruff re-indented
        print(f"{path.relative_to(ROOT)}: its syntax tree changed: run tools/api_docs.py and the tests that read it")
    done = ruff("check", ".")
    sys.stdout.write(done.stdout)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
