"""Lesson 5 (what accumulation saves): peak memory by category, a model where accumulation does not help, a plan
for a card. Every function prints its finding from the `accumlib.memory` reports it is given, in the course
language, and draws its figure; bytes are exact on the CPU, so every printed number is the same on every run.

A split of an effective batch is written "micro-batch × accum_steps" ("8 × 32": 32 micro-batches of 8 samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .. import plots
from ...i18n import _, ngettext
from ...records import History
from ...memory import CATEGORIES, FitPlan, MemoryReport
from ._format import figure, print_table

# Categories whose bytes the model fixes (its weights, their gradients, the optimizer's memory), whatever the
# micro-batch; the others hold something for every sample of the micro-batch.
MODEL_SIZED = ("parameters", "gradients", "incoming gradients", "optimizer state", "optimizer temporaries")


def split(micro_batch_size: int, accum_steps: int) -> str:
    """How the lessons write a split of an effective batch: "micro-batch × accum_steps"."""
    return _("{micro_batch_size} × {accum_steps}").format(micro_batch_size=micro_batch_size, accum_steps=accum_steps)


def _split_of(report: MemoryReport) -> str:
    return split(report.micro_batch_size, report.accum_steps)


def category_name(category: str) -> str:
    """A memory category as the lessons and figures name it, in the course language."""
    return _(plots.CATEGORY_LABELS[category])


def phase_name(phase: str | None) -> str:
    """The part of a training step a peak came in ("forward", "backward", "step"), as a learner reads it."""
    return {"forward": _("the forward pass"), "backward": _("backward()"), "step": _("optimizer.step()")}.get(
        phase, _("unknown")
    )


def _ratio(before: int, after: int) -> str:
    """before / after with three significant digits ("16", "9.8")."""
    return f"{before / after:.3g}"


def _share(fraction: float) -> str:
    """A share (0..1) as a percentage with two decimals, more where rounding would show a part as 100.00%."""
    decimals = 2
    while fraction < 1 and float(f"{fraction * 100:.{decimals}f}") >= 100:
        decimals += 1
    return f"{fraction * 100:.{decimals}f}%"


def _percent(fraction: float, signed: bool = True) -> str:
    """A percentage with two significant digits, signed ("+44%", "-0.014%") or not ("44%")."""
    sign = ("+" if fraction > 0 else "-" if fraction < 0 else "") if signed else ""
    return f"{sign}{abs(fraction) * 100:.2g}%"


@dataclass(frozen=True)
class CategoryChanges:
    """How each category changed from the first report of a split series to the last (category names)."""

    shrinks: tuple[str, ...]  # fewer bytes in the last report than in the first
    stays: tuple[str, ...]  # the same bytes, not zero, in every report
    grows: tuple[str, ...]  # more bytes in the last report than in the first
    unused: tuple[str, ...]  # zero bytes in every report
    varies: tuple[str, ...]  # the same at both ends but not in between
    peak_ratio: float  # peak of the first report / peak of the last
    plot: plots.Plot


def categories(reports: Sequence[MemoryReport]) -> CategoryChanges:
    """Peak memory by category of one effective batch split ever finer: a table of bytes, what shrinks, stays and
    grows from the first split to the last, and stacked bars.

    reports: `memory.measure_step` reports of the same effective batch (micro_batch_size * accum_steps), in the
    order to show them (e.g. 64 × 1 first, 4 × 16 last); two or more.
    """
    reports = list(reports)
    if len(reports) < 2 or not all(isinstance(r, MemoryReport) for r in reports):
        raise TypeError(
            _("reports must be two or more MemoryReports (memory.measure_step), got {kinds}").format(
                kinds=[type(r).__name__ for r in reports]
            )
        )
    batches = {r.micro_batch_size * r.accum_steps for r in reports}
    if len(batches) != 1:
        raise ValueError(
            _(
                "reports must split one effective batch (micro_batch_size x accum_steps the same in each), got "
                "effective batches {batches}"
            ).format(batches=sorted(batches))
        )
    batch = batches.pop()
    first, last = reports[0], reports[-1]
    by_category = {c: [r.categories()[c] for r in reports] for c in CATEGORIES}
    unused = tuple(c for c, values in by_category.items() if not any(values))
    stays = tuple(c for c, values in by_category.items() if any(values) and len(set(values)) == 1)
    shrinks = tuple(c for c, values in by_category.items() if values[-1] < values[0])
    grows = tuple(c for c, values in by_category.items() if values[-1] > values[0])
    varies = tuple(c for c in CATEGORIES if c not in (*unused, *stays, *shrinks, *grows))
    shown = [c for c in CATEGORIES if c not in unused]

    rows = [[category_name(c), *(f"{v:,}" for v in by_category[c])] for c in shown]
    rows.append([_("peak (bytes)"), *(f"{r.peak:,}" for r in reports)])
    print_table([_("micro-batch × accum_steps"), *(_split_of(r) for r in reports)], rows)
    phases = {r.peak_phase for r in reports}
    if len(phases) == 1:
        print(_("Every split peaks during {phase}.").format(phase=phase_name(phases.pop())))
    else:
        print(
            _("Each split peaks during: {phases}.").format(
                phases=", ".join(f"{_split_of(r)} {phase_name(r.peak_phase)}" for r in reports)
            )
        )
    print()
    ends = dict(
        first=_split_of(first), last=_split_of(last), times=_ratio(first.micro_batch_size, last.micro_batch_size)
    )
    if shrinks and first.micro_batch_size > last.micro_batch_size:
        print(_("From {first} to {last} the micro-batch is {times} times smaller. What shrinks:").format(**ends))
    elif shrinks:
        print(_("What shrinks from {first} to {last}:").format(**ends))
    if shrinks:
        for c in shrinks:
            print(
                "  - "
                + _("{category}: {before:,} → {after:,} bytes ({times} times smaller)").format(
                    category=category_name(c),
                    before=by_category[c][0],
                    after=by_category[c][-1],
                    times=_ratio(by_category[c][0], by_category[c][-1]),
                )
            )
    if stays:
        print(_("What stays the same in every split:"))
        for c in stays:
            print("  - " + _("{category}: {bytes:,} bytes").format(category=category_name(c), bytes=by_category[c][0]))
    if grows:
        print(_("What grows:"))
        for c in grows:
            print(
                "  - "
                + _("{category}: {before:,} → {after:,} bytes").format(
                    category=category_name(c), before=by_category[c][0], after=by_category[c][-1]
                )
            )
    if (
        "gradients" in grows
        and first.accum_steps == 1 < last.accum_steps
        and first.peak_phase == "backward"
        and last.gradients == last.parameters
    ):
        print(
            _(
                "One batch peaks during backward() with only the part of .grad built so far ({before:,} of "
                "{whole:,} bytes); under accumulation all of .grad is kept from the first micro-batch to the "
                "step."
            ).format(before=first.gradients, whole=last.gradients)
        )
    for c in varies:
        print(
            _("{category} changes from split to split: {values} bytes.").format(
                category=category_name(c), values=", ".join(f"{v:,}" for v in by_category[c])
            )
        )
    if unused:
        print(
            _("Not alive at the peak (0 bytes in every split): {categories}.").format(
                categories=", ".join(category_name(c) for c in unused)
            )
        )
    peak_ratio = first.peak / last.peak
    values = {
        **ends,
        "before": first.peak,
        "after": last.peak,
        "times": _ratio(first.peak, last.peak),
        "micro_times": _ratio(first.micro_batch_size, last.micro_batch_size),
    }
    if first.peak > last.peak and peak_ratio < first.micro_batch_size / last.micro_batch_size:
        print(
            _(
                "The peak falls from {before:,} to {after:,} bytes: {times} times smaller, while the micro-batch is "
                "{micro_times} times smaller, because what stays the same and what grows do not shrink."
            ).format(**values)
        )
    elif first.peak > last.peak:
        print(_("The peak falls from {before:,} to {after:,} bytes: {times} times smaller.").format(**values))
    else:
        print(_("The peak does not fall: {before:,} bytes at {first}, {after:,} bytes at {last}.").format(**values))

    labels = [_split_of(r) for r in reports]
    mib = dict(batch=batch, first=labels[0], last=labels[-1], before=plots.mib(first.peak), after=plots.mib(last.peak))
    title = (
        _("Effective batch {batch}: the peak falls from {before} at {first} to {after} at {last}")
        if first.peak > last.peak
        else _("Effective batch {batch}: the peak is {before} at {first} and {after} at {last}")
    ).format(**mib)
    alt = _(
        "Stacked bars of the peak memory of one step by category, effective batch {batch}, for micro-batch × "
        "accum_steps {splits}: peaks of {peaks} bytes. Shrinking: {shrinks}. The same in every split: {stays}. "
        "Growing: {grows}."
    ).format(
        batch=batch,
        splits=", ".join(labels),
        peaks=", ".join(f"{r.peak:,}" for r in reports),
        shrinks=", ".join(category_name(c) for c in shrinks) or _("nothing"),
        stays=", ".join(category_name(c) for c in stays) or _("nothing"),
        grows=", ".join(category_name(c) for c in grows) or _("nothing"),
    )
    plot = figure(
        plots.memory_stack({label: r.categories() for label, r in zip(labels, reports, strict=True)}, title, alt)
    )
    return CategoryChanges(shrinks, stays, grows, unused, varies, peak_ratio, plot)


@dataclass(frozen=True)
class Effect:
    """What accumulating did to the peak of one set-up (an optimizer, say)."""

    one_batch: MemoryReport
    accumulated: MemoryReport
    change: float  # accumulated.peak / one_batch.peak - 1 (negative: accumulation lowered the peak)
    largest_change: str  # the category whose bytes changed most
    model_sized_share: float  # share (0..1) of the accumulated peak held by categories the model fixes


def accumulation_effect(pairs: dict[str, tuple[MemoryReport, MemoryReport]]) -> dict[str, Effect]:
    """Does accumulating lower the peak? For each set-up (label -> (one-batch report, accumulated report)): the
    peaks, the part of the step each came in, the change, the category that changed most and the share of the peak
    that the model's size fixes (`MODEL_SIZED`); a table, one sentence per set-up and stacked bars of all reports.

    Every pair must compare the same two splits of the same effective batch (one batch first).
    """
    if not pairs or not all(
        isinstance(p, tuple) and len(p) == 2 and all(isinstance(r, MemoryReport) for r in p) for p in pairs.values()
    ):
        raise TypeError(_("pairs must map a label to (one-batch MemoryReport, accumulated MemoryReport)"))
    shapes = {((a.micro_batch_size, a.accum_steps), (b.micro_batch_size, b.accum_steps)) for a, b in pairs.values()}
    if len(shapes) != 1:
        raise ValueError(_("pairs must all compare the same two splits, got {shapes}").format(shapes=sorted(shapes)))
    ((one_split, accumulated_split),) = shapes
    if one_split[0] * one_split[1] != accumulated_split[0] * accumulated_split[1]:
        raise ValueError(
            _(
                "pairs must compare two splits of one effective batch, got {one_split} and {accumulated_split} "
                "(micro_batch_size, accum_steps)"
            ).format(one_split=one_split, accumulated_split=accumulated_split)
        )
    effects = {}
    rows = []
    for label, (one, accumulated) in pairs.items():
        changes = {c: accumulated.categories()[c] - one.categories()[c] for c in CATEGORIES}
        largest = max(CATEGORIES, key=lambda c: abs(changes[c]))
        share = sum(accumulated.categories()[c] for c in MODEL_SIZED) / accumulated.peak
        effects[label] = Effect(one, accumulated, accumulated.peak / one.peak - 1, largest, share)
        for report, change in ((one, ""), (accumulated, _percent(effects[label].change))):
            rows.append(
                [
                    label,
                    _split_of(report),
                    f"{report.peak:,}",
                    phase_name(report.peak_phase),
                    change,
                    _share(sum(report.categories()[c] for c in MODEL_SIZED) / report.peak),
                ]
            )
    print_table(
        [
            _("set-up"),
            _("micro-batch × accum_steps"),
            _("peak (bytes)"),
            _("peak during"),
            _("change"),
            _("fixed by the model"),
        ],
        rows,
    )
    print()
    for label, effect in effects.items():
        one, accumulated = effect.one_batch, effect.accumulated
        values = dict(
            label=label,
            accumulated=_split_of(accumulated),
            one=_split_of(one),
            change=_percent(abs(effect.change), signed=False),
            category=category_name(effect.largest_change),
            before=one.categories()[effect.largest_change],
            after=accumulated.categories()[effect.largest_change],
            share=_share(effect.model_sized_share),
        )
        if effect.change > 0:
            print(
                _(
                    "{label}: {accumulated} peaks {change} higher than {one}. What changed most: {category}, "
                    "{before:,} → {after:,} bytes."
                ).format(**values)
            )
        elif effect.change < 0:
            print(
                _(
                    "{label}: {accumulated} peaks {change} lower than {one}. What changed most: {category}, "
                    "{before:,} → {after:,} bytes."
                ).format(**values)
            )
        else:
            print(_("{label}: {accumulated} peaks exactly as high as {one}.").format(**values))
        if effect.model_sized_share > 0.5:
            print(
                "  "
                + _(
                    "At the peak of {accumulated}, {share} of the bytes are fixed by the model ({categories}): "
                    "accumulation cannot shrink them."
                ).format(categories=", ".join(category_name(c) for c in MODEL_SIZED), **values)
            )
    changes = ", ".join(
        _("{label} {change}").format(label=label, change=_percent(e.change)) for label, e in effects.items()
    )
    title = _("Peak of {accumulated} against one batch of {batch}: {changes}").format(
        accumulated=split(*accumulated_split), batch=one_split[0] * one_split[1], changes=changes
    )
    alt = _("Stacked bars of peak memory by category for {bars}: peaks of {peaks} bytes.").format(
        bars=", ".join(f"{label} {_split_of(r)}" for label, e in effects.items() for r in (e.one_batch, e.accumulated)),
        peaks=", ".join(f"{r.peak:,}" for e in effects.values() for r in (e.one_batch, e.accumulated)),
    )
    figure(
        plots.memory_stack(
            {
                f"{label} {_split_of(r)}": r.categories()
                for label, e in effects.items()
                for r in (e.one_batch, e.accumulated)
            },
            title,
            alt,
        )
    )
    return effects


def plan(fit: FitPlan) -> FitPlan:
    """Say what `memory.fit_batch` planned: the split, its peak, the next larger split and why it is not chosen."""
    if not isinstance(fit, FitPlan):
        raise TypeError(_("fit must be a FitPlan (memory.fit_batch), got {kind}").format(kind=type(fit).__name__))
    values = dict(
        target=fit.target_batch,
        budget=fit.memory_budget,
        budget_mib=plots.mib(fit.memory_budget),
        plan=split(fit.micro_batch_size, fit.accum_steps),
        peak=fit.peak_bytes,
        largest=fit.largest_fitting,
    )
    print(
        _(
            "For {target} samples per optimizer step on a card of {budget:,} bytes ({budget_mib}): micro-batch × "
            "accum_steps = {plan}, peak {peak:,} bytes."
        ).format(**values)
    )
    if fit.next_micro_batch_size is not None:
        print(
            _(
                "The next larger micro-batch that divides {target}, {next} × {next_steps}, would need {next_peak:,} "
                "bytes: more than the card."
            ).format(
                next=fit.next_micro_batch_size,
                next_steps=fit.target_batch // fit.next_micro_batch_size,
                next_peak=fit.next_peak_bytes,
                **values,
            )
        )
    if fit.largest_fitting != fit.micro_batch_size:
        print(
            _(
                "The largest micro-batch that fits at all has {largest} samples, but no whole number of micro-batches "
                "of {largest} makes {target}."
            ).format(**values)
        )
    return fit


def trained(history: History) -> History:
    """Say what `accumlib.train` did with a plan it accepted: steps, micro-batches per step, samples per step."""
    if not isinstance(history, History) or not history.records:
        raise TypeError(
            _("history must be the History of a training run with at least one step, got {history!r}").format(
                history=history
            )
        )
    first = history.records[0]
    print(
        ngettext(
            "accumlib.train accepted it: {steps} optimizer step of {micro_batches} micro-batches, {samples} "
            "samples per step.",
            "accumlib.train accepted it: {steps} optimizer steps of {micro_batches} micro-batches, {samples} "
            "samples per step.",
            len(history),
        ).format(steps=len(history), micro_batches=first.micro_batches, samples=first.samples)
    )
    return history
