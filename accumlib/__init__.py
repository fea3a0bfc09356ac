"""accumlib: gradient accumulation in PyTorch, done right and measured.

The loop (`accumulate_and_step`, one optimizer step from a cycle of micro-batches; `train`, its driver;
`gradient_gap`, `parameter_gap`) and the measurements (`memory`, `timing`, `batchnorm`) know nothing of plots or
widgets; `plots`, `widgets` and `quiz` sit on top of them (they need the `lessons` extra: matplotlib, ipywidgets and
jsonschema; `import accumlib` imports none of them). `set_language` picks the language of everything a learner reads.
"""
from .i18n import language, set_language
from .loop import (CycleResult, History, NonFiniteError, StepRecord, StopTraining, accumulate_and_step, gradient_gap,
                   parameter_gap, train)
from .memory import FitPlan, MemoryReport, OutOfMemory, fit_batch, measure_step
from .timing import TimingReport, time_config

__all__ = ["set_language", "language", "accumulate_and_step", "CycleResult", "train", "History", "StepRecord",
           "StopTraining", "NonFiniteError", "gradient_gap", "parameter_gap", "measure_step", "MemoryReport",
           "fit_batch", "FitPlan", "OutOfMemory", "time_config", "TimingReport"]
__version__ = "0.2.0"
