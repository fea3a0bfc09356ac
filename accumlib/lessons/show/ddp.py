"""Lesson 9: accumulation across processes. The effective batch of a DDP run, a progress bar for the DDP job, the
all-reduces of every optimizer step with and without `no_sync()`, and the weights against one process.

The runs themselves are `accumlib.lessons.ddp_lab`'s (`compare_no_sync`): these functions only print what they did.
"""

from __future__ import annotations

import ipywidgets as w
from IPython.display import display

from ...i18n import _, ngettext
from ...gaps import parameter_gap
from .._view import view_bundle
from ._format import FLOAT64_ROUNDING, print_table
from .memory import category_name


def effective_batch(*, micro_batch_size: int, accum_steps: int, processes: int, samples: int) -> int:
    """Print the samples one optimizer step sees (micro_batch_size x accum_steps x processes) and how an epoch of
    `samples` splits into steps (the last one shorter when they do not divide); return the effective batch."""
    batch = micro_batch_size * accum_steps * processes
    full, rest = divmod(samples, batch)
    print(
        _(
            "Effective batch: {micro_batch_size} × {accum_steps} × {processes} = {batch} samples per optimizer step."
        ).format(micro_batch_size=micro_batch_size, accum_steps=accum_steps, processes=processes, batch=batch)
    )
    if rest:
        print(
            ngettext(
                "{samples} samples per epoch: {full} full step and a last step of {rest} samples.",
                "{samples} samples per epoch: {full} full steps and a last step of {rest} samples.",
                full,
            ).format(samples=samples, full=full, rest=rest)
        )
    else:
        print(
            ngettext(
                "{samples} samples per epoch: {full} full step.",
                "{samples} samples per epoch: {full} full steps.",
                full,
            ).format(samples=samples, full=full)
        )
    return batch


class ProgressBar:
    """`on_progress` for `ddp_lab.compare_no_sync` and friends: a bar with the job's optimizer steps, shown at
    the first report (the job reports 0 of its total steps as it starts its processes). Its text view (what nbval
    stores) is the state it was shown in, so it is the same on every run."""

    def __init__(self):
        self.bar = w.IntProgress(value=0, min=0, max=1)
        self.label = w.Label()
        self.widget = w.HBox([self.bar, self.label])
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        self.bar.max, self.bar.value = max(total, 1), done
        if done == 0:
            self.label.value = _("starting the processes…")
        elif done < total:
            self.label.value = _("optimizer step {done} of {total}").format(done=done, total=total)
        else:
            self.label.value = ngettext("done: {total} optimizer step", "done: {total} optimizer steps", total).format(
                total=total
            )
        if not self.shown:
            self.shown = True
            display(self)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = view_bundle(self.widget, include, exclude)
        bundle["text/plain"] = _("Progress of the DDP job: {state}").format(state=self.label.value)
        return bundle


def progress_bar() -> ProgressBar:
    """A progress bar to pass as `on_progress=`; it appears when the job starts."""
    return ProgressBar()


def allreduces(results: dict) -> dict[bool, tuple[int, ...]]:
    """The gradient all-reduces of every optimizer step, without and with `no_sync()`.

    results: {False: DDPResult, True: DDPResult} of the same training (`ddp_lab.compare_no_sync`). Prints one
    row per optimizer step (the micro-batches each process ran, the all-reduces of each run) and the finding.
    Returns {no_sync: all-reduces per step}.
    """
    without, with_no_sync = results[False], results[True]
    if without.micro_batches != with_no_sync.micro_batches:
        raise ValueError(
            _(
                "results: the two runs took different steps ({a} and {b} micro-batches per step): pass "
                "the results of one compare_no_sync job"
            ).format(a=without.micro_batches, b=with_no_sync.micro_batches)
        )
    print_table(
        [_("optimizer step"), _("micro-batches per process"), _("all-reduces without no_sync()"), _("with no_sync()")],
        [
            [str(step), str(micro), str(a), str(b)]
            for step, (micro, a, b) in enumerate(
                zip(without.micro_batches, without.allreduces, with_no_sync.allreduces, strict=True), 1
            )
        ],
    )
    steps = without.steps
    if without.allreduces == without.micro_batches and len(set(without.micro_batches)) > 1:
        print(
            _(
                "Without no_sync(), the backward() of every micro-batch all-reduces: as many all-reduces per step as "
                "micro-batches, {total} for {steps} steps ({mean:.1f} per step on average, since the short steps have "
                "fewer micro-batches)."
            ).format(total=without.allreduce_calls, steps=steps, mean=without.allreduce_per_step)
        )
    elif without.allreduces == without.micro_batches:
        print(
            _(
                "Without no_sync(), the backward() of every micro-batch all-reduces: as many all-reduces per step as "
                "micro-batches, {total} for {steps} steps."
            ).format(total=without.allreduce_calls, steps=steps)
        )
    else:
        print(
            _("Without no_sync(): {total} all-reduces for {steps} steps.").format(
                total=without.allreduce_calls, steps=steps
            )
        )
    if set(with_no_sync.allreduces) == {1}:
        print(
            _(
                "With no_sync(), one all-reduce per step, in the backward() of the cycle's last micro-batch: {total} "
                "for {steps} steps, {saved} fewer."
            ).format(
                total=with_no_sync.allreduce_calls,
                steps=steps,
                saved=without.allreduce_calls - with_no_sync.allreduce_calls,
            )
        )
    else:
        print(
            _("With no_sync(): {total} all-reduces for {steps} steps.").format(
                total=with_no_sync.allreduce_calls, steps=steps
            )
        )
    return {False: without.allreduces, True: with_no_sync.allreduces}


def _gaps(results: dict, single) -> tuple[dict, int]:
    """Each run's largest weight difference from `single` (by the runs' keys), and the runs' effective batch."""
    gaps = {key: parameter_gap(result.state, single) for key, result in results.items()}
    result = next(iter(results.values()))
    return gaps, result.micro_batch_size * result.accum_steps * result.world_size


def same_weights(results: dict, single) -> dict[bool, float]:
    """Each DDP run's final weights against one process that trained on whole effective batches (`single`, a
    model or state dict); prints the largest differences and returns {no_sync: difference}."""
    gaps, batch = _gaps(results, single)
    if all(gap <= FLOAT64_ROUNDING for gap in gaps.values()):  # the bound, not the digits: they vary with the CPU
        print(
            _(
                "Without no_sync() and with it, the DDP run ends with the weights of one process trained on batches "
                "of {batch}: they differ by at most {gap:.1e} (float64 rounding)."
            ).format(batch=batch, gap=FLOAT64_ROUNDING)
        )
    else:
        print(
            _(
                "Largest weight difference from one process trained on batches of {batch}: {without:.1e} without "
                "no_sync(), {with_no_sync:.1e} with it."
            ).format(batch=batch, without=gaps[False], with_no_sync=gaps[True])
        )
    return gaps


def fsdp2_weights(results: dict, single) -> dict[str, float]:
    """The DDP run's and the FSDP2 run's final weights (`ddp_lab.compare_fsdp2`) against one process that
    trained on whole effective batches (`single`, a model or state dict); prints the finding, returns
    {"ddp": difference, "fsdp2": difference}."""
    gaps, batch = _gaps(results, single)
    if all(gap <= FLOAT64_ROUNDING for gap in gaps.values()):  # the bound, not the digits: they vary with the CPU
        print(
            _(
                "Under FSDP2, as under DDP, the processes end with the weights of one process trained on batches of "
                "{batch}: they differ by at most {gap:.1e} (float64 rounding)."
            ).format(batch=batch, gap=FLOAT64_ROUNDING)
        )
    else:
        print(
            _(
                "Largest weight difference from one process trained on batches of {batch}: {ddp:.1e} under DDP, "
                "{fsdp2:.1e} under FSDP2."
            ).format(batch=batch, ddp=gaps["ddp"], fsdp2=gaps["fsdp2"])
        )
    return gaps


# the categories lesson 9 shows one by one; the rest of a step's peak (the micro-batch, what backward computes,
# the weights FSDP2 gathers, DDP's buckets' incoming copies) is one row
_OWN_ROWS = ("parameters", "gradients", "optimizer state")


def _moving(wrap: str, nbytes: int) -> str:
    """Bytes as lesson 9 prints them: under FSDP2 a peak (or what depends on it) marked with "*", the footnote that
    says it moves from run to run (notebooks/sanitize.cfg masks such digits)."""
    return f"{nbytes:,}*" if wrap == "fsdp2" else f"{nbytes:,}"


def memory_per_process(results: dict) -> dict[str, tuple[int, ...]]:
    """What each process holds in one step under DDP and under FSDP2 (`ddp_lab.compare_fsdp2`: every process
    measured itself with `measure_step`): a table of bytes, one column per process of each run, and the findings
    on the weights and the peak. FSDP2's peak and the gradients alive at it are marked "*": they can move from
    run to run on a busy CPU (by one layer's gradient, measured under load; the backend's own frees no longer move
    them: `tracker._collective`).
    Returns {"ddp": peaks by rank, "fsdp2": peaks by rank}."""
    columns = [(wrap, rank, report) for wrap in ("ddp", "fsdp2") for rank, report in enumerate(results[wrap].memory)]
    if not all(results[wrap].memory for wrap in ("ddp", "fsdp2")):
        raise ValueError(
            _(
                "results: a run without memory reports; pass the results of compare_fsdp2, whose "
                "processes measure their memory"
            )
        )
    # under FSDP2 the gradients alive at the peak move with it: marked as the peak is; the sharded parameters and the
    # optimizer's state do not
    rows = [
        [
            category_name(name),
            *(
                _moving(wrap, report.categories()[name]) if name == "gradients" else f"{report.categories()[name]:,}"
                for wrap, _rank, report in columns
            ),
        ]
        for name in _OWN_ROWS
    ]
    rest = [
        (wrap, report.peak - sum(report.categories()[name] for name in _OWN_ROWS)) for wrap, _rank, report in columns
    ]
    rows.append([_("the rest of the step"), *(_moving(wrap, nbytes) for wrap, nbytes in rest)])
    rows.append([_("peak"), *(_moving(wrap, report.peak) for wrap, _rank, report in columns)])
    header = [_("{wrap}, process {rank}").format(wrap=wrap.upper(), rank=rank) for wrap, rank, _report in columns]
    print_table([_("bytes per process"), *header], rows)
    ddp, fsdp2 = results["ddp"].memory, results["fsdp2"].memory
    world = len(fsdp2)
    whole, shards = ddp[0].parameters, [report.parameters for report in fsdp2]
    if all(report.parameters == whole for report in ddp) and sum(shards) == whole and len(set(shards)) == 1:
        print(
            _(
                "Under DDP every process holds all the weights ({whole:,} bytes); under FSDP2 each holds its shard, "
                "1/{world} of them ({shard:,} bytes)."
            ).format(whole=whole, world=world, shard=shards[0])
        )
    else:
        print(
            _("Weights per process: {ddp} bytes under DDP, {fsdp2} under FSDP2.").format(
                ddp=", ".join(f"{r.parameters:,}" for r in ddp), fsdp2=", ".join(f"{s:,}" for s in shards)
            )
        )
    ddp_peak, fsdp2_peak = max(r.peak for r in ddp), max(r.peak for r in fsdp2)
    if fsdp2_peak < ddp_peak:
        print(
            _("The busiest process's peak is lower under FSDP2: {fsdp2} bytes against {ddp:,} under DDP.").format(
                fsdp2=_moving("fsdp2", fsdp2_peak), ddp=ddp_peak
            )
        )
    else:
        print(
            _("The busiest process's peak is not lower under FSDP2: {fsdp2} bytes against {ddp:,} under DDP.").format(
                fsdp2=_moving("fsdp2", fsdp2_peak), ddp=ddp_peak
            )
        )
    print(
        _(
            "* Under FSDP2 the peak, and with it the gradients alive at that moment and the rest of the step, can "
            "move from run to run: the two processes share this CPU, each at its own pace."
        )
    )
    return {wrap: tuple(report.peak for report in results[wrap].memory) for wrap in ("ddp", "fsdp2")}
