"""The test suites keep the layers apart: tests/library tests the library without its lesson layer, so nothing there
imports accumlib.lessons (their models and data: tests/library/builders). Imports are read from the source (ast),
also in the scripts a test hands to a fresh process or to eval as a string."""

import ast
from pathlib import Path

import pytest

LIBRARY_TESTS = Path(__file__).resolve().parents[1] / "library"
LESSONS = "accumlib.lessons"
# test_package.py builds the wheel, which ships the lessons too: its fresh processes check the lessons' files and
# their extra's refusal there. Its own imports are checked; the scripts it runs are the wheel's users'.
WHEEL_SCRIPTS = {"test_package.py"}


def imported(source: str, *, scripts: bool = True) -> list[str]:
    """Every module `source` imports: import statements, __import__ and importlib.import_module of a literal name,
    and (scripts=True) the same in every string constant that is Python code."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ast.unparse(node.func) in ("__import__", "importlib.import_module", "import_module")
        ):
            names.append(node.args[0].value)
        elif scripts and isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                names += imported(node.value)
            except SyntaxError:  # prose, not code
                pass
    return names


def lesson_imports(source: str, **kwargs) -> list[str]:
    return [name for name in imported(source, **kwargs) if name == LESSONS or name.startswith(LESSONS + ".")]


@pytest.mark.parametrize(
    "source",
    [
        "from accumlib.lessons import data, models",
        "import accumlib.lessons.models as models",
        "from accumlib import lessons",
        "def f():\n    from accumlib.lessons.quiz import experiments",
        "x = __import__('accumlib.lessons.models')",
        "import importlib\nimportlib.import_module('accumlib.lessons')",
        'SCRIPT = """\nimport os\nfrom accumlib.lessons import data\n"""',
        "f = eval(\"__import__('accumlib.lessons.models').lessons.models.mlp()\")",
    ],
)
def test_every_way_of_importing_the_lessons_is_seen(source):
    assert lesson_imports(source)


def test_the_library_and_its_own_builders_are_not_taken_for_the_lessons():
    source = (
        "import accumlib\nfrom accumlib import batchnorm, devices\nfrom builders import data, models\n"
        "from .data import PAD\nCODE = 'import accumlib.lessons_extra'\nTEXT = 'accumlib.lessons: imports'"
    )
    assert lesson_imports(source) == []


def test_library_tests_use_no_lesson_helper():
    files = sorted(LIBRARY_TESTS.rglob("*.py"))
    assert len(files) > 20 and LIBRARY_TESTS / "builders" / "data.py" in files
    found = {
        path.relative_to(LIBRARY_TESTS).as_posix(): names
        for path in files
        if (names := lesson_imports(path.read_text(encoding="utf-8"), scripts=path.name not in WHEEL_SCRIPTS))
    }
    assert found == {}, f"tests/library imports the lesson layer (use tests/library/builders): {found}"
