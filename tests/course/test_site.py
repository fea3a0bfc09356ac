"""The course's website (tools/site.py, `make site`): built offline from the stored notebooks, both editions, every
page checked in Chromium at a phone's width.

The build runs in the site's own venv (.venv-site, from site/requirements.txt: `make test` installs it first; it is
not in the lessons' environment). Where that venv is missing the build tests fail and say how to make it; the
browser checks skip without Chromium, as tests/course/test_browser.py does. Screenshots of a Hindi lesson and the
dashboards page at 390 px and 1280 px are written to build/screenshots/ to be looked at.
"""

import base64
import functools
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from accumlib.lessons.plots import SMALLEST_TEXT

ROOT = Path(__file__).resolve().parents[2]
# The first test builds the site (the module's fixture): tools/site_data.py computes every dashboard setting's figure,
# minutes of CPU on a loaded 2-core machine (11 min of wall time measured at a load average of 10), past the
# project's 300 s per test; its own subprocess limit is 1800 s.
pytestmark = pytest.mark.timeout(1800)
SITE_PYTHON = ROOT / ".venv-site" / "bin" / "python"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
SCREENSHOTS = ROOT / "build" / "screenshots"
PHONE, DESKTOP = 390, 1280  # px: an iPhone 12-15's CSS width; a laptop's
EDITIONS = ("en", "hi")


def notebooks(lang):
    return sorted(p.stem for p in (ROOT / "notebooks" / lang).glob("*.ipynb"))


def widget_figures(path: Path) -> int:
    """Figures a notebook stores: image outputs of its cells and of its Output widgets (counted from the JSON)."""
    nb = json.loads(path.read_text())
    count = sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    shown = {
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for c in nb["cells"]
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    }

    def figures(ref):
        entry = state.get(ref.removeprefix("IPY_MODEL_"))
        if entry is None:
            return 0
        own = sum("image/png" in o.get("data", {}) for o in entry["state"].get("outputs", []))
        return own + sum(figures(child) for child in entry["state"].get("children", []))

    return count + sum(figures(ref) for ref in shown)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built from this checkout's notebooks into a temporary folder."""
    if not SITE_PYTHON.exists():
        pytest.fail("the site's builder is not installed: run `make .venv-site/.installed` (make test does)")
    out = tmp_path_factory.mktemp("site") / "site"
    # the quiz and the dashboards' figures are computed by the lessons' Python: this one, which runs the tests
    lessons_python = os.environ.get("ACCUMLIB_LESSONS_PYTHON", sys.executable)
    subprocess.run(
        [str(SITE_PYTHON), str(ROOT / "tools" / "site.py"), "--out", str(out)],
        check=True,
        timeout=1800,
        env=dict(os.environ, PYTHONPATH="", ACCUMLIB_LESSONS_PYTHON=lessons_python),
    )
    return out


def test_every_notebook_has_a_page_in_each_edition(site):
    for lang in EDITIONS:
        pages = {p.stem for p in (site / lang).glob("*.html")}
        assert set(notebooks(lang)) | {"index", "search"} <= pages, lang
        assert (site / lang / "searchindex.js").exists()
    assert (site / "index.html").exists()


def test_nothing_is_loaded_from_elsewhere(site):
    """Offline build, offline pages: no script, style sheet, font or image from another host."""
    import re

    external = re.compile(r'<(?:script|link|img|source|iframe)[^>]+(?:src|href)="(?:https?:)?//', re.I)
    css_external = re.compile(r'url\(\s*["\']?(?:https?:)?//|@import\s+["\']?(?:url\()?["\']?(?:https?:)?//', re.I)
    for page in site.rglob("*.html"):
        assert not external.search(page.read_text()), page
    for sheet in site.rglob("*.css"):
        assert not css_external.search(sheet.read_text(errors="replace")), sheet


@pytest.fixture(scope="module")
def served(site):
    """The site on a local HTTP server (127.0.0.1, an ephemeral port), as GitHub Pages would serve it."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # no line per request in the test's output
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("browser checks need Debian's Chromium: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
            ],
        )
        yield chromium
        chromium.close()


MEASURE = """() => {
  const doc = document.documentElement;
  const figures = [...document.querySelectorAll('article img.lesson-figure')];
  const wide = [...document.querySelectorAll('article *')].filter(e => {
      const r = e.getBoundingClientRect();
      return r.width > 0 && r.right > doc.clientWidth + 1 && !e.closest('.highlight') && !e.closest('pre');
    }).map(e => e.tagName + '.' + e.className).slice(0, 5);
  return {
    scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, wide,
    figures: figures.length, broken: figures.filter(i => !(i.complete && i.naturalWidth > 0)).length,
    noAlt: figures.filter(i => !i.alt.trim()).length,
    launch: [...document.querySelectorAll('.lesson-bar a.launch-button')].map(a => [a.textContent, a.href]),
    shown: [...document.querySelectorAll('.lesson-bar a.launch-button')].filter(a => a.offsetWidth > 0)
      .map(a => a.href),
    switch: [...document.querySelectorAll('.lesson-bar a.language-switch')].map(a => a.getAttribute('href')),
    lang: doc.lang,
    // every cell output inside the page; a figure or table wider than it scrolls inside its own box
    outputsWider: [...document.querySelectorAll('article div.cell_output')].filter(e =>
      e.getBoundingClientRect().right > doc.clientWidth + 1 || e.getBoundingClientRect().left < -1).length,
    // each figure's pixels and its drawn width: its smallest text is drawn at (its size in px) x rendered / natural
    figureSizes: figures.filter(i => i.naturalWidth > 0).map(i => ({src: i.src, natural: i.naturalWidth,
                                                                    rendered: i.getBoundingClientRect().width})),
    // a box in a cell output that scrolls sideways: its reader sees part of a figure or a table at a time
    scrolled: [...document.querySelectorAll('article div.cell_output, article div.cell_output *')].filter(e =>
      e.scrollWidth > e.clientWidth + 1 && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX))
      .map(e => e.tagName + '.' + e.className).slice(0, 5),
    tables: document.querySelectorAll('article div.cell_output table').length,
    needsKernel: document.querySelectorAll('.static-dashboard .needs-kernel').length,
    dashboards: document.querySelectorAll('.static-dashboard').length,
  };
}"""


def figure_text_px(site: Path, served: str, figure: dict) -> float | None:
    """The smallest text of a figure on the page, in CSS px: its font size in points (the PNG's SMALLEST_TEXT chunk,
    written by accumlib.lessons.plots) at its dpi, scaled by its drawn width over its pixels. None: a PNG without
    that chunk (drawn before figures recorded it)."""
    from PIL import Image

    src = figure["src"]
    png = (
        base64.b64decode(src.split(",", 1)[1])
        if src.startswith("data:")
        else (site / src.removeprefix(served + "/")).read_bytes()
    )
    image = Image.open(io.BytesIO(png))
    if SMALLEST_TEXT not in image.text:
        return None
    return float(image.text[SMALLEST_TEXT]) * image.info["dpi"][0] / 72 * figure["rendered"] / image.width


def test_every_page_in_chromium_at_a_phones_width(site, served, browser):
    """Figures load and have alt text, the launch buttons and the language switch are there and lead to the same
    lesson in the other edition, nothing is wider than a 390 px screen nor scrolls sideways inside an output, and
    every figure's smallest text is drawn at 9 px or more (before: 5.7 px scaled, or the figure scrolled)."""
    import urllib.request

    page = browser.new_page(viewport={"width": PHONE, "height": 844})
    outside = []
    page.on(
        "request",
        lambda r: outside.append(r.url) if not r.url.startswith(served) and not r.url.startswith("data:") else None,
    )
    checked = 0
    smallest_figure_text, small = [], {}  # every figure's smallest text (px); the pages with one under 9 px
    for lang in EDITIONS:
        other = "hi" if lang == "en" else "en"
        for stem in [*notebooks(lang), "index"]:
            page.goto(f"{served}/{lang}/{stem}.html", wait_until="load")
            m = page.evaluate(MEASURE)
            where = f"{lang}/{stem}"
            assert m["lang"] == lang, where
            assert m["scrollWidth"] <= m["clientWidth"], (where, m["scrollWidth"], m["wide"])
            assert m["outputsWider"] == 0 and m["scrolled"] == [], (where, m["scrolled"])
            sizes = [figure_text_px(site, served, figure) for figure in m["figureSizes"]]
            if None in sizes or min(sizes, default=9) < 9:  # figure text: 9 px at least
                small[where] = sizes
            smallest_figure_text += [size for size in sizes if size is not None]
            assert m["switch"] == [f"../{other}/{stem}.html"], where
            urllib.request.urlopen(f"{served}/{other}/{stem}.html").close()  # the other edition's page exists
            if stem == "index":
                continue
            expected = widget_figures(ROOT / "notebooks" / lang / f"{stem}.ipynb")
            assert m["figures"] == expected and m["broken"] == 0 and m["noAlt"] == 0, (where, m)
            # Binder's single-document view first; JupyterLab beside it only where the screen is wide enough
            binder = [href for _, href in m["launch"] if "mybinder.org" in href]
            assert "urlpath=doc%2Ftree%2Fnotebooks" in binder[0] and "urlpath=lab%2Ftree" in binder[1], where
            assert binder[0] in m["shown"] and binder[1] not in m["shown"], where
            hosts = [href.split("/")[2] for _, href in m["launch"]]
            assert {"mybinder.org", "colab.research.google.com", "kaggle.com"} <= set(hosts), where
            assert any(
                f"notebooks%2F{lang}%2F{stem}.ipynb" in href or f"notebooks/{lang}/{stem}.ipynb" in href
                for _, href in m["launch"]
            ), where
            # a page with a dashboard links the Voila app and says, at each dashboard, that it needs a kernel
            assert ("voila" in " ".join(h for _, h in m["launch"])) == (m["dashboards"] > 0), where
            assert m["needsKernel"] == m["dashboards"], where
            checked += 1
    assert checked == len(notebooks("en")) + len(notebooks("hi"))
    print(f"smallest figure text at {PHONE} px: {min(smallest_figure_text):.2f} px")
    # None: a figure without its font size, drawn before plots.py recorded it (execute its notebook again)
    assert small == {}, small
    assert outside == [], outside[:5]  # every request went to the site itself


def test_the_dashboards_page_shows_each_dashboards_stored_figure(served, browser):
    page = browser.new_page(viewport={"width": DESKTOP, "height": 900})
    for lang in EDITIONS:
        page.goto(f"{served}/{lang}/dashboards.html", wait_until="load")
        dashboards = page.locator(".static-dashboard")
        assert dashboards.count() == 3, lang  # loss, memory, BatchNorm
        for i in range(3):
            assert dashboards.nth(i).locator("img.lesson-figure").count() >= 1
            assert dashboards.nth(i).locator("input[type=range]").count() >= 2  # micro-batch size, accum_steps


def test_search_finds_a_lesson_in_each_edition(served, browser):
    page = browser.new_page(viewport={"width": DESKTOP, "height": 900})
    # a Hindi word too: Sphinx has no Hindi splitter, and its index and its search split a word the same way
    for lang, word, lesson in (
        ("en", "BatchNorm", "07_batchnorm"),
        ("hi", "BatchNorm", "07_batchnorm"),
        ("hi", "प्रश्नोत्तरी", "10_recap_and_quiz"),
    ):
        page.goto(f"{served}/{lang}/search.html?q={word}", wait_until="load")
        page.wait_for_selector("#search-results ul li a", timeout=20000)
        hits = page.locator("#search-results ul li a").evaluate_all("l => l.map(a => a.getAttribute('href'))")
        assert any(lesson in h for h in hits), (lang, word, hits)


def test_screenshots_of_a_hindi_lesson_and_the_dashboards(served, browser):
    """Screenshots to look at (build/screenshots/): lesson 7 in both editions (its top and its first figure) and the
    dashboards pages."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for width in (PHONE, DESKTOP):
        page = browser.new_page(viewport={"width": width, "height": 844 if width == PHONE else 800})
        for name, path in (
            ("hi-lesson", "hi/07_batchnorm.html"),
            ("en-lesson", "en/07_batchnorm.html"),
            ("dashboards", "en/dashboards.html"),
            ("hi-dashboards", "hi/dashboards.html"),
        ):
            page.goto(f"{served}/{path}", wait_until="load")
            page.evaluate("document.fonts.ready")
            page.screenshot(path=str(SCREENSHOTS / f"site-{name}-{width}.png"))
            figure = page.locator("article div.cell_output img.lesson-figure").first
            if "lesson" in name and figure.count():
                figure.scroll_into_view_if_needed()
                page.screenshot(path=str(SCREENSHOTS / f"site-{name}-{width}-figure.png"))
            dashboard = page.locator(".static-dashboard").first
            if dashboard.count():
                dashboard.scroll_into_view_if_needed()
                dashboard.screenshot(path=str(SCREENSHOTS / f"site-{name}-{width}-dashboard.png"))
        page.close()
    assert len(list(SCREENSHOTS.glob("site-*.png"))) >= 12


def bank_question(qid: str) -> dict:
    """A question as the quiz's own loader reads it (the bank the notebooks' quiz asks)."""
    return next(
        q
        for q in json.loads((ROOT / "accumlib" / "lessons" / "quiz" / "questions.json").read_text())["questions"]
        if q["id"] == qid
    )


def test_the_quiz_is_answered_in_the_page_and_the_first_try_score_survives_a_reload(served, browser):
    """Lesson 2's quick check on the site, without a kernel: a wrong option gives that option's feedback and the
    hint, the right one the explanation, a number question grades typed numbers (a known wrong one gets its own
    feedback); the score counts first tries, and after a reload it is the same (localStorage); a predict question
    shows its stored run once answered. Both editions."""
    context = browser.new_context(viewport={"width": PHONE, "height": 844})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    for lang, right, wrong in (("en", "Correct!", "That is not it. Try again."), ("hi", "सही!", None)):
        page.goto(f"{served}/{lang}/02_grad_accumulates.html", wait_until="load")
        check = page.locator(".web-quiz").filter(has=page.locator(".wq-question[data-qid=grad-adds-up]"))
        assert check.count() == 1, lang
        assert check.locator(".wq-question").count() == 5, lang  # grad-adds-up ... logging-loss: the stored quiz's
        question = check.locator(".wq-question[data-qid=grad-adds-up]")
        options = question.locator(".wq-option")
        texts = options.all_inner_texts()
        bank = bank_question("grad-adds-up")
        if lang == "en":  # the options are the bank's, shown in the quiz's order for the website's seed
            assert sorted(texts) == sorted(o["text"] for o in bank["options"])
        right_text = next(o["text"] for o in bank["options"] if o["id"] == bank["answer"])
        wrong_index = next(i for i, t in enumerate(texts) if lang != "en" or t != right_text)
        if lang == "en":
            wrong_option = next(o for o in bank["options"] if o["text"] == texts[wrong_index])
        options.nth(wrong_index).locator("input").check()
        question.locator(".wq-check").click()
        feedback = question.locator(".wq-feedback").inner_text()
        if lang == "en":
            assert feedback.startswith(wrong) and wrong_option["feedback"] in feedback, feedback
            assert bank["hint"] in question.locator(".wq-hint").inner_text()
        number = check.locator(".wq-question[data-qid=samples-per-step]")
        number.locator("input").fill("16")
        number.locator(".wq-check").click()
        known = next(c["feedback"] for c in bank_question("samples-per-step")["known_wrong"] if c["answer"] == 16)
        if lang == "en":
            assert known in number.locator(".wq-feedback").inner_text()
        number.locator("input").fill("64")
        number.locator(".wq-check").click()
        assert number.locator(".wq-feedback").inner_text().startswith(right if lang == "en" else "सही"), lang
        score = check.locator(".wq-score").inner_text()
        page.reload(wait_until="load")
        again = page.locator(".web-quiz").filter(has=page.locator(".wq-question[data-qid=grad-adds-up]"))
        assert again.locator(".wq-score").inner_text() == score, (lang, score)
        assert again.locator(".wq-before").count() == 2  # the two questions answered before the reload
        if lang == "en":  # two answered, neither right at the first try; one right in the end
            assert score == "Score: 0 of 5 right at the first try, 1 of 5 in the end", score
        predict = page.locator(".wq-question[data-qid=predict-no-division-adam]")
        assert predict.locator(".wq-result").is_hidden()
        predict.locator(".wq-option input").first.check()
        predict.locator(".wq-check").click()
        assert "Adam" in predict.locator(".wq-result pre").inner_text(), lang  # the run's text, stored at the build
    assert errors == [], errors
    context.close()


def platform_fonts(page, selector: str) -> list[str]:
    """The fonts Chromium drew `selector`'s first element's text with (DevTools' CSS.getPlatformFontsForNode)."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    cdp.detach()
    return [f["familyName"] for f in fonts]


def test_the_install_cell_and_the_timer_emoji_are_not_on_the_site_and_hindi_text_uses_the_shipped_font(served, browser):
    """The Colab/Kaggle install cell (tag remove-cell) is on no page, nor the Hindi notebooks' cell that sets their
    language (tag language: the page is in Hindi already); the lesson time shows the theme's stopwatch
    icon, not the ⏱ emoji (a font the page does not carry); the Hindi title, text and code comments are drawn in
    Lohit Devanagari, the font the site ships (before: headings and code fell back to whatever the system had)."""
    page = browser.new_page(viewport={"width": DESKTOP, "height": 900})
    for lang in EDITIONS:
        for stem in notebooks(lang):
            page.goto(f"{served}/{lang}/{stem}.html", wait_until="load")
            text = page.inner_text("article")
            assert "ACCUMLIB_INSTALL" not in text and "Colab and Kaggle only" not in text, (lang, stem)
            assert "set_language(" not in text, (lang, stem)
            assert "⏱" not in text, (lang, stem)
        page.goto(f"{served}/{lang}/03_the_loop.html", wait_until="load")
        assert page.locator("article .fa-stopwatch").count() == 1, lang
    page.goto(f"{served}/hi/03_the_loop.html", wait_until="load")
    page.evaluate("document.fonts.ready")
    comment = "article .highlight .c1"
    assert page.locator(comment).count() > 0
    hindi_comment = next(
        i for i, t in enumerate(page.locator(comment).all_inner_texts()) if any("\u0900" <= c <= "\u097f" for c in t)
    )
    page.evaluate(f"(i) => document.querySelectorAll({comment!r})[i].id = 'hindi-comment'", hindi_comment)
    for selector in ("article h1", "article p", "#hindi-comment"):
        assert "Lohit Devanagari" in platform_fonts(page, selector), selector
        # named by the page's CSS itself: a machine whose fallback is another font still gets the shipped one
        family = page.evaluate(f"() => getComputedStyle(document.querySelector({selector!r})).fontFamily")
        assert "Lohit Devanagari" in family, (selector, family)


# bytes. The dashboards' figures for every offered setting, both editions (measured: about 10 MiB); the whole
# site with them (measured before them: 17 MB, mostly the theme's assets and the notebooks' inline figures, twice)
DASHBOARDS_BUDGET, SITE_BUDGET = 12 * 2**20, 32 * 2**20


def test_the_site_fits_its_size_budget(site):
    total = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    figures = sum(f.stat().st_size for f in site.glob("*/_dashboards/*.png"))
    assert 0 < figures <= DASHBOARDS_BUDGET and total <= SITE_BUDGET, (total, figures)


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
def test_a_dashboards_sliders_change_its_figure_and_findings(served, browser, width):
    """On the dashboards page, without a kernel: moving accum_steps (the loss dashboard) or the card (memory) shows
    the figure, alt text and findings computed for that setting; a switch the site offers changes them too; the
    controls carry the dashboard's own labels. Both editions, at a phone's and a desktop's width; screenshots before
    and after to look at (build/screenshots/site-slider-*.png)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": width, "height": 844})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    for lang in EDITIONS:
        page.goto(f"{served}/{lang}/dashboards.html", wait_until="load")
        loss = page.locator(".web-dashboard[data-dashboard=loss]")
        assert loss.count() == 1 and page.locator(".web-dashboard").count() == 3, lang
        figure = loss.locator("img.lesson-figure").first
        before = (figure.get_attribute("src"), figure.get_attribute("alt"), loss.locator(".wd-summary").inner_text())
        assert "accum_steps=4" in before[2] and "micro_batch_size=8" in before[2], before[2]
        loss.scroll_into_view_if_needed()
        loss.screenshot(path=str(SCREENSHOTS / f"site-slider-{lang}-{width}-before.png"))
        slider = loss.locator("input[type=range][data-part=accum_steps]")
        box = loss.locator(".sw-slider", has=page.locator("input[data-part=accum_steps]"))
        assert "accum_steps" in box.inner_text()
        slider.fill("15")  # index 15: accum_steps 16
        page.wait_for_function(
            "(src) => document.querySelector('.web-dashboard[data-dashboard=loss] "
            "img.lesson-figure').getAttribute('src') !== src",
            arg=before[0],
        )
        after = (figure.get_attribute("src"), figure.get_attribute("alt"), loss.locator(".wd-summary").inner_text())
        assert "accum_steps=16" in after[2] and after[1] != before[1], after
        assert box.locator("output").inner_text() == "16"
        assert page.evaluate("(img) => img.complete && img.naturalWidth > 0", figure.element_handle())
        loss.screenshot(path=str(SCREENSHOTS / f"site-slider-{lang}-{width}-after.png"))
        switch = loss.locator("input[type=checkbox][data-switch=forget_division]")
        assert switch.is_enabled() and loss.locator("input[type=checkbox]:disabled").count() == 3
        switch.check()
        assert "forget_division=True" in loss.locator(".wd-summary").inner_text()
        memory = page.locator(".web-dashboard[data-dashboard=memory]")
        card = memory.locator("input[type=range][data-part=extra]")
        summary = memory.locator(".wd-summary").inner_text()
        card.fill("4")  # 4 MiB
        assert memory.locator(".wd-summary").inner_text() != summary
        assert f"memory_budget={4 * 2**20}" in memory.locator(".wd-summary").inner_text()
        width_now = page.evaluate("document.documentElement.scrollWidth")
        assert width_now <= width, (lang, width_now)
    assert errors == [], errors


# ---- the library section: docs/*.md as pages of the English edition, linked from the Hindi one ----


def site_module():
    """tools/site.py as a module (its functions, without building anything)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("site_builder", ROOT / "tools" / "site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def docs_pages():
    return sorted(p.stem for p in (ROOT / "docs").glob("*.md"))


@pytest.fixture
def fake_repository(tmp_path, monkeypatch):
    """tools/site.py pointed at a small repository: docs/, a lesson in each edition, a library file."""
    module = site_module()
    (tmp_path / "docs" / "images").mkdir(parents=True)
    (tmp_path / "docs" / "images" / "a.png").write_bytes(b"png")
    for lang in ("en", "hi"):
        (tmp_path / "notebooks" / lang).mkdir(parents=True)
        (tmp_path / "notebooks" / lang / "03_the_loop.ipynb").write_text("{}")
    (tmp_path / "accumlib").mkdir()
    (tmp_path / "accumlib" / "loop.py").write_text("")
    (tmp_path / "pyproject.toml").write_text('[project.urls]\nRepository = "https://github.com/someone/thing"\n')
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(module, "NOTEBOOKS", tmp_path / "notebooks")
    return module, tmp_path


def test_a_docs_pages_links_are_rewritten_for_the_site(fake_repository):
    """Another docs page and a docs image stay relative; an English lesson is the page one folder up, a Hindi one the
    Hindi edition's page (a plain link: not a document of the English project); any other repository file is on
    GitHub (a file in blob/, a folder in tree/), its anchor kept; URLs, anchors and code blocks are left alone."""
    module, root = fake_repository
    (root / "docs" / "other.md").write_text("# Other\n")
    (root / "docs" / "page.md").write_text(
        "# Page\n\nSee [other](other.md#a-part), ![a figure](images/a.png),"
        " [the loop](../notebooks/en/03_the_loop.ipynb), [पाठ 3](../notebooks/hi/03_the_loop.ipynb),"
        " [`loop.py`](../accumlib/loop.py#L10), [the code](../accumlib),"
        " [a site](https://example.org/x.md) and [here](#page).\n\n```text\n[kept](../nowhere.md)\n```\n"
    )
    page = module.library_page("page")
    assert "[other](other.md#a-part)" in page and "![a figure](images/a.png)" in page
    assert "[the loop](../03_the_loop.ipynb)" in page
    assert '<a href="../../hi/03_the_loop.html">पाठ 3</a>' in page
    assert "[`loop.py`](https://github.com/someone/thing/blob/main/accumlib/loop.py#L10)" in page
    assert "[the code](https://github.com/someone/thing/tree/main/accumlib)" in page
    assert "[a site](https://example.org/x.md)" in page and "[here](#page)" in page
    assert "[kept](../nowhere.md)" in page  # inside a code block: text, not a link


@pytest.mark.parametrize(
    "link, says",
    [("../missing.py", "no such file"), ("../../outside.md", "no such file"), ("../accumlib/loop.py", "docs/images/")],
)
def test_a_docs_link_to_nothing_or_an_image_from_elsewhere_stops_the_build(fake_repository, link, says):
    """A link to a file the repository lacks (or outside it) would 404 on the site and on GitHub: the build stops
    and names the page and the link; so does an image outside docs/images/ (the site would not have it)."""
    module, root = fake_repository
    image = "!" if says == "docs/images/" else ""
    (root / "docs" / "page.md").write_text(f"# Page\n\n{image}[this]({link})\n")
    with pytest.raises(SystemExit, match="docs/page.md") as error:
        module.library_page("page")
    assert link in str(error.value) and says in str(error.value)


def test_every_docs_page_is_in_the_library_section_in_order_and_the_switch_finds_its_counterpart():
    """A docs page missing from tools/site.py's order still gets a page (after the others); the language switch of a
    library page leads to the Hindi edition's library page and back to the English section's index."""
    module = site_module()
    assert sorted(module.library_pages()) == docs_pages()
    assert module.library_pages()[:3] == ["install", "library", "api"]
    assert module.counterpart("library/api", "hi") == "library"
    assert module.counterpart("library", "en") == "library/index"
    assert module.counterpart("03_the_loop", "hi") == "03_the_loop"


def test_the_library_section_has_a_page_per_docs_file_after_the_lessons(site):
    """en/library/index.html lists every docs page; each is a page of the English edition; the left navigation's
    "Library" comes after its "Lessons" on every page; the Hindi edition's library page links to each English page."""
    index = (site / "en" / "library" / "index.html").read_text()
    for stem in docs_pages():
        assert (site / "en" / "library" / f"{stem}.html").exists(), stem
        assert f'href="{stem}.html"' in index, stem
    for page in (site / "en" / "index.html", site / "en" / "library" / "api.html", site / "en" / "03_the_loop.html"):
        text = page.read_text()
        assert 0 < text.index('caption-text">Lessons') < text.index('caption-text">Library'), page
    hindi = (site / "hi" / "library.html").read_text()
    assert 'href="../en/library/index.html"' in hindi
    assert all(f'href="../en/library/{stem}.html"' in hindi for stem in docs_pages())
    assert 'href="library.html"' in (site / "hi" / "index.html").read_text()


def page_text(path: Path) -> str:
    import html.parser

    class Text(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.parts = []

        def handle_data(self, data):
            self.parts.append(data)

    parser = Text()
    parser.feed(path.read_text())
    return "".join(parser.parts)


def test_the_api_page_names_every_public_name_of_accumlib(site):
    import accumlib

    text = page_text(site / "en" / "library" / "api.html")
    missing = [name for name in accumlib.__all__ if f"accumlib.{name}" not in text]
    assert missing == [], missing


def links_of(path: Path) -> list[str]:
    """Every href and src of a built page's a, link, img and script elements."""
    import html.parser

    class Links(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.found = []

        def handle_starttag(self, tag, attrs):
            if tag in ("a", "link", "img", "script"):
                self.found += [value for name, value in attrs if name in ("href", "src") and value]

    parser = Links()
    parser.feed(path.read_text())
    return parser.found


def test_no_link_of_the_library_pages_is_broken(site):
    """Every relative link of the library pages (and of both home pages, which lead to them) is a file of the built
    site, and its #anchor an id in that page; a link to GitHub names a file or folder this repository has (the docs'
    links to ../accumlib/..., ../tests/... go there); no link is left to a .md or .ipynb file."""
    import re
    from urllib.parse import unquote, urlsplit

    owner, name = site_module().repository()
    on_github = re.compile(rf"https://github\.com/{owner}/{name}/(?:blob|tree)/main/([^#?]+)")
    pages = [
        *sorted((site / "en" / "library").glob("*.html")),
        site / "hi" / "library.html",
        site / "en" / "index.html",
        site / "hi" / "index.html",
    ]
    broken, checked = [], 0
    for page in pages:
        for link in links_of(page):
            parts = urlsplit(link)
            if parts.scheme in ("http", "https"):
                found = on_github.match(link)
                if link.startswith("https://github.com/") and found and not (ROOT / unquote(found.group(1))).exists():
                    broken.append((page.name, link))
                continue
            if parts.scheme:  # data:, mailto:
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            ok = target.is_file() and target.is_relative_to(site.resolve()) and target.suffix not in (".md", ".ipynb")
            if ok and parts.fragment and target.suffix == ".html":
                ok = f'id="{parts.fragment}"' in target.read_text()
            if not ok:
                broken.append((str(page.relative_to(site)), link))
            checked += 1
    assert checked > 100 and broken == [], broken[:10]


def test_the_library_pages_in_chromium_at_a_phones_width(served, browser):
    """Each library page (and the Hindi edition's) at 390 px: nothing wider than the screen (long inline code, such as
    a test's name, breaks; a wide table or code block scrolls in its own box), its language, its images loaded,
    nothing fetched from elsewhere; the language switch leads to the other edition's library page."""
    page = browser.new_page(viewport={"width": PHONE, "height": 844})
    outside = []
    page.on(
        "request",
        lambda r: outside.append(r.url) if not r.url.startswith(served) and not r.url.startswith("data:") else None,
    )
    for path in [*(f"en/library/{stem}" for stem in ["index", *docs_pages()]), "hi/library"]:
        page.goto(f"{served}/{path}.html", wait_until="load")
        m = page.evaluate("""() => ({scrollWidth: document.documentElement.scrollWidth,
          clientWidth: document.documentElement.clientWidth, lang: document.documentElement.lang,
          broken: [...document.querySelectorAll('article img')].filter(i => !(i.complete && i.naturalWidth)).length,
          switch: [...document.querySelectorAll('.lesson-bar a.language-switch')].map(a => a.getAttribute('href')),
          wide: [...document.querySelectorAll('article *')].filter(e => !e.closest('pre')
            && !e.closest('.pst-scrollable-table-container') && e.getBoundingClientRect().right > innerWidth + 1)
            .map(e => e.tagName + '.' + e.className).slice(0, 5)})""")
        assert m["scrollWidth"] <= m["clientWidth"] and m["wide"] == [], (path, m)
        assert m["lang"] == path[:2] and m["broken"] == 0, (path, m)
        assert m["switch"] == (["../../hi/library.html"] if path.startswith("en") else ["../en/library/index.html"])
    assert outside == [], outside[:5]


def test_the_site_reads_a_stored_quiz_s_questions_where_the_quiz_puts_them():
    """The website's quiz asks what the notebook's quiz asked: its ids, from the stored output's metadata (no view
    shows them: hindi.md X-9), under the key the quiz writes (tools/site.py cannot import accumlib: its own venv)."""
    from accumlib.lessons import quiz

    module = site_module()
    assert module.QUIZ_IDS == quiz.QUESTIONS_METADATA
    stored = [
        output
        for path in sorted((ROOT / "notebooks").glob("*/*.ipynb"))
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
        for output in cell.get("outputs", [])
        if quiz.QUESTIONS_METADATA in output.get("metadata", {})
    ]
    quiz_cells = sum(
        1
        for path in sorted((ROOT / "notebooks").glob("*/*.ipynb"))
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]
        if cell["cell_type"] == "code"
        and ("quiz.check(" in "".join(cell["source"]) or "quiz.predict(" in "".join(cell["source"]))
    )
    assert quiz_cells and len(stored) == quiz_cells
    bank = {q["id"] for q in quiz.bank()["questions"]}
    assert all(set(output["metadata"][quiz.QUESTIONS_METADATA]) <= bank for output in stored)
