"""The lessons in every language from one source: the English notebooks plus one translation file per lesson.

    python tools/editions.py update    # translations/lessons/<lang>/<lesson>.po follow notebooks/en
    python tools/editions.py build     # notebooks/<lang>/<lesson>.ipynb from notebooks/en and those PO files
    python tools/editions.py execute   # run both editions in fresh kernels; store outputs and widget state
    python tools/editions.py status    # per lesson: cells translated, fuzzy, stale, missing (exit 1 if any)

`make translations` runs update and build; `make notebooks` runs update, build and execute.

A translation file is a gettext PO catalogue (read and written with Babel), one entry per markdown cell of the
English notebook, in cell order: msgctxt is the cell's id, msgid the English cell's text, msgstr its translation.
A code cell with comments has an entry too (msgctxt its id): msgid its comments, one `#` line each in the order they
come, msgstr their translations, line for line. A string literal the cell passes straight to print() is a line of
that entry too, where it comes, written as a one-line Python string in double quotes (the Colab/Kaggle set-up cell's
messages: it runs before accumlib, and so its catalogue, is installed); nothing else of a code cell is translated.
`update` adds new cells empty, marks an entry whose English changed `fuzzy` and keeps the English it translated as
the previous msgid (`#| msgid`, as GNU msgmerge --previous writes it, so PO editors show what changed), and drops
deleted cells (a translation whose cell moved to another lesson, or was re-created with the same text, follows it).

A generated notebook is the English one with every markdown cell, code comment and printed string translated, the rest
of every code and raw cell unchanged (tests/course/test_editions.py compares the code's tokens without them), and one
code cell on top, tagged `language`, that calls `accumlib.set_language(...)`. A cell whose translation is missing, fuzzy
or stale keeps its English text (gettext's rule: never show a translation of text that has changed); `status` and
tests/course/test_editions.py name every such cell. The last lesson of an edition ends with one more markdown cell, its
word list (id `word-list`): every term of translations/glossary.tsv in the edition's language with its English,
generated at build time. Relative links between lessons stay within the edition, since both editions keep the same file
names.
"""

from __future__ import annotations

import argparse
import ast
import copy
import csv
import difflib
import io
import json
import re
import sys
import tokenize
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from babel.messages import pofile
from babel.messages.catalog import Catalog, Message

from catalogs import FIXED_DATE

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ENGLISH = NOTEBOOKS / "en"
TRANSLATIONS = ROOT / "translations" / "lessons"
GLOSSARY = ROOT / "translations" / "glossary.tsv"
LANGUAGES = ("hi",)  # the editions generated from notebooks/en (codes accepted by accumlib.set_language)
LANGUAGE_TAG = "language"  # tag and id of the cell that sets the edition's language
WIDTH = 120  # PO line width
CLOSE = 0.6  # text similarity above which a deleted cell's translation is offered to a new cell, fuzzy
WORD_LIST_LESSON = "10_recap_and_quiz"  # the last lesson: its edition ends with the word list
WORD_LIST_ID = "word-list"  # id of that cell, reserved like the language cell's
PLATFORM_CELL = "platform-setup"  # id of the Colab/Kaggle set-up cell (tools/platform_cell.py): first in every edition
WORD_LIST_INTRO = {
    "hi": "## शब्दावली: हिन्दी और English\n\nइस पाठ्यक्रम के हिन्दी शब्द और उनके English नाम, ताकि आप "
    "अंग्रेज़ी में लिखी सामग्री (PyTorch के मदद वाले पन्ने, सवाल-जवाब की साइटें, वीडियो) "
    "भी पढ़ और खोज सकें। "
    "बाक़ी शब्द, जैसे batch, gradient और loss, पूरे पाठ्यक्रम में English में ही लिखे गए हैं।"
}


def language_source(language: str) -> str:
    """The code of an edition's first cell."""
    return f'import accumlib\naccumlib.set_language("{language}")'


def lessons() -> list[str]:
    """File stems of the English notebooks, sorted: the lessons every edition has."""
    return sorted(p.stem for p in ENGLISH.glob("*.ipynb"))


def english_path(name: str) -> Path:
    return ENGLISH / f"{name}.ipynb"


def edition_path(name: str, language: str) -> Path:
    return NOTEBOOKS / language / f"{name}.ipynb"


def po_path(name: str, language: str) -> Path:
    return TRANSLATIONS / language / f"{name}.po"


def read_notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def cell_label(path: Path, index: int, cell) -> str:
    """How messages name a cell: file, position from 1, id and the start of its first line."""
    first = cell.source.strip().splitlines()[0] if cell.source.strip() else ""
    first = first if len(first) <= 60 else first[:57] + "..."
    return f"{path.relative_to(ROOT)} cell {index + 1} (id {cell.id}, {first!r})"


# --- code comments and printed text ---------------------------------------------------------------------------

CODE_NOTE = "the comments of a code cell, one per line: translate each line, keep its '#' and the number of lines"
PRINT_NOTE = (
    "a line in double quotes is a text the cell prints (a Python string passed to print()): translate what is "
    "inside the quotes and keep them, so that the line stays a Python string"
)


def comments(source: str) -> list[tokenize.TokenInfo]:
    """The comment tokens of a code cell, in order; none for a cell that Python's tokenizer cannot read."""
    try:
        return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []


def _offset(rows: list[str], row: int, column: int, in_bytes: bool = False) -> int:
    """The character offset in the source of (row, column): 1-based row; a column in characters (tokenize) or in
    UTF-8 bytes (ast)."""
    line = rows[row - 1] if row <= len(rows) else ""
    return sum(len(r) for r in rows[: row - 1]) + (
        len(line.encode("utf-8")[:column].decode("utf-8")) if in_bytes else column
    )


def printed_strings(source: str) -> list[ast.Constant]:
    """The string literals a code cell passes straight to print(), in source order: text the cell shows, translated
    with its comments (the Colab/Kaggle set-up cell's messages: it runs before accumlib, and its catalogue, can be
    imported). None for a cell Python cannot parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found = [
        arg
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    ]
    return sorted(found, key=lambda node: (node.lineno, node.col_offset))


def pieces(source: str) -> list[tuple[int, int, str]]:
    """(start, end, English line) of what is translated in a code cell, in source order: each comment (its text, from
    '#') and each printed string (its text as a one-line Python string, double-quoted)."""
    rows = source.splitlines(keepends=True)
    found = [(_offset(rows, *token.start), _offset(rows, *token.end), token.string) for token in comments(source)] + [
        (
            _offset(rows, node.lineno, node.col_offset, in_bytes=True),
            _offset(rows, node.end_lineno, node.end_col_offset, in_bytes=True),
            json.dumps(node.value, ensure_ascii=False),  # also a Python string literal, on one line
        )
        for node in printed_strings(source)
    ]
    return sorted(found)


def translatable(cell) -> str:
    """What of a cell is translated: a markdown cell's text, a code cell's comments and printed strings (one per
    line, in source order), else ""."""
    if cell.cell_type == "markdown":
        return cell.source if cell.source.strip() else ""
    if cell.cell_type == "code":
        return "\n".join(line for _, _, line in pieces(cell.source))
    return ""


def _is_string(line: str) -> bool:
    try:
        return line.startswith('"') and isinstance(ast.literal_eval(line), str)
    except (ValueError, SyntaxError):
        return False


def _replaced(source: str, spans: list[tuple[int, int, str]]) -> str:
    for start, end, text in sorted(spans, reverse=True):  # from the end, so earlier offsets stay valid
        source = source[:start] + text + source[end:]
    return source


def with_comments(source: str, translated: str, where: str = "a code cell") -> str:
    """`source` with its comments and printed strings replaced, in order, by the lines of `translated` (the PO
    entry's msgstr): a comment by a line starting with '#', a printed string by a line that is a Python string."""
    found, lines = pieces(source), translated.split("\n")
    kinds = ["#" if english.startswith("#") else '"' for _, _, english in found]
    fits = len(lines) == len(found) and all(
        line.startswith("#") if kind == "#" else _is_string(line) for kind, line in zip(kinds, lines, strict=False)
    )
    if not fits:
        strings = kinds.count('"')
        raise ValueError(
            f"{where}: the translation of its {kinds.count('#')} comment(s)"
            + (f" and {strings} printed string(s)" if strings else "")
            + f" must be {len(found)} line(s), in their order, each comment starting with '#'"
            + (" and each string a Python string in double quotes" if strings else "")
            + f"; got {translated!r}"
        )
    return _replaced(source, [(start, end, line) for (start, end, _), line in zip(found, lines, strict=True)])


def without_comments(source: str) -> str:
    """A code cell's source with every comment cut out and every printed string emptied: what must be the same in
    every edition."""
    return _replaced(
        source, [(start, end, "" if english.startswith("#") else '""') for start, end, english in pieces(source)]
    )


# --- translation files ------------------------------------------------------------------------------------------


def template(english: nbformat.NotebookNode, name: str) -> Catalog:
    """One message per markdown cell and per commented code cell of an English notebook, in cell order."""
    catalog = new_catalog(name, "en")
    for cell in english.cells:
        if text := translatable(cell):
            catalog.add(
                text,
                locations=[(f"notebooks/en/{name}.ipynb", None)],
                context=cell.id,
                auto_comments=(
                    [CODE_NOTE, *([PRINT_NOTE] if printed_strings(cell.source) else [])]
                    if cell.cell_type == "code"
                    else []
                ),
            )
    return catalog


def new_catalog(name: str, language: str) -> Catalog:
    """An empty catalogue for a lesson, with the project's fixed header (no dates that change on every run)."""
    catalog = Catalog(
        locale=language,
        domain=name,
        project=f"accumlib lesson {name}",
        version="0.2",
        copyright_holder="the accumlib authors",
        msgid_bugs_address="the accumlib issue tracker",
        charset="utf-8",
        creation_date=FIXED_DATE,
        revision_date=FIXED_DATE,
        last_translator="the accumlib authors",
        language_team="the accumlib authors",
        header_comment=f"# The markdown cells and code comments of notebooks/en/{name}.ipynb: msgctxt = "
        "cell id, msgid = its English text.\n# Terms: translations/glossary.tsv. "
        "`make translations` updates this file; #| msgid: the English a fuzzy entry "
        "translated.",
    )
    catalog.fuzzy = False
    return catalog


def read_po(path: Path, language: str) -> Catalog:
    """A lesson's PO file, with the previous English of fuzzy entries (`#| msgid`) in `previous_id`.

    Babel's reader keeps `#|` lines as translator comments, so they are parsed back here.
    """
    with path.open("rb") as f:
        catalog = pofile.read_po(f, locale=language, domain=path.stem, abort_invalid=True)
    for message in catalog:
        previous = [c[1:].strip() for c in message.user_comments if c.startswith("|")]
        message.user_comments = [c for c in message.user_comments if not c.startswith("|")]
        start = next((i for i, line in enumerate(previous) if line.startswith("msgid ")), None)
        if start is not None:
            lines = [previous[start][len("msgid ") :]]
            for line in previous[start + 1 :]:
                if not line.startswith('"'):
                    break
                lines.append(line)
            message.previous_id = [pofile.denormalize("\n".join(lines))]
    return catalog


def po_bytes(catalog: Catalog) -> bytes:
    """The PO text of a lesson catalogue, in cell order, with `#| msgid` before each fuzzy entry's msgctxt.

    Babel's own `include_previous` folds a multi-line previous msgid into wrapped comment text that no PO tool
    reads back, so the previous English is written here in GNU gettext's format.
    """
    buffer = io.BytesIO()
    pofile.write_po(buffer, catalog, width=WIDTH, include_lineno=False, ignore_obsolete=True)
    text = buffer.getvalue().decode("utf-8")
    for message in catalog:
        if message.id and message.fuzzy and message.previous_id:
            context = f"msgctxt {pofile.normalize(message.context, width=WIDTH)}\n"
            previous = f"#| msgid {pofile.normalize(message.previous_id[0], prefix='#| ', width=WIDTH)}\n"
            text = text.replace(context, previous + context, 1)
    return text.encode("utf-8")


def updated(
    pot: Catalog,
    old: Catalog | None,
    language: str,
    moved: dict[str, Message] | None = None,
    deleted: dict[str, Message] | None = None,
) -> Catalog:
    """The lesson's catalogue after the English changed: `pot` (the English cells, `template`) with the
    translations of `old` carried over by cell id.

    Unchanged English keeps its translation; changed English keeps it too, marked fuzzy, with the English it
    translated as `previous_id`. A new cell takes the translation of `moved` (cell id -> entry of a cell that left
    another lesson) under its id, else of the entry of `deleted` (cell id -> entry of a cell that exists nowhere now)
    whose English is at least CLOSE to its own: fuzzy unless the English is equal, and removed from that dict.
    Other new cells are empty. Cells not in `pot` are dropped.
    """
    catalog = new_catalog(pot.domain, language)
    own = {m.context: m for m in (old or ()) if m.id and m.string}
    moved, deleted = ({} if moved is None else moved), ({} if deleted is None else deleted)
    for message in pot:
        if not message.id:
            continue
        before = own.get(message.context) or moved.pop(message.context, None) or _closest(message.id, deleted)
        string, flags, previous, comments = "", set(), (), []
        if before is not None:
            string, comments = before.string, before.user_comments
            if before.id != message.id or before.fuzzy:
                flags = {"fuzzy"}
                previous = before.previous_id if before.fuzzy and before.previous_id else before.id
        catalog.add(
            message.id,
            string,
            locations=message.locations,
            flags=flags,
            user_comments=comments,
            auto_comments=message.auto_comments,
            previous_id=previous,
            context=message.context,
        )
    return catalog


def _closest(text: str, spare: dict[str, Message]) -> Message | None:
    """The spare entry whose English is most like `text` (removed from `spare`), if any is at least CLOSE."""
    scored = [(difflib.SequenceMatcher(None, text, m.id).ratio(), cell_id) for cell_id, m in spare.items()]
    score, cell_id = max(scored, default=(0.0, None))
    return spare.pop(cell_id) if score >= CLOSE else None


def update(language: str) -> list[str]:
    """Bring translations/lessons/<language>/*.po in line with notebooks/en; one summary line per lesson."""
    folder = TRANSLATIONS / language
    folder.mkdir(parents=True, exist_ok=True)
    englishes = {name: read_notebook(english_path(name)) for name in lessons()}
    olds = {p.stem: read_po(p, language) for p in sorted(folder.glob("*.po"))}
    cells = {name: {cell.id for cell in english.cells} for name, english in englishes.items()}
    everywhere = set().union(*cells.values())
    left = [
        m
        for name, catalog in olds.items()
        for m in catalog
        if m.id and m.string and m.context not in cells.get(name, ())
    ]  # cells gone from their lesson
    moved = {m.context: m for m in left if m.context in everywhere}
    deleted = {m.context: m for m in left if m.context not in everywhere}
    summary = []
    for name, english in englishes.items():
        catalog = updated(template(english, name), olds.get(name), language, moved, deleted)
        _write_if_changed(po_path(name, language), po_bytes(catalog))
        summary.append(f"{po_path(name, language).relative_to(ROOT)}: {_counts(english, catalog, language)}")
    for name in sorted(set(olds) - set(englishes)):  # the English notebook is gone; its cells' translations moved
        po_path(name, language).unlink()
        summary.append(f"{po_path(name, language).relative_to(ROOT)}: removed (no notebooks/en/{name}.ipynb)")
    return summary


def _counts(english, catalog: Catalog, language: str) -> str:
    found = translation_problems(english, catalog, catalog.domain, language)
    kinds = [kind for kind, _ in found]
    cells = sum(1 for m in catalog if m.id)
    return (
        f"{cells} cells (markdown, code comments), {cells - len(kinds)} translated, {kinds.count('fuzzy')} fuzzy, "
        f"{kinds.count('stale')} stale, {kinds.count('missing')} untranslated"
    )


def translation(name: str, language: str) -> Catalog:
    """A lesson's committed translation (empty if it has no PO file yet)."""
    path = po_path(name, language)
    return read_po(path, language) if path.exists() else new_catalog(name, language)


def state(entry: Message | None, cell) -> str:
    """Whether a cell's entry (its markdown, its code comments) can be shown: "translated", or why not: "missing"
    (no entry, or an empty one), "stale" (it translates other English than the cell holds: run make translations),
    "fuzzy" (the English changed since: a translator must revise it and remove the flag)."""
    if entry is None or not entry.string:
        return "missing"
    if entry.id != translatable(cell):
        return "stale"
    return "fuzzy" if entry.fuzzy else "translated"


PROBLEM = {
    "missing": "no translation in {po}",
    "stale": "the English changed after it was translated: run make translations, then revise it in {po}",
    "fuzzy": "fuzzy in {po}: revise the translation against the changed English (#| msgid), then remove the fuzzy flag",
}


def translation_problems(english, catalog: Catalog, name: str, language: str) -> list[tuple[str, str]]:
    """(state, message naming the cell) for every markdown cell and commented code cell of `english` whose
    translation cannot be shown."""
    entries = {m.context: m for m in catalog if m.id}
    po = po_path(name, language).relative_to(ROOT)
    found = []
    for index, cell in enumerate(english.cells):
        if translatable(cell):
            kind = state(entries.get(cell.id), cell)
            if kind != "translated":
                found.append((kind, f"{cell_label(english_path(name), index, cell)}: {PROBLEM[kind].format(po=po)}"))
    return found


# --- generated notebooks ----------------------------------------------------------------------------------------


def glossary() -> list[dict[str, str]]:
    """The rows of translations/glossary.tsv (english, hindi, avoid, note); a line starting with # is a comment."""
    with GLOSSARY.open(encoding="utf-8") as f:
        return list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))


DEVANAGARI = re.compile(r"[\u0900-\u097F]")
NUKTA = "\u093c"


ENGLISH_NOTE = re.compile(r"\s*\([^()]*\)$")  # "digits (the course's 8×8 images ...)": a note for the glossary's users
NOT_LISTED = "not in the word list"  # in a row's note: a transliteration (सेल, cell) or an everyday word (समय, time)


def word_list_terms(rows: list[dict[str, str]]) -> list[tuple[str, str]]:
    """(Hindi, English) for the glossary rows a learner would look up, sorted by the Hindi: those whose Hindi is
    (partly) Devanagari, leaving out conventions (an English column in brackets, "… मिला"), rows that are only
    about spelling (every avoided form is the Hindi without its nukta: ज़्यादा, not ज्यादा) and rows whose note says
    NOT_LISTED; the English without its note in brackets (the English words to search for)."""
    terms = []
    for row in rows:
        hindi, english = row["hindi"].strip(), row["english"].strip()
        avoid = {v.strip() for v in (row["avoid"] or "").split(",") if v.strip()}
        spellings = {form.strip().replace(NUKTA, "") for form in hindi.split("/")}
        if not DEVANAGARI.search(hindi) or english.startswith("(") or hindi.startswith("…"):
            continue
        if (avoid and avoid <= spellings) or NOT_LISTED in (row.get("note") or ""):
            continue
        terms.append((hindi, ENGLISH_NOTE.sub("", english)))
    return sorted(terms, key=lambda term: (not DEVANAGARI.match(term[0]), term))  # Devanagari first, in its order


def cell_text(text: str) -> str:
    """Text for a markdown table cell: a | would end the cell."""
    return text.replace("|", "\\|")


def word_list_cell(language: str) -> nbformat.NotebookNode:
    """The markdown cell that ends the last lesson of an edition: its glossary as a table, Hindi to English."""
    rows = [f"| {cell_text(hindi)} | {cell_text(english)} |" for hindi, english in word_list_terms(glossary())]
    table = "\n".join(["| हिन्दी | English |", "|---|---|", *rows])
    cell = nbformat.v4.new_markdown_cell(f"{WORD_LIST_INTRO[language]}\n\n{table}")
    cell.id = WORD_LIST_ID
    return cell


def language_cell(language: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(language_source(language), metadata={"tags": [LANGUAGE_TAG]})
    cell.id = LANGUAGE_TAG
    return cell


def edition(english, catalog: Catalog, language: str, stored=None) -> nbformat.NotebookNode:
    """The notebook of an edition: `english` with its markdown and code comments translated by `catalog` and the
    language cell first.

    A cell whose translation cannot be shown (`state`) stays English. Code cells are the English ones with their
    comments translated, unexecuted, unless `stored` (the edition's notebook as it is) has the same code cells, comments
    aside: then its outputs and widget state are kept, since running the same code again would store the same.
    """
    for reserved, what in ((LANGUAGE_TAG, "the language cell"), (WORD_LIST_ID, "the word list")):
        if any(cell.id == reserved for cell in english.cells):
            raise ValueError(f"an English cell has the id {reserved!r}, reserved for {what}: rename it")
    entries = {m.context: m for m in catalog if m.id}
    cells = [language_cell(language)]
    for cell in english.cells:
        cell = copy.deepcopy(cell)
        shown = state(entries.get(cell.id), cell) == "translated"
        if cell.cell_type == "markdown" and shown:
            cell.source = entries[cell.id].string
        elif cell.cell_type == "code":
            if shown:
                cell.source = with_comments(
                    cell.source,
                    entries[cell.id].string,
                    f"{po_path(catalog.domain, language).relative_to(ROOT)} entry {cell.id}",
                )
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
        cells.append(cell)
    if len(cells) > 1 and cells[1].id == PLATFORM_CELL:  # Colab/Kaggle: accumlib is installed before it is imported
        cells[0], cells[1] = cells[1], cells[0]
    if catalog.domain == WORD_LIST_LESSON:
        cells.append(word_list_cell(language))
    metadata = copy.deepcopy(english.metadata)
    metadata.pop("widgets", None)
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=metadata)
    notebook.nbformat_minor = english.nbformat_minor
    if stored is not None and code_cells(stored, keep_comments=False) == code_cells(notebook, keep_comments=False):
        outputs = {c.id: c for c in stored.cells if c.cell_type == "code"}
        for cell in notebook.cells:
            if cell.cell_type == "code":
                kept = outputs[cell.id]
                cell.outputs, cell.execution_count = kept.outputs, kept.execution_count
                if "execution" in kept.metadata:
                    cell.metadata["execution"] = kept.metadata["execution"]
        if "widgets" in stored.metadata:
            notebook.metadata["widgets"] = stored.metadata["widgets"]
    return notebook


def cell_shape(cell) -> tuple[str, str, str, dict]:
    """What the generator decides about a cell: type, id, source, metadata (execution times aside)."""
    return cell.cell_type, cell.id, cell.source, {k: v for k, v in cell.metadata.items() if k != "execution"}


def code_cells(notebook, keep_comments: bool = True) -> list[tuple[str, str, str, dict]]:
    """The shape of every code cell, in order; with `keep_comments=False` their sources without comments: while that
    stays the same, stored outputs stay valid."""
    shapes = [cell_shape(c) for c in notebook.cells if c.cell_type == "code"]
    if keep_comments:
        return shapes
    return [(kind, id_, without_comments(source), meta) for kind, id_, source, meta in shapes]


def execution_problems(notebook, path: Path) -> list[str]:
    """What shows that a notebook is not stored as one run top to bottom in a fresh kernel, naming each cell: an
    execution count out of sequence (1, 2, ... over the non-empty code cells), an error output."""
    found = []
    code = [(i, c) for i, c in enumerate(notebook.cells) if c.cell_type == "code" and c.source.strip()]
    for expected, (index, cell) in enumerate(code, start=1):
        if cell.execution_count != expected:
            found.append(
                f"{cell_label(path, index, cell)}: execution count {cell.execution_count}, expected {expected}"
            )
        if any(output.output_type == "error" for output in cell.outputs):
            found.append(f"{cell_label(path, index, cell)}: stored error output")
    return found


def build(language: str) -> list[str]:
    """Write notebooks/<language>/ from notebooks/en and the PO files; one line per notebook written or removed."""
    folder = NOTEBOOKS / language
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in lessons():
        path = edition_path(name, language)
        stored = read_notebook(path) if path.exists() else None
        notebook = edition(read_notebook(english_path(name)), translation(name, language), language, stored)
        if _write_if_changed(path, notebook_bytes(notebook)):
            executed = not execution_problems(notebook, path)
            written.append(
                f"{path.relative_to(ROOT)}: written ({'outputs kept' if executed else 'run make notebooks'})"
            )
    for path in sorted(folder.glob("*.ipynb")):
        if path.stem not in lessons():
            path.unlink()
            written.append(f"{path.relative_to(ROOT)}: removed (no notebooks/en/{path.name})")
    return written


def notebook_bytes(notebook) -> bytes:
    """A notebook's file content, as Jupyter writes it."""
    return nbformat.writes(notebook).encode("utf-8") + b"\n"


def _write_if_changed(path: Path, content: bytes) -> bool:
    if path.exists() and path.read_bytes() == content:
        return False
    path.write_bytes(content)
    return True


# --- execution ----------------------------------------------------------------------------------------------------


def execute(path: Path) -> str:
    """Run a notebook top to bottom in a fresh kernel started in its folder; store outputs and widget state.

    Returns "" on success, else the failure (the notebook is then left as it was).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = read_notebook(path)
    notebook.metadata.pop("widgets", None)  # only the state of this run's widgets is stored
    client = NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as error:
        return f"{path.relative_to(ROOT)}: {str(error).strip().splitlines()[-1]}"
    path.write_bytes(notebook_bytes(notebook))
    return ""


def execute_all(paths: list[Path], workers: int = 2) -> list[str]:
    """Execute notebooks, `workers` at a time, each in its own fresh kernel; the failures (empty if none)."""
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return [failure for failure in pool.map(execute, paths) if failure]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "commands", nargs="+", choices=["update", "build", "execute", "status"], help="run in the order given"
    )
    parser.add_argument("--workers", type=int, default=2, help="notebooks executed at a time (execute)")
    parser.add_argument(
        "--edition",
        action="append",
        choices=["en", *LANGUAGES],
        help="execute only this edition (repeatable; default: all)",
    )
    args = parser.parse_args()
    if args.workers < 1:
        parser.error(f"--workers must be at least 1; got {args.workers}")
    failed = False
    for command in args.commands:
        if command == "update":
            print("\n".join(line for language in LANGUAGES for line in update(language)))
        elif command == "build":
            print("\n".join(line for language in LANGUAGES for line in build(language)) or "editions up to date")
        elif command == "execute":
            # English and each edition of a lesson side by side, so two workers run different lessons' kernels
            chosen = args.edition or ["en", *LANGUAGES]
            paths = [
                english_path(name) if code == "en" else edition_path(name, code)
                for name in lessons()
                for code in chosen
            ]
            failures = execute_all(paths, args.workers)
            print("\n".join(failures) or f"{len(paths)} notebooks executed")
            failed |= bool(failures)
        else:
            found = [
                message
                for language in LANGUAGES
                for name in lessons()
                for _, message in translation_problems(
                    read_notebook(english_path(name)), translation(name, language), name, language
                )
            ]
            print("\n".join(found) or "every markdown cell and code comment is translated")
            failed |= bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
