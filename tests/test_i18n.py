"""accumlib's Hindi catalogue (accumlib/locale/hi/LC_MESSAGES/accumlib.po): every string a learner can see is
translated and compiled, placeholders survive translation, the Hindi follows the glossary, and the language switch
refuses what it does not know. Each failure names the string and the file.
"""
from __future__ import annotations

import functools
import re
import string
import sys
from pathlib import Path

import pytest

import accumlib
from accumlib import i18n

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import catalogs  # noqa: E402
from hindi import text_problems, untranslated  # noqa: E402

LANGUAGE = "hi"
PO = catalogs.LOCALE / LANGUAGE / "LC_MESSAGES" / f"{catalogs.DOMAIN}.po"
# A number followed by a unit that notebooks/sanitize.cfg masks ("12.5 ms", "2.25x"): the Hindi must keep it as is,
# or nbval would compare a wall-clock time in the Hindi edition.
MASKED = re.compile(r"\{[^{}]*\}(?: ms\b|x\b)")
PLACEHOLDER = re.compile(r"\{[^{}]*\}")  # code, not words


@functools.lru_cache(maxsize=None)
def committed():
    return catalogs.read(PO, LANGUAGE)


def translations():
    """(where, Hindi, the English texts it stands for) for each non-empty translation and plural form.

    Hindi's plural form 0 (n = 0 or 1) stands for both English forms: it may show the count the English singular
    leaves out ("{n} अधूरा cycle" for n = 0). Every other Hindi text stands for one English text.
    """
    for message in committed():
        if not message.id or not message.string:
            continue
        if isinstance(message.id, str):
            yield f"{PO.relative_to(ROOT)}: {message.id!r}", message.string, (message.id,)
        else:
            for index, form in enumerate(message.string):
                if form:
                    yield (f"{PO.relative_to(ROOT)}: {message.id[0]!r} msgstr[{index}]", form,
                           message.id if index == 0 else message.id[1:])


def fields(text: str) -> set[tuple[str, str, str]] | None:
    """The str.format placeholders of a text, (name, conversion, format spec); None if it is no format string."""
    try:
        return {(name, conversion or "", spec or "") for _, name, spec, conversion in string.Formatter().parse(text)
                if name is not None}
    except ValueError:
        return None


def report(found: list[str]) -> str:
    return f"{len(found)} problem(s):\n" + "\n".join(found)


def test_every_string_has_a_hindi_translation_and_the_mo_is_compiled_from_the_po():
    found = catalogs.problems(LANGUAGE, catalogs.template())
    assert not found, report(found)


def test_placeholders_agree_between_english_and_hindi():
    found = []
    for where, form, english in translations():
        mine, theirs = fields(form), [fields(text) for text in english]
        if None in theirs:
            continue  # the English has lone braces: it is not formatted
        known = set().union(*theirs)
        if mine is None:
            found.append(f"{where}: the Hindi has unbalanced braces: {form!r}")
        elif mine != known if len(english) == 1 else not mine <= known:
            found.append(f"{where}: placeholders {sorted(mine)} in the Hindi, {sorted(known)} in the English")
        for unit in MASKED.findall(english[-1]):
            if unit not in form:
                found.append(f"{where}: {unit!r} must stay as it is (notebooks/sanitize.cfg masks it in both editions)")
    assert not found, report(found)


def test_hindi_is_nfc_follows_the_glossary_and_leaves_no_english():
    found = [f"{where}: {problem}" for where, form, _ in translations() for problem in text_problems(form)]
    found += [f"{where}: English words left: {sorted(set(words))}"
              for where, form, _ in translations() if (words := untranslated(PLACEHOLDER.sub(" ", form)))]
    assert not found, report(found)


def test_translations_are_what_the_hindi_edition_shows():
    shown = [(message.context, message.id, message.string) for message in committed()
             if message.id and isinstance(message.id, str) and message.string and not message.fuzzy]
    if not shown:
        pytest.skip(f"no Hindi translation in {PO.relative_to(ROOT)} yet")
    try:
        accumlib.set_language(LANGUAGE)
        wrong = [f"{PO.relative_to(ROOT)}: {message_id!r} shows {got!r}" for context, message_id, string in shown
                 if (got := i18n.pgettext(context, message_id) if context else i18n._(message_id)) != string]
    finally:
        accumlib.set_language("en")
    assert not wrong, report(wrong)


@pytest.mark.parametrize("code", ["xx", "HI", "hindi", "", None, 1])
def test_set_language_refuses_unknown_codes_and_keeps_the_language(code):
    accumlib.set_language(LANGUAGE)
    try:
        with pytest.raises(ValueError) as refused:
            accumlib.set_language(code)
        assert accumlib.language() == LANGUAGE
    finally:
        accumlib.set_language("en")
    message = str(refused.value)
    assert "language" in message and repr(code) in message, message
    assert all(repr(known) in message for known in i18n.LANGUAGES), message
