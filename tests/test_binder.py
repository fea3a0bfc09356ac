"""Binder's environment agrees with requirements.txt: same packages and versions, torch CPU-only."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def test_binder_pins_the_same_packages_and_versions_with_a_cpu_only_torch():
    local, local_options = pins(ROOT / "requirements.txt")
    binder, binder_options = pins(ROOT / "binder" / "requirements.txt")
    assert set(local) == set(binder)
    assert local["torch"] == "2.13.0"
    assert binder["torch"] == local["torch"] + "+cpu"
    assert {k: v for k, v in binder.items() if k != "torch"} == {k: v for k, v in local.items() if k != "torch"}
    assert binder_options == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
    assert local_options == []


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
