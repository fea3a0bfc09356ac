"""accumlib: gradient accumulation in PyTorch, done right and measured.

The loop (`train`, `gradient_gap`) and the measurements (`memory`, `timing`, `batchnorm`) know nothing of
plots or widgets; `plots`, `widgets` and `quiz` sit on top of them (they need the `lessons` extra: matplotlib and
ipywidgets; `import accumlib` imports neither). `set_language` picks the language of everything a learner reads.
"""
from .i18n import language, set_language
from .loop import History, NonFiniteError, StepRecord, StopTraining, gradient_gap, parameter_gap, train
from .memory import FitPlan, MemoryReport, OutOfMemory, fit_batch, measure_step
from .timing import TimingReport, time_config

__all__ = ["set_language", "language", "train", "History", "StepRecord", "StopTraining", "NonFiniteError",
           "gradient_gap", "parameter_gap", "measure_step", "MemoryReport", "fit_batch", "FitPlan", "OutOfMemory",
           "time_config", "TimingReport"]
__version__ = "0.2.0"
