"""accumlib's message catalogues: extract every translatable string, merge it into each language's PO file, compile.

    python tools/catalogs.py           # extract -> accumlib/locale/accumlib.pot, update every accumlib.po, compile .mo
    python tools/catalogs.py --check   # change nothing; exit 1 naming each string that is untranslated, fuzzy or stale

Sources of strings: `_()`, `ngettext()`, `pgettext()` and `N_()` in accumlib's Python files (Babel's extractor),
the English texts of the quiz bank (`accumlib/lessons/quiz/questions.json`, see `quiz_messages`) and the comments
of the exercises' solutions (`solution_messages`, msgctxt `<ExerciseClass>.solution_code`). A translator edits only
the PO files; `make translations` runs this script. Changed English text comes back as fuzzy (Babel's merge), and a
fuzzy or empty translation is shown in English until a translator confirms it.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import io
import json
import sys
import tokenize
from pathlib import Path

from babel.messages import mofile, pofile
from babel.messages.catalog import Catalog
from babel.messages.extract import DEFAULT_KEYWORDS, extract_from_dir

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "accumlib"
LOCALE = PACKAGE / "locale"
DOMAIN = "accumlib"
FIXED_DATE = datetime.datetime(2026, 11, 30, tzinfo=datetime.timezone.utc)  # stable headers: no diff noise
HEADER = dict(
    project="accumlib",
    version="0.2",
    copyright_holder="the accumlib authors",
    charset="utf-8",
    msgid_bugs_address="the accumlib issue tracker",
    creation_date=FIXED_DATE,
    revision_date=FIXED_DATE,
    header_comment="# The accumlib course's messages (widgets, plots, findings, quiz, exercises).\n"
    "# Terms: translations/glossary.tsv. Regenerate with `make translations`.",
)


def languages() -> list[str]:
    return sorted(p.name for p in LOCALE.iterdir() if (p / "LC_MESSAGES").is_dir())


# Fields of the quiz bank that are not text a learner reads: ids, numbers, the name of an experiment.
QUIZ_NOT_TEXT = {"id", "lesson", "topic", "kind", "answer", "run"}


def quiz_messages():
    """(message, context, location) for every English text of the quiz bank: each string under a key that is not in
    QUIZ_NOT_TEXT. The location names the question and the field, e.g. questions.json:loop-order/options/b/feedback."""
    bank = json.loads((PACKAGE / "lessons" / "quiz" / "questions.json").read_text(encoding="utf-8"))

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, str):
                    if key not in QUIZ_NOT_TEXT:
                        yield value, None, f"accumlib/lessons/quiz/questions.json:{path}{key}"
                else:
                    yield from walk(value, f"{path}{key}/")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                name = value.get("id", value.get("answer", i)) if isinstance(value, dict) else i
                yield from walk(value, f"{path}{name}/")

    for question in bank["questions"]:
        yield from walk(question, f"{question['id']}/")


def solution_context(class_name: str) -> str:
    """The msgctxt of the comments of an exercise's solution_code (accumlib.lessons.exercises.core.commented)."""
    return f"{class_name}.solution_code"


def solution_messages():
    """(comment, context, location) for every comment of every exercise's `solution_code` (the code
    `exercises.<name>.solution()` prints; its comments are shown in the course language): read from the source with
    ast and tokenize, so that no exercise (nor torch) is imported. Context: the class, one per exercise."""
    for path in sorted((PACKAGE / "lessons" / "exercises").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and any(getattr(t, "id", None) == "solution_code" for t in item.targets)
                    and isinstance(item.value, ast.Constant)
                    and isinstance(item.value.value, str)
                ):
                    for token in tokenize.generate_tokens(io.StringIO(item.value.value).readline):
                        if token.type == tokenize.COMMENT and token.string[1:].strip():
                            yield (
                                token.string[1:].strip(),
                                solution_context(node.name),
                                f"accumlib/lessons/exercises/{path.name}:{node.name}.solution_code",
                            )


def template() -> Catalog:
    """Every translatable string of the package, as a POT catalogue."""
    catalog = Catalog(domain=DOMAIN, **HEADER)
    for filename, _lineno, message, comments, context in extract_from_dir(
        PACKAGE, keywords=DEFAULT_KEYWORDS, comment_tags=("TRANSLATORS:",), strip_comment_tags=True
    ):
        catalog.add(message, locations=[(f"accumlib/{filename}", None)], auto_comments=comments, context=context)
    for message, context, location in quiz_messages():
        catalog.add(message, locations=[(location, None)], context=context)
    for message, context, location in solution_messages():
        catalog.add(message, locations=[(location, None)], context=context)
    return catalog


def _po_bytes(catalog: Catalog) -> bytes:
    buffer = io.BytesIO()
    pofile.write_po(buffer, catalog, width=120, include_lineno=False, sort_output=True, ignore_obsolete=True)
    return buffer.getvalue()


def _mo_bytes(catalog: Catalog) -> bytes:
    buffer = io.BytesIO()
    mofile.write_mo(buffer, catalog, use_fuzzy=False)
    return buffer.getvalue()


def read(path: Path, locale: str | None = None) -> Catalog:
    with path.open("rb") as f:
        return pofile.read_po(f, locale=locale, domain=DOMAIN)


def merged(language: str, pot: Catalog) -> Catalog:
    """The language's PO catalogue updated to the template (new strings empty, changed ones fuzzy)."""
    path = LOCALE / language / "LC_MESSAGES" / f"{DOMAIN}.po"
    catalog = read(path, language) if path.exists() else Catalog(locale=language, domain=DOMAIN, **HEADER)
    catalog.update(pot, update_creation_date=False)
    catalog.revision_date = FIXED_DATE
    catalog.last_translator = catalog.language_team = "the accumlib authors"
    catalog.fuzzy = False  # the header (charset, plural forms) must reach the compiled catalogue
    return catalog


def problems(language: str, pot: Catalog) -> list[str]:
    """One line per string of the template that the language's committed catalogue does not translate."""
    path = LOCALE / language / "LC_MESSAGES" / f"{DOMAIN}.po"
    if not path.exists():
        return [f"{path.relative_to(ROOT)} is missing: run make translations"]
    po = read(path, language)
    found = []
    for message in pot:
        if not message.id:
            continue
        entry = po.get(message.id, message.context)
        where = ", ".join(f for f, _ in message.locations)
        text = message.id if isinstance(message.id, str) else message.id[0]
        if entry is None:
            found.append(f"{language}: not in the catalogue (run make translations): {text!r} ({where})")
        elif entry.fuzzy:
            found.append(f"{language}: fuzzy (the English changed; confirm the translation): {text!r} ({where})")
        elif not entry.string or (isinstance(entry.string, tuple) and not all(entry.string)):
            found.append(f"{language}: untranslated: {text!r} ({where})")
    compiled = path.with_suffix(".mo")
    if not compiled.exists() or compiled.read_bytes() != _mo_bytes(po):
        found.append(f"{compiled.relative_to(ROOT)} is not compiled from its .po: run make translations")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; report what is not translated")
    args = parser.parse_args()
    pot = template()
    if args.check:
        found = [line for language in languages() for line in problems(language, pot)]
        print("\n".join(found) or "every string is translated and compiled")
        return 1 if found else 0
    (LOCALE / f"{DOMAIN}.pot").write_bytes(_po_bytes(pot))
    for language in languages():
        folder = LOCALE / language / "LC_MESSAGES"
        catalog = merged(language, pot)
        (folder / f"{DOMAIN}.po").write_bytes(_po_bytes(catalog))
        (folder / f"{DOMAIN}.mo").write_bytes(_mo_bytes(catalog))
        untranslated = sum(1 for m in catalog if m.id and (m.fuzzy or not m.string))
        print(f"{language}: {len(catalog)} strings, {untranslated} untranslated or fuzzy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
