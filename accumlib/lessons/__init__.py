"""What serves the lessons, on top of the library: nothing here is needed to train with accumlib.

`data` and `models` (the digits and the lessons' small models), `pitfalls` (the classic loop with its bugs as
switches), `show` (what each lesson prints and draws), `plots`, `widgets` (the dashboards), `quiz` and `exercises`
(the checkers). They need the `lessons` extra (matplotlib, ipywidgets, IPython; jsonschema for the quiz bank's
schema in the tests); `import accumlib` imports none of them. A notebook imports what it uses:
`from accumlib.lessons import data, exercises, models, quiz, show`. Without the extra, importing any of them
raises ModuleNotFoundError naming what is missing and the command that installs it.
"""

from importlib.util import find_spec

from ..i18n import _

STACK = ("matplotlib", "ipywidgets", "IPython")  # what the lesson modules import, as the `lessons` extra installs it

_missing = [name for name in STACK if find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        _("{module} needs {missing}, which the lessons' extra installs: {command}").format(
            module=__name__, missing=", ".join(_missing), command='pip install "accumlib[lessons]"'
        ),
        name=_missing[0],
    )
