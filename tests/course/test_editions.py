"""The Hindi edition (notebooks/hi) is generated from notebooks/en and translations/lessons/hi/*.po (tools/editions.py).

Per lesson, each test names every cell it fails on: a code cell that differs from its English cell in more than its
comments and printed strings (compared token by token, those left out), a markdown cell or code comment without a
translation or with a stale or fuzzy one, a translated comment or printed string that keeps English words, Hindi text
that is not mostly Devanagari, not NFC or uses a variant the glossary avoids, a glossary term without its English on its
first use, a stored notebook that is not what the generator builds or not executed top to bottom.
No kernel runs here: nbval runs both editions (`make test`). The last tests check the generator itself.
"""

from __future__ import annotations

import copy
import functools
import io
import re
import sys
import tokenize
from pathlib import Path

import nbformat
import pytest
from babel.messages.catalog import Catalog

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import editions  # noqa: E402
from hindi import anchored, devanagari_share, first_use_problems, text_problems, untranslated  # noqa: E402

LANGUAGE = "hi"
LESSONS = editions.lessons()
MOSTLY = 0.5  # share of Devanagari letters in a Hindi markdown cell's prose (code and markup left out)
FENCED = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)[^)]*\)|href=[\"']([^\"']+)[\"']")
DEVANAGARI_DIGIT = re.compile(r"[\u0966-\u096F]")


@functools.lru_cache(maxsize=None)
def english(name: str):
    return editions.read_notebook(editions.english_path(name))


@functools.lru_cache(maxsize=None)
def hindi(name: str):
    path = editions.edition_path(name, LANGUAGE)
    if not path.exists():
        pytest.fail(f"{path.relative_to(ROOT)} is missing: run make notebooks")
    return editions.read_notebook(path)


@functools.lru_cache(maxsize=None)
def translation(name: str) -> Catalog:
    return editions.translation(name, LANGUAGE)


def hindi_path(name: str) -> Path:
    return editions.edition_path(name, LANGUAGE)


def report(found: list[str]) -> str:
    return f"{len(found)} problem(s):\n" + "\n".join(found)


# --- what the tests look for, as functions of notebooks (so that the last tests can show each one catching) -------


def code_tokens(source: str) -> list[tuple]:
    """The tokens of a code cell without its comments and with its printed strings emptied (the text the set-up cell
    prints is translated: tools/editions.py): each one's type and text, and where it stands (line ends aside, since a
    comment of another length moves them). Two sources with the same tokens differ in comments and printed text only."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(editions.without_comments(source)).readline))
    except (tokenize.TokenError, SyntaxError):
        return [source]  # not Python that the tokenizer reads: it must be the same text
    return [
        (t.type, t.string) + (() if t.type in (tokenize.NL, tokenize.NEWLINE) else (t.start, t.end))
        for t in tokens
        if t.type != tokenize.COMMENT
    ]


def code_differences(english_nb, hindi_nb, path: Path) -> list[str]:
    """Each Hindi code cell that is not its English cell (id, tags, and the code's tokens without its comments:
    execution times aside), the language cell that is not first or not what it must be, and code cells missing or
    added."""
    found = []
    # the language cell comes first, or right after Colab's set-up cell (which installs accumlib before its import)
    lead = 1 if hindi_nb.cells and hindi_nb.cells[0].id == editions.PLATFORM_CELL else 0
    first = hindi_nb.cells[lead] if len(hindi_nb.cells) > lead else None
    if first is None or (first.id, first.cell_type, first.source, first.metadata.get("tags")) != (
        editions.LANGUAGE_TAG,
        "code",
        editions.language_source(LANGUAGE),
        [editions.LANGUAGE_TAG],
    ):
        found.append(
            f"{path.relative_to(ROOT)} cell {lead + 1}: not the language cell "
            f"(id and tag {editions.LANGUAGE_TAG!r}, "
            f"source {editions.language_source(LANGUAGE)!r})"
        )
    theirs = [(i, c) for i, c in enumerate(hindi_nb.cells) if c.cell_type == "code" and c.id != editions.LANGUAGE_TAG]
    ours = editions.code_cells(english_nb)
    for (index, cell), expected in zip(theirs, ours, strict=False):  # a count mismatch is reported below
        mine = editions.cell_shape(cell)
        if (mine[:2], code_tokens(mine[2]), mine[3]) != (expected[:2], code_tokens(expected[2]), expected[3]):
            what = (
                "code (comments aside)"
                if code_tokens(mine[2]) != code_tokens(expected[2])
                else "id"
                if mine[1] != expected[1]
                else "metadata"
            )
            found.append(
                f"{editions.cell_label(path, index, cell)}: its {what} differs from English cell {expected[1]}"
            )
    if len(theirs) != len(ours):
        found.append(
            f"{path.relative_to(ROOT)}: {len(theirs)} code cells besides the language cell, English has {len(ours)}"
        )
    return found


def build_differences(built, stored, path: Path) -> list[str]:
    """Cells of the stored notebook that are not the generator's (type, id, source, metadata), in order."""
    found = [
        f"{editions.cell_label(path, i, cell)}: not what tools/editions.py builds here (run make translations)"
        # strict=False: the cells both have are compared; a count mismatch is reported below
        for i, (cell, expected) in enumerate(zip(stored.cells, built.cells, strict=False))
        if editions.cell_shape(cell) != editions.cell_shape(expected)
    ]
    if len(stored.cells) != len(built.cells):
        found.append(f"{path.relative_to(ROOT)}: {len(stored.cells)} cells, the generator builds {len(built.cells)}")
    return found


def prose_problems(hindi_nb, path: Path) -> list[str]:
    """Markdown cells whose prose is not mostly Devanagari, or keeps English words that are not glossary terms."""
    found = []
    for index, cell in enumerate(hindi_nb.cells):
        if cell.cell_type != "markdown" or cell.id == editions.WORD_LIST_ID:  # Hindi and English side by side
            continue
        share, english_words = devanagari_share(cell.source), untranslated(cell.source)
        if share == 0 and not english_words:
            continue  # no prose (only code, links or markup): nothing to translate
        if share < MOSTLY:
            found.append(f"{editions.cell_label(path, index, cell)}: {share:.0%} of its letters are Devanagari")
        if english_words:
            found.append(f"{editions.cell_label(path, index, cell)}: English words left: {sorted(set(english_words))}")
    return found


def comment_problems(hindi_nb, path: Path) -> list[str]:
    """Comments and printed strings of Hindi code cells that keep English words (glossary terms, names and code
    aside)."""
    found = []
    for index, cell in enumerate(hindi_nb.cells):
        if cell.cell_type == "code":
            texts = [("comment", t.string, t.string.lstrip("#")) for t in editions.comments(cell.source)]
            texts += [("printed string", n.value, n.value) for n in editions.printed_strings(cell.source)]
            for what, shown, text in texts:
                if english_words := untranslated(text):
                    found.append(
                        f"{editions.cell_label(path, index, cell)}: its {what} {shown!r} keeps "
                        f"English words: {sorted(set(english_words))}"
                    )
    return found


def link_problems(english_nb, hindi_nb, path: Path) -> list[str]:
    """Links from a Hindi markdown cell to a notebook that leave the edition or lead nowhere, links the English
    cell has and the Hindi lacks, and fenced code blocks that differ from the English cell's (code stays code)."""
    found = []
    english_cells = {c.id: c for c in english_nb.cells}
    for index, cell in enumerate(hindi_nb.cells):
        if cell.cell_type != "markdown" or cell.id not in english_cells:
            continue
        where, original = editions.cell_label(path, index, cell), english_cells[cell.id].source
        targets = [a or b for a, b in LINK.findall(cell.source)]
        for target in targets:
            file = target.split("#")[0]
            if file.endswith(".ipynb") and not (path.parent / file).resolve().is_relative_to(path.parent):
                found.append(f"{where}: links to {target}, outside notebooks/{LANGUAGE}")
            elif file.endswith(".ipynb") and not (path.parent / file).exists():
                found.append(f"{where}: links to {target}, which does not exist")
        lost = {a or b for a, b in LINK.findall(original)} - set(targets)
        if lost:
            found.append(f"{where}: the English cell links to {sorted(lost)}, the translation does not")
        if fenced_code(cell.source) != fenced_code(original):
            found.append(f"{where}: its fenced code blocks differ from the English cell's (comments aside)")
        english_left = [
            comment
            for block in FENCED.findall(cell.source)
            for comment in fenced_comments(block)
            if untranslated(comment)
        ]
        if english_left:
            found.append(f"{where}: its fenced code keeps English comments: {english_left}")
    return found


def _fenced_body(block: str) -> tuple[str, str]:
    """A fenced block as (its opening line, the code inside)."""
    opening, _, rest = block[3:].partition("\n")
    return opening, rest.rsplit("```", 1)[0]


def fenced_code(text: str) -> list[tuple[str, str]]:
    """Each fenced block of a markdown text, its comments cut out (Python blocks): what every edition shares. The
    Hindi review's N10-1: the recap's loop kept English comments because blocks had to be identical."""
    blocks = [_fenced_body(block) for block in FENCED.findall(text)]
    return [
        (opening, editions.without_comments(code) if opening.strip() in ("python", "py") else code)
        for opening, code in blocks
    ]


def fenced_comments(block: str) -> list[str]:
    opening, code = _fenced_body(block)
    if opening.strip() not in ("python", "py"):
        return []
    return [token.string[1:].strip() for token in editions.comments(code)]


def output_problems(english_nb, hindi_nb, path: Path) -> list[str]:
    """A Hindi code cell without outputs where the English cell has some (or the reverse), widget state missing,
    Devanagari digits in an output (notebooks/sanitize.cfg masks times as Latin digits in both editions)."""
    found = []
    english_cells = {c.id: c for c in english_nb.cells}
    for index, cell in enumerate(hindi_nb.cells):
        if cell.cell_type != "code" or cell.id not in english_cells:
            continue
        if bool(cell.outputs) != bool(english_cells[cell.id].outputs):
            has = "has outputs" if cell.outputs else "has no output"
            found.append(f"{editions.cell_label(path, index, cell)}: {has}, unlike the English cell")
        if DEVANAGARI_DIGIT.search(nbformat.writes(nbformat.v4.new_notebook(cells=[cell]))):
            found.append(
                f"{editions.cell_label(path, index, cell)}: an output has Devanagari digits; numbers keep "
                "Latin digits and the English format so that notebooks/sanitize.cfg masks them"
            )
    if "widgets" in english_nb.metadata and "widgets" not in hindi_nb.metadata:
        found.append(f"{path.relative_to(ROOT)}: no widget state stored (the English notebook has it)")
    return found


# --- the committed edition --------------------------------------------------------------------------------------


def test_hindi_edition_has_every_lesson_and_nothing_else():
    stored = sorted(p.stem for p in (editions.NOTEBOOKS / LANGUAGE).glob("*.ipynb"))
    assert stored == LESSONS, "notebooks/hi must mirror notebooks/en: run make translations"
    po = sorted(p.stem for p in (editions.TRANSLATIONS / LANGUAGE).glob("*.po"))
    assert po == LESSONS, "translations/lessons/hi must have one PO file per lesson: run make translations"


@pytest.mark.parametrize("name", LESSONS)
def test_code_cells_are_the_english_ones(name):
    assert not (found := code_differences(english(name), hindi(name), hindi_path(name))), report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_every_markdown_cell_is_translated(name):
    found = [
        m
        for kind, m in editions.translation_problems(english(name), translation(name), name, LANGUAGE)
        if kind == "missing"
    ]
    assert not found, report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_no_translation_is_stale_or_fuzzy(name):
    found = [
        m
        for kind, m in editions.translation_problems(english(name), translation(name), name, LANGUAGE)
        if kind in ("stale", "fuzzy")
    ]
    assert not found, report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_hindi_markdown_is_mostly_devanagari(name):
    assert not (found := prose_problems(hindi(name), hindi_path(name))), report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_code_comments_and_printed_text_are_in_hindi(name):
    assert not (found := comment_problems(hindi(name), hindi_path(name))), report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_translations_are_nfc_and_follow_the_glossary(name):
    po = editions.po_path(name, LANGUAGE).relative_to(ROOT)
    found = [
        f"{po} cell {m.context} ({m.id.splitlines()[0][:60]!r}): {problem}"
        for m in translation(name)
        if m.id
        for problem in text_problems(m.string)
    ]
    assert not found, report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_a_glossary_term_brings_its_english_on_its_first_use(name):
    """The glossary's terms marked `first use: (English)` carry the English in brackets the first time a lesson's
    prose uses them, "माध्यिका (median)", so that a learner can go on to English documentation."""
    built = editions.edition(english(name), translation(name), LANGUAGE)
    found = [
        f"{editions.po_path(name, LANGUAGE).relative_to(ROOT)}: {problem}"
        for problem in first_use_problems(
            [c.source for c in built.cells if c.cell_type == "markdown" and c.id != editions.WORD_LIST_ID]
        )
    ]
    assert not found, report(found)


def test_the_last_lesson_ends_with_the_glossary_as_a_word_list():
    notebook = hindi(editions.WORD_LIST_LESSON)
    cell = notebook.cells[-1]
    assert (cell.cell_type, cell.id) == ("markdown", editions.WORD_LIST_ID), "run make translations"
    intro, _, table = cell.source.partition("\n| ")
    assert not untranslated(intro) and devanagari_share(intro) > MOSTLY, intro
    rows = [tuple(part.strip() for part in re.split(r"(?<!\\)\|", line)[1:-1]) for line in table.splitlines()[2:]]
    # the glossary's rows, the English without its note in brackets
    glossary = {
        (row["hindi"].strip(), editions.ENGLISH_NOTE.sub("", row["english"].strip())) for row in editions.glossary()
    }
    assert set(rows) <= glossary, f"rows that are not the glossary's: {sorted(set(rows) - glossary)}"
    # every term the lessons give with its English on first use is there (the English column of its row)
    listed = {hindi_term for hindi_term, _ in rows}
    assert not (missing := [term for term, _ in anchored() if term not in listed]), missing
    assert len(rows) == len(set(rows)) > len(anchored())
    assert sum(1 for c in notebook.cells if c.id == editions.WORD_LIST_ID) == 1
    assert all(
        c.id != editions.WORD_LIST_ID
        for name in LESSONS
        if name != editions.WORD_LIST_LESSON
        for c in hindi(name).cells
    )


@pytest.mark.parametrize("name", LESSONS)
def test_links_stay_in_the_edition_and_code_blocks_are_kept(name):
    assert not (found := link_problems(english(name), hindi(name), hindi_path(name))), report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_hindi_notebook_is_what_the_generator_builds(name):
    built = editions.edition(english(name), translation(name), LANGUAGE)
    assert not (found := build_differences(built, hindi(name), hindi_path(name))), report(found)


@pytest.mark.parametrize("name", LESSONS)
def test_hindi_notebook_is_stored_executed(name):
    found = editions.execution_problems(hindi(name), hindi_path(name))
    found += output_problems(english(name), hindi(name), hindi_path(name))
    assert not found, report(found) + "\nrun make notebooks"


# --- the generator and the checks above, on small notebooks --------------------------------------------------------


def lesson(*cells):
    """A notebook from ("markdown" | "code", id, source) triples."""
    notebook = nbformat.v4.new_notebook()
    for kind, cell_id, source in cells:
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell.id = cell_id
        notebook.cells.append(cell)
    return notebook


def translated(name: str, entries: dict[str, tuple[str, str]]) -> Catalog:
    """A catalogue with cell id -> (English, Hindi) entries."""
    catalog = editions.new_catalog(name, LANGUAGE)
    for cell_id, (source, string) in entries.items():
        catalog.add(source, string, context=cell_id)
    return catalog


OLD = lesson(
    ("markdown", "title", "# Lesson 9: Old title"),
    ("code", "c1", "x = 1"),
    ("markdown", "body", "Some text."),
    ("markdown", "gone", "A cell that will be deleted."),
)
NEW = lesson(
    ("markdown", "title", "# Lesson 9: Old title"),
    ("code", "c1", "x = 1"),
    ("markdown", "body", "Some changed text."),
    ("markdown", "added", "A new cell."),
)
HINDI = {"title": "# पाठ 9: पुराना शीर्षक", "body": "कुछ पाठ्य सामग्री।", "gone": "यह cell हटेगा।"}


def test_update_keeps_translations_marks_changed_cells_fuzzy_adds_new_and_drops_deleted(tmp_path):
    old = translated("x", {c.id: (c.source, HINDI[c.id]) for c in OLD.cells if c.cell_type == "markdown"})
    new = editions.updated(editions.template(NEW, "x"), old, LANGUAGE)
    entries = {m.context: m for m in new if m.id}
    assert list(entries) == ["title", "body", "added"]  # cell order; the deleted cell is gone
    assert (entries["title"].string, entries["title"].fuzzy) == (HINDI["title"], False)
    body = entries["body"]
    assert (body.id, body.string, body.fuzzy, body.previous_id) == (
        "Some changed text.",
        HINDI["body"],
        True,
        ["Some text."],
    )
    assert (entries["added"].string, entries["added"].fuzzy) == ("", False)
    # The PO file GNU tools and PO editors read: the previous English as `#| msgid`, read back as it was written
    path = tmp_path / "x.po"
    path.write_bytes(editions.po_bytes(new))
    assert '#, fuzzy\n#| msgid "Some text."\nmsgctxt "body"\nmsgid "Some changed text."' in path.read_text()
    again = {m.context: m for m in editions.read_po(path, LANGUAGE) if m.id}
    assert [(m.id, m.string, m.fuzzy, m.previous_id, m.user_comments) for m in again.values()] == [
        (m.id, m.string, m.fuzzy, m.previous_id, m.user_comments) for m in entries.values()
    ]
    assert editions.po_bytes(editions.read_po(path, LANGUAGE)) == path.read_bytes()


def test_a_twice_changed_cell_keeps_the_english_its_translation_was_made_for():
    once = editions.updated(
        editions.template(NEW, "x"), translated("x", {"body": ("Some text.", HINDI["body"])}), LANGUAGE
    )
    twice = editions.updated(editions.template(lesson(("markdown", "body", "Changed again.")), "x"), once, LANGUAGE)
    body = next(m for m in twice if m.id)
    assert (body.fuzzy, body.previous_id, body.string) == (True, ["Some text."], HINDI["body"])


def test_a_confirmed_translation_drops_its_fuzzy_flag_and_previous_english():
    once = editions.updated(
        editions.template(NEW, "x"), translated("x", {"body": ("Some text.", HINDI["body"])}), LANGUAGE
    )
    once.get("Some changed text.", context="body").flags.discard("fuzzy")  # what a translator does after revising
    body = editions.updated(editions.template(NEW, "x"), once, LANGUAGE).get("Some changed text.", context="body")
    assert (body.fuzzy, body.previous_id) == (False, [])


def test_moved_and_recreated_cells_take_their_translation_along():
    moved = {
        m.context: m for m in translated("x", {"gone": ("A cell that will move.", "यह cell दूसरे पाठ में जाएगा।")}) if m.id
    }
    deleted = {
        m.context: m
        for m in translated(
            "y", {"old": ("Unrelated words here.", "असंबंधित शब्द।"), "far": ("Something else entirely.", "कुछ और।")}
        )
        if m.id
    }
    elsewhere = lesson(
        ("markdown", "gone", "A cell that will move."),  # same id, another lesson
        ("markdown", "fresh", "Unrelated words, here!"),  # new id, nearly the English of a deleted cell
        ("markdown", "new", "Brand new."),
    )  # nothing like it before
    entries = {
        m.context: m
        for m in editions.updated(editions.template(elsewhere, "z"), None, LANGUAGE, moved, deleted)
        if m.id
    }
    assert (entries["gone"].string, entries["gone"].fuzzy) == ("यह cell दूसरे पाठ में जाएगा।", False)
    assert (entries["fresh"].string, entries["fresh"].fuzzy, entries["fresh"].previous_id) == (
        "असंबंधित शब्द।",
        True,
        ["Unrelated words here."],
    )
    assert entries["new"].string == ""
    assert (list(moved), list(deleted)) == ([], ["far"])


def test_update_follows_a_renamed_lesson(tmp_path, monkeypatch):
    for module_path, folder in (("ENGLISH", tmp_path / "en"), ("TRANSLATIONS", tmp_path / "po")):
        folder.mkdir()
        monkeypatch.setattr(editions, module_path, folder)
    monkeypatch.setattr(editions, "ROOT", tmp_path)
    (tmp_path / "en" / "01_old_name.ipynb").write_bytes(editions.notebook_bytes(OLD))
    editions.update(LANGUAGE)
    po = tmp_path / "po" / LANGUAGE / "01_old_name.po"
    catalog = editions.read_po(po, LANGUAGE)
    for message in catalog:
        if message.id:
            message.string = HINDI[message.context]
    po.write_bytes(editions.po_bytes(catalog))
    (tmp_path / "en" / "01_old_name.ipynb").rename(tmp_path / "en" / "01_new_name.ipynb")
    assert editions.update(LANGUAGE)[-1] == "po/hi/01_old_name.po: removed (no notebooks/en/01_old_name.ipynb)"
    renamed = {
        m.context: (m.string, m.fuzzy) for m in editions.read_po(po.with_name("01_new_name.po"), LANGUAGE) if m.id
    }
    assert renamed == {cell_id: (HINDI[cell_id], False) for cell_id in ("title", "body", "gone")}


def test_edition_translates_only_what_is_current_and_keeps_code():
    catalog = translated(
        "x",
        {
            "title": ("# Lesson 9: Old title", HINDI["title"]),  # current
            "body": ("Some text.", HINDI["body"]),
        },
    )  # stale: English changed
    built = editions.edition(NEW, catalog, LANGUAGE)
    assert [(c.cell_type, c.id, c.source) for c in built.cells] == [
        ("code", "language", 'import accumlib\naccumlib.set_language("hi")'),
        ("markdown", "title", HINDI["title"]),
        ("code", "c1", "x = 1"),
        ("markdown", "body", "Some changed text."),
        ("markdown", "added", "A new cell."),
    ]
    assert built.cells[0].metadata.tags == ["language"]
    fuzzy = translated("x", {"body": ("Some changed text.", HINDI["body"])})
    fuzzy.get("Some changed text.", context="body").flags.add("fuzzy")
    assert editions.edition(NEW, fuzzy, LANGUAGE).cells[3].source == "Some changed text."
    with pytest.raises(ValueError, match="'language', reserved"):
        editions.edition(lesson(("code", "language", "x = 1")), catalog, LANGUAGE)


def test_edition_keeps_stored_outputs_only_while_the_code_is_the_same():
    stored = editions.edition(NEW, translated("x", {}), LANGUAGE)
    for count, cell in enumerate((c for c in stored.cells if c.cell_type == "code"), start=1):
        cell.execution_count, cell.outputs = count, [nbformat.v4.new_output("stream", text=f"{count}\n")]
    stored.metadata["widgets"] = {"state": "kept"}
    again = editions.edition(NEW, translated("x", {"body": ("Some changed text.", HINDI["body"])}), LANGUAGE, stored)
    assert [c.execution_count for c in again.cells if c.cell_type == "code"] == [1, 2]
    assert again.metadata.widgets == {"state": "kept"} and again.cells[3].source == HINDI["body"]
    changed = copy.deepcopy(NEW)
    changed.cells[1].source = "x = 2"
    rebuilt = editions.edition(changed, translated("x", {}), LANGUAGE, stored)
    assert [c.execution_count for c in rebuilt.cells if c.cell_type == "code"] == [None, None]
    assert "widgets" not in rebuilt.metadata


def test_the_checks_name_the_cell_they_fail_on():
    path = editions.edition_path("x", LANGUAGE)
    good = editions.edition(NEW, translated("x", {}), LANGUAGE)
    assert code_differences(NEW, good, path) == []
    bad = copy.deepcopy(good)
    bad.cells[2].source = "x = 2"
    assert code_differences(NEW, bad, path) == [
        "notebooks/hi/x.ipynb cell 3 (id c1, 'x = 2'): its code (comments aside) differs from English cell c1"
    ]
    assert build_differences(good, bad, path) == [
        "notebooks/hi/x.ipynb cell 3 (id c1, 'x = 2'): not what tools/editions.py builds here (run make translations)"
    ]
    assert code_differences(NEW, nbformat.v4.new_notebook(cells=good.cells[1:]), path)[0].startswith(
        "notebooks/hi/x.ipynb cell 1: not the language cell"
    )
    english_left = lesson(("markdown", "t", "# पाठ 9: यह हिन्दी है"), ("markdown", "e", "This sentence is English."))
    found = prose_problems(english_left, path)
    assert len(found) == 2 and all(f.startswith("notebooks/hi/x.ipynb cell 2 (id e,") for f in found), found
    assert text_problems("\u095b्यादा") == [  # the precomposed ज़: NFC writes ज + nukta
        "not in Unicode NFC (normalise it: unicodedata.normalize('NFC', text))"
    ]
    assert text_problems("ज़्यादा बाक़ी") == []
    assert text_problems("ज्यादा बाकी") == [
        "uses 'बाकी', which translations/glossary.tsv avoids",
        "uses 'ज्यादा', which translations/glossary.tsv avoids",
    ]
    # a danda ends a sentence, not a word: an avoided word before it is still found (and the danda alone is fine)
    assert text_problems("जाँच के लिए सेल चलाइए।") == ["uses 'चलाइए', which translations/glossary.tsv avoids"]
    assert text_problems("जाँच के लिए सेल चलाएँ। फिर पढ़ें॥") == []
    # a term's first use in prose (headings aside, inflected or bold) brings its English; later uses need not
    assert first_use_problems(["## माध्यिका", "हर समय **माध्यिका** है, फिर माध्यिका।"]) == [
        "first use of 'माध्यिका' needs \"(median)\" after it: 'हर समय **माध्यिका** है, फिर माध्यिका।'"
    ]
    assert first_use_problems(["## माध्यिका", "हर समय **माध्यिका** (median) है, फिर माध्यिका।"]) == []
    assert first_use_problems(["चलते औसत से भाग", "चलता औसत (running average)"]) == [
        "first use of 'चलता औसत' needs \"(running average)\" after it: 'चलते औसत से भाग चलता औसत (running aver'"
    ]
    assert text_problems("तय ख़र्च (fixed cost, overhead)") == []  # the bridge to English, allowed in its brackets
    assert text_problems("यह overhead है") == ["uses 'overhead', which translations/glossary.tsv avoids"]
    english_links = lesson(("markdown", "n", "[Next](03_the_loop.ipynb)"))
    hindi_links = lesson(("markdown", "n", "[आगे](../en/03_the_loop.ipynb)"))
    assert link_problems(english_links, hindi_links, path) == [
        "notebooks/hi/x.ipynb cell 1 (id n, '[आगे](../en/03_the_loop.ipynb)'): links to ../en/03_the_loop.ipynb, "
        "outside notebooks/hi",
        "notebooks/hi/x.ipynb cell 1 (id n, '[आगे](../en/03_the_loop.ipynb)'): the English cell links to "
        "['03_the_loop.ipynb'], the translation does not",
    ]
    unrun = copy.deepcopy(good)
    unrun.cells[2].execution_count = 1
    assert editions.execution_problems(unrun, path) == [
        "notebooks/hi/x.ipynb cell 1 (id language, 'import accumlib'): execution count None, expected 1",
        "notebooks/hi/x.ipynb cell 3 (id c1, 'x = 1'): execution count 1, expected 2",
    ]


def test_translation_problems_tell_missing_stale_and_fuzzy_apart():
    catalog = translated(
        "x",
        {
            "title": ("# Lesson 9: Old title", ""),
            "body": ("Some text.", HINDI["body"]),
            "added": ("A new cell.", "एक नया cell।"),
        },
    )
    catalog.get("A new cell.", context="added").flags.add("fuzzy")
    found = editions.translation_problems(NEW, catalog, "x", LANGUAGE)
    assert [(kind, message.split(":")[0]) for kind, message in found] == [
        ("missing", "notebooks/en/x.ipynb cell 1 (id title, '# Lesson 9"),
        ("stale", "notebooks/en/x.ipynb cell 3 (id body, 'Some changed text.')"),
        ("fuzzy", "notebooks/en/x.ipynb cell 4 (id added, 'A new cell.')"),
    ]


COMMENTED = lesson(
    ("markdown", "t", "# Title"),
    (
        "code",
        "c",
        "x = 1  # one\n# the loop\nfor i in range(2):\n    x += i  # add '#' not a comment\n"
        'y = "# a string, not a comment"\n',
    ),
)


def test_code_comments_are_translated_line_for_line_and_nothing_else_changes():
    english_text = "# one\n# the loop\n# add '#' not a comment"
    assert editions.translatable(COMMENTED.cells[1]) == english_text
    catalog = editions.template(COMMENTED, "x")
    assert [(m.context, m.id, m.auto_comments) for m in catalog if m.id] == [
        ("t", "# Title", []),
        ("c", english_text, [editions.CODE_NOTE]),
    ]
    hindi_text = "# एक\n# यह loop\n# जोड़ें"
    built = editions.edition(COMMENTED, translated("x", {"c": (english_text, hindi_text)}), LANGUAGE)
    assert built.cells[2].source == (
        'x = 1  # एक\n# यह loop\nfor i in range(2):\n    x += i  # जोड़ें\ny = "# a string, not a comment"\n'
    )
    path = editions.edition_path("x", LANGUAGE)
    assert code_differences(COMMENTED, built, path) == []
    assert editions.without_comments(built.cells[2].source) == editions.without_comments(COMMENTED.cells[1].source)
    # a change of code beside a translated comment is caught, and so is one inside a string that looks like a comment
    for changed in (
        "x = 2  # एक\n# यह loop\nfor i in range(2):\n    x += i  # जोड़ें\n",
        "x = 1  # एक\n# यह loop\nfor i in range(2):\n    x -= i  # जोड़ें\n",
        "x = 1  # एक\n# यह loop\nfor i in range(3):  # जोड़ें\n    x += i\n",
    ):
        bad = copy.deepcopy(built)
        bad.cells[2].source = changed
        assert [f.split(": ", 1)[1] for f in code_differences(COMMENTED, bad, path)] == [
            "its code (comments aside) differs from English cell c"
        ], changed
    # a translation with another number of lines, or a line that is no comment, is refused before anything is built
    for wrong in ("# एक\n# यह loop", "# एक\n# यह loop\nजोड़ें", "# एक\n# यह loop\n# जोड़ें\n# और"):
        with pytest.raises(ValueError, match="3 comment\\(s\\) must be 3 line"):
            editions.edition(COMMENTED, translated("x", {"c": (english_text, wrong)}), LANGUAGE)
    # English comments that changed keep the English (stale), as markdown does
    stale = editions.edition(COMMENTED, translated("x", {"c": ("# one\n# the loop\n# add", hindi_text)}), LANGUAGE)
    assert stale.cells[2].source == COMMENTED.cells[1].source
    assert [kind for kind, _ in editions.translation_problems(COMMENTED, translated("x", {}), "x", LANGUAGE)] == [
        "missing",
        "missing",
    ]


PRINTING = lesson(
    (
        "code",
        "p",
        'x = 1  # one\nif x:\n    print("a long "\n          "message:", x, "and more")\nprint(f"not {x}", "#x")\n',
    ),
)


def test_printed_strings_are_translated_with_the_comments_and_the_code_stays():
    english_text = '# one\n"a long message:"\n"and more"\n"#x"'
    assert editions.translatable(PRINTING.cells[0]) == english_text
    assert [m.auto_comments for m in editions.template(PRINTING, "x") if m.id] == [
        [editions.CODE_NOTE, editions.PRINT_NOTE]
    ]
    hindi_text = '# एक\n"एक लंबा संदेश:"\n"और भी \\"कुछ\\""\n"#x"'
    built = editions.edition(PRINTING, translated("x", {"p": (english_text, hindi_text)}), LANGUAGE)
    assert built.cells[1].source == (
        'x = 1  # एक\nif x:\n    print("एक लंबा संदेश:", x, "और भी \\"कुछ\\"")\nprint(f"not {x}", "#x")\n'
    )
    printed = io.StringIO()
    exec(compile(built.cells[1].source, "cell", "exec"), {"print": lambda *a: print(*a, file=printed)})
    assert printed.getvalue() == 'एक लंबा संदेश: 1 और भी "कुछ"\nnot 1 #x\n'
    path = editions.edition_path("x", LANGUAGE)
    assert code_differences(PRINTING, built, path) == []
    bad = copy.deepcopy(built)
    bad.cells[1].source = bad.cells[1].source.replace(", x,", ", x + 1,")
    assert [f.split(": ", 1)[1] for f in code_differences(PRINTING, bad, path)] == [
        "its code (comments aside) differs from English cell p"
    ]
    # a string line that is no Python string, or a comment where a string stands, is refused before anything is built
    for wrong in ('# एक\n"एक\n"और"\n"#x"', '# एक\nएक\n"और"\n"#x"', '# एक\n# एक\n"और"\n"#x"', '"एक"\n"a"\n"b"\n"#x"'):
        with pytest.raises(ValueError, match="1 comment\\(s\\) and 3 printed string\\(s\\) must be 4 line"):
            editions.edition(PRINTING, translated("x", {"p": (english_text, wrong)}), LANGUAGE)


def platform_run(source: str, loaded: bool) -> tuple[str, list[list[str]]]:
    """What the Colab/Kaggle set-up cell prints and runs on a fresh Colab (a stand-in: /content is there, accumlib is
    not, torch is missing, and already imported when `loaded`), without installing anything."""
    import importlib.metadata
    import importlib.util
    import os
    import subprocess
    from unittest import mock

    def version(name):
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return "99.0"

    runs, printed = [], io.StringIO()
    modules = dict(sys.modules, torch=object()) if loaded else {k: v for k, v in sys.modules.items() if k != "torch"}
    with (
        mock.patch.object(os.path, "isdir", lambda path: path == "/content"),
        mock.patch.object(importlib.util, "find_spec", lambda name: None),
        mock.patch.object(importlib.metadata, "version", version),
        mock.patch.object(subprocess, "run", lambda command, check: runs.append(command)),
        mock.patch.dict(os.environ, {"ACCUMLIB_INSTALL": "accumlib-test"}),
        mock.patch.dict(sys.modules, modules, clear=True),
    ):
        exec(compile(source, "platform-setup", "exec"), {"print": lambda *a: print(*a, file=printed)})
    return printed.getvalue(), runs


@pytest.mark.parametrize("name", LESSONS)
def test_the_hindi_set_up_cell_installs_as_the_english_one_and_says_so_in_hindi(name):
    """The set-up cell runs before accumlib is installed, so its catalogue cannot translate it: the edition's cell
    carries the Hindi from the lesson's PO file (hindi.md: "installing" and the restart request were English)."""
    cell = next(c for c in hindi(name).cells if c.get("id") == editions.PLATFORM_CELL)
    assert hindi(name).cells.index(cell) == 0
    english_cell = next(c for c in english(name).cells if c.get("id") == editions.PLATFORM_CELL)
    for loaded in (False, True):
        shown, runs = platform_run(cell.source, loaded)
        english_shown, english_runs = platform_run(english_cell.source, loaded)
        assert runs == english_runs and "accumlib-test" in runs[0] and any("torch>=2.13,<2.14" in r for r in runs)
        assert english_shown.startswith("installing accumlib-test, torch>=2.13,<2.14\n")
        assert shown.startswith("इंस्टॉल हो रहे हैं: accumlib-test, torch>=2.13,<2.14\n")
        assert ("Restart the runtime now" in english_shown) == loaded == ("रनटाइम को दोबारा शुरू करें" in shown)
        assert not untranslated(shown.replace("accumlib-test, torch>=2.13,<2.14", "")), shown
        assert len(shown.splitlines()) == len(english_shown.splitlines()) == 1 + loaded


def test_stored_outputs_survive_a_change_of_comments_only():
    stored = editions.edition(COMMENTED, translated("x", {}), LANGUAGE)
    for count, cell in enumerate((c for c in stored.cells if c.cell_type == "code"), start=1):
        cell.execution_count, cell.outputs = count, [nbformat.v4.new_output("stream", text=f"{count}\n")]
    catalog = translated("x", {"c": ("# one\n# the loop\n# add '#' not a comment", "# एक\n# यह loop\n# जोड़ें")})
    again = editions.edition(COMMENTED, catalog, LANGUAGE, stored)
    assert [c.execution_count for c in again.cells if c.cell_type == "code"] == [1, 2]
    changed = copy.deepcopy(COMMENTED)
    changed.cells[1].source = changed.cells[1].source.replace("range(2)", "range(3)")
    assert [
        c.execution_count for c in editions.edition(changed, catalog, LANGUAGE, stored).cells if c.cell_type == "code"
    ] == [None, None]


def test_the_word_list_takes_terms_not_spellings_or_conventions_and_only_ends_the_last_lesson():
    rows = [
        {"english": e, "hindi": h, "avoid": a, "note": ""}
        for e, h, a in (
            ("median", "माध्यिका", ""),
            ("more", "ज़्यादा", "ज्यादा"),
            ("batch", "batch", ""),
            ("got", "… मिला", ""),
            ("(run it)", "चलाएँ", "चलाइए"),
            ("noise", "उतार-चढ़ाव", "noise, अस्थिरता"),
            ("a | b", "क | ख", ""),
        )
    ]
    assert editions.word_list_terms(rows) == [("उतार-चढ़ाव", "noise"), ("क | ख", "a | b"), ("माध्यिका", "median")]
    # Hindi review, lesson 10 (low): the list gave English notes a Hindi reader cannot use ("digits (the course's 8×8
    # images of handwritten digits)") and padded itself with transliterations and everyday words (सेल, समय)
    rows = [
        {"english": "digits (the course's 8×8 images of handwritten digits)", "hindi": "अंक", "avoid": "", "note": ""},
        {"english": "cell (notebook)", "hindi": "सेल", "avoid": "", "note": "a transliteration: not in the word list"},
        {"english": "time", "hindi": "समय", "avoid": "", "note": "an everyday word: not in the word list"},
    ]
    assert editions.word_list_terms(rows) == [("अंक", "digits")]
    shown = editions.word_list_terms(editions.glossary())
    assert not [english for _, english in shown if "(" in english], shown
    assert not {hindi for hindi, _ in shown} & {"सेल", "डिवाइस", "डॉकस्ट्रिंग", "समय", "सही", "मापना"}, shown
    assert editions.cell_text("क | ख") == "क \\| ख"
    assert editions.edition(NEW, translated("x", {}), LANGUAGE).cells[-1].id != editions.WORD_LIST_ID
    last = editions.edition(NEW, translated(editions.WORD_LIST_LESSON, {}), LANGUAGE)
    assert (last.cells[-1].id, last.cells[-1].cell_type) == (editions.WORD_LIST_ID, "markdown")
    with pytest.raises(ValueError, match="'word-list', reserved for the word list"):
        editions.edition(lesson(("markdown", "word-list", "x")), translated("x", {}), LANGUAGE)
