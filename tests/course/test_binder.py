"""Binder's environment: the lessons' stack at requirements.txt's versions, torch CPU-only, none of the test tools,
and nothing that fights repo2docker's own server environment."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> tuple[dict[str, str], list[str]]:
    packages, options = {}, []
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        if line.startswith("-"):
            options.append(line)
            continue
        name, version = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+)==(\S+)", line).groups()
        packages[name.lower()] = version
    return packages, options


TEST_TOOLS = {"pytest", "pytest-timeout", "pytest-xdist", "nbval", "playwright", "scikit-learn", "nbclient", "babel"}
# What repo2docker's Python 3.11 environment brings (repo2docker/buildpacks/conda/environment.py-3.11-linux-64.lock,
# 2025-10): the server side, which Binder's requirements.txt must not pin; notebook 7.4.7 needs jupyterlab < 4.5.
REPO2DOCKER = {"jupyterlab": "4.4.9", "notebook": "7.4.7", "jupyter-server": "2.17.0", "jupyterhub": "5.4.0"}


def test_binder_installs_the_lessons_stack_at_the_same_versions_with_a_cpu_only_torch():
    local, local_options = pins(ROOT / "requirements.txt")
    binder, binder_options = pins(ROOT / "binder" / "requirements.txt")
    assert not set(binder) & TEST_TOOLS
    assert not set(binder) & ({name.replace("-", "_") for name in REPO2DOCKER} | set(REPO2DOCKER))
    assert set(binder) <= set(local)
    assert local["torch"] == "2.13.0"
    assert binder["torch"] == local["torch"] + "+cpu"
    assert {k: v for k, v in binder.items() if k != "torch"} == {k: local[k] for k in binder if k != "torch"}
    assert binder_options == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
    assert local_options == []
    # everything the lessons import: the package's `lessons` extra, the kernel and the Voila app
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lessons"]
    needed = {re.match(r"[A-Za-z0-9_.\-]+", r).group().lower() for r in extra} - {"ipython"}  # ipykernel brings it
    assert needed | {"torch", "ipykernel", "voila"} <= set(binder)


def test_binder_pins_accept_repo2dockers_server():
    """The pinned packages' own requirements (read from this environment, where the same versions are installed)
    accept repo2docker's jupyterlab, notebook and jupyter_server."""
    from importlib import metadata

    from packaging.requirements import Requirement

    binder, _ = pins(ROOT / "binder" / "requirements.txt")
    checked = 0
    for name, version in binder.items():
        if name == "torch" or metadata.version(name) != version:
            continue
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            server = requirement.name.lower().replace("_", "-")
            if server in REPO2DOCKER and (requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
                assert requirement.specifier.contains(REPO2DOCKER[server]), (name, line)
                checked += 1
    assert checked >= 1  # voila's jupyter_server requirement at least


def test_binder_runtime_and_post_build():
    assert (ROOT / "binder" / "runtime.txt").read_text().strip() == "python-3.11"
    post_build = ROOT / "binder" / "postBuild"
    assert post_build.stat().st_mode & 0o111
    text = post_build.read_text()
    assert "pip install --no-deps -e ." in text and "FontManager" in text


def test_requirements_pin_the_whole_stack():
    local, _ = pins(ROOT / "requirements.txt")
    for name in ("torch", "jupyterlab", "ipywidgets", "matplotlib", "nbval", "voila"):
        assert name in local
