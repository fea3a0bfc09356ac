"""accumlib: gradient accumulation in PyTorch, done right and measured.

What an engineer imports is here: the cycle (`cycle.accumulate_and_step`, one optimizer step from a cycle of
micro-batches), its driver (`loop.train`, with `gradient_gap` and `parameter_gap`) and the measurements (`memory`,
`timing`, `batchnorm`, `distributed`). They know nothing of plots or widgets. What serves the lessons sits on top of
them in `accumlib.lessons` (data, models, pitfalls, show, plots, widgets, quiz, exercises; they need the `lessons`
extra: matplotlib, ipywidgets and jsonschema); `import accumlib` imports none of it. `set_language` picks the
language of everything a learner reads.
"""

from .i18n import language, set_language
from .cycle import CycleResult, Inputs, NonFiniteError, accumulate_and_step
from .gaps import gradient_gap, parameter_gap
from .loop import train
from .options import CycleOptions
from .records import History, StepRecord, StopTraining
from .memory import FitPlan, MemoryReport, OutOfMemory, fit_batch, measure_step
from .timing import TimingReport, time_config

__all__ = [
    "set_language",
    "language",
    "accumulate_and_step",
    "CycleOptions",
    "CycleResult",
    "Inputs",
    "train",
    "History",
    "StepRecord",
    "StopTraining",
    "NonFiniteError",
    "gradient_gap",
    "parameter_gap",
    "measure_step",
    "MemoryReport",
    "fit_batch",
    "FitPlan",
    "OutOfMemory",
    "time_config",
    "TimingReport",
]
__version__ = "0.2.0"
