"""Hands-on exercises for the lessons: the learner writes or breaks code, `accumlib` checks it.

Each exercise has `check(answer)` (prints the verdict), `hint()`, `solution()` (prints one solution's code),
`verdict(answer)` (the verdict as data: `.correct`, `.findings` with stable `.name`s, `.text`; subclasses implement
`judge`, which `verdict` runs under the time limit), and `stub`: the
exercise cell exactly as a lesson stores it. A stub runs as stored and gets a true, deterministic verdict. It
expects the notebook to have run `import torch`, `from torch import nn` and `from accumlib.lessons import exercises`.

No answer can fool, hang or crash a check, or end the kernel: on Linux and macOS every check runs in a forked child
process of the kernel, ended at a hard limit (contained.py: the learner's code `GRACE` seconds past `time_limit`,
or the whole check past `check_limit` seconds), and only its verdict, as data, comes back; without fork (Windows)
it runs in the kernel under the cooperative limit alone (docs/exercise-checks.md says what that does not stop).
Inside, the learner's code runs under a time limit (`time_limit` seconds, counted only while the learner's code
runs, its __repr__ and number conversions included) and a call budget on what it hands out (largest_batch's
fits()); whatever escapes is answered in words (a time-out, an error, a raw PyTorch message said in the learner's
terms, os._exit(), sys.exit()); what the code changes in torch's global state stays in the child (in the kernel's
process, without fork: grad mode, default dtype and torch's excepthook are restored, nothing else); numbers of any
real numeric type with the right value are accepted (32.0, numpy, a 0-d tensor), and a right answer is tried on a
second problem (another card, another accum_steps or max_norm), so that numbers copied from the first do not pass.

Loop exercises do not compare code, they run it: on a tiny float64 model at learning rate 0, the gradient at each
optimizer step is read off as a combination of the micro-batches' gradients, which names the bug, where it shows
and by how much (`fingerprint.py`); a right loop is then trained for real and compared with `accumlib.train`.

    lesson 0  first_loop           def accumulate(...): the seed's loop, its step condition left out
    lesson 1  largest_batch        def largest_batch(fits) -> the largest batch that fits a 2 MiB card
    lesson 2  scale_loss           def scale_loss(loss, accum_steps) -> the loss to call backward() on
    lesson 3  the_loop             def accumulate(model, optimizer, loader, loss_fn, accum_steps)
    lesson 4  last_cycle           def accumulate(model, optimizer, loader, loss_fn, accum_steps, epochs)
    lesson 5  memory_plan          micro_batch_size, accum_steps = ...  (256 samples per step on 0.5 MiB)
    lesson 6  time_cost            arithmetic_ratio = ...  (predict, then run)
    lesson 7  batchnorm_split      def choose_split(fits, effective_batch) -> the largest micro-batch that fits
    lesson 8  amp_loop             def accumulate(model, optimizer, scaler, loader, loss_fn, accum_steps)
              clip_after_unscale   def optimizer_step(model, optimizer, scaler, max_norm)
    lesson 9  no_sync              def accumulate(model, optimizer, loader, loss_fn, accum_steps), model under DDP
"""

from .core import Exercise, Finding, Prediction, Verdict
from .ddp import no_sync
from .in_ten_minutes import first_loop
from .loops import last_cycle, scale_loss, the_loop
from .normalization import batchnorm_split
from .planning import largest_batch, memory_plan
from .precision import amp_loop, clip_after_unscale
from .predictions import time_cost

BY_LESSON: dict[int, tuple[Exercise, ...]] = {
    1: (largest_batch,),
    2: (scale_loss,),
    3: (the_loop,),
    4: (last_cycle,),
    5: (memory_plan,),
    6: (time_cost,),
    7: (batchnorm_split,),
    8: (amp_loop, clip_after_unscale),
    9: (no_sync,),
}
BY_LESSON = {0: (first_loop,), **BY_LESSON}  # lesson 0, the seed's lesson in ten minutes: the loop's step condition

__all__ = [
    "BY_LESSON",
    "Exercise",
    "Finding",
    "Prediction",
    "Verdict",
    "largest_batch",
    "scale_loss",
    "the_loop",
    "last_cycle",
    "memory_plan",
    "time_cost",
    "batchnorm_split",
    "amp_loop",
    "clip_after_unscale",
    "no_sync",
    "first_loop",
]
