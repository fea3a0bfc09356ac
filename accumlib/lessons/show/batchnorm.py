"""Lesson 7 (watch BatchNorm): what BatchNorm sees in a micro-batch, why accumulation stops being exact, why two
runs' running statistics differ, and what each remedy fixes on held-out data (`accumlib.batchnorm`).

Deviations are relative (a mean's difference over the reference's standard deviation, a variance's difference
over the reference variance, averaged over channels); `batchnorm.total` adds a layer list's mean and variance parts.
Everything printed is computed from the results passed in. They come from float32 training, which another CPU
(AVX-512, AVX2 or neither), thread count or device moves in the third or fourth digit: values print to two
significant digits (`_format.measured`), verdicts compare the unrounded values.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import plots
from ...batchnorm import DivergenceCauses, LayerDeviation, Outcome, Remedies, RunningAverageMove, total
from ...i18n import _, ngettext
from ._format import figure, measured, table
from .memory import split

ROUNDING = 1e-5  # largest gradient difference float32 rounding explains for the lessons' CNN (measured: ~1e-6)


def _layer_names(deviations: list[LayerDeviation]) -> list[str]:
    return [d.layer for d in deviations]


def deviation(drift: dict[int, list[LayerDeviation]], batch: int) -> dict[int, float]:
    """How far each micro-batch size's BatchNorm statistics stray from those of the whole batch of `batch` samples
    (`batchnorm.micro_batch_deviation` per size): a table per layer, the finding, a figure; returns the totals."""
    if len(drift) < 2 or not all(isinstance(v, list) and v and all(isinstance(d, LayerDeviation) for d in v)
                                 for v in drift.values()):
        raise TypeError("drift must map two or more micro-batch sizes to batchnorm.micro_batch_deviation results")
    sizes = sorted(drift)
    layers = _layer_names(drift[sizes[0]])
    header = [_("micro-batch")]
    for layer in layers:
        header += [_("layer {layer}: mean").format(layer=layer), _("layer {layer}: variance").format(layer=layer)]
    rows = [[str(m), *(measured(value) for d in drift[m] for value in (d.mean, d.variance))] for m in sizes]
    print(table(header, rows))
    totals = {m: total(drift[m]) for m in sizes}
    smallest, largest = sizes[0], sizes[-1]
    values = dict(small=smallest, large=largest, batch=batch, small_total=measured(totals[smallest]),
                  large_total=measured(totals[largest]), times=f"{totals[smallest] / totals[largest]:.1f}")
    if totals[smallest] > totals[largest]:
        finding = _("Micro-batches of {small} stray {times} times as far from the statistics of the whole batch of "
                    "{batch} as micro-batches of {large} ({small_total} against {large_total}, summed over "
                    "layers).")
    else:
        finding = _("Micro-batches of {small} stray no further from the statistics of the whole batch of {batch} than "
                    "micro-batches of {large} ({small_total} against {large_total}, summed over layers).")
    print(finding.format(**values))
    parts = {"mean": _("mean"), "variance": _("variance")}
    series = {_("layer {layer}: {part}").format(layer=layer, part=name): (
        sizes, [getattr(next(d for d in drift[m] if d.layer == layer), part) for m in sizes])
        for layer in layers for part, name in parts.items()}
    title = _("Micro-batches of {small} stray {times} times as far from the batch's statistics as micro-batches of "
              "{large}").format(**values) if totals[smallest] > totals[largest] else finding.format(**values)
    alt = _("Lines, log scale: the deviation of each micro-batch's BatchNorm mean and variance from those of the whole "
            "batch of {batch}, per layer, at micro-batch sizes {sizes}: summed over layers {totals}.").format(
        batch=batch, sizes=", ".join(map(str, sizes)), totals=", ".join(measured(totals[m]) for m in sizes))
    figure(plots.lines(series, _("micro-batch size (samples)"), _("deviation from the whole batch (relative)"), title,
                       alt, logy=True))
    return totals


def gradient_gaps(gaps: dict[str, float], micro_batch_size: int, accum_steps: int) -> dict[str, bool]:
    """For each model (label -> `accumlib.gradient_gap` over accum_steps micro-batches of micro_batch_size): is the
    accumulated gradient the full batch's up to float32 rounding (`ROUNDING`)? Prints one line each; returns it."""
    exact = {}
    print(_("Largest difference between the gradient of {accum_steps} accumulated micro-batches of {micro} and the "
            "gradient of one batch of {batch}:").format(accum_steps=accum_steps, micro=micro_batch_size,
                                                        batch=micro_batch_size * accum_steps))
    for label, gap in gaps.items():
        exact[label] = gap < ROUNDING
        if exact[label]:
            print("  " + _("{label}: below {rounding:.0e}: accumulation is exact up to float32 rounding.").format(
                label=label, rounding=ROUNDING))
        else:
            print("  " + _("{label}: {gap}: accumulation is not exact.").format(label=label, gap=measured(gap)))
    return exact


def _moved_line(moves: list[RunningAverageMove]) -> str:
    move = moves[0]  # every layer of the lessons' CNN has the default momentum
    momentum = _("momentum {momentum}").format(momentum=move.momentum) if move.momentum is not None else \
        _("momentum None (a plain average)")
    return ngettext("after {updates} update at {momentum}, a running average has moved {moved:.1%} of the way from "
                    "its starting value to the statistics it is fed ({remaining:.1%} of the start remains)",
                    "after {updates} updates at {momentum}, a running average has moved {moved:.1%} of the way from "
                    "its starting value to the statistics it is fed ({remaining:.1%} of the start remains)",
                    move.updates).format(updates=move.updates, momentum=momentum, moved=move.moved,
                                         remaining=move.remaining)


def causes(result: DivergenceCauses, moved: dict[int, list[RunningAverageMove]]) -> str:
    """Why the running statistics of the (m, k) run and of the one-batch run differ (`batchnorm.divergence_causes`),
    cause by cause, with how far a running average moves in each run's number of updates
    (`batchnorm.running_average_moved`, keyed by updates). Returns the name of the largest cause."""
    if not isinstance(result, DivergenceCauses):
        raise TypeError(f"result must be a DivergenceCauses (batchnorm.divergence_causes), got {type(result).__name__}")
    for updates in (result.updates_one_batch, result.updates_accumulated):
        if updates not in moved:
            raise ValueError(f"moved must hold batchnorm.running_average_moved(model, {updates}) under the key "
                             f"{updates} (the updates of one of the two runs); it has {sorted(moved)}")
    m, k = result.micro_batch_size, result.accum_steps
    runs = dict(accumulated=split(m, k), one=split(m * k, 1), updates_accumulated=result.updates_accumulated,
                updates_one=result.updates_one_batch)
    print(_("Running-statistic updates per BatchNorm layer: {updates_accumulated} in the {accumulated} run (one per "
            "micro-batch), {updates_one} in the {one} run.").format(**runs))
    links = {"noise": (_("the noise: micro-batches of {m} instead of the whole cycle").format(m=m),
                       _("the noise of micro-batch statistics"), result.noise),
             "update_count": (_("the updates: {updates_accumulated} instead of {updates_one}").format(**runs),
                              _("the number of updates"), result.update_count),
             "weights": (_("the weights: each run's own"), _("the different weights"), result.weights)}
    totals = {name: total(deviations) for name, (_row_label, _name, deviations) in links.items()}
    everything = total(result.total_divergence)
    rows = [[_("all causes together"), measured(everything)]]
    rows += [[row_label, measured(totals[name])] for name, (row_label, _name, _deviations) in links.items()]
    print(table([_("difference between the two runs' running statistics"), _("relative, summed over layers")], rows))
    largest = max(totals, key=totals.get)
    values = dict(cause=links[largest][1], value=measured(totals[largest]), total=measured(everything))
    if totals[largest] >= 0.9 * everything and all(v <= 0.1 * totals[largest] for n, v in totals.items()
                                                   if n != largest):
        print(_("Of the three, {cause} alone makes about as large a difference as all causes together: {value}, "
                "against {total}; the other two barely matter.").format(**values))
    else:
        print(_("The largest cause is {cause}: {value}, against {total} for all causes together.").format(
            **values))
    print(_("In the {one} run, {line}.").format(one=runs["one"], line=_moved_line(moved[result.updates_one_batch])))
    print(_("In the {accumulated} run, {line}.").format(accumulated=runs["accumulated"],
                                                       line=_moved_line(moved[result.updates_accumulated])))
    return largest


def _row(label: str, outcome: Outcome) -> list[str]:
    evaluation = outcome.evaluation
    accuracy = "" if evaluation.accuracy is None else f"{evaluation.accuracy:.0%}"
    statistics = measured(evaluation.statistics_error_total) if evaluation.statistics_error else _("none kept")
    gap = f"{outcome.weight_gap:.2g}" if outcome.weight_gap == 0 or outcome.weight_gap >= ROUNDING else \
        f"< {ROUNDING:.0e}"  # float32 rounding: its digits depend on the machine, not on the method
    return [label, gap, measured(evaluation.loss), accuracy, statistics]


@dataclass(frozen=True)
class RemedyFindings:
    """What `remedies` found, as the sentences it printed say it."""

    reestimate_kept_weights: bool  # re-estimating changed no weight
    reestimate_lowered_error: bool  # ... and lowered both BatchNorm runs' held-out statistics error
    groupnorm_exact: bool  # GroupNorm's two splits trained the same weights up to float32 rounding
    groupnorm_higher_loss: bool  # GroupNorm's held-out loss is above re-estimated BatchNorm's (accumulated run)


def remedies(result: Remedies) -> RemedyFindings:
    """What re-estimating the running statistics and what GroupNorm fix, measured on held-out data
    (`batchnorm.compare_remedies`): a table of every trained model, then one finding per remedy."""
    if not isinstance(result, Remedies):
        raise TypeError(f"result must be a Remedies (batchnorm.compare_remedies), got {type(result).__name__}")
    m, k = result.micro_batch_size, result.accum_steps
    runs = dict(accumulated=split(m, k), one=split(m * k, 1))
    rows = [_row(_("BatchNorm, {one}").format(**runs), result.batchnorm_one_batch),
            _row(_("BatchNorm, {accumulated}").format(**runs), result.batchnorm_accumulated),
            _row(_("BatchNorm, {one}, re-estimated").format(**runs), result.batchnorm_one_batch_reestimated),
            _row(_("BatchNorm, {accumulated}, re-estimated").format(**runs), result.batchnorm_reestimated),
            _row(_("GroupNorm, {one}").format(**runs), result.groupnorm_one_batch),
            _row(_("GroupNorm, {accumulated}").format(**runs), result.groupnorm_accumulated)]
    print(table([_("model, micro-batch × accum_steps"), _("weights: largest difference from {one}").format(**runs),
                 _("held-out loss"), _("held-out accuracy"), _("statistics error")], rows))
    print()
    accumulated, reestimated = result.batchnorm_accumulated, result.batchnorm_reestimated
    one, one_reestimated = result.batchnorm_one_batch, result.batchnorm_one_batch_reestimated
    lowered = all(after.evaluation.statistics_error_total < before.evaluation.statistics_error_total
                  for before, after in ((accumulated, reestimated), (one, one_reestimated)))
    if result.reestimate_weight_change == 0 and lowered:
        print(_("Re-estimating changed no weight. It replaced the running statistics that eval mode uses: on held-out "
                "data their error went from {before} to {after} and the loss from {loss_before} to "
                "{loss_after} ({accumulated}); from {one_before} to {one_after} and from "
                "{one_loss_before} to {one_loss_after} ({one}). The two BatchNorm runs still differ in their "
                "weights, by up to {gap:.2g}.").format(
            before=measured(accumulated.evaluation.statistics_error_total), after=measured(reestimated.evaluation.statistics_error_total),
            loss_before=measured(accumulated.evaluation.loss), loss_after=measured(reestimated.evaluation.loss),
            one_before=measured(one.evaluation.statistics_error_total),
            one_after=measured(one_reestimated.evaluation.statistics_error_total),
            one_loss_before=measured(one.evaluation.loss), one_loss_after=measured(one_reestimated.evaluation.loss),
            gap=reestimated.weight_gap, **runs))
    elif result.reestimate_weight_change == 0:
        print(_("Re-estimating changed no weight, but it did not lower the held-out statistics error of both "
                "BatchNorm runs."))
    else:
        print(_("Re-estimating changed weights by up to {change:.2g}: it should change only the running "
                "statistics.").format(change=result.reestimate_weight_change))
    grouped = result.groupnorm_accumulated
    if grouped.weight_gap < ROUNDING:
        print(_("GroupNorm: {accumulated} and {one} trained the same weights (largest difference below {rounding:.0e}, "
                "float32 rounding), and it keeps no running statistics: eval mode computes what training "
                "computed.").format(rounding=ROUNDING, **runs))
    else:
        print(_("GroupNorm: {accumulated} and {one} trained weights that differ by up to {gap:.2g}.").format(
            gap=grouped.weight_gap, **runs))
    values = dict(grouped=measured(grouped.evaluation.loss), batchnorm=measured(reestimated.evaluation.loss), **runs)  # both accumulated
    if grouped.evaluation.loss > reestimated.evaluation.loss:
        print(_("GroupNorm makes accumulation exact, not the model better: here its held-out loss, {grouped}, is "
                "higher than re-estimated BatchNorm's, {batchnorm} (both {accumulated}). A different normalisation "
                "is a different model: check it on held-out data.").format(**values))
    else:
        print(_("Here GroupNorm's held-out loss, {grouped}, is not higher than re-estimated BatchNorm's, "
                "{batchnorm} (both {accumulated}). A different normalisation is a different model: check it on "
                "held-out data.").format(**values))
    return RemedyFindings(result.reestimate_weight_change == 0, lowered, grouped.weight_gap < ROUNDING,
                          grouped.evaluation.loss > reestimated.evaluation.loss)
