"""What the Hindi-edition tests look for: English left untranslated, variants the glossary avoids, Devanagari share.

The glossary (translations/glossary.tsv) is the one list of terms: a row whose Hindi column is in Latin script is
a term the Hindi text keeps in English (batch, gradient, ...), so it is allowed; every "avoid" variant is refused.
"""
from __future__ import annotations

import csv
import functools
import html
import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVANAGARI = re.compile(r"[\u0900-\u097F]")
# What continues a word: letters, digits and Devanagari signs, but not the danda "।" and double danda "॥" (U+0964,
# U+0965), which end a sentence as "." does: "चलाइए।" is the word चलाइए before a full stop.
WORD_CHAR = r"[\w\u0900-\u0963\u0966-\u097F]"
LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
# Names and notation that are not English prose: libraries, optimizers, number formats, units, Python literals.
NAMES = {"mib", "pytorch", "torch", "accumlib", "python", "jupyter", "jupyterlab", "voila", "binder", "sgd", "adam",
         "adamw", "nan", "inf", "fp16", "bf16", "float16", "bfloat16", "float32", "float64", "amp", "gradscaler",
         "kaggle", "nanogpt", "gloo", "nccl", "torchrun", "true", "false", "none", "ms", "s", "us", "kb", "mb",
         "gb", "kib", "gib", "x", "e", "id", "mlp", "cnn", "relu", "linear", "conv2d", "cuda", "h100",
         "h200", "a100", "numpy", "matplotlib", "ipywidgets", "okabe", "ito", "hindi", "english", "ok"}


@functools.lru_cache(maxsize=None)
def glossary() -> list[dict[str, str]]:
    with (ROOT / "translations" / "glossary.tsv").open(encoding="utf-8") as f:
        rows = [row for row in csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t")]
    return rows


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
    return [w for w in LATIN_WORD.findall(_prose(text)) if w.lower().strip("'’-") not in allowed_latin()]


def avoided(text: str) -> list[str]:
    """Variants the glossary avoids, found in a Hindi text (whole words; str.format placeholders are code)."""
    text = re.sub(r"\{[^{}]*\}", " ", text)
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
