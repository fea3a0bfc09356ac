"""accumlib as a user installs it: a real wheel (`pip wheel`, not editable) that holds every module and data file
and imports on its own; and `import accumlib` without the lesson stack."""
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
LESSON_STACK = ("matplotlib", "ipywidgets", "jsonschema", "sklearn")


def test_import_accumlib_imports_none_of_the_lesson_stack():
    code = f"import sys, accumlib; print([m for m in {LESSON_STACK!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (the working tree stays clean), offline where setuptools allows."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "accumlib", source / "accumlib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    offline = int(metadata.version("setuptools").split(".")[0]) >= 77  # else pip fetches it (build isolation)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *["--no-build-isolation"] * offline,
                    "-w", str(dist), str(source)], check=True, capture_output=True)
    return next(dist.glob("accumlib-*.whl"))


def test_the_wheel_holds_every_file_of_the_package_and_needs_torch_alone(wheel):
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "accumlib").rglob("*")
               if path.is_file() and "__pycache__" not in path.parts}
    assert {"accumlib/lessons/quiz/__init__.py", "accumlib/lessons/quiz/questions.json", "accumlib/lessons/digits.bin.gz",
            "accumlib/locale/hi/LC_MESSAGES/accumlib.mo", "accumlib/lessons/fonts/Lohit-Devanagari.ttf",
            "accumlib/lessons/fonts/OFL.txt"} <= sources
    assert sources - shipped == set()
    info = zipfile.ZipFile(wheel).read(next(name for name in shipped if name.endswith(".dist-info/METADATA")))
    requirements = [line.split(":", 1)[1].strip() for line in info.decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    assert [r for r in requirements if "extra ==" not in r] == ["torch>=2.6"]
    lessons = " ".join(r for r in requirements if 'extra == "lessons"' in r)
    assert all(name in lessons for name in ("matplotlib", "ipywidgets", "jsonschema"))
    # the project's URLs (the website's and the README's Binder, Colab and Kaggle buttons are built from Repository)
    urls = dict(line.split(":", 1)[1].strip().split(", ", 1) for line in info.decode().splitlines()
                if line.startswith("Project-URL:"))
    assert urls["Repository"].startswith("https://github.com/") and {"Homepage", "Issues"} <= set(urls)


def test_the_installed_wheel_imports_on_its_own_with_its_data(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True, capture_output=True)
    dependencies = str(Path(torch.__file__).parents[1])  # torch and the lesson stack, never the source tree
    code = "\n".join([
        f"import sys; sys.path[:0] = [{str(target)!r}, {dependencies!r}]",
        "import json, accumlib, accumlib.lessons.quiz, accumlib.distributed",
        "from importlib import resources",
        "from accumlib import i18n; from accumlib.lessons import data",
        f"assert accumlib.__file__.startswith({str(target)!r}), accumlib.__file__",
        "assert len(data.digits()[0]) == 1797",
        "assert i18n.catalogue('hi') is not None",
        "from accumlib.lessons import plots; assert plots.SHIPPED_FONT.is_file(), plots.SHIPPED_FONT",
        "assert plots.SHIPPED_FONT.with_name('OFL.txt').read_text().count('SIL Open Font License') >= 1",
        "assert json.loads((resources.files('accumlib.lessons.quiz') / 'questions.json').read_text(encoding='utf-8'))",
        "print('ok')"])
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip() == "ok", done.stderr
