"""accumlib's Hindi catalogue (accumlib/locale/hi/LC_MESSAGES/accumlib.po): every string a learner can see is
translated and compiled, placeholders survive translation, the Hindi follows the glossary, and the language switch
refuses what it does not know. Each failure names the string and the file.
"""

from __future__ import annotations

import ast
import functools
import re
import string
import sys
from pathlib import Path

import pytest
import torch

import accumlib
from accumlib import batchnorm, i18n, memory, timing

ROOT = Path(__file__).resolve().parents[2]
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
                    yield (
                        f"{PO.relative_to(ROOT)}: {message.id[0]!r} msgstr[{index}]",
                        form,
                        message.id if index == 0 else message.id[1:],
                    )


def fields(text: str) -> set[tuple[str, str, str]] | None:
    """The str.format placeholders of a text, (name, conversion, format spec); None if it is no format string."""
    try:
        return {
            (name, conversion or "", spec or "")
            for _, name, spec, conversion in string.Formatter().parse(text)
            if name is not None
        }
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
    found += [
        f"{where}: English words left: {sorted(set(words))}"
        for where, form, _ in translations()
        if (words := untranslated(PLACEHOLDER.sub(" ", form)))
    ]
    assert not found, report(found)


def test_translations_are_what_the_hindi_edition_shows():
    shown = [
        (message.context, message.id, message.string)
        for message in committed()
        if message.id and isinstance(message.id, str) and message.string and not message.fuzzy
    ]
    if not shown:
        pytest.skip(f"no Hindi translation in {PO.relative_to(ROOT)} yet")
    try:
        accumlib.set_language(LANGUAGE)
        wrong = [
            f"{PO.relative_to(ROOT)}: {message_id!r} shows {got!r}"
            for context, message_id, string in shown
            if (got := i18n.pgettext(context, message_id) if context else i18n._(message_id)) != string
        ]
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


# --- Which language the library speaks (docs/translating.md): every message a user reads goes through the catalogue.

# the library and the lessons' modules (accumlib/lessons, its findings, exercises and quiz: a learner reads them)
LIBRARY = sorted((ROOT / "accumlib").rglob("*.py"))
# .format() arguments written as they are typed or clicked in every language: a shell command, a menu's label
VERBATIM = {"command", "menu"}
CATALOGUE_CALLS = {"_", "ngettext", "pgettext"}
WORDS = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}")  # two English words: prose, not a name such as "x[0]"
# Messages left in English on purpose, as (file, function): each is a bug report for accumlib's authors, not
# something a user's input can cause. Empty: no library error is exempt today.
ENGLISH_ON_PURPOSE: dict[tuple[str, str], str] = {}


def _exception_classes(tree) -> set[str]:
    """Names that build exceptions or warnings here: Python's, torch's (*Error) and the module's own subclasses."""
    import builtins

    names = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    grew = True
    while grew:  # a class of this module whose base is one of them
        found = {
            c.name
            for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef)
            and any(
                ast.unparse(b).rsplit(".", 1)[-1] in names or ast.unparse(b).endswith(("Error", "Exception"))
                for b in c.bases
            )
        }
        grew = not found <= names
        names |= found
    return names


class _Messages(ast.NodeVisitor):
    """Every message of an exception raised or built, or of a warning, whose English text is not a catalogue
    call's: a literal or f-string with words in it, followed through `.format()`, `+`, `if`/`else`, a local
    variable and a helper function of the same module that returns the message."""

    def __init__(self, path: Path, tree):
        self.path, self.tree, self.found = path, tree, []
        self.exceptions = _exception_classes(tree)
        self.functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        self.scope: list[ast.AST] = [tree]

    def visit_FunctionDef(self, node):
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node):
        name = ast.unparse(node.func)
        message = None
        if name in ("warnings.warn", "warn") and node.args:
            message = node.args[0]
        elif name.rsplit(".", 1)[-1] in self.exceptions and node.args:
            message = node.args[0]
        elif name == "super().__init__" and node.args and self._in_exception_class(node):
            message = node.args[0]
        if message is not None:
            where = self.scope[-1].name if len(self.scope) > 1 else "<module>"
            if (self.path.name, where) not in ENGLISH_ON_PURPOSE:
                self._check(message, set())
                for value in [*node.args[1:], *(k.value for k in node.keywords)]:  # OutOfMemory's what=, advice=
                    self._check(value, set(), True)
        self.generic_visit(node)

    def _in_exception_class(self, node) -> bool:
        return any(
            isinstance(c, ast.ClassDef) and c.name in self.exceptions and node in ast.walk(c)
            for c in ast.walk(self.tree)
        )

    def _assignments(self, name: str):
        for scope in reversed(self.scope):
            values = [
                a.value
                for a in ast.walk(scope)
                if isinstance(a, (ast.Assign, ast.AnnAssign))
                and a.value
                and any(
                    isinstance(t, ast.Name) and t.id == name
                    for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
                )
            ]
            if values:
                return values
        return []

    def _check(self, node, seen: set, prose_only: bool = False):
        """Flag English text in `node`, a message (or with prose_only, a value put into one: only prose counts)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if WORDS.search(node.value) if prose_only else re.search("[A-Za-z]", node.value):
                self._flag(node)
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if WORDS.search(text) if prose_only else re.search("[A-Za-z]", text):
                self._flag(node)
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    self._check(value.value, seen, True)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in CATALOGUE_CALLS:
                return
            if isinstance(func, ast.Attribute) and func.attr in ("format", "join"):
                self._check(func.value, seen, prose_only or func.attr == "join")
                for argument in [*node.args, *(k.value for k in node.keywords if k.arg not in VERBATIM)]:
                    self._check(argument, seen, True)
            elif isinstance(func, ast.Name) and func.id in self.functions and func.id not in seen:
                for returned in ast.walk(self.functions[func.id]):  # a helper that words the message
                    if isinstance(returned, ast.Return) and returned.value is not None:
                        self._check(returned.value, seen | {func.id}, prose_only)
        elif isinstance(node, ast.BinOp):
            self._check(node.left, seen, prose_only)
            self._check(node.right, seen, prose_only)
        elif isinstance(node, ast.IfExp):
            self._check(node.body, seen, prose_only)
            self._check(node.orelse, seen, prose_only)
        elif isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            self._check(node.elt, seen, prose_only)
        elif isinstance(node, ast.Name) and node.id not in seen:
            for value in self._assignments(node.id):
                self._check(value, seen | {node.id}, prose_only)

    def _flag(self, node):
        self.found.append(f"{self.path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)[:100]}")


def _bound_here(scope):
    """The nodes of `scope`'s own body (not of a function, lambda, class or comprehension inside it)."""
    for child in ast.iter_child_nodes(scope):
        if not isinstance(
            child,
            (
                ast.FunctionDef,
                ast.AsyncFunctionDef,
                ast.Lambda,
                ast.ClassDef,
                ast.ListComp,
                ast.SetComp,
                ast.DictComp,
                ast.GeneratorExp,
            ),
        ):
            yield child
            yield from _bound_here(child)


def shadowed_catalogue(path: Path, tree) -> list[str]:
    """Where a function (or the module) binds a catalogue name such as `_` ("for _ in ...", "a, _, b = ..."):
    its every `_()` would then raise UnboundLocalError instead of the message."""
    scopes = [tree, *(f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: binds {node.id!r}, the catalogue's function"
        for scope in scopes
        for node in _bound_here(scope)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in CATALOGUE_CALLS
    ]


def untranslated_messages(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    visitor = _Messages(path, tree)
    visitor.visit(tree)
    return list(dict.fromkeys(visitor.found)) + shadowed_catalogue(path, tree)


def test_every_library_error_and_warning_goes_through_the_catalogue():
    found = [line for path in LIBRARY for line in untranslated_messages(path)]
    assert not found, report([f"{line}  (wrap the English in _() or ngettext())" for line in found])


def _batchnorm_model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))


def _data(n=8):
    return torch.randn(n, 3), torch.randint(0, 4, (n,))


QUOTED = re.compile(r"'[^']*'")
# A sample of the library's refusals, one or more per module, each with its arguments and its English words.
REFUSALS = {
    "batchnorm: no BatchNorm to replace": (
        lambda: batchnorm.to_groupnorm(torch.nn.Linear(3, 4)),
        "model has no BatchNorm layer to replace",
    ),
    "batchnorm: micro_batch_size past the batch": (
        lambda: batchnorm.micro_batch_deviation(_batchnorm_model(), torch.randn(8, 3), 9),
        "micro_batch_size must be between 1 and 8 (the batch), got 9",
    ),
    "batchnorm: groups do not divide the channels": (
        lambda: batchnorm.to_groupnorm(_batchnorm_model(), groups=3),
        "groups=3 must divide the 4 channels of layer 1",
    ),
    "timing: a step needs more samples than data has": (
        lambda: timing.time_config(torch.nn.Linear(3, 4), _data(), micro_batch_size=4, accum_steps=4),
        "micro_batch_size * accum_steps = 16 exceeds the 8 samples of data",
    ),
    "timing: optimizer_fn is an optimizer": (
        lambda: timing.time_config(
            torch.nn.Linear(3, 4),
            _data(),
            micro_batch_size=2,
            accum_steps=2,
            optimizer_fn=torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1),
        ),
        "optimizer_fn must be a function from parameters to an optimizer, e.g. lambda params: "
        "torch.optim.SGD(params, lr=0.01), got SGD",
    ),
    "timing: one accum_steps value": (
        lambda: timing.decompose_time(torch.nn.Linear(3, 4), _data(), effective_batch=8, accum_steps=(2, 2)),
        "accum_steps must hold two or more different values (one line needs two points), each once, got (2, 2)",
    ),
    "memory: a device accumlib does not measure on": (
        lambda: memory.measure_step(torch.nn.Linear(3, 4), *_data(), device="mps"),
        "device must be 'cpu' or 'cuda' (the devices accumlib measures on), got 'mps'",
    ),
    "memory: target_batch past the largest": (
        lambda: memory.fit_batch(
            torch.nn.Linear(3, 4), _data(), target_batch=memory.MAX_TARGET_BATCH + 1, memory_budget=2**20
        ),
        f"target_batch must be between 1 and {memory.MAX_TARGET_BATCH:,} samples, got {memory.MAX_TARGET_BATCH + 1:,}",
    ),
    "_validate: the model's class": (
        lambda: timing.time_config(torch.nn.Linear, _data(), micro_batch_size=2, accum_steps=2),
        "model must be a model instance, got the class Linear: call it, e.g. Linear(...)",
    ),
    "_validate: a dict for (x, y)": (
        lambda: timing.time_config(torch.nn.Linear(3, 4), {"x": _data()[0]}, micro_batch_size=2, accum_steps=2),
        "data must be a tuple (x, y) of two tensors, got a dict (keys 'x'): pass (batch['input_ids'], batch['labels'])",
    ),
    "i18n: an unknown language": (lambda: accumlib.set_language("xx"), "language must be one of 'en', 'hi'; got 'xx'"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_library_refusals_speak_the_course_language(case):
    """The same refusal in English, then under set_language("hi"): Hindi in Devanagari with no English prose left,
    the values it names (numbers, names of code) unchanged."""
    refuse, english = REFUSALS[case]
    with pytest.raises((TypeError, ValueError)) as in_english:
        refuse()
    assert str(in_english.value) == english
    accumlib.set_language(LANGUAGE)
    try:
        with pytest.raises(type(in_english.value)) as in_hindi:
            refuse()
        assert accumlib.language() == LANGUAGE
    finally:
        accumlib.set_language("en")
    hindi = str(in_hindi.value)
    words = QUOTED.sub(" ", hindi)  # the values a message quotes ('xx', 'layer.0') are code, not words
    assert hindi != english and re.search("[\u0900-\u097f]", words) and not untranslated(words), hindi
    numbers = re.findall(r"\d+(?:\.\d+)?", english)
    assert sorted(re.findall(r"\d+(?:\.\d+)?", hindi)) == sorted(numbers), hindi
