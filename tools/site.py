"""Build the course's website: both editions, from the stored notebooks (never executed), offline.

    python tools/site.py [--out build/site]          (`make site` runs it in .venv-site, site/requirements.txt)

Layout of the result (publish the folder as it is, e.g. with GitHub Pages):
    build/site/index.html          choose a language (a link to each edition's home page)
    build/site/en/index.html       English home page: what the course is, the table of contents
    build/site/en/<lesson>.html    one page per notebook in notebooks/en/, in file-name order, dashboards last
    build/site/hi/...              the same for notebooks/hi/ (Hindi)
    build/site/en/library/         the library section: index.html lists the pages of docs/*.md, one page each
                                   (api.html the API reference, docs/api.md); build/site/hi/library.html links to it

Each edition is one Sphinx project (MyST-NB reads the notebooks, the book theme lays them out; site/conf.py), built
with its own language, so its search index, its theme's labels and its `lang` attribute are its language's.

What the page shows of a notebook is what is stored in it. Widgets have no kernel on a static page, so each stored
widget is drawn here as plain HTML from the notebook's widget state: its text, its controls as they were set
(disabled) and its figures; a dashboard says that it needs a kernel and how to open one. Each stored quiz is
answered in the page (site/_static/quiz.js, no kernel): its questions as accumlib's quiz loads and grades them,
computed with the lessons' Python by tools/site_data.py (a small script of our own rather than jupyterquiz: the
bank's grading, its per-option and known-wrong-number feedback, the hint rule and the translations already live in
accumlib.lessons.quiz, and the site takes them from there, so the two quizzes cannot drift). No script of
the widgets' manager is loaded (it would come from a CDN). Every figure is an <img> with the alt text its notebook
stores.

The library section is docs/*.md as they are read on GitHub, with their links rewritten for the site (library_page):
a link to another docs page or to an English lesson stays a link between pages of the site, to a Hindi lesson it
goes to the Hindi edition's page, and to any other file of the repository (../accumlib/loop.py, ../INSTRUCTORS.md)
to that file on GitHub; a link to a file that does not exist stops the build. The docs are in English, so the
section is built once, into the English edition (its search finds them there); the Hindi edition has one page that
says so in Hindi and links to each of them (one copy to build and test, no English pages in a Hindi search index).

The page's own strings (buttons, notices) are English msgids translated in translations/site/<lang>.po.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import quote

from babel.messages.pofile import read_po

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SITE = ROOT / "site"
LANGUAGES = {"en": "English", "hi": "हिन्दी"}  # each edition's folder under notebooks/ and its name in itself
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SLIDERS = {
    "IntSliderModel",
    "FloatSliderModel",
    "SelectionSliderModel",
    "FloatLogSliderModel",
    "IntRangeSliderModel",
    "FloatRangeSliderModel",
    "SelectionRangeSliderModel",
}


def repository() -> tuple[str, str]:
    """(owner, name) of the GitHub repository named in pyproject.toml's [project.urls] Repository."""
    url = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    owner, name = url.rstrip("/").split("/")[-2:]
    return owner, name


def catalogue(lang: str):
    """gettext for the site's strings in `lang` (English msgids: English needs no catalogue)."""
    path = ROOT / "translations" / "site" / f"{lang}.po"
    if not path.exists():
        return lambda text, context=None: text
    with path.open("rb") as f:
        po = read_po(f)

    def gettext(text: str, context: str | None = None) -> str:
        message = po.get(text, context)
        if message is None or not message.string or message.fuzzy:
            raise KeyError(f"{path}: no translation of {text!r} (context {context!r})")
        return message.string

    return gettext


OUT_OF_NOTEBOOKS = re.compile(r"\]\(\.\./\.\./")  # a markdown link from notebooks/<lang>/ to the repository's root


LESSONS_PYTHON = os.environ.get("ACCUMLIB_LESSONS_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
DATA_INPUTS = ("accumlib", "tools/site_data.py")  # what tools/site_data.py's results depend on


DOCS = ROOT / "docs"
LIBRARY, LIBRARY_EDITION = "library", "en"  # the section's folder on the site, and the edition it is built into
# the docs pages in the section's order: using accumlib, what it guarantees and measures, then the course's making
# (a docs page left out here comes after them, by name)
LIBRARY_ORDER = (
    "install",
    "library",
    "api",
    "refused",
    "benchmarks",
    "loss-weighting",
    "checkpoints",
    "scaling",
    "lessons",
    "lesson0",
    "hindi",
    "exercise-checks",
    "quiz",
    "translating",
    "website",
    "publishing",
    "layout",
)
DOCS_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")  # [text](target) and ![alt](image), one line each
FENCE = re.compile(r"^\s*(```|~~~)")


def library_pages() -> list[str]:
    """The docs pages (docs/<name>.md) in the library section's order."""
    found = {p.stem for p in DOCS.glob("*.md")}
    return [n for n in LIBRARY_ORDER if n in found] + sorted(found - set(LIBRARY_ORDER))


def page_names(lang: str) -> list[str]:
    """Every page of an edition (Sphinx's names): its lessons, its home page and its library pages."""
    names = [p.stem for p in lessons(lang)] + ["index"]
    if lang == LIBRARY_EDITION:
        return names + [f"{LIBRARY}/index"] + [f"{LIBRARY}/{n}" for n in library_pages()]
    return [*names, LIBRARY]


def counterpart(page: str, other: str) -> str:
    """The page of edition `other` that the language switch of `page` leads to: the same lesson; from a library page,
    the other edition's library page; else its home page."""
    theirs = page_names(other)
    if page in theirs:
        return page
    if page.split("/")[0] == LIBRARY:
        return next(p for p in (f"{LIBRARY}/index", LIBRARY) if p in theirs)
    return "index"


def docs_link(match: re.Match, page: str) -> str:
    """One link of docs/<page>.md as the library section's page needs it (see the module's docstring)."""
    image, text, href = match.groups()
    if re.match(r"[a-z][a-z0-9+.-]*:", href, re.I) or href.startswith("#"):  # a URL, or a place in the same page
        return match.group(0)
    path, _, anchor = href.partition("#")
    target = (DOCS / path).resolve()
    if not target.is_relative_to(ROOT) or not target.exists():
        raise SystemExit(f"docs/{page}.md links to {href!r}: no such file in the repository")
    fragment = f"#{anchor}" if anchor else ""
    if target.is_relative_to(DOCS / "images") or (target.parent == DOCS and target.suffix == ".md"):
        return match.group(0)  # another docs page, or a docs image: beside this page on the site too
    if image:
        raise SystemExit(f"docs/{page}.md shows {href!r}: a docs page's image lives in docs/images/")
    if target.parent.parent == NOTEBOOKS and target.suffix == ".ipynb":
        if target.parent.name == LIBRARY_EDITION:  # the lesson's page, in this Sphinx project (one folder up)
            return f"[{text}](../{target.name}{fragment})"
        # the other edition's page, outside this project: a plain HTML link (MyST would look for it as a document)
        return f'<a href="../../{target.parent.name}/{target.stem}.html{fragment}">{text}</a>'
    owner, name = repository()
    kind = "tree" if target.is_dir() else "blob"  # a file the site does not have: the repository's, on GitHub
    return f"[{text}](https://github.com/{owner}/{name}/{kind}/main/{target.relative_to(ROOT).as_posix()}{fragment})"


def library_page(page: str) -> str:
    """docs/<page>.md with its links rewritten for the site; code blocks as they are."""
    lines, fenced = [], False
    for line in (DOCS / f"{page}.md").read_text(encoding="utf-8").splitlines(keepends=True):
        if FENCE.match(line):
            fenced = not fenced
        lines.append(line if fenced else DOCS_LINK.sub(lambda m: docs_link(m, page), line))
    return "".join(lines)


def docs_title(page: str) -> str:
    """The first heading of docs/<page>.md, as HTML (its `code` spans as <code>)."""
    text = (DOCS / f"{page}.md").read_text(encoding="utf-8")
    title = next(line[2:].strip() for line in text.splitlines() if line.startswith("# "))
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(title, quote=False))


def prepare_library(lang: str, source: Path, pages: dict) -> str:
    """Write the edition's library pages into its Sphinx source; returns the home page's toctree of them."""
    _ = catalogue(lang)
    if lang == LIBRARY_EDITION:
        folder = source / LIBRARY
        folder.mkdir()
        if (DOCS / "images").is_dir():
            shutil.copytree(DOCS / "images", folder / "images")
        for page in library_pages():
            (folder / f"{page}.md").write_text(library_page(page), encoding="utf-8")
            pages[f"{LIBRARY}/{page}"] = {"launch": [], "dashboard": False}
        intro = _(
            "accumlib's documentation, beside the lessons: how to install and run it, what it offers and "
            "guarantees, its API reference (generated from the docstrings), what it refuses, what it measured, "
            "and how the course is checked, translated, built and published. The same pages are the "
            "repository's `docs/` folder."
        )
        (folder / "index.md").write_text(
            f"# {_('The library')}\n\n{intro}\n\n```{{toctree}}\n:maxdepth: 1\n\n"
            + "\n".join(library_pages())
            + "\n```\n",
            encoding="utf-8",
        )
        pages[f"{LIBRARY}/index"] = {"launch": [], "dashboard": False}
        entry = f"{LIBRARY}/index"
    else:  # the docs are in English: this edition's page says so and links to each of them
        up = f"../{LIBRARY_EDITION}/{LIBRARY}"
        links = "".join(
            f'<li><a href="{up}/{page}.html" lang="{LIBRARY_EDITION}">{docs_title(page)}</a></li>'
            for page in library_pages()
        )
        intro = _(
            "The library's documentation is in English: how to install and run accumlib, its API reference, "
            "what it refuses, its benchmarks, and how the course is translated and built. Its pages are in the "
            "English edition of this website:"
        )
        (source / f"{LIBRARY}.md").write_text(
            f'# {_("The library")}\n\n{intro}\n\n<ul class="library-links">'
            f'<li><a href="{up}/index.html" lang="{LIBRARY_EDITION}">'
            f"{catalogue(LIBRARY_EDITION)('The library')}</a></li>{links}</ul>\n",
            encoding="utf-8",
        )
        pages[LIBRARY] = {"launch": [], "dashboard": False}
        entry = LIBRARY
    return "```{toctree}\n:maxdepth: 1\n:caption: " + _("Library") + "\n\n" + entry + "\n```\n"


def site_data(folder: Path) -> dict:
    """What tools/site_data.py computes with the lessons' stack (the quiz, the dashboards' figures), written into
    `folder` by the lessons' Python ($ACCUMLIB_LESSONS_PYTHON, else .venv's); recomputed only when accumlib's
    sources or that script changed since (a hash of them is kept beside the results)."""
    digest = hashlib.sha256()
    for top in DATA_INPUTS:
        for path in (
            sorted(p for p in (ROOT / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if (ROOT / top).is_dir()
            else [ROOT / top]
        ):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    stamp = folder / "inputs.sha256"
    if not (stamp.exists() and stamp.read_text() == digest.hexdigest()):
        if not Path(LESSONS_PYTHON).exists():
            raise SystemExit(
                f"the lessons' Python {LESSONS_PYTHON} is missing: run `make .venv/.installed`, or "
                f"set ACCUMLIB_LESSONS_PYTHON to a Python with the lessons' stack"
            )
        shutil.rmtree(folder, ignore_errors=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        subprocess.run(
            [LESSONS_PYTHON, str(ROOT / "tools" / "site_data.py"), "--out", str(folder)], check=True, env=env
        )
        stamp.write_text(digest.hexdigest())
    dashboards = {
        lang: json.loads((folder / "dashboards" / lang / "dashboards.json").read_text(encoding="utf-8"))
        for lang in LANGUAGES
    }
    return {
        "quiz": json.loads((folder / "quiz.json").read_text(encoding="utf-8")),
        "dashboards": dashboards,
        "folder": folder,
    }


def lessons(lang: str) -> list[Path]:
    """The edition's notebooks, in the order of the table of contents: lessons by file name, then the dashboards."""
    found = sorted(NOTEBOOKS.glob(f"{lang}/*.ipynb"), key=lambda p: (p.stem == "dashboards", p.name))
    if not found:
        raise SystemExit(f"no notebooks in {NOTEBOOKS / lang}")
    return found


DESKTOP_ONLY = {"Binder (JupyterLab)"}  # launch buttons a phone does not show (its screen is too narrow for them)


def launch_links(lang: str, stem: str, has_dashboard: bool) -> list[tuple[str, str]]:
    """(label msgid, URL) of each button that opens this notebook live."""
    owner, name = repository()
    path = f"notebooks/{lang}/{stem}.ipynb"
    binder = f"https://mybinder.org/v2/gh/{owner}/{name}/HEAD?urlpath="
    github = f"https://github.com/{owner}/{name}/blob/main/{path}"
    # the single-document view first: at a phone's 390 px it leaves the notebook about 304 px (JupyterLab's side bars
    # left its cells 40 px); JupyterLab beside it, for a desktop (site/_static/accumlib.css hides it on a phone)
    links = [
        ("Binder", binder + quote(f"doc/tree/{path}", safe="")),
        ("Binder (JupyterLab)", binder + quote(f"lab/tree/{path}", safe="")),
    ]
    if has_dashboard:  # Voila shows the dashboards notebook as an app: its controls and figures, no code
        links.append(("Binder (Voila app)", binder + quote(f"voila/render/notebooks/{lang}/dashboards.ipynb", safe="")))
    links.append(("Colab", f"https://colab.research.google.com/github/{owner}/{name}/blob/main/{path}"))
    links.append(("Kaggle", "https://kaggle.com/kernels/welcome?src=" + quote(github, safe="")))
    return links


# ---- widgets drawn as static HTML from the stored widget state ----


class StaticWidgets:
    """Draws a notebook's stored widgets as HTML: what a learner saw when the notebook was executed."""

    def __init__(self, state: dict):
        self.state = state  # model id -> {"model_name": ..., "state": {...}}

    def model(self, ref: str) -> dict | None:
        return self.state.get(ref.removeprefix("IPY_MODEL_"))

    def contains(self, ref: str, names: set[str]) -> bool:
        entry = self.model(ref)
        if entry is None:
            return False
        return entry["model_name"] in names or any(
            self.contains(child, names) for child in entry["state"].get("children", [])
        )

    def html_text(self, ref: str) -> str:
        """The values of every HTML widget in `ref`'s tree, in order."""
        entry = self.model(ref)
        if entry is None:
            return ""
        own = entry["state"].get("value", "") if entry["model_name"] in ("HTMLModel", "HTMLMathModel") else ""
        return str(own) + "".join(self.html_text(child) for child in entry["state"].get("children", []))

    def draw(self, ref: str) -> str:
        entry = self.model(ref)
        if entry is None:
            return ""
        name, s = entry["model_name"], entry["state"]
        description = s.get("description") or ""
        label = f'<span class="sw-label">{html.escape(description)}</span>' if description else ""
        if name in ("VBoxModel", "BoxModel", "GridBoxModel", "HBoxModel"):
            kind = "sw-hbox" if name == "HBoxModel" else "sw-vbox"
            return f'<div class="{kind}">' + "".join(self.draw(c) for c in s.get("children", [])) + "</div>"
        if name in ("HTMLModel", "HTMLMathModel"):
            return f'<div class="sw-html">{label}{s.get("value", "")}</div>' if s.get("value") or label else ""
        if name == "LabelModel":
            return f'<div class="sw-html">{html.escape(str(s.get("value", "")))}</div>'
        if name == "OutputModel":
            return '<div class="sw-output">' + "".join(output_html(o) for o in s.get("outputs", [])) + "</div>"
        if name in SLIDERS:
            if name == "SelectionSliderModel":
                labels = s.get("_options_labels", [])
                index = s.get("index", 0)
                low, high, value, shown = 0, max(len(labels) - 1, 0), index, labels[index] if labels else ""
            else:
                low, high, value = s.get("min", 0), s.get("max", 100), s.get("value", 0)
                shown = value
            return (
                f'<label class="sw-slider">{label}<input type="range" disabled min="{low}" max="{high}" '
                f'value="{value}" step="{s.get("step", 1) or 1}">'
                f"<output>{html.escape(str(shown))}</output></label>"
            )
        if name == "CheckboxModel":
            checked = " checked" if s.get("value") else ""
            return (
                f'<label class="sw-check"><input type="checkbox" disabled{checked}>{html.escape(description)}</label>'
            )
        if name in ("RadioButtonsModel", "ToggleButtonsModel", "DropdownModel", "SelectModel"):
            index = s.get("index")
            options = "".join(
                f'<label class="sw-option"><input type="radio" disabled{" checked" if i == index else ""}>'
                f"{html.escape(str(text))}</label>"
                for i, text in enumerate(s.get("_options_labels", []))
            )
            kind = "sw-toggles" if name == "ToggleButtonsModel" else "sw-options"
            legend = f"<legend>{html.escape(description)}</legend>" if description else ""
            return f'<fieldset class="{kind}" disabled>{legend}{options}</fieldset>'
        if name == "ButtonModel":
            return f'<button class="sw-button" type="button" disabled>{html.escape(description)}</button>'
        if name in (
            "TextModel",
            "TextareaModel",
            "IntTextModel",
            "FloatTextModel",
            "BoundedIntTextModel",
            "BoundedFloatTextModel",
        ):
            return (
                f'<label class="sw-text">{label}<input type="text" disabled '
                f'value="{html.escape(str(s.get("value", "")))}"'
                f' placeholder="{html.escape(str(s.get("placeholder") or ""))}"></label>'
            )
        if name in ("IntProgressModel", "FloatProgressModel"):
            return (
                f'<label class="sw-progress">{label}<progress max="{s.get("max", 100)}" '
                f'value="{s.get("value", 0)}">'
                f"</progress></label>"
            )
        return ""  # layout and style models, and widgets with nothing to show


def figure_html(png: str, alt: str) -> str:
    return f'<img class="lesson-figure" src="data:image/png;base64,{png.strip()}" alt="{html.escape(alt.strip())}">'


def output_html(output: dict) -> str:
    """One stored output (of a cell or of an Output widget) as HTML."""
    if output.get("output_type") == "stream":
        return f'<pre class="sw-stream">{html.escape("".join(output.get("text", "")))}</pre>'
    if output.get("output_type") == "error":
        return (
            f'<pre class="sw-stream">{html.escape(output.get("ename", ""))}: '
            f"{html.escape(output.get('evalue', ''))}</pre>"
        )
    data = output.get("data", {})
    if "image/png" in data:
        alt = output.get("metadata", {}).get("image/png", {}).get("alt") or "".join(data.get("text/plain", ""))
        return figure_html(data["image/png"], alt)
    if "text/html" in data:
        return "".join(data["text/html"])
    if "text/plain" in data:
        return f'<pre class="sw-stream">{html.escape("".join(data["text/plain"]))}</pre>'
    return ""


TIMER = '<span class="fa-solid fa-stopwatch" aria-hidden="true"></span>'  # FontAwesome: in the theme's wheel
QUIZ_IDS = "accumlib-quiz-questions"  # a stored quiz output's metadata: the ids it asks (accumlib.lessons.quiz)


def web_quiz(widgets: "StaticWidgets", ref: str, metadata: dict, quiz: dict, lang: str) -> str:
    """The stored quiz widget `ref` as a quiz answered in the page (site/_static/quiz.js): its questions (the ids
    in its output's `metadata`), as accumlib's quiz grades them (tools/site_data.py), in a JSON script; the stored
    drawing until the script runs."""
    _ = catalogue(lang)
    ids = metadata.get(QUIZ_IDS)
    if not ids:
        raise SystemExit(f"a stored quiz output without its questions' ids in its metadata ({QUIZ_IDS}): {ref}")
    unknown = [qid for qid in ids if qid not in quiz["questions"]]
    if unknown:
        raise SystemExit(f"stored quiz names questions the bank lacks: {unknown}")
    headings = re.findall(r"<h3>(.*?)</h3>", widgets.html_text(ref))  # the title the notebook's quiz showed
    title = html.unescape(headings[0]) if headings else quiz["ui"]["title"]
    data = {
        "language": lang,
        "title": title,
        "ui": quiz["ui"],
        "questions": [{"id": qid, **quiz["questions"][qid]} for qid in ids],
        "measured": _("What accumlib measured when this website was built (on a CPU):"),
        "before": _("You answered this question before, on this device: your first answer counts in the score."),
    }
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    return (
        f'<div class="static-widget web-quiz"><script type="application/json" class="web-quiz-data">{payload}'
        f'</script><div class="web-quiz-body">{widgets.draw(ref)}</div></div>'
    )


TASKS = re.compile(r"<b>[^<]*</b><ol>.*?</ol>", re.S)  # a stored dashboard's task list (its HTML widget)


def web_dashboard(widgets: "StaticWidgets", ref: str, plain: str, dashboards: dict, lang: str) -> str | None:
    """The stored dashboard `ref` with working controls (site/_static/dashboards.js): the figures and findings of
    every offered setting, computed by tools/site_data.py; None when the dashboard is not one of those."""
    _ = catalogue(lang)
    name = next((n for n, d in dashboards.items() if plain.startswith(d["title"] + " (")), None)
    if name is None:
        return None
    board = dashboards[name]
    tasks = TASKS.search(widgets.html_text(ref))
    sliders = [("micro_batch_size", board["micro_batch_size"]), ("accum_steps", board["accum_steps"])]
    if board["budget"]:
        sliders.append(("extra", board["budget"]))
    controls = []
    for part, control in sliders:
        keys = [str(v) for v in control["values"]]
        labels = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in control["values"]]
        index = control["values"].index(control["default"])
        controls.append(
            f'<label class="sw-slider"><span class="sw-label">{html.escape(control["label"])}</span>'
            f'<input type="range" min="0" max="{len(keys) - 1}" step="1" value="{index}" data-part="{part}" '
            f"data-keys='{html.escape(json.dumps(keys))}' data-labels='{html.escape(json.dumps(labels))}'>"
            f"<output>{html.escape(labels[index])}</output></label>"
        )
    switches = "".join(
        f'<label class="sw-check"><input type="checkbox" data-part="switch" data-switch="{s["name"]}" '
        f'data-offered="{"yes" if s["offered"] else "no"}">{html.escape(s["label"])}</label>'
        for s in board["switches"]
    )
    default = board["frames"][
        f"{board['micro_batch_size']['default']}|{board['accum_steps']['default']}|"
        f"{board['budget']['default'] if board['budget'] else ''}"
    ]
    base = "_dashboards/"
    figures = "".join(
        f'<div class="lesson-figure-box">{figure_html_file(base + file, alt)}</div>' for file, alt in default["images"]
    )
    offered = _(
        "This page shows the figures and findings computed with accumlib for each setting below when this "
        "website was built (on a CPU): move a slider to see them. The switches that are greyed out, and "
        "every other setting, need the notebook live: open it with a button at the top of the page."
    )
    payload = json.dumps(
        {"frames": board["frames"], "base": base, "shown": board["shown"]}, ensure_ascii=False
    ).replace("</", "<\\/")
    return (
        f'<div class="static-widget static-dashboard web-dashboard" data-dashboard="{name}">'
        f'<script type="application/json" class="web-dashboard-data">{payload}</script>'
        f"<h3>{html.escape(board['title'])}</h3>{tasks.group(0) if tasks else ''}"
        f'<p class="needs-kernel">{html.escape(offered)}</p>'
        f'<div class="sw-hbox wd-controls">{"".join(controls)}</div>'
        + (f'<div class="sw-hbox wd-switches">{switches}</div>' if switches else "")
        + f'<div class="wd-readout">{default["readout"]}</div><div class="wd-figures">{figures}</div>'
        f'<pre class="sw-stream wd-summary">{html.escape(board["shown"] + chr(10) + default["summary"])}</pre>'
        "</div>"
    )


def figure_html_file(src: str, alt: str) -> str:
    return f'<img class="lesson-figure" src="{html.escape(src)}" alt="{html.escape(alt.strip())}">'


# The tag of the cell that sets an edition's language (tools/editions.py's LANGUAGE_TAG: `accumlib.set_language("hi")`
# on top of every Hindi notebook): the website's page is in its language already, so the cell is left out of it.
LANGUAGE_CELL = "language"


def static_notebook(notebook: dict, lang: str, stem: str, computed: dict | None = None) -> tuple[dict, bool]:
    """A copy of `notebook` whose widget views and figures are plain HTML outputs; and whether it has a dashboard.
    `computed`: what tools/site_data.py computed (site_data); its quiz makes each stored quiz answerable in the page."""
    _ = catalogue(lang)
    owner, name = repository()
    notebook = copy.deepcopy(notebook)
    state = notebook.get("metadata", {}).pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    widgets = StaticWidgets(state)
    has_dashboard = False
    for cell in notebook["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if LANGUAGE_CELL in tags and "remove-cell" not in tags:  # left out, as the install cell is (its own tag)
            cell["metadata"]["tags"] = [*tags, "remove-cell"]
        outputs = []
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                ref = data[WIDGET_VIEW]["model_id"]
                if widgets.model(ref) is None:  # no state stored: what the notebook shows without a kernel
                    outputs.append(output | {"data": {"text/plain": data.get("text/plain", "")}})
                    continue
                plain = "".join(data_plain) if (data_plain := data.get("text/plain")) else ""
                live = (
                    web_dashboard(widgets, ref, plain, computed["dashboards"][lang], lang)
                    if computed is not None and widgets.contains(ref, SLIDERS)
                    else None
                )
                if live is not None:
                    has_dashboard = True
                    outputs.append({"output_type": "display_data", "metadata": {}, "data": {"text/html": live}})
                    continue
                if widgets.contains(ref, SLIDERS):
                    has_dashboard = True
                    notice = _(
                        "This dashboard needs a running Python kernel. This page shows the figure stored "
                        "for the settings below; to move the controls, open the notebook live with a button "
                        "at the top of the page."
                    )
                    kind = "dashboard"
                elif widgets.contains(ref, {"RadioButtonsModel", "TextModel"}) and computed is not None:
                    outputs.append(
                        {
                            "output_type": "display_data",
                            "metadata": {},
                            "data": {
                                "text/html": web_quiz(
                                    widgets, ref, output.get("metadata", {}), computed["quiz"][lang], lang
                                )
                            },
                        }
                    )
                    continue
                elif widgets.contains(ref, {"RadioButtonsModel", "TextModel"}):
                    notice = _(
                        "This quiz needs a running Python kernel to check your answers. This page shows it "
                        "as stored, at its first question; open the notebook live with a button at the top of "
                        "the page to answer every question."
                    )
                    kind = "quiz"
                else:
                    notice, kind = "", "widget"
                note = f'<p class="needs-kernel">{html.escape(notice)}</p>' if notice else ""
                body = f'<div class="static-widget static-{kind}">{note}{widgets.draw(ref)}</div>'
                outputs.append({"output_type": "display_data", "metadata": {}, "data": {"text/html": body}})
            elif "image/png" in data:
                outputs.append(
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {"text/html": f'<div class="lesson-figure-box">{output_html(output)}</div>'},
                    }
                )
            else:
                outputs.append(output)
        if cell["cell_type"] == "code":
            cell["outputs"] = outputs
        elif cell["cell_type"] == "markdown":  # a link out of notebooks/ (../../INSTRUCTORS.md): to the repository
            repository_root = f"](https://github.com/{owner}/{name}/blob/main/"
            cell["source"] = OUT_OF_NOTEBOOKS.sub(lambda _, root=repository_root: root, "".join(cell["source"]))
            # the lesson time's ⏱ needs an emoji font many readers lack: the theme's own stopwatch icon instead
            cell["source"] = cell["source"].replace("⏱", TIMER)
    notebook.setdefault("metadata", {})["accumlib_site"] = {"stem": stem}
    return notebook, has_dashboard


# ---- the build ----


def prepare(lang: str, source: Path, data: dict | None = None) -> dict:
    """Write the edition's Sphinx source folder; returns what site/conf.py needs to know of each page."""
    _ = catalogue(lang)
    if source.exists():
        shutil.rmtree(source)
    source.mkdir(parents=True)
    pages = {}
    entries = []
    for path in lessons(lang):
        notebook, has_dashboard = static_notebook(json.loads(path.read_text()), lang, path.stem, data)
        (source / path.name).write_text(json.dumps(notebook, ensure_ascii=False))
        pages[path.stem] = {
            "launch": [
                [_(label), url, label in DESKTOP_ONLY] for label, url in launch_links(lang, path.stem, has_dashboard)
            ],
            "dashboard": has_dashboard,
        }
        entries.append(path.stem)
    home = (SITE / "home" / f"{lang}.md").read_text()
    toctree = "```{toctree}\n:maxdepth: 1\n:caption: " + _("Lessons") + "\n\n" + "\n".join(entries) + "\n```\n"
    toctree += "\n" + prepare_library(lang, source, pages)  # the library section after the lessons
    (source / "index.md").write_text(home.replace("{toctree}", toctree))
    pages["index"] = {"launch": [], "dashboard": False}
    return pages


def build(out: Path, sphinx: list[str], data_folder: Path = ROOT / "build" / "site-data") -> None:
    data = site_data(data_folder)
    work = out.parent / (out.name + "-src")
    shutil.rmtree(work, ignore_errors=True)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for lang in LANGUAGES:
        pages = prepare(lang, work / lang, data)
        other = {
            code: {
                "name": catalogue(code)("English", "language name"),
                "label": catalogue(code)("Read this page in {language}").format(
                    language=catalogue(code)("English", "language name")
                ),
                "pages": {page: counterpart(page, code) for page in page_names(lang)},
            }
            for code in LANGUAGES
            if code != lang
        }
        _ = catalogue(lang)
        config = {
            "language": lang,
            "pages": pages,
            "other": other,
            "labels": {"open live": _("Open live:"), "home": _("Gradient accumulation, seen and measured")},
        }
        (work / f"{lang}.json").write_text(json.dumps(config, ensure_ascii=False))
        env = dict(os.environ, ACCUMLIB_SITE=str(work / f"{lang}.json"))
        # MyST-NB writes its copies of the notebooks beside the output folder: built in the work folder, then moved
        html_dir = work / f"{lang}-html" / lang
        subprocess.run(
            [
                *sphinx,
                "-b",
                "html",
                "-q",
                "-W",
                "--keep-going",
                "-c",
                str(SITE),
                "-D",
                f"language={lang}",
                "-d",
                str(work / f"{lang}-doctrees"),
                str(work / lang),
                str(html_dir),
            ],
            check=True,
            env=env,
        )
        shutil.rmtree(html_dir / "_sources", ignore_errors=True)  # html_copy_source is off: nothing to serve there
        shutil.move(html_dir, out / lang)
        frames = out / lang / "_dashboards"  # the dashboards' figures for every offered setting
        frames.mkdir()
        for png in (data["folder"] / "dashboards" / lang).glob("*.png"):
            shutil.copy(png, frames / png.name)
    choices = "".join(
        f'<li><a lang="{code}" href="{code}/index.html">'
        f"{html.escape(catalogue(code)('Gradient accumulation, seen and measured'))}"
        f" ({html.escape(name)})</a></li>"
        for code, name in LANGUAGES.items()
    )
    (out / "index.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><title>accumlib</title>'
        "<style>body{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem;"
        "line-height:1.6}a{font-size:1.2rem}</style></head>"
        f"<body><h1>accumlib</h1><ul>{choices}</ul></body></html>\n"
    )
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve the _static folders as they are


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site")
    args = parser.parse_args()
    build(args.out.resolve(), [sys.executable, "-m", "sphinx"])
    print(f"site: {args.out / 'index.html'}")


if __name__ == "__main__":
    main()
