"""What the Hindi-edition tests look for: English left untranslated, variants the glossary avoids, Devanagari share.

The glossary (translations/glossary.tsv) is the one list of terms: a row whose Hindi column is in Latin script is
a term the Hindi text keeps in English (batch, gradient, ...), so it is allowed; every "avoid" variant is refused.
"""

from __future__ import annotations

import functools
import html
import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import editions  # noqa: E402

DEVANAGARI = re.compile(r"[\u0900-\u097F]")
# What continues a word: letters, digits and Devanagari signs, but not the danda "।" and double danda "॥" (U+0964,
# U+0965), which end a sentence as "." does: "चलाइए।" is the word चलाइए before a full stop.
WORD_CHAR = r"[\w\u0900-\u0963\u0966-\u097F]"
LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
# Names and notation that are not English prose: libraries, optimizers, number formats, units, Python literals.
NAMES = {
    "mib",
    "pytorch",
    "torch",
    "accumlib",
    "python",
    "jupyter",
    "jupyterlab",
    "voila",
    "binder",
    "sgd",
    "adam",
    "adamw",
    "nan",
    "inf",
    "fp16",
    "bf16",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "amp",
    "gradscaler",
    "kaggle",
    "nanogpt",
    "gloo",
    "nccl",
    "torchrun",
    "true",
    "false",
    "none",
    "ms",
    "s",
    "us",
    "kb",
    "mb",
    "gb",
    "kib",
    "gib",
    "x",
    "e",
    "id",
    "mlp",
    "cnn",
    "relu",
    "linear",
    "conv2d",
    "cuda",
    "h100",
    "h200",
    "a100",
    "numpy",
    "matplotlib",
    "ipywidgets",
    "okabe",
    "ito",
    "hindi",
    "english",
    "ok",
}


@functools.lru_cache(maxsize=None)
def glossary() -> list[dict[str, str]]:
    """The glossary's rows, read as the edition builder reads them (tools/editions.py: it also makes the word list)."""
    return editions.glossary()


@functools.lru_cache(maxsize=None)
def allowed_latin() -> frozenset[str]:
    """Lower-case Latin words a Hindi text may contain: the glossary's Latin-script terms and NAMES."""
    words = set(NAMES)
    for row in glossary():
        hindi = row["hindi"]
        for word in LATIN_WORD.findall(hindi):
            words.add(word.lower())
            words.add(word.lower() + "s")  # plural of a kept term: gradients, batches are handled below
            words.add(word.lower() + "es")
    return frozenset(words)


def _prose(text: str) -> str:
    """The text without markup and code: HTML tags, `code`, fenced blocks, URLs, identifiers and numbers."""
    text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "] ", text)  # markdown link targets
    text = re.sub(r"https?://\S+", " ", text)
    # identifiers and calls: anything with _, ., (, ), =, [, ] or digits glued to letters
    text = re.sub(r"\S*[A-Za-z]\S*[_.()=\[\]0-9]\S*|\S*[_.()=\[\]0-9]\S*[A-Za-z]\S*", " ", text)
    return text


def untranslated(text: str) -> list[str]:
    """English words in a Hindi text that are neither glossary terms kept in Latin script nor names or code."""
    words = LATIN_WORD.findall(_prose(_without_anchors(text)))
    return [w for w in words if w.lower().strip("'’-") not in allowed_latin()]


FIRST_USE = re.compile(r"first use: \(([^)]+)\)")  # in a glossary note: the English written in brackets once
HEADING = re.compile(r"^#.*$", re.M)
CODE = re.compile(r"```.*?```|`[^`]*`", re.S)
INFLECTED = "\u093e\u093f\u0940\u0947\u094b\u0902\u0901"  # ा ि ी े ो ं ँ: endings that change with case and number


@functools.lru_cache(maxsize=None)
def anchored() -> list[tuple[str, str]]:
    """(Hindi term, English) for each glossary row whose note says `first use: (English)`: on its first use in a
    lesson the Hindi term is followed by the English in brackets, "तय ख़र्च (fixed cost)", so that a learner can go
    on to English documentation."""
    return [
        (row["hindi"].strip(), match.group(1)) for row in glossary() if (match := FIRST_USE.search(row["note"] or ""))
    ]


def _term(hindi: str) -> re.Pattern:
    """A Hindi term with its inflected forms: each Devanagari word's case and number ending may change (चलता औसत,
    चलते औसत), a Latin word may take a plural (प्रभावी batches); a bold close ** may follow."""
    words = []
    for word in hindi.split():
        if DEVANAGARI.search(word):
            words.append(re.escape(word.rstrip(INFLECTED)) + f"[{INFLECTED}]*")
        else:
            words.append(re.escape(word) + "(?:e?s)?")
    return re.compile(rf"(?<!{WORD_CHAR})" + r"\s+".join(words) + rf"(?!{WORD_CHAR})(?:\*\*)?")


def _without_anchors(text: str) -> str:
    """The text without the bracketed English of anchored terms (allowed there, even where the glossary avoids it)."""
    names = [re.escape(english) for _, english in anchored()]
    if not names:
        return text
    return re.sub(rf"\((?=[^)]*(?:{'|'.join(names)}))[^)]*\)", " ", text, flags=re.I)


def first_use_problems(texts: list[str]) -> list[str]:
    """Glossary terms whose first use in a lesson's prose (`texts` in order; headings and code left out) is not
    followed by their English in brackets."""
    prose = CODE.sub(" ", HEADING.sub(" ", "\n".join(texts)))
    found = []
    for hindi, english in anchored():
        match = _term(hindi).search(prose)
        if match is None:
            continue
        after = re.match(r"\s*\(([^)]*)\)", prose[match.end() :])
        if after is None or english.lower() not in after.group(1).lower():
            where = " ".join(prose[max(0, match.start() - 30) : match.end() + 30].split())
            found.append(f'first use of {hindi!r} needs "({english})" after it: {where!r}')
    return found


def avoided(text: str) -> list[str]:
    """Variants the glossary avoids, found in a Hindi text (whole words; str.format placeholders are code; the
    English of an anchored term in its brackets is allowed)."""
    # whitespace as one space: a phrase the glossary avoids may be wrapped across lines of a PO entry
    text = " ".join(_without_anchors(re.sub(r"\{[^{}]*\}", " ", text)).split())
    found = []
    for row in glossary():
        for variant in filter(None, (v.strip() for v in row["avoid"].split(","))):
            if re.search(rf"(?<!{WORD_CHAR}){re.escape(variant)}(?!{WORD_CHAR})", text):
                found.append(variant)
    return found


def devanagari_share(text: str) -> float:
    """Devanagari letters over all letters of the prose (code and markup left out); 0 for a text with no letters."""
    letters = [c for c in _prose(text) if c.isalpha() or DEVANAGARI.match(c)]
    return sum(1 for c in letters if DEVANAGARI.match(c)) / len(letters) if letters else 0.0


def is_nfc(text: str) -> bool:
    return unicodedata.normalize("NFC", text) == text


def text_problems(text: str) -> list[str]:
    """What is wrong with a Hindi text whatever its place: not NFC, a variant the glossary avoids."""
    found = [] if is_nfc(text) else ["not in Unicode NFC (normalise it: unicodedata.normalize('NFC', text))"]
    return found + [f"uses {variant!r}, which translations/glossary.tsv avoids" for variant in avoided(text)]
