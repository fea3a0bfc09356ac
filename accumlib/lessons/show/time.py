"""Lesson 6 (what accumulation costs): the time of one effective batch split ever finer, taken apart into a fixed
cost per forward/backward pass and arithmetic per sample (`accumlib.timing.decompose_time`).

Times differ from run to run, so every printed time is written as milliseconds ("12.34 ms") or as a ratio
("1.23x"), the two forms notebooks/sanitize.cfg masks; a sentence whose wording depends on a measured time is
chosen only where the margin is wide (the fixed cost's share of a small model's pass against a larger model's).
"""

from __future__ import annotations

from .. import plots
from ...i18n import N_, _
from ...timing import THREAD_CPU, WALL, TimeDecomposition
from ._format import figure, width
from .memory import split


def _ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals ("1.07 ms"), or three below 1 ms ("0.095 ms")."""
    return f"{seconds * 1e3:.{3 if seconds < 1e-3 else 2}f} ms"  # the same in every language (the glossary's ms)


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x"


# What the clock of a decomposition measured, as the table says it: the one it used on the device it ran on.
CLOCKS = {
    THREAD_CPU: N_("the CPU time of the one thread that computes (waiting for other programs does not count)"),
    WALL: N_("wall time (on a GPU: after waiting for the card to finish, before each reading)"),
}


def _check(decomposition, name: str = "decomposition") -> TimeDecomposition:
    if not isinstance(decomposition, TimeDecomposition):
        raise TypeError(
            _("{name} must be a TimeDecomposition (timing.decompose_time), got {kind}").format(
                name=name, kind=type(decomposition).__name__
            )
        )
    return decomposition


def _lines(labels: list[str], texts: list[str]) -> str:
    """One line per label: the labels padded to one width (they are the same on every run), then the text. Measured
    times never sit in padded columns: their width changes from run to run, and the padding would then differ where
    the times themselves are masked."""
    widest = max(width(label) for label in labels)
    return "\n".join(
        f"  {label}{' ' * (widest - width(label))}  {text}" for label, text in zip(labels, texts, strict=True)
    )


def steps(decomposition: TimeDecomposition) -> list[float]:
    """The measured time of one effective batch at each split, and each against the first split (one line per
    split and one sentence); returns those ratios."""
    d = _check(decomposition)
    first, last = d.steps[0], d.steps[-1]
    ratios = [s.seconds / first.seconds for s in d.steps]
    names = dict(
        first=split(first.micro_batch_size, first.accum_steps),
        last=split(last.micro_batch_size, last.accum_steps),
        batch=d.effective_batch,
    )
    print(
        _("Time per effective batch of {batch} samples, micro-batch × accum_steps (against {first}):").format(**names)
    )
    print(
        _lines(
            [split(s.micro_batch_size, s.accum_steps) for s in d.steps],
            [f"{_ms(s.seconds)}  ({_times(r)})" for s, r in zip(d.steps, ratios, strict=True)],
        )
    )
    print(
        _("The same {batch} samples per optimizer step: {last} takes {ratio} the time of {first}.").format(
            ratio=_times(ratios[-1]), **names
        )
    )
    print(
        _("Measured on {device}, {threads} thread(s); the clock: {clock}.").format(
            device=d.device, threads=d.threads, clock=_(CLOCKS[d.clock])
        )
    )
    return ratios


def passes(decomposition: TimeDecomposition) -> plots.Plot:
    """What one forward/backward pass costs: the measured pass times against the fitted line fixed cost +
    per-sample arithmetic (figure and one line per size), then every split's step as fixed costs + arithmetic +
    optimizer step; returns the figure."""
    d = _check(decomposition)
    values = dict(fixed=_ms(d.overhead_seconds), per_sample=_ms(d.seconds_per_sample))
    print(_("One forward and backward pass, by micro-batch size: measured, and the fitted fixed cost + arithmetic:"))
    print(
        _lines(
            [str(p.micro_batch_size) for p in d.passes],
            [
                _("{measured}; line: {fixed} + {arithmetic} = {fitted}").format(
                    measured=_ms(p.seconds),
                    fixed=_ms(d.overhead_seconds),
                    arithmetic=_ms(d.seconds_per_sample * p.micro_batch_size),
                    fitted=_ms(d.pass_seconds(p.micro_batch_size)),
                )
                for p in d.passes
            ],
        )
    )
    print(
        _(
            "Fitted: a pass costs {fixed} whatever its size, plus {per_sample} for each sample; the line misses the "
            "measured passes by at most {miss}."
        ).format(miss=_ms(max(abs(p.residual) for p in d.passes)), **values)
    )
    print()
    print(
        _(
            "One effective batch, micro-batch × accum_steps: fixed costs + arithmetic + optimizer step and zeroing = "
            "predicted (measured):"
        )
    )
    print(
        _lines(
            [split(s.micro_batch_size, s.accum_steps) for s in d.steps],
            [
                _("{fixed} + {arithmetic} + {optimizer} = {predicted} ({measured})").format(
                    fixed=_ms(s.overhead_seconds),
                    arithmetic=_ms(s.compute_seconds),
                    optimizer=_ms(d.optimizer_seconds),
                    predicted=_ms(s.predicted_seconds),
                    measured=_ms(s.seconds),
                )
                for s in d.steps
            ],
        )
    )
    print(
        _(
            "Every split does the same arithmetic: each sample passes through the same layers. What grows is the "
            "fixed cost, paid once per pass: {first_fixed} for {first_passes} pass, {last_fixed} for "
            "{last_passes}."
        ).format(
            first_fixed=_ms(d.steps[0].overhead_seconds),
            first_passes=d.steps[0].accum_steps,
            last_fixed=_ms(d.steps[-1].overhead_seconds),
            last_passes=d.steps[-1].accum_steps,
        )
    )
    sizes = [p.micro_batch_size for p in d.passes]
    line = [0, *sizes]
    title = _("One pass costs {fixed} plus {per_sample} per sample").format(**values)
    alt = _(
        "Measured median time of one forward and backward pass at micro-batch sizes {sizes}: {measured}. The "
        "fitted straight line starts at {fixed} at size 0 (the fixed cost of a pass) and rises by {per_sample} "
        "per sample."
    ).format(sizes=", ".join(map(str, sizes)), measured=", ".join(_ms(p.seconds) for p in d.passes), **values)
    plot = plots.lines(
        {
            _("measured"): (sizes, [p.seconds * 1e3 for p in d.passes]),
            _("fixed cost + arithmetic"): (line, [d.pass_seconds(m) * 1e3 for m in line]),
            _("fixed cost"): ([0, sizes[-1]], [d.overhead_seconds * 1e3] * 2),
        },
        _("micro-batch size (samples)"),
        _("time of one pass (ms)"),
        title,
        alt,
    )
    plot.figure.axes[0].set_ylim(bottom=0)  # the fixed cost is the height at size 0
    return figure(plot)


def compare(decompositions: dict[str, TimeDecomposition]) -> dict[str, list[float]]:
    """Models side by side: the measured passes of the smallest and largest micro-batch and the time of the last
    split against the first (one line per model), one sentence on the fitted fixed cost's share of a pass (printed
    only as a comparison: the intercept of a model whose passes are mostly arithmetic is a small difference of large
    times, too noisy to print), and a figure of every split; returns each model's ratios (time of each split / time
    of the first).

    Every decomposition must split the same effective batch in the same accum_steps.
    """
    if len(decompositions) < 2:
        raise ValueError(
            _("decompositions must hold two or more models (label -> TimeDecomposition), got {count}").format(
                count=len(decompositions)
            )
        )
    for label, d in decompositions.items():
        _check(d, f"decompositions[{label!r}]")
    shapes = {(d.effective_batch, tuple(s.accum_steps for s in d.steps)) for d in decompositions.values()}
    if len(shapes) != 1:
        raise ValueError(
            _("decompositions must split the same effective batch the same ways, got {shapes}").format(
                shapes=sorted(shapes)
            )
        )
    ((batch, splits),) = shapes
    first = next(iter(decompositions.values()))
    labels = [split(s.micro_batch_size, s.accum_steps) for s in first.steps]
    ratios = {label: [s.seconds / d.steps[0].seconds for s in d.steps] for label, d in decompositions.items()}
    print(
        _lines(
            list(decompositions),
            [
                _(
                    "a pass of {small} samples takes {small_time}, of {large} samples {large_time} ({pass_ratio}); "
                    "{last} takes "
                    "{ratio} the time of {first}"
                ).format(
                    small=d.passes[0].micro_batch_size,
                    small_time=_ms(d.passes[0].seconds),
                    large=d.passes[-1].micro_batch_size,
                    large_time=_ms(d.passes[-1].seconds),
                    pass_ratio=_times(d.passes[-1].seconds / d.passes[0].seconds),
                    last=labels[-1],
                    ratio=_times(ratios[label][-1]),
                    first=labels[0],
                )
                for label, d in decompositions.items()
            ],
        )
    )

    def growth(d: TimeDecomposition) -> float:  # how much a pass grows from the smallest to the largest micro-batch
        return d.passes[-1].seconds / d.passes[0].seconds

    (small_label, small), *others = decompositions.items()
    for label, d in others:
        values = dict(
            label=label,
            other=small_label,
            smallest=d.passes[0].micro_batch_size,
            largest=d.passes[-1].micro_batch_size,
            growth=_times(growth(d)),
            other_growth=_times(growth(small)),
        )
        if growth(d) > growth(small) and ratios[label][-1] < ratios[small_label][-1]:
            print(
                _(
                    "From {smallest} to {largest} samples a pass of {label} takes {growth} the time, one of {other} "
                    "{other_growth}: more of its time is arithmetic per sample, and splitting its batch adds a "
                    "smaller share of time."
                ).format(**values)
            )
        else:
            print(
                _(
                    "From {smallest} to {largest} samples a pass of {label} takes {growth} the time, one of {other} "
                    "{other_growth}: here either its time is not more arithmetic per sample, or splitting its "
                    "batch does not add a smaller share of time."
                ).format(**values)
            )
    title = _("Time per effective batch of {batch} against one batch: {last} costs {ratios}").format(
        batch=batch,
        last=labels[-1],
        ratios=", ".join(
            _("{ratio} for {label}").format(ratio=_times(r[-1]), label=label) for label, r in ratios.items()
        ),
    )
    alt = _(
        "Lines of the time per effective batch of {batch} samples against one batch, for micro-batch × "
        "accum_steps {splits}: {series}."
    ).format(
        batch=batch,
        splits=", ".join(labels),
        series="; ".join(f"{label} {', '.join(_times(r) for r in rs)}" for label, rs in ratios.items()),
    )
    figure(
        plots.lines(
            {label: (list(splits), rs) for label, rs in ratios.items()},
            _("accum_steps"),
            _("time per effective batch (relative to one batch)"),
            title,
            alt,
        )
    )
    return ratios


SLIGHTLY, SEVERAL = 1.5, 2.5  # a split under 1.5 times the time of one batch takes "slightly longer", one of 2.5
# times or more "several times as long": lesson 0's CNN measured 1.2x at 32 × 2 and 3.6x-4.7x at 4 × 16 on the
# course's CPUs (AVX2 and without vector extensions), so each verdict holds with a margin of 20% or more


def _how_long(ratio: float) -> str:
    if ratio < SLIGHTLY:
        return _("only slightly longer ({ratio})").format(ratio=_times(ratio))
    if ratio >= SEVERAL:
        return _("several times as long ({ratio})").format(ratio=_times(ratio))
    return _("{ratio} as long").format(ratio=_times(ratio))


def cost(decomposition: TimeDecomposition) -> list[float]:
    """Lesson 0: what accumulating costs at each micro-batch size, and why, in two sentences: how long the largest
    accumulated micro-batch and the smallest take against one batch ("only slightly longer" under SLIGHTLY times,
    "several times as long" from SEVERAL times), then the fitted fixed cost of a pass against its arithmetic at
    the smallest micro-batch and at the whole batch (which is the larger part of a pass at each: far apart, so
    that the verdict is the same on another CPU, where a size in between can fall either side). Needs three or
    more splits, the first of one micro-batch; returns the ratios (time of each split / time of the first)."""
    d = _check(decomposition)
    if len(d.steps) < 3 or d.steps[0].accum_steps != 1:
        raise ValueError(
            _(
                "decomposition must time one batch (accum_steps 1, first) and two or more splits of it, got "
                "accum_steps {accum_steps}"
            ).format(accum_steps=[s.accum_steps for s in d.steps])
        )
    ratios = [s.seconds / d.steps[0].seconds for s in d.steps]
    first, large, small = d.steps[0], d.steps[1], d.steps[-1]
    print(
        _("Against {first} ({seconds}), {large} takes {large_verdict}, {small} {small_verdict}.").format(
            first=split(first.micro_batch_size, first.accum_steps),
            seconds=_ms(first.seconds),
            large=split(large.micro_batch_size, large.accum_steps),
            large_verdict=_how_long(ratios[1]),
            small=split(small.micro_batch_size, small.accum_steps),
            small_verdict=_how_long(ratios[-1]),
        )
    )
    values = dict(
        fixed=_ms(d.overhead_seconds),
        per_sample=_ms(d.seconds_per_sample),
        small=small.micro_batch_size,
        large=first.micro_batch_size,
    )
    fixed_small, fixed_large = (d.overhead_share(s.micro_batch_size) > 0.5 for s in (small, first))
    if fixed_small and not fixed_large:
        print(
            _(
                "A pass costs {fixed} plus {per_sample} per sample: mostly fixed cost at {small} samples, mostly "
                "arithmetic at {large}. Small micro-batches underuse the hardware."
            ).format(**values)
        )
    elif fixed_small:
        print(
            _(
                "A pass costs {fixed} plus {per_sample} per sample: mostly fixed cost at {small} and at {large} "
                "samples. Micro-batches this small underuse the hardware."
            ).format(**values)
        )
    elif not fixed_large:
        print(
            _(
                "A pass costs {fixed} plus {per_sample} per sample: mostly arithmetic at {small} and at {large} "
                "samples, so the fixed cost adds little."
            ).format(**values)
        )
    else:
        print(
            _(
                "A pass costs {fixed} plus {per_sample} per sample: mostly arithmetic at {small} samples, mostly "
                "fixed cost at {large}."
            ).format(**values)
        )
    return ratios
