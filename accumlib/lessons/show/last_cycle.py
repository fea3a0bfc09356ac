"""Lesson 4, the last cycle and fair weights: the weight each micro-batch's loss gets, what classic loops do with a
short last cycle against training with one batch per cycle, and why tokens must be counted over the whole cycle."""

from __future__ import annotations

from fractions import Fraction
from typing import Mapping, Sequence

import torch

from .. import data
from ...i18n import N_, _, ngettext
from ...gaps import parameter_gap
from ...records import History
from ..pitfalls import LAST_CYCLE_CHOICES, ClassicStep, loss_weights
from ._format import FLOAT64_ROUNDING as ROUNDING, listing, print_table, rounding_or_gap


def _fraction(weight: float) -> str:
    """A loss weight as a short fraction ("1/3", "1"), as a person would write it."""
    return str(Fraction(weight).limit_denominator(1000))


def weights(sizes: Sequence[int], accum_steps: int) -> list[list[int]]:
    """The cycles an epoch of micro-batches (samples per micro-batch, in order) makes, and the weight each
    micro-batch's mean loss gets: loss / accum_steps (the six-line loop) against its share of the cycle's samples
    (`pitfalls.loss_weights`, as accumlib.train weights them). Prints the first full cycle and the last one, and what
    the last one's weight means. Returns the cycles as lists of micro-batch sizes."""
    sizes = list(sizes)
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(
            _("sizes must list the samples of each micro-batch (whole numbers >= 1), got {sizes}").format(sizes=sizes)
        )
    cycles = [sizes[first : first + accum_steps] for first in range(0, len(sizes), accum_steps)]
    classic = loss_weights(sizes, accum_steps, "divide-by-steps", divide=True)
    weighted = loss_weights(sizes, accum_steps, "weighted", divide=True)
    print(
        ngettext(
            "{samples} samples in micro-batches of at most {largest}: {micro} micro-batch.",
            "{samples} samples in micro-batches of at most {largest}: {micro} micro-batches.",
            len(sizes),
        ).format(samples=sum(sizes), largest=max(sizes), micro=len(sizes)),
        ngettext(
            "They make {cycles} cycle of up to {accum_steps} micro-batches.",
            "They make {cycles} cycles of up to {accum_steps} micro-batches.",
            len(cycles),
        ).format(cycles=len(cycles), accum_steps=accum_steps),
    )
    shown = [0, len(cycles) - 1] if len(cycles) > 1 else [0]
    rows = []
    for c in shown:
        first = c * accum_steps
        rows.append(
            [
                c + 1,
                len(cycles[c]),
                sum(cycles[c]),
                ", ".join(_fraction(w) for w in classic[first : first + len(cycles[c])]),
                ", ".join(_fraction(w) for w in weighted[first : first + len(cycles[c])]),
            ]
        )
    print_table(
        [
            _("cycle"),
            _("micro-batches"),
            _("samples"),
            _("weights, loss / accum_steps"),
            _("weights, share of the cycle's samples"),
        ],
        rows,
    )
    last, last_first = cycles[-1], (len(cycles) - 1) * accum_steps
    if len(last) < accum_steps:
        print(
            _(
                "The last cycle holds {samples} samples. Divided by accum_steps, its step gets {classic:.0%} of the "
                "gradient one batch of those {samples} samples gives; weighted by their samples, "
                "{weighted:.0%}."
            ).format(samples=sum(last), classic=sum(classic[last_first:]), weighted=sum(weighted[last_first:]))
        )
    else:
        print(_("Every cycle is full: both ways weight each micro-batch the same."))
    return cycles


def last_cycles(
    runs: Mapping[str, tuple[torch.nn.Module, Sequence[ClassicStep]]],
    reference: torch.nn.Module,
    library: tuple[torch.nn.Module, History],
) -> dict[str, float]:
    """What each treatment of the short last cycle did, against the reference (one batch per cycle's samples).

    runs: `pitfalls.classic_train`'s last_cycle value -> (the trained model, the ClassicStep records its on_step
    received); library: accumlib.train's model and History on the same data. Prints the optimizer steps, the
    micro-batches the steps held and the largest weight difference from the reference, then which match it.
    Returns name -> weight difference ("accumlib.train" for the library's run)."""
    unknown = sorted(set(runs) - set(LAST_CYCLE_CHOICES))
    if unknown:
        raise ValueError(
            _("runs: unknown last_cycle values {unknown}; valid: {valid}").format(
                unknown=unknown, valid=", ".join(LAST_CYCLE_CHOICES)
            )
        )
    held = {name: [step.micro_batches for step in steps] for name, (_model, steps) in runs.items()}
    gaps = {name: parameter_gap(model, reference) for name, (model, _steps) in runs.items()}
    model, history = library
    held["accumlib.train"] = [record.micro_batches for record in history]
    gaps["accumlib.train"] = parameter_gap(model, reference)
    print_table(
        [
            _("last cycle"),
            _("optimizer steps"),
            _("micro-batches per step"),
            _("weight difference from one batch per cycle"),
        ],
        [
            [name, len(held[name]), ", ".join(map(str, sorted(set(held[name])))), rounding_or_gap(gaps[name], ROUNDING)]
            for name in held
        ],
    )
    exact = [name for name in held if gaps[name] <= ROUNDING]
    others = [gaps[name] for name in held if name not in exact]
    if not exact:
        print(_("None of them gives the weights of training with one batch per cycle."))
    elif not others:
        print(_("Every one of them gives the weights of training with one batch per cycle, up to rounding."))
    else:
        print(
            _(
                "Only {exact} give the weights of training with one batch per cycle, up to rounding (at most "
                "{gap:.1e}); the others are off by {smallest:.1e} to {largest:.1e}."
            ).format(exact=listing(exact), gap=ROUNDING, smallest=min(others), largest=max(others))
        )
    return gaps


def token_weights(targets: torch.Tensor, micro_batch_size: int, accum_steps: int) -> dict[str, list[float]]:
    """The weight one token's loss gets in the first cycle of `targets` (sequences in order, padding = data.PAD):
    averaging each micro-batch's mean over its own tokens, weighted by its share of the sequences, against dividing
    the sum over all tokens by the cycle's token count. Prints a table and the largest ratio between two tokens'
    weights. Returns both weightings per micro-batch."""
    cycle = targets[: micro_batch_size * accum_steps]
    micro = cycle.split(micro_batch_size)
    counts = [int(data.count_tokens(part)) for part in micro]  # read to print
    if 0 in counts:
        raise ValueError(
            _("targets: a micro-batch of the first cycle has no token (tokens per micro-batch: {counts})").format(
                counts=counts
            )
        )
    total = sum(counts)
    by_mean = [len(part) / len(cycle) / n for part, n in zip(micro, counts, strict=True)]
    by_count = [1 / total] * len(micro)
    print_table(
        [
            _("micro-batch"),
            _("tokens"),
            _("weight of a token, mean of means"),
            _("weight of a token, by the cycle's tokens"),
        ],
        [[i + 1, n, f"{a:.4f}", f"{b:.4f}"] for i, (n, a, b) in enumerate(zip(counts, by_mean, by_count, strict=True))],
    )
    most, least = counts.index(max(counts)), counts.index(min(counts))
    print(
        _(
            "Averaging means, a token of micro-batch {few_at} ({few} tokens) weighs {ratio:.1f} times as much as one "
            "of micro-batch {many_at} ({many} tokens). Counted over the cycle's {total} tokens, every token weighs the "
            "same: 1/{total}."
        ).format(
            few_at=least + 1,
            few=counts[least],
            ratio=by_mean[least] / by_mean[most],
            many_at=most + 1,
            many=counts[most],
            total=total,
        )
    )
    return {"mean": by_mean, "count": by_count}


# how a sequence run normalised its loss, as the token table names it
TOKEN_RUNS = {"mean": N_("mean of micro-batch means"), "count": N_("sum / tokens in the cycle")}


def tokens(runs: Mapping[str, torch.nn.Module], reference: torch.nn.Module) -> dict[str, float]:
    """Sequence models trained with accumulation, against the reference trained with one batch per cycle and the
    loss divided by the cycle's tokens: runs is "mean" (each micro-batch's mean over its own tokens) and/or "count"
    (sum-reduced loss, normalize="count") -> the trained model. Prints the weight differences; returns them."""
    unknown = sorted(set(runs) - set(TOKEN_RUNS))
    if unknown:
        raise ValueError(
            _("runs: unknown normalisations {unknown}; valid: {valid}").format(
                unknown=unknown, valid=", ".join(TOKEN_RUNS)
            )
        )
    gaps = {name: parameter_gap(model, reference) for name, model in runs.items()}
    print_table(
        [_("loss"), _("weight difference from one batch per cycle")],
        [[_(TOKEN_RUNS[name]), rounding_or_gap(gap, ROUNDING)] for name, gap in gaps.items()],
    )
    for name, gap in gaps.items():
        if gap <= ROUNDING:
            print(
                _("{loss}: the weights of one batch per cycle, up to rounding (at most {gap:.1e}).").format(
                    loss=_(TOKEN_RUNS[name]), gap=ROUNDING
                )
            )
        else:
            print(_("{loss}: off by up to {gap:.1e}.").format(loss=_(TOKEN_RUNS[name]), gap=gap))
    return gaps
