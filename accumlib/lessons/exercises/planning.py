"""Exercises on memory: the largest batch that fits a simulated card (lesson 1), and micro_batch_size and
accum_steps for a memory budget (lesson 5).

Peaks are measured as `accumlib.train(memory_budget=...)` measures them before it trains (`memory.check_fits`:
one step of the small CNN on digits under FakeTensorMode, byte-exact and the same on every machine with the same
device), on the lesson's device (`accumlib.devices.pick()`): on CUDA the trace counts the allocator's 512-byte
blocks, as `train` does there.
"""

from __future__ import annotations

import functools
import math

import torch

from ... import devices, memory
from ...i18n import N_, _, ngettext
from .. import data, models
from . import contained
from .core import (
    Budget,
    Exercise,
    Finding,
    Shown,
    Verdict,
    learner_code,
    right,
    whole_number,
    wrong,
)
from .fingerprint import call_with, error_finding
from .loops import not_a_function


@contained.kernel_side  # measured in the kernel, on its device, when a check's child process asks
def step_peak(micro_batch_size: int, accum_steps: int = 1, device=None) -> int:
    """Peak bytes of one training step of models.cnn() with SGD on digits: accum_steps micro-batches of this size,
    on `device` (default: the lesson's, `accumlib.devices.pick()`).

    From the second micro-batch on, every micro-batch repeats the same allocations on top of the same gradient, so
    any accum_steps >= 2 has the peak of accum_steps = 2 (tested), and is measured as 2: fast at any accum_steps.
    """
    return _measured_peak(
        micro_batch_size, min(accum_steps, 2), devices.pick() if device is None else torch.device(device)
    )


@functools.lru_cache(maxsize=None)
def _measured_peak(micro_batch_size: int, accum_steps: int, device: torch.device) -> int:
    X, y = data.digits()  # measure_step moves the micro-batch to the model's device
    model = models.cnn().to(device)
    return memory.measure_step(
        model,
        *memory.batch_of((X, y), micro_batch_size),
        accum_steps=accum_steps,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        fake=True,
    ).peak


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


class LargestBatch(Exercise):
    lesson, name, answer = 1, "largest_batch", ("largest_batch",)
    card_bytes = 2 * 2**20  # the simulated card
    stub = """\
def largest_batch(fits):
    # fits(batch) is True when one training step on `batch` samples fits the card.
    batch = 1
    while fits(batch * 2):  # double while the next size fits
        batch *= 2
    return batch


exercises.largest_batch.check(largest_batch)
"""
    # The solution keeps the stub's doubling and adds the bisection after it, so the lines a learner writes are
    # those of the search's second half (tools/lesson_time.py counts them against the stub).
    solution_code = """\
def largest_batch(fits):
    # fits(batch) is True when one training step on `batch` samples fits the card.
    batch = 1
    while fits(batch * 2):  # double while the next size fits
        batch *= 2
    step = batch // 2  # the answer is in batch .. 2 * batch - 1: try the middle of that range
    while step > 0:
        if fits(batch + step):  # the middle fits: keep the upper half
            batch += step
        step //= 2  # halve the range
    return batch


exercises.largest_batch.check(largest_batch)
"""
    hint_text = N_(
        "Doubling finds a size that fits and twice that size, which does not. The answer lies between "
        "them: try the middle, keep the half that contains it, and repeat until one size is left."
    )

    other_cards = (2**20, 3 * 2**19)  # 1 MiB and 1.5 MiB: the same search must find their own largest batch
    hang_text = N_(
        "Look at the loop of your search: each pass must change the size it tests and keep the new value "
        "(batch *= 2, not batch * 2 alone), and a bisection must shrink its range every time (low = middle "
        "or high = middle)."
    )

    def fits(self, batch: int, card_bytes: int | None = None) -> bool:
        """Whether one training step on `batch` samples fits the card (batch: 1 to the 1,797 digits); card_bytes:
        another card's memory (default: the lesson's 2 MiB)."""
        size = whole_number(batch)
        if size is None or not 1 <= size <= data.DIGITS:
            raise ValueError(
                _("fits() takes a whole number of samples from 1 to {most} (the digits); it got {batch!r}").format(
                    most=data.DIGITS, batch=Shown(batch)
                )
            )
        return step_peak(size) <= (self.card_bytes if card_bytes is None else card_bytes)

    def largest(self, card_bytes: int | None = None) -> int:
        """The largest batch that fits: doubling, then bisection (the peak grows with the batch)."""
        low, high = 1, 2
        while high <= data.DIGITS and self.fits(high, card_bytes):
            low, high = high, high * 2
        high = min(high, data.DIGITS + 1)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self.fits(middle, card_bytes) else (low, middle)
        return low

    def search(self, largest_batch, card_bytes: int) -> tuple[object, list]:
        """Run the learner's search on a card: (what it returned, the sizes it tried). fits() may be called at most
        once per possible size plus one: any search that tries each size once stays within it."""
        tried = []

        def fits(batch):
            result = self.fits(batch, card_bytes)
            tried.append(whole_number(batch))
            contained.progress(card=card_bytes, count=len(set(tried)), last=tried[-3:])  # shown while a search runs
            return result

        budget = Budget(
            fits,
            data.DIGITS + 1,
            lambda calls: Finding(
                "endless-search",
                _(
                    "Your search called fits() {calls:,} times without returning, more often than there are batch "
                    "sizes to "
                    "try ({most:,}): it goes round in circles. {look}"
                ).format(calls=calls, most=data.DIGITS, look=_(self.hang_text)),
            ),
        )
        return call_with(largest_batch, {"fits": budget}), tried

    def needed(self) -> int:
        """The most measurements a doubling and then a bisection make, over all the sizes fits() takes."""
        return 2 * math.ceil(math.log2(data.DIGITS))

    def progress_text(self, report: dict) -> str | None:
        """Shown only for a search that has measured more sizes than doubling and bisection ever need (so that the
        stored output of the stub or a right search is the same on any machine, however long it takes)."""
        if report["count"] <= self.needed():
            return None
        return ngettext(
            "Still checking: your search has measured {count} batch size so far (the last: {last}).",
            "Still checking: your search has measured {count} batch sizes so far (the last: {last}).",
            report["count"],
        ).format(count=report["count"], last=report["last"][-1])

    def overtime(self, report: dict | None) -> Finding:
        """A search still measuring at check_limit: how far it got, and how few measurements a bisection needs."""
        if not report:
            return super().overtime(report)
        return Finding(
            "slow-search",
            _(
                "Your search had measured {count:,} batch sizes on the {card} card after {seconds:g} seconds (the last "
                "ones: {last}) and was still going, so the check stopped it. Each fits() is a training step the check "
                "measures; trying the sizes one by one takes up to {most:,} of them. Double the size while it fits, "
                "then halve the range between the last size that fits and the first that does not: at most {needed} "
                "measurements."
            ).format(
                count=report["count"],
                card=_mib(report["card"]),
                seconds=self.check_limit,
                last=", ".join(map(str, report["last"])),
                most=data.DIGITS,
                needed=self.needed(),
            ),
        )

    def judge(self, largest_batch) -> Verdict:
        if not callable(largest_batch):
            return not_a_function("largest_batch")
        try:
            returned, tried = self.search(largest_batch, self.card_bytes)
        except Exception as error:  # the learner's code
            return wrong([error_finding(error)])
        card = _mib(self.card_bytes)
        answer = whole_number(returned)
        if answer is None or not 1 <= answer <= data.DIGITS:
            return wrong(
                [
                    Finding(
                        "not-a-batch",
                        _(
                            "largest_batch returned {answer!r}; it must return a whole number of samples between 1 and "
                            "{most}."
                        ).format(answer=Shown(returned), most=data.DIGITS),
                    )
                ]
            )
        best = self.largest()
        if not tried:
            return wrong(
                [
                    Finding(
                        "hard-coded",
                        _(
                            "largest_batch returned {answer} without calling fits() once: a number written into the "
                            "code is not "
                            "a search. The check runs your function on other cards too, where the answer differs; find "
                            "the size "
                            "by calling fits(batch)."
                        ).format(answer=answer),
                    )
                ]
            )
        if answer > best:
            return wrong(
                [
                    Finding(
                        "too-large",
                        _(
                            "A step on a batch of {batch} needs {peak:,} bytes, more than the {card} card ({budget:,} "
                            "bytes): the "
                            "largest batch that fits is smaller."
                        ).format(batch=answer, peak=step_peak(answer), card=card, budget=self.card_bytes),
                    )
                ]
            )
        if answer < best:
            message = _(
                "A step on a batch of {batch} fits the {card} card ({peak:,} of {budget:,} bytes), but so "
                "does a step on a batch of {next} ({next_peak:,} bytes): the largest batch that fits is "
                "larger."
            ).format(
                batch=answer,
                card=card,
                peak=step_peak(answer),
                budget=self.card_bytes,
                next=answer + 1,
                next_peak=step_peak(answer + 1),
            )
            if all(size & (size - 1) == 0 for size in tried):
                message += " " + _(
                    "Your search tried only powers of two ({sizes}); the answer lies between {low} and {high}."
                ).format(sizes=", ".join(map(str, sorted(set(tried)))), low=answer, high=2 * answer)
            return wrong([Finding("not-largest", message)])
        for other in self.other_cards:
            try:
                elsewhere, _tried = self.search(largest_batch, other)
            except Exception as error:  # the learner's code
                return wrong([error_finding(error)])
            right_there = self.largest(other)
            if whole_number(elsewhere) != right_there:
                return wrong(
                    [
                        Finding(
                            "not-general",
                            _(
                                "On the {card} card your function returns {answer}, the right size. On a {other} card "
                                "it returns "
                                "{elsewhere!r}, where the largest batch that fits is {right}: the answer must come "
                                "from what "
                                "fits() says, not from a number that is right for one card."
                            ).format(
                                card=card,
                                answer=answer,
                                other=_mib(other),
                                elsewhere=Shown(elsewhere),
                                right=right_there,
                            ),
                        )
                    ]
                )
        return right(
            ngettext(
                "A step on a batch of {batch} needs {peak:,} bytes of the {card} card ({budget:,} bytes); one more "
                "sample "
                "would need {next_peak:,}. Your search measured {count} batch size, and it finds the largest batch on "
                "a "
                "{one} and on a {two} card too.",
                "A step on a batch of {batch} needs {peak:,} bytes of the {card} card ({budget:,} bytes); one more "
                "sample "
                "would need {next_peak:,}. Your search measured {count} batch sizes, and it finds the largest batch on "
                "a "
                "{one} and on a {two} card too.",
                len(set(tried)),
            ).format(
                batch=answer,
                peak=step_peak(answer),
                card=card,
                budget=self.card_bytes,
                next_peak=step_peak(answer + 1),
                count=len(set(tried)),
                one=_mib(self.other_cards[0]),
                two=_mib(self.other_cards[1]),
            )
        )


class MemoryPlan(Exercise):
    lesson, name, answer = 5, "memory_plan", ("micro_batch_size", "accum_steps")
    card_bytes = 2**19  # 0.5 MiB
    effective_batch = 256  # samples per optimizer step
    stub = """\
micro_batch_size = 256  # samples per forward and backward pass
accum_steps = 1  # micro-batches per optimizer step
exercises.memory_plan.check(micro_batch_size, accum_steps)
"""
    solution_code = """\
micro_batch_size = 8  # the largest micro-batch whose accumulating step fits 0.5 MiB
accum_steps = 32  # 8 x 32 = 256 samples per optimizer step
exercises.memory_plan.check(micro_batch_size, accum_steps)
"""
    hint_text = N_(
        "micro_batch_size x accum_steps must stay 256. Halve the micro-batch and double accum_steps until "
        "the step fits: try a plan with accumlib.train(..., memory_budget=2**19), which refuses one that "
        "does not fit. Mind that an accumulating step also keeps the gradient between micro-batches."
    )

    def peak(self, micro_batch_size: int, accum_steps: int) -> int:
        """Peak bytes of the plan's step, as accumlib.train(memory_budget=...) measures it before training."""
        return step_peak(micro_batch_size, accum_steps)

    def best(self) -> int:
        """The largest micro-batch that divides the effective batch and whose step fits the card."""
        divisors = [d for d in range(self.effective_batch, 0, -1) if self.effective_batch % d == 0]
        return next(d for d in divisors if self.peak(d, self.effective_batch // d) <= self.card_bytes)

    def judge(self, micro_batch_size, accum_steps) -> Verdict:
        plan = {"micro_batch_size": micro_batch_size, "accum_steps": accum_steps}
        counts = {}
        for name, value in plan.items():
            with learner_code():  # the value's own methods (__index__, __float__) are the learner's code
                counts[name] = whole_number(value)
            if counts[name] is None or counts[name] < 1:
                return wrong(
                    [
                        Finding(
                            "not-a-count",
                            _("{name} must be a whole number of at least 1; it is {value!r}.").format(
                                name=name, value=Shown(value)
                            ),
                        )
                    ]
                )
        m, k = counts["micro_batch_size"], counts["accum_steps"]
        card = _mib(self.card_bytes)
        if m * k != self.effective_batch:
            return wrong(
                [
                    Finding(
                        "wrong-effective-batch",
                        _(
                            "micro_batch_size x accum_steps = {m} x {k} = {effective} samples per optimizer step; the "
                            "plan must "
                            "keep {target}."
                        ).format(m=m, k=k, effective=m * k, target=self.effective_batch),
                    )
                ]
            )
        peak = self.peak(m, k)
        if peak > self.card_bytes:
            return wrong(
                [
                    Finding(
                        "does-not-fit",
                        _(
                            "A step with micro_batch_size={m} and accum_steps={k} needs {peak:,} bytes, more than the "
                            "{card} "
                            "card ({budget:,} bytes): accumlib.train(..., memory_budget={budget}) would refuse it. Use "
                            "a smaller "
                            "micro-batch and more accum_steps."
                        ).format(k=k, m=m, peak=peak, card=card, budget=self.card_bytes),
                    )
                ]
            )
        message = _(
            "micro_batch_size={m} with accum_steps={k} gives {target} samples per step at a peak of {peak:,} "
            "bytes, within the {card} card ({budget:,} bytes)."
        ).format(m=m, k=k, target=self.effective_batch, peak=peak, card=card, budget=self.card_bytes)
        best = self.best()
        if m < best:  # any plan that fits is right; the fastest one is worth knowing
            message += " " + _(
                "A larger micro-batch fits too: {best} x {best_k} ({best_peak:,} bytes) makes "
                "{best_k} forward and backward passes per step instead of {k}, and the fewer the "
                "passes, the faster the step."
            ).format(
                best=best,
                best_k=self.effective_batch // best,
                k=k,
                best_peak=self.peak(best, self.effective_batch // best),
            )
        elif m < self.effective_batch:
            larger = min(d for d in range(m + 1, self.effective_batch + 1) if self.effective_batch % d == 0)
            message += " " + _("The next larger plan, {larger} x {larger_k}, would need {larger_peak:,} bytes.").format(
                larger=larger,
                larger_k=self.effective_batch // larger,
                larger_peak=self.peak(larger, self.effective_batch // larger),
            )
        return right(message)


largest_batch = LargestBatch()
memory_plan = MemoryPlan()
