"""What the lessons show: each function takes measurements, prints its finding and draws its figure, in the course's
language (`accumlib.set_language`). One module per lesson topic; a lesson calls e.g. `show.memory.categories(...)`.

The measurements themselves live in accumlib's own modules (memory, timing, batchnorm, ...); these functions only
turn them into sentences, tables and figures, every string through the message catalogue, every title and alt
text formatted from the measured values. They need the `lessons` extra (matplotlib, IPython).
"""

import importlib

from ...i18n import _

MODULES = ("large_batch", "gradients", "loop", "last_cycle", "memory", "time", "batchnorm", "once_per_step", "ddp")


def __getattr__(name: str):
    """Import a topic's module on first use (`show.memory`), so a lesson pays only for what it shows."""
    if name in MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(
        _("module {module!r} has no attribute {name!r}; the topics are {topics}").format(
            module=__name__, name=name, topics=", ".join(MODULES)
        )
    )


def __dir__():
    return sorted(MODULES)
