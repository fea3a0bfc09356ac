"""Real-browser tests: JupyterLab and Voila render the dashboards, and moving the accum_steps slider redraws.

Playwright drives Debian's Chromium (headless; no browser is downloaded). Without Chromium these tests skip:
install it with `apt-get install -y chromium` (.ci/run does).
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="browser tests need Debian's Chromium: apt-get install -y chromium (then rerun make test)"
)
TOKEN = "accumlib-browser-test"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {seconds} s")


@pytest.fixture
def lessons(tmp_path):
    """A copy of the notebooks: JupyterLab autosaves, and must not rewrite the stored outputs."""
    folder = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder)
    return folder


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield chromium
        chromium.close()


def server(command: list[str], cwd: Path, ready_url: str):
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(ready_url)
    except TimeoutError:
        process.kill()
        raise
    return process


def stop(process) -> None:
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def menu(page, name: str, item: str) -> None:
    page.get_by_role("menuitem", name=name, exact=True).click()
    page.get_by_role("menuitem", name=re.compile(f"^{re.escape(item)}")).click()  # names end in a shortcut


def dashboard_image(page) -> str:
    """src of the loss dashboard's figure (a data: URL of the PNG)."""
    return page.locator(".widget-output img").first.get_attribute("src")


def move_accum_steps_and_see_redraw(page, value: int, effective_batch: int, label: str) -> None:
    """Type a new value into the first accum_steps slider's readout, as a learner can; the figure must change."""
    before = dashboard_image(page)
    slider = page.locator(".widget-slider", has=page.locator("label", has_text="accum_steps")).first
    slider.locator(".widget-readout").click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")
    summary = page.locator(".widget-html pre", has_text=f"accum_steps={value}, effective_batch={effective_batch}")
    summary.first.wait_for(timeout=30_000)
    assert summary.first.inner_text().startswith(label)
    page.wait_for_function(
        "before => document.querySelector('.widget-output img').src !== before", arg=before, timeout=30_000
    )
    assert_no_errors(page)


def assert_no_errors(page) -> None:
    assert page.locator("[data-mime-type='application/vnd.jupyter.stderr']").count() == 0
    assert "Traceback" not in page.inner_text("body")


def test_jupyterlab_runs_the_first_interactive_lesson_and_the_slider_redraws(lessons, browser):
    port = free_port()
    lab = server(
        [
            str(BIN / "jupyter"),
            "lab",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            "--allow-root",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={lessons}",
            f"--LabApp.workspaces_dir={lessons.parent / 'workspaces'}",
        ],  # no tabs restored from elsewhere
        lessons,
        f"http://127.0.0.1:{port}/api/status?token={TOKEN}",
    )
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/lab/tree/en/03_the_loop.ipynb?token={TOKEN}")
        page.locator(".jp-RenderedMarkdown h1", has_text="Lesson 3").first.wait_for(timeout=60_000)
        page.get_by_text("Python 3 (ipykernel) | Idle").first.wait_for(timeout=60_000)  # notebook menus are ready
        menu(page, "Edit", "Clear Outputs of All Cells")  # so what we see next was computed now
        assert page.locator(".widget-output img").count() == 0
        menu(page, "Run", "Run All Cells")
        summary = page.get_by_text("curves equal to within 1e-5: yes").first
        summary.wait_for(state="attached", timeout=120_000)
        summary.scroll_into_view_if_needed()  # JupyterLab renders only the cells near the viewport
        try:
            page.locator(".widget-output img").first.wait_for(timeout=60_000)
        except Exception as error:
            page.screenshot(path=lessons / "failure.png")
            raise AssertionError(f"no dashboard figure; screenshot: {lessons / 'failure.png'}") from error
        move_accum_steps_and_see_redraw(page, 2, effective_batch=16, label="latest run, after your change:")
    finally:
        stop(lab)


def test_voila_app_renders_the_dashboards_and_the_slider_redraws(lessons, browser):
    port = free_port()
    app = server(
        [
            str(BIN / "voila"),
            "en/dashboards.ipynb",
            "--no-browser",
            f"--port={port}",
            "--Voila.ip=127.0.0.1",
            "--ServerApp.allow_root=True",
        ],
        lessons,
        f"http://127.0.0.1:{port}/",
    )
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"http://127.0.0.1:{port}/", timeout=120_000)
        page.get_by_text("curves equal to within 1e-5: yes").first.wait_for(timeout=120_000)
        page.locator(".widget-output img").first.wait_for(timeout=30_000)
        assert page.locator("label", has_text="accum_steps").count() == 3  # one per dashboard
        # one summary per dashboard, in the dashboard, worded for the app; no cell output beside it
        label = "the figure above, with these settings:"
        assert page.locator(".widget-html pre", has_text=label).count() == 3
        assert page.get_by_text("when this cell ran").count() == 0
        move_accum_steps_and_see_redraw(page, 6, effective_batch=48, label=label)
    finally:
        stop(app)


# ---- a phone (390 px) and a desktop (1280 px): the dashboards and the quiz in Voila and JupyterLab ----
# The controls' layout. scope: null in Voila (the page is the bound: no horizontal scrolling, nothing past its
# right edge); in JupyterLab the selector of the output area each control must stay inside, none of them (nor the
# notebook) scrolling sideways.
LAYOUT = """(scope) => {
  const doc = document.documentElement, r = e => e.getBoundingClientRect();
  const sliders = [...document.querySelectorAll('.widget-slider')].map(s => {
    const track = s.querySelector('.slider-container');
    const label = s.querySelector('label');
    return {label: label ? label.textContent : '', track: track ? r(track).width : 0};
  });
  const within = scope ? scope + ' ' : '';
  const controls = [...document.querySelectorAll(within + '.widget-radio-box label, ' + within + ':is(.widget-button, '
      + '.widget-toggle-button, .widget-checkbox, .widget-slider, .widget-text, .widget-html, .widget-label)')]
    .filter(e => r(e).width > 0 && r(e).height > 0);
  const overlaps = [];
  for (let i = 0; i < controls.length; i++) for (let j = i + 1; j < controls.length; j++) {
    const a = controls[i], b = controls[j];
    if (a.contains(b) || b.contains(a)) continue;
    const p = r(a), q = r(b);
    if (Math.min(p.right, q.right) - Math.max(p.left, q.left) > 1
        && Math.min(p.bottom, q.bottom) - Math.max(p.top, q.top) > 1)
      overlaps.push([a.textContent.slice(0, 30), b.textContent.slice(0, 30)]);
  }
  const clipped = controls.filter(e => {
    const box = r(e), area = scope ? r(e.closest(scope)) : {left: 0, right: doc.clientWidth};
    return box.left < area.left - 1 || box.right > area.right + 1 || e.scrollWidth > e.clientWidth + 1;
  }).map(e => `${e.className.slice(0, 40)}: ${e.textContent.slice(0, 30)} (${r(e).left}-${r(e).right} px)`);
  const scrollers = scope ? [...document.querySelectorAll(scope + ', .jp-WindowedPanel-outer, .jp-Notebook')] : [doc];
  const overflow = Math.max(0, ...scrollers.map(e => e.scrollWidth - e.clientWidth));
  return {overflow, sliders, overlaps: overlaps.slice(0, 5), clipped: clipped.slice(0, 5)};
}"""


def assert_usable(page, width: int, scope: str | None = None, sliders: int = 0, per_step: int = 0) -> None:
    """Nothing scrolls sideways, overlaps or is cut off; with `sliders`, that many, each with a track of at least
    150 px, and accum_steps (1 to 16) at least `per_step` px per step."""
    m = page.evaluate(LAYOUT, scope)
    assert m["overflow"] <= 0 and not m["overlaps"] and not m["clipped"], (width, m)
    if sliders:
        assert len(m["sliders"]) == sliders and min(s["track"] for s in m["sliders"]) >= 150, (width, m["sliders"])
        for s in m["sliders"]:
            if s["label"] == "accum_steps":
                assert s["track"] / 15 >= per_step, (width, s)


def assert_every_question_usable(page, width: int, screenshot: Path, scope: str | None = None) -> None:
    """Step through the Hindi quiz (the longest texts) with Next, checking the layout at every question; the
    screenshot at question 13 (long options that wrap on a phone)."""
    questions = int(re.search(r"/ (\d+)", page.locator(".accumlib-quiz").inner_text()).group(1))
    for number in range(1, questions + 1):
        page.get_by_text(f"प्रश्न {number} / {questions}").wait_for(timeout=10_000)
        assert_usable(page, width, scope)
        if number == 13:
            page.locator(".accumlib-quiz").screenshot(path=str(screenshot))
        page.get_by_role("button", name="अगला").click()


def quiz_notebook(folder: Path) -> str:
    import nbformat

    notebook = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )
    notebook.cells = [nbformat.v4.new_code_cell("from accumlib.lessons import quiz\nquiz.check(language='hi')")]
    nbformat.write(notebook, folder / "quiz.ipynb")
    return "quiz.ipynb"


def test_dashboards_and_quiz_are_usable_on_a_phone_and_a_desktop(lessons, browser):
    """At 390 px (a phone) and 1280 px: no horizontal scrolling, no control over another or cut off, every slider
    with a usable track; accum_steps (1 to 16) moves at least 10 px per step on the phone and 20 px on the desktop
    (measured before: tracks of 0 px at 390, about 7 px per step at 1280). The Hindi quiz (the longest texts) is
    checked at every question. Screenshots: build/screenshots/voila-*.png."""
    shots = ROOT / "build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    quiz = quiz_notebook(lessons)
    port = free_port()
    app = server(
        [
            str(BIN / "voila"),
            str(lessons),
            "--no-browser",
            f"--port={port}",
            "--Voila.ip=127.0.0.1",
            "--ServerApp.allow_root=True",
        ],
        lessons,
        f"http://127.0.0.1:{port}/",
    )
    try:
        for width, per_step in ((390, 10), (1280, 20)):
            page = browser.new_page(viewport={"width": width, "height": 844})
            page.goto(f"http://127.0.0.1:{port}/voila/render/en/dashboards.ipynb", timeout=180_000)
            page.get_by_text("curves equal to within 1e-5: yes").first.wait_for(timeout=180_000)
            page.locator(".widget-output img").first.wait_for(timeout=60_000)
            page.locator(".widget-output img").nth(2).wait_for(timeout=60_000)  # the third dashboard's figure
            assert_usable(page, width, sliders=7, per_step=per_step)
            page.locator(".widget-vbox").filter(has=page.locator(".widget-slider")).first.screenshot(
                path=str(shots / f"voila-dashboard-{width}.png")
            )
            page.goto(f"http://127.0.0.1:{port}/voila/render/{quiz}", timeout=180_000)
            page.locator(".widget-radio-box, .widget-text").first.wait_for(timeout=180_000)
            assert_every_question_usable(page, width, shots / f"voila-quiz-{width}.png")
            page.close()
    finally:
        stop(app)


# ---- the same in JupyterLab, at a phone's 390 x 844 and a desktop's 1280 x 800 ----
# JupyterLab's own frame stays as JupyterLab draws it (at 390 px its side bars' tab strips keep about 70 px); what is
# checked is ours: every control inside its cell's output area, none over another, no output or the notebook
# scrolling sideways, slider tracks of a usable width. The notebooks open in JupyterLab's single-document view
# (/doc), as on a phone, with every cell rendered (windowingMode none: the checks see them all), and no news toast.
LAB_SETTINGS = {
    "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "notebook-extension/tracker": {"windowingMode": "none"},
}
# every code cell has run (a number in its prompt, after Clear Outputs left "[ ]") and the kernel is idle again
ALL_RAN = """() => {
  const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(p => p.textContent);
  const status = [...document.querySelectorAll('.jp-StatusBar-Widget')].map(e => e.textContent).join(' ');
  return prompts.length > 0 && prompts.every(t => /\\[\\d+\\]/.test(t)) && status.includes('| Idle');
}"""


def run_all_in_lab(page, url: str, shots: Path, name: str) -> None:
    """Open a notebook, wait for its kernel, clear the stored outputs and run every cell; wait until all have run."""
    page.goto(url, timeout=120_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").first.wait_for(timeout=120_000)  # the kernel is ready
    menu(page, "Edit", "Clear Outputs of All Cells")  # so what is measured was drawn now
    menu(page, "Run", "Run All Cells")
    try:
        page.wait_for_function(ALL_RAN, timeout=300_000, polling=250)
    except Exception as error:
        page.screenshot(path=str(shots / f"{name}-failure.png"))
        raise AssertionError(f"{url}: not every cell ran; screenshot {shots / f'{name}-failure.png'}") from error
    assert_no_errors(page)


def lab_screenshot(page, path: Path) -> None:
    """The whole notebook: for the shot, a viewport as tall as its content (the width, hence the layout, is kept)."""
    viewport = page.viewport_size
    height = page.evaluate("() => document.querySelector('.jp-WindowedPanel-outer').scrollHeight") + 200
    page.set_viewport_size({"width": viewport["width"], "height": min(height, 8000)})
    page.screenshot(path=str(path))
    page.set_viewport_size(viewport)


def test_jupyterlab_dashboards_and_quiz_are_usable_on_a_phone_and_a_desktop(tmp_path, browser):
    """The dashboards notebook and the Hindi quiz, run in JupyterLab at 390 x 844 and 1280 x 800: the checks of the
    Voila test above (sliders of at least 150 px, accum_steps at least 10 px per step on the phone and 20 on the
    desktop, no overlap, nothing cut off or scrolling sideways; every quiz question). Each width opens its own
    copies, so each runs in a fresh kernel. Screenshots: build/screenshots/lab-*.png."""
    import json

    shots = ROOT / "build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    root, settings = tmp_path / "root", tmp_path / "settings" / "@jupyterlab"
    for width in (390, 1280):
        (root / str(width)).mkdir(parents=True)
        shutil.copy(ROOT / "notebooks" / "en" / "dashboards.ipynb", root / str(width))
        quiz = quiz_notebook(root / str(width))
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / f"{name}.jupyterlab-settings").write_text(json.dumps(values))
    port = free_port()
    lab = server(
        [
            str(BIN / "jupyter"),
            "lab",
            "--no-browser",
            f"--port={port}",
            "--ip=127.0.0.1",
            "--allow-root",
            "--ServerApp.token=",
            "--IdentityProvider.token=",
            f"--ServerApp.root_dir={root}",
            f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
            f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
        ],
        root,
        f"http://127.0.0.1:{port}/api/status",
    )
    try:
        for width, height, per_step in ((390, 844, 10), (1280, 800, 20)):
            page = browser.new_page(viewport={"width": width, "height": height})
            run_all_in_lab(
                page, f"http://127.0.0.1:{port}/doc/tree/{width}/dashboards.ipynb", shots, f"lab-dashboards-{width}"
            )
            dashboards = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-slider"))
            assert dashboards.count() == 3 and all(
                dashboards.nth(i).locator(".widget-output img").count() >= 1 for i in range(3)
            )  # each dashboard drew its figures
            lab_screenshot(page, shots / f"lab-dashboards-{width}.png")
            assert_usable(page, width, ".jp-OutputArea-output", sliders=7, per_step=per_step)
            page.close()
            page = browser.new_page(viewport={"width": width, "height": height})
            run_all_in_lab(page, f"http://127.0.0.1:{port}/doc/tree/{width}/{quiz}", shots, f"lab-quiz-{width}")
            assert_every_question_usable(page, width, shots / f"lab-quiz-{width}.png", ".jp-OutputArea-output")
            page.close()
    finally:
        stop(lab)
