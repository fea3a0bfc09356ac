"""Lesson 1, the large-batch problem: small against large batches per optimizer step and per sample seen, the peak
memory of a step against the batch and the card's budget, and a first run with accumulation under that budget."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

from .. import plots
from ...i18n import _, ngettext
from ...records import History
from ...memory import MemoryReport
from ._format import figure, print_table


@dataclass(frozen=True)
class BatchComparison:
    """Two runs on the same samples, one with small batches and one with large ones (one batch per step)."""

    small: int  # samples per batch of the small-batch run
    large: int  # samples per batch of the large-batch run
    samples: int  # samples each run saw (both saw the same)
    steps: dict[int, int]  # batch size -> optimizer steps taken
    compared_steps: int  # the first optimizer steps of both runs compared step by step (the shorter run's steps)
    jumps: dict[int, float]  # batch size -> mean |loss change| from one step to the next over compared_steps, nats
    last_epoch_loss: dict[int, float]  # batch size -> mean step loss over the last epoch, nats
    plot: plots.Plot

    @property
    def jump_ratio(self) -> float:
        """How many times as much the small batches' loss jumps per step as the large batches'."""
        return self.jumps[self.small] / self.jumps[self.large]

    @property
    def small_ends_lower(self) -> bool:
        return self.last_epoch_loss[self.small] < self.last_epoch_loss[self.large]


def _mean_jump(losses: Sequence[float]) -> float:
    """Mean absolute change of the loss from one step to the next (nats)."""
    return sum(abs(b - a) for a, b in itertools.pairwise(losses)) / (len(losses) - 1)


def compare_batches(histories: Mapping[int, History]) -> BatchComparison:
    """Compare two runs (batch size -> its History, one batch per optimizer step, same samples and epochs): per
    optimizer step (how much the loss jumps over the steps both took) and per sample seen (steps taken, the loss
    over the last epoch). Prints the two findings (they hold every number a table would), shows the loss per step,
    returns the numbers."""
    if len(histories) != 2:
        raise ValueError(
            _("histories must map exactly two batch sizes to their History, got {count}").format(count=len(histories))
        )
    small, large = sorted(histories)
    samples = {size: history[-1].samples_seen for size, history in histories.items()}
    if samples[small] != samples[large]:
        raise ValueError(
            _(
                "histories: both runs must see the same samples; batches of {small} saw {small_samples}, batches of "
                "{large} saw {large_samples}"
            ).format(small=small, small_samples=samples[small], large=large, large_samples=samples[large])
        )
    if any(len(history) < 2 for history in histories.values()):
        raise ValueError(_("histories: each run needs at least two optimizer steps to compare them"))
    steps = {size: len(history) for size, history in histories.items()}
    compared = min(steps.values())
    losses = {size: [record.loss for record in history] for size, history in histories.items()}
    jumps = {size: _mean_jump(losses[size][:compared]) for size in histories}
    last_epoch_loss = {}
    for size, history in histories.items():
        last = [record.loss for record in history if record.epoch == history[-1].epoch]
        last_epoch_loss[size] = sum(last) / len(last)

    ratio = jumps[small] / jumps[large]
    if ratio >= 1:
        title = _(
            "Per optimizer step, the loss with batches of {small} jumps {ratio:.1f} times as much as with "
            "batches of {large}"
        ).format(small=small, large=large, ratio=ratio)
    else:
        title = _(
            "Per optimizer step, the loss with batches of {small} jumps less than with batches of {large} "
            "({ratio:.2f} times as much)"
        ).format(small=small, large=large, ratio=ratio)
    print(
        _(
            "Per optimizer step: over the first {steps} steps, the loss changed by {small_jump:.3f} per step on "
            "average with batches of {small} and by {large_jump:.3f} with batches of {large}."
        ).format(steps=compared, small=small, large=large, small_jump=jumps[small], large_jump=jumps[large])
    )
    step_ratio = steps[small] / steps[large]
    if last_epoch_loss[small] < last_epoch_loss[large]:
        per_sample = _(
            "Per sample seen: both runs saw the same {samples:,} samples, but batches of {small} took "
            "{small_steps} optimizer steps and batches of {large} only {large_steps}. With {ratio:g} times "
            "as many steps, the small batches end lower: mean loss over the last epoch {small_loss:.3f} "
            "against {large_loss:.3f}."
        )
    else:
        per_sample = _(
            "Per sample seen: both runs saw the same {samples:,} samples; batches of {small} took "
            "{small_steps} optimizer steps and batches of {large} {large_steps}. Even so, the small "
            "batches do not end lower: mean loss over the last epoch {small_loss:.3f} against "
            "{large_loss:.3f}."
        )
    print(
        per_sample.format(
            samples=samples[small],
            small=small,
            large=large,
            small_steps=steps[small],
            large_steps=steps[large],
            ratio=round(step_ratio, 2),
            small_loss=last_epoch_loss[small],
            large_loss=last_epoch_loss[large],
        )
    )
    alt = _(
        "Line chart of the training loss of each optimizer step's batch against the optimizer step, over the "
        "first {steps} steps, for batches of {small} and of {large}. The loss changes by {small_jump:.3f} per "
        "step on average with batches of {small} and by {large_jump:.3f} with batches of {large}."
    ).format(steps=compared, small=small, large=large, small_jump=jumps[small], large_jump=jumps[large])
    series = {
        _("batches of {size}").format(size=size): (list(range(1, compared + 1)), losses[size][:compared])
        for size in (large, small)
    }
    plot = figure(
        plots.lines(series, _("optimizer step"), _("loss of the step's batch (cross-entropy, nats)"), title, alt)
    )
    return BatchComparison(small, large, samples[small], steps, compared, jumps, last_epoch_loss, plot)


@dataclass(frozen=True)
class MemoryFinding:
    """Which measured batch sizes fit a card: their peaks against the budget."""

    sizes: list[int]  # batch sizes measured, ascending
    peaks: list[int]  # peak bytes of one training step at each size
    memory_budget: int
    fitting: list[int]  # the sizes whose peak is within the budget
    first_too_large: int | None  # the smallest size from which on no measured size fits (None: the largest fits)
    plot: plots.Plot


def memory_by_batch(reports: Sequence[MemoryReport], memory_budget: int, *, brief: bool = False) -> MemoryFinding:
    """The peak memory of one training step at each batch size (`memory.measure_step` reports) against a card's
    budget in bytes: a table, the finding (which sizes fit, from which size on none does), how the activations and
    the peak grow, and the figure; brief=True (lesson 0): the finding and the figure alone. Returns what it found."""
    if not reports:
        raise ValueError(_("reports must hold at least one MemoryReport (one per batch size)"))
    reports = sorted(reports, key=lambda r: r.micro_batch_size)
    sizes = [r.micro_batch_size for r in reports]
    peaks = [r.peak for r in reports]
    fitting = [size for size, peak in zip(sizes, peaks, strict=True) if peak <= memory_budget]
    card = plots.mib(memory_budget)
    yes, no = _("yes"), _("no")
    if not brief:
        print_table(
            [_("batch"), _("peak of one step (bytes)"), _("activations (bytes)"), _("fits {card}?").format(card=card)],
            [
                [size, f"{r.peak:,}", f"{r.activations:,}", yes if r.peak <= memory_budget else no]
                for size, r in zip(sizes, reports, strict=True)
            ],
        )
    first_too_large = None
    if len(fitting) == len(sizes):
        finding = _("Every batch measured, up to {largest} samples, fits the {card} card.").format(
            largest=sizes[-1], card=card
        )
        title = _("Peak memory grows with the batch; every batch measured fits the {card} card").format(card=card)
    elif not fitting:
        first_too_large = sizes[0]
        finding = _("Not even a batch of {smallest} samples fits the {card} card: a step on it needs {peak}.").format(
            smallest=sizes[0], card=card, peak=plots.mib(peaks[0])
        )
        title = _("Peak memory grows with the batch; no batch measured fits the {card} card").format(card=card)
    elif max(fitting) < min(set(sizes) - set(fitting)):  # every size that fits is smaller than every one that does not
        first_too_large = min(set(sizes) - set(fitting))
        finding = _(
            "Batches of up to {largest_fit} samples fit the {card} card; from {first} samples on, a step needs "
            "more than the card has ({peak} at {first} samples)."
        ).format(
            largest_fit=max(fitting),
            card=card,
            first=first_too_large,
            peak=plots.mib(peaks[sizes.index(first_too_large)]),
        )
        title = _(
            "Peak memory grows with the batch: from {first} samples on, a step needs more than the {card} card"
        ).format(first=first_too_large, card=card)
    else:
        finding = _("Batches of {fitting} samples fit the {card} card; batches of {others} samples do not.").format(
            fitting=", ".join(map(str, fitting)), others=", ".join(str(s) for s in sizes if s not in fitting), card=card
        )
        title = _("Peak memory against the batch: some batches fit the {card} card, some do not").format(card=card)
    print(finding)
    if len(sizes) > 1 and not brief:
        print(
            _(
                "From {first} to {last} samples ({factor:g} times as many), the activations grow {activations:.2f} "
                "times and the peak {peak:.2f} times."
            ).format(
                first=sizes[0],
                last=sizes[-1],
                factor=round(sizes[-1] / sizes[0], 2),
                activations=reports[-1].activations / reports[0].activations,
                peak=peaks[-1] / peaks[0],
            )
        )
    alt = _(
        "Line chart of the measured peak memory of one training step against the batch size (log scale), from "
        "{first_peak} at {first} samples to {last_peak} at {last} samples, with a dashed line at the {card} "
        "budget. {finding}"
    ).format(
        first_peak=plots.mib(peaks[0]),
        first=sizes[0],
        last_peak=plots.mib(peaks[-1]),
        last=sizes[-1],
        card=card,
        finding=finding,
    )
    plot = figure(plots.memory_by_batch(sizes, peaks, memory_budget, title, alt))
    return MemoryFinding(sizes, peaks, memory_budget, fitting, first_too_large, plot)


def accumulated(history: History, memory_budget: int, *, brief: bool = False) -> list[tuple[int, int, int]]:
    """What a run with accumulation really did: its optimizer steps grouped by (samples, micro-batches) in order,
    as a table (left out with brief=True, lesson 0), and its peak memory against the card's budget (bytes). The
    history must come from `accumlib.train(..., measure_memory=True)`. Returns the groups as (steps, samples per
    step, micro-batches)."""
    if not len(history):
        raise ValueError(_("history holds no optimizer step"))
    if any(record.peak_memory_bytes is None for record in history):
        raise ValueError(_("history has no peak memory: train with measure_memory=True"))
    groups: list[list[int]] = []
    for record in history:
        if groups and groups[-1][1:] == [record.samples, record.micro_batches]:
            groups[-1][0] += 1
        else:
            groups.append([1, record.samples, record.micro_batches])
    if not brief:
        print_table([_("optimizer steps"), _("samples per step"), _("micro-batches per step")], groups)
    total = history[-1].samples_seen
    print(
        ngettext(
            "{steps} optimizer step for {samples:,} samples.",
            "{steps} optimizer steps for {samples:,} samples.",
            len(history),
        ).format(steps=len(history), samples=total)
    )
    if len(groups) > 1 and groups[-1][0] == 1 and groups[-1][1] < groups[0][1]:
        print(
            _(
                "The last step has only {last} samples: {total:,} samples do not divide into steps of {full} "
                "(lesson 4 deals with this short last step)."
            ).format(last=groups[-1][1], total=total, full=groups[0][1])
        )
    peak = max(record.peak_memory_bytes for record in history)
    if peak <= memory_budget:
        print(
            _("The peak memory of a step, {peak:,} bytes, stays within the {card} card ({budget:,} bytes).").format(
                peak=peak, card=plots.mib(memory_budget), budget=memory_budget
            )
        )
    else:
        print(
            _(
                "The peak memory of a step, {peak:,} bytes, is more than the {card} card holds ({budget:,} bytes)."
            ).format(peak=peak, card=plots.mib(memory_budget), budget=memory_budget)
        )
    return [tuple(group) for group in groups]
