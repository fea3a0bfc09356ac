"""Sphinx configuration of one edition of the course's website (tools/site.py runs it once per language).

tools/site.py writes what this needs to know into the JSON file named by $ACCUMLIB_SITE: the edition's language,
each page's launch buttons and whether it has a dashboard, and for the language switch each page's counterpart in
the other edition.
"""

import json
import os

SITE = json.loads(open(os.environ["ACCUMLIB_SITE"], encoding="utf-8").read())

project = "accumlib"
author = "accumlib contributors"
language = SITE["language"]
extensions = ["myst_nb"]
exclude_patterns = ["**.ipynb_checkpoints"]

# The notebooks are shown as stored: never executed here (their outputs are what nbval checks).
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no widgets' manager from a CDN: tools/site.py draws the stored widgets as HTML
nb_merge_streams = True
myst_enable_extensions = ["colon_fence"]

html_theme = "sphinx_book_theme"
html_title = SITE["labels"]["home"]
html_static_path = ["_static", "../accumlib/lessons/fonts"]  # the course's CSS, and Lohit Devanagari for Hindi
html_css_files = ["accumlib.css"]
# the quiz answered and the dashboards' controls in the page; a table too wide for the screen shown row by row
html_js_files = ["quiz.js", "dashboards.js", "tables.js"]
html_copy_source = False
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "use_download_button": False,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
}


def launch_bar(app, pagename, templatename, context, doctree):
    """Put the language switch and the buttons that open this notebook live at the top of each page."""
    page = SITE["pages"].get(pagename)
    if page is None or "body" not in context:
        return
    parts = []
    up = "../" * (pagename.count("/") + 1)  # from this page to the site's root (a library page is one folder down)
    for code, other in SITE["other"].items():
        target = other["pages"].get(pagename, "index")  # the same page in that edition, else its nearest
        parts.append(
            f'<a class="language-switch" lang="{code}" hreflang="{code}" '
            f'href="{up}{code}/{target}.html">{other["label"]}</a>'
        )
    if page["launch"]:
        buttons = "".join(
            f'<a class="launch-button{" desktop-only" if desktop else ""}" href="{url}" '
            f'target="_blank" rel="noopener">{label}</a>'
            for label, url, desktop in page["launch"]
        )
        parts.append(f'<span class="launch-label">{SITE["labels"]["open live"]}</span>{buttons}')
    context["body"] = f'<nav class="lesson-bar">{"".join(parts)}</nav>' + context["body"]


def setup(app):
    app.connect("html-page-context", launch_bar)
