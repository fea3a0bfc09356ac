"""accumlib as a user installs it: a real wheel (`pip wheel`, not editable) that holds every module and data file
and imports on its own; and `import accumlib` without the lesson stack."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import torch

SLOW = pytest.mark.slow  # each test but the last builds or installs a wheel (pip, a venv): seconds to minutes
ROOT = Path(__file__).resolve().parents[2]
LESSON_STACK = ("matplotlib", "ipywidgets", "jsonschema", "sklearn")


@SLOW
def test_import_accumlib_imports_none_of_the_lesson_stack():
    code = f"import sys, accumlib; print([m for m in {LESSON_STACK!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@SLOW
def test_no_library_module_imports_lesson_code():
    """Every module of the library (accumlib/*.py) imported: no accumlib.lessons module comes with it (the lessons'
    experiments, BatchNorm's and DDP's, live there and the library never reaches up to them)."""
    code = (
        "import importlib, pkgutil, sys, accumlib\n"
        "for info in pkgutil.iter_modules(accumlib.__path__):\n"
        "    if info.name != 'lessons': importlib.import_module('accumlib.' + info.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('accumlib.lessons')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (the working tree stays clean), offline where setuptools allows."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "accumlib", source / "accumlib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    offline = int(metadata.version("setuptools").split(".")[0]) >= 77  # else pip fetches it (build isolation)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            *["--no-build-isolation"] * offline,
            "-w",
            str(dist),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    return next(dist.glob("accumlib-*.whl"))


@SLOW
def test_the_wheel_holds_every_file_of_the_package_and_needs_torch_alone(wheel):
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "accumlib").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {
        "accumlib/lessons/quiz/__init__.py",
        "accumlib/lessons/quiz/questions.json",
        "accumlib/lessons/digits.bin.gz",
        "accumlib/locale/hi/LC_MESSAGES/accumlib.mo",
        "accumlib/py.typed",  # PEP 561: the hints reach a user's type checker
        "accumlib/lessons/fonts/Lohit-Devanagari.ttf",
        "accumlib/lessons/fonts/OFL.txt",
    } <= sources
    assert sources - shipped == set()
    info = zipfile.ZipFile(wheel).read(next(name for name in shipped if name.endswith(".dist-info/METADATA")))
    requirements = [
        line.split(":", 1)[1].strip() for line in info.decode().splitlines() if line.startswith("Requires-Dist:")
    ]
    # torch bounded to the minor release CI tests (requirements.txt's pin): pip never pulls an untested torch
    pinned = next(
        line.split("==")[1].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.startswith("torch==")
    )
    major, minor = map(int, pinned.split(".")[:2])
    assert [r for r in requirements if "extra ==" not in r] == [f"torch<{major}.{minor + 1},>={major}.{minor}"]
    lessons = " ".join(r for r in requirements if 'extra == "lessons"' in r)
    assert all(name in lessons for name in ("matplotlib", "ipywidgets", "jsonschema"))
    # the project's URLs (the website's and the README's Binder, Colab and Kaggle buttons are built from Repository)
    urls = dict(
        line.split(":", 1)[1].strip().split(", ", 1)
        for line in info.decode().splitlines()
        if line.startswith("Project-URL:")
    )
    assert urls["Repository"].startswith("https://github.com/") and {"Homepage", "Issues"} <= set(urls)


@SLOW
def test_the_sdist_carries_every_file_its_tests_need(tmp_path):
    """The source distribution holds every tracked file but the CI workflows and git's own files: the tests, the
    notebooks nbval checks, the tools, translations and site sources they build from (MANIFEST.in)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout to list the tracked files")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    tracked = {name for name in tracked if name and (ROOT / name).is_file()}
    source = tmp_path / "source"
    for name in tracked:  # a copy: the build writes accumlib.egg-info beside the sources
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path / 'dist')!r}))"
    built = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, check=True)
    with tarfile.open(tmp_path / "dist" / built.stdout.strip().splitlines()[-1]) as sdist:
        shipped = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    left_out = {
        name
        for name in tracked - shipped
        if not name.startswith(".github/") and name not in (".gitignore", ".gitattributes")
    }
    assert left_out == set(), sorted(left_out)[:10]
    assert not any(name.startswith(".github/") for name in shipped)


@SLOW
def test_the_installed_wheel_imports_on_its_own_with_its_data(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    dependencies = str(Path(torch.__file__).parents[1])  # torch and the lesson stack, never the source tree
    code = "\n".join(
        [
            f"import sys; sys.path[:0] = [{str(target)!r}, {dependencies!r}]",
            "import json, accumlib, accumlib.lessons.quiz, accumlib.lessons.ddp_lab",
            "from importlib import resources",
            "from accumlib import i18n; from accumlib.lessons import data",
            f"assert accumlib.__file__.startswith({str(target)!r}), accumlib.__file__",
            "assert len(data.digits()[0]) == 1797",
            "assert i18n.catalogue('hi') is not None",
            "from accumlib.lessons import plots; assert plots.SHIPPED_FONT.is_file(), plots.SHIPPED_FONT",
            "assert plots.SHIPPED_FONT.with_name('OFL.txt').read_text().count('SIL Open Font License') >= 1",
            "assert json.loads((resources.files('accumlib.lessons.quiz') / "
            "'questions.json').read_text(encoding='utf-8'))",
            "print('ok')",
        ]
    )
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip() == "ok", done.stderr


STAND_IN = """# A stand-in for Colab: /content exists for this venv's processes (the machine's / is untouched)
import os.path
_isdir = os.path.isdir
os.path.isdir = lambda path: True if str(path) == "/content" else _isdir(path)
"""


@SLOW
@pytest.mark.parametrize("platform", [True, False])
def test_the_notebooks_first_cell_installs_accumlib_on_colab_and_nothing_elsewhere(wheel, tmp_path, platform):
    """tools/platform_cell.py's cell in a fresh venv that has the platform's packages (torch, matplotlib,
    ipywidgets: this environment's, as Colab has its own) and no accumlib. With /content there it installs accumlib
    alone and a Hindi figure draws; without it the cell does nothing. pip may not use an index here (PIP_NO_INDEX):
    what it installs comes from the wheel or was there."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import platform_cell
    finally:
        sys.path.pop(0)
    venv = tmp_path / "venv"
    # no pip or setuptools of its own (an old setuptools would shadow the platform's): pip comes from the platform
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "platform-stack.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    if platform:
        (site / "sitecustomize.py").write_text(STAND_IN)
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    env |= {"PIP_NO_INDEX": "1", "ACCUMLIB_INSTALL": f"accumlib[lessons] @ {wheel.as_uri()}", "OMP_NUM_THREADS": "1"}
    lesson = (
        "import accumlib, importlib.metadata as m\n"
        "accumlib.set_language('hi')\n"
        "from accumlib.lessons import plots\n"
        "curve = {'samples_seen': [32, 64], 'loss': [2.3, 1.7]}\n"
        "assert plots.loss_curves({'पूरा batch': curve}, 'संचित gradient', 'वैकल्पिक पाठ').png()\n"
        "print('accumlib', m.version('accumlib'), 'from', accumlib.__file__)"
    )
    done = subprocess.run(
        [str(python), "-c", platform_cell.SOURCE + "\n" + lesson],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    installed = sorted(p.name for p in site.iterdir() if p.suffix == ".dist-info")
    if platform:
        assert done.returncode == 0, done.stderr
        assert "installing accumlib[lessons]" in done.stdout
        assert f"from {site}" in done.stdout
        assert installed == ["accumlib-0.2.0.dist-info"]  # nothing else: the platform's packages were enough
    else:
        assert "ModuleNotFoundError: No module named 'accumlib'" in done.stderr  # nothing was installed
        assert "installing" not in done.stdout and installed == []


# Colab's versions of the packages whose upgrade would need a runtime restart there (and ipywidgets 7.7's own
# dependencies), as the issue measured them in a Colab runtime; everything else comes from this environment.
COLAB = (
    "matplotlib==3.10.0",
    "ipywidgets==7.7.1",
    "widgetsnbextension==3.6.6",
    "jupyterlab_widgets==1.1.1",
    "ipython_genutils==0.2.0",
)
LESSON_0 = ROOT / "notebooks" / "en" / "00_in_ten_minutes.ipynb"
DASHBOARD_AND_QUIZ = [
    "import accumlib, ipywidgets, matplotlib\nprint(ipywidgets.__version__, matplotlib.__version__)",
    "from accumlib.lessons import quiz, widgets\ndashboard = widgets.LossDashboard(device='cpu')\ndashboard.show()",
    "dashboard.accum_steps.value = 16  # as the slider does\ndashboard.wait()\n"
    "print(dashboard.summary.splitlines()[0])",
    "check = quiz.check(lesson=2)\ncheck",
    "check.choices.value = check.quiz.question('grad-adds-up')['answer']\nprint(check.submit().correct)",
    "accumlib.set_language('hi')\nfrom accumlib.lessons import plots\n"
    "plots.loss_curves({'पूरा batch': {'samples_seen': [1, 2], 'loss': [2.0, 1.0]}}, 'संचित', 'alt').png()",
]


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    """A stand-in for a Colab runtime: a venv with Colab's matplotlib and ipywidgets (from the package registry;
    the test skips where it cannot reach one), this environment's torch and Jupyter stack behind them, /content
    present and no accumlib; and a Jupyter kernel that runs in it."""
    if sys.platform != "linux":
        pytest.skip("Colab's runtime is Linux (the stand-in's venv layout is too)")
    folder = tmp_path_factory.mktemp("colab")
    wheels = folder / "wheels"
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *COLAB],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if fetched.returncode != 0:
        pytest.skip(f"the Colab stand-in needs {', '.join(COLAB)} from a package registry: {fetched.stderr[-300:]}")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            *map(str, wheels.glob("*.whl")),
        ],
        check=True,
        capture_output=True,
    )
    (site / "platform-stack.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")  # after the venv's own
    (site / "sitecustomize.py").write_text(STAND_IN)
    kernel = folder / "jupyter" / "kernels" / "colab"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Colab stand-in",
                "language": "python",
            }
        )
    )
    return {"site": site, "jupyter": folder / "jupyter", "cwd": folder}


def run_in(colab, notebook, wheel) -> list[dict]:
    """Execute `notebook` in the stand-in's kernel, as a learner opening it on Colab would; every cell's outputs."""
    import nbclient

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {
        "PIP_NO_INDEX": "1",
        "ACCUMLIB_INSTALL": f"accumlib[lessons] @ {wheel.as_uri()}",
        "OMP_NUM_THREADS": "1",
        "JUPYTER_PATH": str(colab["jupyter"]),
    }
    previous = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel's environment (nbclient starts it from this process's)
    try:
        nbclient.NotebookClient(
            notebook, kernel_name="colab", timeout=600, resources={"metadata": {"path": str(colab["cwd"])}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(previous)
    return [cell.get("outputs", []) for cell in notebook.cells]


def text_of(outputs) -> str:
    return "".join(
        o.get("text", "") if o["output_type"] == "stream" else "".join(o.get("data", {}).get("text/plain", ""))
        for o in outputs
    )


@SLOW
def test_on_a_colab_stand_in_the_install_cell_keeps_its_packages_and_lesson_0_a_dashboard_and_the_quiz_run(
    colab, wheel
):
    """With Colab's matplotlib 3.10 and ipywidgets 7.7, the notebooks' first cell installs accumlib alone (before:
    it upgraded both, which needs a runtime restart) and says no restart is needed; lesson 0 then runs top to bottom;
    a dashboard shows its widget (ipywidgets 7's display, accumlib.lessons._view) and redraws for a new accum_steps;
    the quiz shows and grades; a Hindi figure warns that matplotlib 3.10 cannot join Devanagari letters."""
    import nbformat

    lesson = nbformat.read(LESSON_0, as_version=4)
    outputs = run_in(colab, lesson, wheel)  # raises CellExecutionError on any cell's error
    installed = sorted(p.name for p in colab["site"].iterdir() if p.suffix == ".dist-info")
    assert [
        name
        for name in installed
        if not name.startswith(
            ("matplotlib-3.10.0", "ipywidgets-7.7.1", "widgetsnbextension", "jupyterlab_widgets", "ipython_genutils")
        )
    ] == ["accumlib-0.2.0.dist-info"]
    said = text_of(outputs[0])
    assert said.startswith("installing accumlib[lessons] @ ") and "matplotlib" not in said, said
    assert "Restart" not in said
    assert not any(o["output_type"] == "error" for cell in outputs for o in cell)
    probe = nbformat.v4.new_notebook()
    probe.cells = [nbformat.v4.new_code_cell(source) for source in DASHBOARD_AND_QUIZ]
    versions, shown, redrawn, quiz_shown, graded, hindi = run_in(colab, probe, wheel)
    assert text_of(versions).split() == ["7.7.1", "3.10.0"]
    view = "application/vnd.jupyter.widget-view+json"
    assert any(view in o.get("data", {}) for o in shown) and any(view in o.get("data", {}) for o in quiz_shown)
    assert "accum_steps=16" in text_of(redrawn)
    assert text_of(graded).strip() == "True"
    assert "matplotlib 3.10.0" in text_of(hindi) and "pip install" in text_of(hindi)


MAX_LINES = 450  # issue 29: a module a newcomer reads in one sitting


def test_no_library_module_is_longer_than_450_lines():
    """Every module of the library (accumlib/**/*.py but accumlib/lessons) as `ruff format` leaves it: at most 450
    lines, so a room of the house holds one concern."""
    package = ROOT / "accumlib"
    modules = [p for p in package.rglob("*.py") if "lessons" not in p.relative_to(package).parts]
    assert len(modules) > 20  # the library's modules were found
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines: {long}"
