"""The course's one language setting, and its message catalogues (GNU gettext).

Every string a learner reads (widgets, plots, printed findings, the quiz, exercise verdicts) is written in English
in the code, marked with `_()` (or `ngettext()` / `pgettext()`), and looked up at call time in the catalogue of the
language chosen with `set_language()`: `accumlib/locale/<language>/LC_MESSAGES/accumlib.mo`, compiled from the
translators' `accumlib.po` beside it (`make translations` extracts, merges and compiles them with Babel).
English needs no catalogue: the English text is the message id.

    import accumlib
    accumlib.set_language("hi")   # every plot, widget, finding and quiz from here on speaks Hindi
"""

from __future__ import annotations

import functools
import gettext
from importlib import resources

DOMAIN = "accumlib"
LANGUAGES = {"en": "English", "hi": "हिन्दी"}  # code -> the language's own name for itself

_language = "en"


def set_language(code: str) -> None:
    """Choose the language of everything accumlib shows from now on: "en" (English) or "hi" (Hindi)."""
    global _language
    if not isinstance(code, str) or code not in LANGUAGES:
        raise ValueError(
            _("language must be one of {choices}; got {value!r}").format(
                choices=", ".join(repr(c) for c in LANGUAGES), value=code
            )
        )
    _language = code


def language() -> str:
    """The language code chosen with `set_language` ("en" until then)."""
    return _language


@functools.lru_cache(maxsize=None)
def catalogue(code: str) -> gettext.NullTranslations:
    """The compiled catalogue of a language (English: the identity)."""
    if code == "en":
        return gettext.NullTranslations()
    with resources.as_file(resources.files(__package__) / "locale") as folder:
        return gettext.translation(DOMAIN, localedir=folder, languages=[code])


def _(message: str) -> str:
    """`message` in the current language."""
    return catalogue(_language).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    """The singular or plural form for the count `n`, in the current language."""
    return catalogue(_language).ngettext(singular, plural, n)


def pgettext(context: str, message: str) -> str:
    """`message` in the current language, where the same English words need different translations by context."""
    return catalogue(_language).pgettext(context, message)


def N_(message: str) -> str:
    """Mark a constant for extraction without translating it yet: pass it through `_()` where it is shown."""
    return message
