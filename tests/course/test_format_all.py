"""tools/format_all.py (`make format`): the string literals ruff format leaves over the limit are split into adjacent
literals within it, and a file is rewritten only where its syntax tree stays the same."""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("format_all", ROOT / "tools" / "format_all.py")
format_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(format_all)
LIMIT = 40  # short lines, so the cases stay readable


def joined(lines: list[str]) -> str:
    """The value of the adjacent literals on `lines` (inside brackets, as Python joins them)."""
    return ast.literal_eval("(" + "\n".join(line.rstrip(",)") for line in lines) + ")")


@pytest.mark.parametrize(
    "line",
    [
        '        "one two three four five six seven eight nine",',
        '    "one two three four five six seven eight nine ten eleven twelve thirteen")',
        "        r'raw \\d+ words in a row of raw text to split here'",
    ],
)
def test_a_long_literal_becomes_adjacent_literals_within_the_limit_with_the_same_value(line):
    pieces = format_all.split_literal(line, LIMIT)
    assert pieces and len(pieces) >= 2 and all(len(piece) <= LIMIT for piece in pieces)
    indent = line[: len(line) - len(line.lstrip())]
    assert all(piece.startswith(indent) and not piece[len(indent)].isspace() for piece in pieces)
    assert joined(pieces) == joined([line])
    assert pieces[-1].endswith(line[len(line.rstrip(",)")) :])  # the comma or bracket stays last


def test_an_f_string_is_split_outside_its_fields_and_a_piece_without_one_is_plain():
    line = """        f"refused: {' or '.join(names)} are not valid here","""  # spaces inside the field too
    pieces = format_all.split_literal(line, LIMIT)
    assert pieces and all(len(piece) <= LIMIT for piece in pieces)
    assert all(piece.count("{") == piece.count("}") for piece in pieces)  # no field cut in two
    assert all(piece.lstrip().startswith("f") == ("{" in piece) for piece in pieces)  # ruff's F541
    names = ["a", "b"]
    assert eval("(" + "\n".join(piece.rstrip(",") for piece in pieces) + ")") == (
        f"refused: {' or '.join(names)} are not valid here"
    )


@pytest.mark.parametrize(
    "line",
    [
        '        "short enough",',  # within the limit: nothing to do
        '        "two" "literals on one line that is far too long",',
        '        """a triple-quoted string that is far too long to fit""",',
        '        "nospacesinthisliteralatallsoitcannotbesplitanywhere",',
        '        call("an argument that is far too long for the line"),',  # not a literal alone on its line
    ],
)
def test_what_it_cannot_split_safely_is_left_alone(line):
    assert format_all.split_literal(line, LIMIT) is None


def test_a_file_is_rewritten_only_where_its_syntax_tree_stays_the_same(tmp_path):
    inside = tmp_path / "inside.py"
    inside.write_text('x = (\n    "one two three four five six seven eight nine ten"\n)\n')
    assert format_all.wrap(inside, [2], LIMIT) == []
    assert len(inside.read_text().splitlines()) == 4 and ast.literal_eval(inside.read_text()[4:]) == (
        "one two three four five six seven eight nine ten"
    )
    bare = tmp_path / "bare.py"  # a literal statement: two lines would be two statements
    source = 'def f():\n    "one two three four five six seven eight nine ten"\n'
    bare.write_text(source)
    assert format_all.wrap(bare, [2], LIMIT) == [2] and bare.read_text() == source
