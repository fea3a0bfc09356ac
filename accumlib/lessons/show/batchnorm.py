"""Lesson 7 (watch BatchNorm): what BatchNorm sees in a micro-batch, why accumulation stops being exact, and what
micro-batches of each size and each remedy do on held-out data, with the running-statistic updates held equal
(`accumlib.batchnorm`, and lesson 7's experiment, `accumlib.lessons.batchnorm_lab`).

Deviations are relative (a mean's difference over the reference's standard deviation, a variance's difference
over the reference variance, averaged over channels); `batchnorm.total` adds a layer list's mean and variance parts.
Everything printed is computed from the results passed in; on the CPU they are the same on every run.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .. import plots
from ..batchnorm_lab import MicroBatchComparison
from ...batchnorm import LayerDeviation, total
from ...i18n import _
from ._format import figure, print_table
from .memory import split

ROUNDING = {"float32": 1e-5, "float64": 1e-12}  # largest gradient or weight difference rounding explains for the
# lessons' CNN: measured about 1e-6 in float32 and 1e-16 in float64; the bounds leave a margin of 10 and 10,000


def _layer_names(deviations: list[LayerDeviation]) -> list[str]:
    return [d.layer for d in deviations]


def deviation(drift: dict[int, list[LayerDeviation]], batch: int, *, brief: bool = False) -> dict[int, float]:
    """How far each micro-batch size's BatchNorm statistics stray from those of the whole batch of `batch` samples
    (`batchnorm.micro_batch_deviation` per size): a table per layer (left out with brief=True, lesson 0), the
    finding, a figure; returns the totals."""
    if len(drift) < 2 or not all(
        isinstance(v, list) and v and all(isinstance(d, LayerDeviation) for d in v) for v in drift.values()
    ):
        raise TypeError(_("drift must map two or more micro-batch sizes to batchnorm.micro_batch_deviation results"))
    sizes = sorted(drift)
    layers = _layer_names(drift[sizes[0]])
    header = [_("micro-batch")]
    for layer in layers:
        header += [_("layer {layer}: mean").format(layer=layer), _("layer {layer}: variance").format(layer=layer)]
    rows = [[str(m), *(f"{value:.3f}" for d in drift[m] for value in (d.mean, d.variance))] for m in sizes]
    if not brief:
        print_table(header, rows)
    totals = {m: total(drift[m]) for m in sizes}
    smallest, largest = sizes[0], sizes[-1]
    values = dict(
        small=smallest,
        large=largest,
        batch=batch,
        small_total=totals[smallest],
        large_total=totals[largest],
        times=f"{totals[smallest] / totals[largest]:.1f}",
    )
    if totals[smallest] > totals[largest]:
        finding = _(
            "Micro-batches of {small} stray {times} times as far from the statistics of the whole batch of "
            "{batch} as micro-batches of {large} ({small_total:.3f} against {large_total:.3f}, summed over "
            "layers)."
        )
    else:
        finding = _(
            "Micro-batches of {small} stray no further from the statistics of the whole batch of {batch} than "
            "micro-batches of {large} ({small_total:.3f} against {large_total:.3f}, summed over layers)."
        )
    print(finding.format(**values))
    parts = {"mean": _("mean"), "variance": _("variance")}
    series = {
        _("layer {layer}: {part}").format(layer=layer, part=name): (
            sizes,
            [getattr(next(d for d in drift[m] if d.layer == layer), part) for m in sizes],
        )
        for layer in layers
        for part, name in parts.items()
    }
    title = (
        _(
            "Micro-batches of {small} stray {times} times as far from the batch's statistics as micro-batches of "
            "{large}"
        ).format(**values)
        if totals[smallest] > totals[largest]
        else finding.format(**values)
    )
    alt = _(
        "Lines, log scale: the deviation of each micro-batch's BatchNorm mean and variance from those of the whole "
        "batch of {batch}, per layer, at micro-batch sizes {sizes}: summed over layers {totals}."
    ).format(batch=batch, sizes=", ".join(map(str, sizes)), totals=", ".join(f"{totals[m]:.3f}" for m in sizes))
    figure(
        plots.lines(
            series,
            _("micro-batch size (samples)"),
            _("deviation from the whole batch (relative)"),
            title,
            alt,
            logy=True,
        )
    )
    return totals


def gradient_gaps(
    gaps: dict[str, float], micro_batch_size: int, accum_steps: int, gradient_size: float, precision: str = "float32"
) -> dict[str, bool]:
    """For each model (label -> `accumlib.gradient_gap` over accum_steps micro-batches of micro_batch_size): is the
    accumulated gradient the full batch's up to rounding in `precision` (`ROUNDING`)? gradient_size, the largest
    entry of the full batch's gradient (`batchnorm_lab.gradient_size`), gives the scale. Prints one line each."""
    rounding = ROUNDING[precision]
    exact = {}
    print(
        _(
            "Largest difference between the gradient of {accum_steps} accumulated micro-batches of {micro} and the "
            "gradient of one batch of {batch}, whose largest entry is {size:.3f}:"
        ).format(
            accum_steps=accum_steps, micro=micro_batch_size, batch=micro_batch_size * accum_steps, size=gradient_size
        )
    )
    for label, gap in gaps.items():
        exact[label] = gap < rounding
        if exact[label]:
            print(
                "  "
                + _("{label}: below {rounding:.0e}: accumulation is exact up to {precision} rounding.").format(
                    label=label, rounding=rounding, precision=precision
                )
            )
        else:
            print(
                "  "
                + _("{label}: {gap:.3f}, {share:.0%} of the largest entry: accumulation is not exact.").format(
                    label=label, gap=gap, share=gap / gradient_size
                )
            )
    return exact


# Digits that hold on every CPU (measured under ATEN_CPU_CAPABILITY=default and avx512, float64): the starting
# weights differ in their last float32 bit between CPUs, which moves the BatchNorm runs' held-out losses by at most
# 2e-5 and the GroupNorm run's by about 1e-3; an accuracy moves by one digit (0.13%) in the 2 × 32 run.
BATCHNORM_LOSS, GROUPNORM_LOSS = 3, 2


def _loss(evaluation, digits: int) -> list[str]:
    statistics = f"{evaluation.statistics_error_total:.3f}" if evaluation.statistics_error else _("none kept")
    return [statistics, f"{evaluation.loss:.{digits}f}", f"{evaluation.accuracy:.0%}"]


@dataclass(frozen=True)
class MicroBatchFindings:
    """What `micro_batches` found, as the sentences it printed say it."""

    noisiest_smallest: bool  # the smallest micro-batch's settled statistics are the furthest from the held-out data's
    loss_falls_with_size: bool  # re-estimated, the held-out loss never rises as the micro-batch grows
    reestimate_kept_weights: bool  # re-estimating changed no weight
    reestimate_helped: list[int]  # micro-batch sizes whose held-out loss re-estimating lowered
    groupnorm_exact: bool  # GroupNorm's two splits trained the same weights up to rounding
    best: str  # the row with the lowest held-out loss


def micro_batches(result: MicroBatchComparison, precision: str = "float64") -> MicroBatchFindings:
    """BatchNorm trained at one effective batch in micro-batches of each size, GroupNorm beside it
    (`batchnorm_lab.compare_micro_batches`): the confound held equal, a table, and one finding per question."""
    if not isinstance(result, MicroBatchComparison):
        raise TypeError(
            _("result must be a MicroBatchComparison (batchnorm_lab.compare_micro_batches), got {kind}").format(
                kind=type(result).__name__
            )
        )
    rounding = ROUNDING[precision]
    bn, gn = result.batchnorm, result.groupnorm
    print(
        _(
            "Every run: an effective batch of {batch}, {steps} optimizer steps ({epochs} epochs), the same samples "
            "in the same order."
        ).format(batch=result.effective_batch, steps=result.optimizer_steps, epochs=result.epochs)
    )
    print(
        _(
            "Training updated the running statistics once per micro-batch: {counts}. Compared as training left them, "
            "the runs would differ in their number of updates too."
        ).format(
            counts=", ".join(
                _("{updates} times at {split}").format(
                    updates=f"{o.training_updates:,}", split=split(o.micro_batch_size, o.accum_steps)
                )
                for o in bn
            )
        )
    )
    print(
        _(
            "Held equal: each model's running statistics collected anew, weights fixed, from {updates} micro-batches "
            "of its own size; after {updates} updates a running average has moved {moved:.3%} of the way, so every "
            "one has settled."
        ).format(updates=result.updates, moved=result.settled_fraction)
    )
    print()
    rows = [
        [
            _("BatchNorm, {split}").format(split=split(o.micro_batch_size, o.accum_steps)),
            *_loss(o.settled, BATCHNORM_LOSS),
            *_loss(o.reestimated, BATCHNORM_LOSS),
        ]
        for o in bn
    ]
    rows += [
        [
            _("GroupNorm, {split}").format(split=split(o.micro_batch_size, o.accum_steps)),
            *_loss(o.settled, GROUPNORM_LOSS),
            "",
            "",
            "",
        ]
        for o in gn
    ]
    print(
        _(
            "On the held-out digits, in eval mode. Left: the running statistics from the model's own "
            "micro-batches; right: re-estimated on all the training digits."
        )
    )
    print_table(
        [
            _("model, micro-batch × accum_steps"),
            _("statistics error"),
            _("loss"),
            _("accuracy"),
            _("re-estimated: statistics error"),
            _("loss"),
            _("accuracy"),
        ],
        rows,
    )
    print()
    smallest, largest = bn[0], bn[-1]
    errors = [o.settled.statistics_error_total for o in bn]
    noisiest = errors[0] == max(errors)
    values = dict(
        small=smallest.micro_batch_size, large=largest.micro_batch_size, small_error=errors[0], large_error=errors[-1]
    )
    if noisiest:
        print(
            _(
                "Noise: after the same number of updates, the running statistics from micro-batches of {small} are "
                "the furthest from those of the held-out digits: error {small_error:.3f}, against {large_error:.3f} "
                "from micro-batches of {large}."
            ).format(**values)
        )
    else:
        print(
            _(
                "Noise: after the same number of updates, the running statistics from micro-batches of {small} are "
                "not the furthest from those of the held-out digits: error {small_error:.3f}, against "
                "{large_error:.3f} from micro-batches of {large}."
            ).format(**values)
        )
    losses = [o.reestimated.loss for o in bn]
    falls = all(a >= b for a, b in itertools.pairwise(losses))
    path = " → ".join(f"{o.reestimated.loss:.3f} ({o.micro_batch_size})" for o in bn)
    if falls:
        print(
            _(
                "Weights: re-estimated on the same training digits, the held-out loss still falls as the micro-batch "
                "grows: {path}. What is left is the weights, trained with the micro-batch's statistics."
            ).format(path=path)
        )
    else:
        print(
            _(
                "Weights: re-estimated on the same training digits, the held-out loss does not fall steadily as the "
                "micro-batch grows: {path}."
            ).format(path=path)
        )
    helped = [o.micro_batch_size for o in bn if o.reestimated.loss < o.settled.loss]
    kept = result.reestimate_weight_change == 0
    if kept:
        print(
            _(
                "Re-estimating changed no weight; it lowered the held-out loss at micro-batch sizes {helped} of "
                "{sizes}."
            ).format(
                helped=", ".join(map(str, helped)) or _("none"), sizes=", ".join(str(o.micro_batch_size) for o in bn)
            )
        )
    else:
        print(
            _(
                "Re-estimating changed weights by up to {change:.2g}: it should change only the running statistics."
            ).format(change=result.reestimate_weight_change)
        )
    exact = all(o.weight_gap < rounding for o in gn)
    if exact:
        print(
            _(
                "GroupNorm: {splits} trained the same weights (largest difference below {rounding:.0e}): accumulation "
                "is exact. Its held-out loss is {loss:.2f}."
            ).format(
                splits=_(" and ").join(split(o.micro_batch_size, o.accum_steps) for o in gn),
                rounding=rounding,
                loss=gn[-1].settled.loss,
            )
        )
    else:
        print(
            _("GroupNorm: {splits} trained weights that differ by up to {gap:.2g}.").format(
                splits=_(" and ").join(split(o.micro_batch_size, o.accum_steps) for o in gn),
                gap=max(o.weight_gap for o in gn),
            )
        )
    candidates = {
        _("BatchNorm, {split}").format(split=split(o.micro_batch_size, o.accum_steps)): (o.settled.loss, BATCHNORM_LOSS)
        for o in bn
    }
    candidates.update(
        {
            _("BatchNorm, {split}, re-estimated").format(split=split(o.micro_batch_size, o.accum_steps)): (
                o.reestimated.loss,
                BATCHNORM_LOSS,
            )
            for o in bn
        }
    )
    candidates.update(
        {
            _("GroupNorm, {split}").format(split=split(o.micro_batch_size, o.accum_steps)): (
                o.settled.loss,
                GROUPNORM_LOSS,
            )
            for o in gn
        }
    )
    best = min(candidates, key=lambda name: candidates[name][0])
    loss, digits = candidates[best]
    print(_("Lowest held-out loss: {best}, {loss}.").format(best=best, loss=f"{loss:.{digits}f}"))
    return MicroBatchFindings(noisiest, falls, kept, helped, exact, best)


@dataclass(frozen=True)
class SeedDifference:
    """One quantity of two micro-batch sizes compared seed by seed (`over_seeds`)."""

    quantity: str  # "statistics error" or "re-estimated loss"
    smaller: int  # the smaller micro-batch size
    larger: int
    mean: float  # mean over seeds of (value at `smaller`) - (value at `larger`)
    spread: float  # the standard deviation of those differences over the seeds
    same_sign: bool  # every seed's difference has the sign of the mean (and none is 0): a finding, not noise


def _mean_spread(values: list[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return t.mean().item(), (t.std().item() if len(values) > 1 else 0.0)


def over_seeds(results: dict, precision: str = "float64") -> list[SeedDifference]:
    """`compare_micro_batches` repeated with several seeds (the model's starting weights; results: seed -> its
    MicroBatchComparison, the same sizes in each): mean ± standard deviation per micro-batch size, then each pair
    of neighbouring sizes, and the smallest against the largest, compared seed by seed: a difference is a finding
    only when it has the same sign in every seed. Returns the comparisons."""
    if (
        not isinstance(results, dict)
        or len(results) < 2
        or not all(isinstance(r, MicroBatchComparison) for r in results.values())
    ):
        raise TypeError(
            _(
                "results must be a dict of two or more seeds -> MicroBatchComparison "
                "(batchnorm_lab.compare_micro_batches), got {results!r:.200}"
            ).format(results=results)
        )
    runs = list(results.values())
    sizes = [o.micro_batch_size for o in runs[0].batchnorm]
    if any([o.micro_batch_size for o in r.batchnorm] != sizes for r in runs):
        raise ValueError(
            _("results: every seed must compare the same micro-batch sizes; the first has {sizes}").format(sizes=sizes)
        )
    steps = {o.micro_batch_size: o.accum_steps for o in runs[0].batchnorm}
    values = {
        "statistics error": {
            m: [next(o for o in r.batchnorm if o.micro_batch_size == m).settled.statistics_error_total for r in runs]
            for m in sizes
        },
        "re-estimated loss": {
            m: [next(o for o in r.batchnorm if o.micro_batch_size == m).reestimated.loss for r in runs] for m in sizes
        },
    }
    names = {"statistics error": _("statistics error"), "re-estimated loss": _("re-estimated loss")}
    print(
        _(
            "BatchNorm over {n} seeds (the models' starting weights: {seeds}), on the held-out digits: mean ± "
            "standard deviation."
        ).format(n=len(runs), seeds=", ".join(map(str, results)))
    )
    rows = []
    for m in sizes:
        cells = [split(m, steps[m])]
        for quantity in values:
            mean, spread = _mean_spread(values[quantity][m])
            cells.append(f"{mean:.3f} ± {spread:.3f}")
        rows.append(cells)
    print_table([_("micro-batch × accum_steps"), names["statistics error"], names["re-estimated loss"]], rows)
    pairs = list(itertools.pairwise(sizes))
    if (sizes[0], sizes[-1]) not in pairs:
        pairs.append((sizes[0], sizes[-1]))
    found = []
    for quantity in values:
        for small, large in pairs:
            differences = [a - b for a, b in zip(values[quantity][small], values[quantity][large], strict=True)]
            mean, spread = _mean_spread(differences)
            same = all(d > 0 for d in differences) or all(d < 0 for d in differences)
            found.append(SeedDifference(quantity, small, large, mean, spread, same))
            words = {
                "quantity": names[quantity],
                "small": split(small, steps[small]),
                "large": split(large, steps[large]),
                "mean": f"{mean:+.3f}",
                "spread": f"{spread:.3f}",
                "n": len(runs),
            }
            if same:
                print(
                    _(
                        "{quantity}, {small} minus {large}: {mean} ± {spread}, the same sign in all {n} seeds: "
                        "{small} is {direction}."
                    ).format(direction=_("higher") if mean > 0 else _("lower"), **words)
                )
            else:
                print(
                    _(
                        "{quantity}, {small} minus {large}: {mean} ± {spread}, the sign changes between seeds: no "
                        "finding, the difference is within the seeds' spread."
                    ).format(**words)
                )
    return found


def skipped_cycle(skipped: bool, before: dict[str, tuple], after: dict[str, tuple]) -> bool:
    """A cycle `accumlib.accumulate_and_step` skipped (a NaN): are the BatchNorm running statistics as they were
    before it? before/after: layer -> (running_mean, running_var), copies taken around the call. Returns it."""
    kept = before.keys() == after.keys() and all(
        torch.equal(a, b) for layer in before for a, b in zip(before[layer], after[layer], strict=True)
    )
    if not skipped:
        print(_("The cycle was not skipped: its loss and gradient were finite."))
    elif kept:
        print(
            _(
                "The cycle was skipped (its loss is NaN), and the running statistics of every BatchNorm layer are "
                "exactly as before it."
            )
        )
    else:
        print(_("The cycle was skipped (its loss is NaN), but the running statistics changed."))
    return skipped and kept
