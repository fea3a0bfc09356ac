"""Exercise of lesson 7: swap BatchNorm for GroupNorm, checked with `accumlib.gradient_gap`.

The learner's `build_model()` is built in float64 (seeded), put in training mode (what training uses), and its
accumulated gradient over 8 micro-batches of 8 digits is compared with the gradient of one batch of 64.
"""
from __future__ import annotations

import torch
from torch import nn

from .. import data
from ...i18n import N_, _
from ...loop import gradient_gap
from .core import Exercise, Finding, Verdict, right, wrong
from .fingerprint import EXACT, call_with, error_finding
from .loops import not_a_function

PER_SAMPLE_NORMS = (nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


class GroupNormSwap(Exercise):
    lesson, name, answer = 7, "groupnorm", ("build_model",)
    batch, accum_steps = 64, 8
    stub = '''\
def build_model():
    # models.cnn(norm="batch"), written out. Make accumulation exact again.
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 16, 10))


exercises.groupnorm.check(build_model)
'''
    solution_code = '''\
def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),  # 4 groups of 4 channels, per sample
        nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 16, 10))


exercises.groupnorm.check(build_model)
'''
    hint_text = N_("nn.GroupNorm(groups, channels) normalises each sample on its own, over groups of channels, so it "
                   "does not care which micro-batch a sample is in. The number of groups must divide the channels.")

    def verdict(self, build_model) -> Verdict:
        if not callable(build_model):
            return not_a_function("build_model")
        X, y = data.digits(self.batch, dtype=torch.float64)
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = call_with(build_model, {})
            if not isinstance(model, nn.Module):
                return wrong([Finding("not-a-model", _("build_model() returned {kind}; it must return the model, an "
                                                       "nn.Module.").format(kind=type(model).__name__))])
            model = model.double().train()
            with torch.no_grad():
                shape = tuple(model(X[:2]).shape)
            if shape != (2, 10):
                return wrong([Finding("wrong-output", _(
                    "For 2 digits the model returns a tensor of shape {shape}; it must return (2, 10): one score per "
                    "class.").format(shape=shape))])
            gap = gradient_gap(model, nn.functional.cross_entropy, X, y, self.accum_steps)
        except Exception as error:  # the learner's code
            return wrong([error_finding(error)])
        micro = self.batch // self.accum_steps
        batchnorms = [name for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, PER_SAMPLE_NORMS)})
        if gap > EXACT:
            if batchnorms:
                return wrong([Finding("batchnorm-left", _(
                    "Accumulation is not exact with this model: over {accum_steps} micro-batches of {micro}, the "
                    "accumulated gradient differs from the gradient of one batch of {batch} by up to {gap:.3g}. "
                    "Layers {layers} are BatchNorm, which normalises each micro-batch with that micro-batch's own "
                    "mean and variance. Replace each with nn.GroupNorm(groups, channels).").format(
                        accum_steps=self.accum_steps, micro=micro, batch=self.batch, gap=gap,
                        layers=", ".join(batchnorms)))])
            return wrong([Finding("not-exact", _(
                "Over {accum_steps} micro-batches of {micro}, the accumulated gradient differs from the gradient of "
                "one batch of {batch} by up to {gap:.3g}: something in the model depends on the other samples of the "
                "micro-batch, or on chance (dropout).").format(accum_steps=self.accum_steps, micro=micro,
                                                                batch=self.batch, gap=gap))])
        if not norms:
            return wrong([Finding("no-normalisation", _(
                "Accumulation is exact now (largest difference {gap:.1e}), but the model has no normalisation layer "
                "left: replace each BatchNorm2d with nn.GroupNorm rather than removing it.").format(gap=gap))])
        return right(_("With {norms}, {accum_steps} accumulated micro-batches of {micro} give the gradient of one "
                       "batch of {batch} (largest difference {gap:.1e}).").format(
                           norms=", ".join(norms), accum_steps=self.accum_steps, micro=micro, batch=self.batch,
                           gap=gap))


groupnorm = GroupNormSwap()
