"""Exercises on memory: the largest batch that fits a simulated card (lesson 1), and micro_batch_size and
accum_steps for a memory budget (lesson 5).

Peaks are measured as `accumlib.train(memory_budget=...)` measures them before it trains (`memory.check_fits`:
one step of the small CNN on digits under FakeTensorMode, byte-exact and the same on every machine).
"""
from __future__ import annotations

import functools
import numbers

import torch

from ... import memory
from .. import data, models
from ...i18n import N_, _, ngettext
from .core import Exercise, Finding, Verdict, right, wrong
from .fingerprint import call_with, error_finding
from .loops import not_a_function


def step_peak(micro_batch_size: int, accum_steps: int = 1) -> int:
    """Peak bytes of one training step of models.cnn() with SGD on digits: accum_steps micro-batches of this size.

    From the second micro-batch on, every micro-batch repeats the same allocations on top of the same gradient, so
    any accum_steps >= 2 has the peak of accum_steps = 2 (tested), and is measured as 2: fast at any accum_steps.
    """
    return _measured_peak(micro_batch_size, min(accum_steps, 2))


@functools.lru_cache(maxsize=None)
def _measured_peak(micro_batch_size: int, accum_steps: int) -> int:
    X, y = data.digits()
    model = models.cnn()
    return memory.measure_step(model, *memory.batch_of((X, y), micro_batch_size), accum_steps=accum_steps,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.05), fake=True).peak


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


class LargestBatch(Exercise):
    lesson, name, answer = 1, "largest_batch", ("largest_batch",)
    card_bytes = 2 * 2**20  # the simulated card
    stub = '''\
def largest_batch(fits):
    # fits(batch) is True when one training step on `batch` samples fits the card.
    batch = 1
    while fits(batch * 2):  # double while the next size fits
        batch *= 2
    return batch


exercises.largest_batch.check(largest_batch)
'''
    solution_code = '''\
def largest_batch(fits):
    low, high = 1, 2  # fits(low) is True; look for a size that does not fit
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:  # the answer is in low .. high - 1: halve that range
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


exercises.largest_batch.check(largest_batch)
'''
    hint_text = N_("Doubling finds a size that fits and twice that size, which does not. The answer lies between "
                   "them: try the middle, keep the half that contains it, and repeat until one size is left.")

    def fits(self, batch: int) -> bool:
        """Whether one training step on `batch` samples fits the card (batch: 1 to the 1,797 digits)."""
        if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or not 1 <= batch <= data.DIGITS:
            raise ValueError(f"batch must be a whole number of samples from 1 to {data.DIGITS} (the digits); "
                             f"got {batch!r}")
        return step_peak(int(batch)) <= self.card_bytes

    def largest(self) -> int:
        """The largest batch that fits: doubling, then bisection (the peak grows with the batch)."""
        low, high = 1, 2
        while high <= data.DIGITS and self.fits(high):
            low, high = high, high * 2
        high = min(high, data.DIGITS + 1)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.fits(middle) else (low, middle)
        return low

    def judge(self, largest_batch) -> Verdict:
        if not callable(largest_batch):
            return not_a_function("largest_batch")
        tried = []

        def fits(batch):
            tried.append(batch)
            return self.fits(batch)

        try:
            returned = call_with(largest_batch, {"fits": fits})
        except Exception as error:  # the learner's code
            return wrong([error_finding(error)])
        card = _mib(self.card_bytes)
        if isinstance(returned, bool) or not isinstance(returned, numbers.Integral) or not 1 <= returned <= data.DIGITS:
            return wrong([Finding("not-a-batch", _(
                "largest_batch returned {answer!r}; it must return a whole number of samples between 1 and "
                "{most}.").format(answer=returned, most=data.DIGITS))])
        answer, best = int(returned), self.largest()
        if answer > best:
            return wrong([Finding("too-large", _(
                "A step on a batch of {batch} needs {peak:,} bytes, more than the {card} card ({budget:,} bytes): the "
                "largest batch that fits is smaller.").format(batch=answer, peak=step_peak(answer), card=card,
                                                              budget=self.card_bytes))])
        if answer < best:
            message = _("A step on a batch of {batch} fits the {card} card ({peak:,} of {budget:,} bytes), but so "
                        "does a step on a batch of {next} ({next_peak:,} bytes): the largest batch that fits is "
                        "larger.").format(
                            batch=answer, card=card, peak=step_peak(answer), budget=self.card_bytes, next=answer + 1,
                            next_peak=step_peak(answer + 1))
            if tried and all(size & (size - 1) == 0 for size in tried):
                message += " " + _("Your search tried only powers of two ({sizes}); the answer lies between {low} "
                                   "and {high}.").format(sizes=", ".join(map(str, sorted(set(tried)))), low=answer,
                                                         high=2 * answer)
            return wrong([Finding("not-largest", message)])
        return right(ngettext(
            "A step on a batch of {batch} needs {peak:,} bytes of the {card} card ({budget:,} bytes); one more sample "
            "would need {next_peak:,}. Your search measured {count} batch size.",
            "A step on a batch of {batch} needs {peak:,} bytes of the {card} card ({budget:,} bytes); one more sample "
            "would need {next_peak:,}. Your search measured {count} batch sizes.", len(set(tried))).format(
                           batch=answer, peak=step_peak(answer), card=card, budget=self.card_bytes,
                           next_peak=step_peak(answer + 1), count=len(set(tried))))


class MemoryPlan(Exercise):
    lesson, name, answer = 5, "memory_plan", ("micro_batch_size", "accum_steps")
    card_bytes = 2**19  # 0.5 MiB
    effective_batch = 256  # samples per optimizer step
    stub = '''\
micro_batch_size = 256  # samples per forward and backward pass
accum_steps = 1  # micro-batches per optimizer step
exercises.memory_plan.check(micro_batch_size, accum_steps)
'''
    solution_code = '''\
micro_batch_size = 8  # the largest micro-batch whose accumulating step fits 0.5 MiB
accum_steps = 32  # 8 x 32 = 256 samples per optimizer step
exercises.memory_plan.check(micro_batch_size, accum_steps)
'''
    hint_text = N_("micro_batch_size x accum_steps must stay 256. Halve the micro-batch and double accum_steps until "
                   "the step fits: try a plan with accumlib.train(..., memory_budget=2**19), which refuses one that "
                   "does not fit. Mind that an accumulating step also keeps the gradient between micro-batches.")

    def peak(self, micro_batch_size: int, accum_steps: int) -> int:
        """Peak bytes of the plan's step, as accumlib.train(memory_budget=...) measures it before training."""
        return step_peak(micro_batch_size, accum_steps)

    def best(self) -> int:
        """The largest micro-batch that divides the effective batch and whose step fits the card."""
        divisors = [d for d in range(self.effective_batch, 0, -1) if self.effective_batch % d == 0]
        return next(d for d in divisors if self.peak(d, self.effective_batch // d) <= self.card_bytes)

    def judge(self, micro_batch_size, accum_steps) -> Verdict:
        plan = {"micro_batch_size": micro_batch_size, "accum_steps": accum_steps}
        for name, value in plan.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                return wrong([Finding("not-a-count", _("{name} must be a whole number of at least 1; it is "
                                                       "{value!r}.").format(name=name, value=value))])
        m, k = int(micro_batch_size), int(accum_steps)
        card = _mib(self.card_bytes)
        if m * k != self.effective_batch:
            return wrong([Finding("wrong-effective-batch", _(
                "micro_batch_size x accum_steps = {m} x {k} = {effective} samples per optimizer step; the plan must "
                "keep {target}.").format(m=m, k=k, effective=m * k, target=self.effective_batch))])
        peak = self.peak(m, k)
        if peak > self.card_bytes:
            return wrong([Finding("does-not-fit", _(
                "A step with micro_batch_size={m} and accum_steps={k} needs {peak:,} bytes, more than the {card} "
                "card ({budget:,} bytes): accumlib.train(..., memory_budget={budget}) would refuse it. Use a smaller "
                "micro-batch and more accum_steps.").format(k=k, m=m, peak=peak, card=card,
                                                           budget=self.card_bytes))])
        best = self.best()
        if m < best:
            return wrong([Finding("slower-than-needed", _(
                "It fits ({peak:,} of {budget:,} bytes), but micro_batch_size={best} with accum_steps={best_k} fits "
                "too ({best_peak:,} bytes) with {best_k} forward and backward passes per step instead of {k}: the "
                "largest micro-batch that fits is the fastest plan.").format(
                    peak=peak, budget=self.card_bytes, best=best, best_k=self.effective_batch // best, k=k,
                    best_peak=self.peak(best, self.effective_batch // best)))])
        larger = min(d for d in range(m + 1, self.effective_batch + 1) if self.effective_batch % d == 0) \
            if m < self.effective_batch else None
        message = _("micro_batch_size={m} with accum_steps={k} gives {target} samples per step at a peak of {peak:,} "
                    "bytes, within the {card} card ({budget:,} bytes).").format(
                        m=m, k=k, target=self.effective_batch, peak=peak, card=card, budget=self.card_bytes)
        if larger is not None:
            message += " " + _("The next larger plan, {larger} x {larger_k}, would need {larger_peak:,} "
                               "bytes.").format(larger=larger, larger_k=self.effective_batch // larger,
                                                larger_peak=self.peak(larger, self.effective_batch // larger))
        return right(message)


largest_batch = LargestBatch()
memory_plan = MemoryPlan()
