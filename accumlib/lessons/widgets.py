"""Interactive dashboards: sliders and switches re-run a real experiment and redraw its figures.

Each dashboard opens with two or three tasks: what to try and what to look for (a lesson may show only some of them,
`tasks=[2]`, where the others repeat what it already measured). `show()` displays it and runs the
first experiment in the cell, so its printed summary (every setting, seed included, and the finding) is
deterministic and nbval checks it. Every later change of a control starts a run in a background thread. Runs go
one after another, and a run made stale by a newer change stops at its next check (within one training step), so
the last setting's figure arrives about one run's time after the last change however fast the slider moves.
While a run computes, the figure area says so above the faded previous figure; a failed run's error is shown in the
figure area, kept in `runs` and raised by `wait()`.
Figures go into an ipywidgets Output by assigning its `outputs` (widget state, which nbval does not compare). Every
string a dashboard shows goes through `_()`: `accumlib.set_language("hi")` before building one gives the Hindi
dashboard.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import html
import math
import os
import threading
import time
import weakref
from dataclasses import dataclass

import ipywidgets as w
import torch
import traitlets
from IPython.display import display

from .. import batchnorm, devices, memory
from . import batchnorm_lab, data, models, pitfalls, plots
from ._view import view_bundle
from .._validate import as_integer, boolean, non_negative_int, positive_int, positive_number
from ..i18n import N_, _, ngettext
from ..loop import train
from ..records import StopTraining

MICRO_BATCH_SIZES = (2, 4, 8, 16, 32, 64)
MAX_ACCUM_STEPS = 16
CARD_MIB = tuple(0.25 * i for i in range(1, 17))  # the memory dashboard's card sizes: 0.25 to 4 MiB
STYLE = {"description_width": "initial"}  # a control's label as wide as its text


# Where a slider's box is narrow (a phone's JupyterLab leaves a cell about 280 px), its label takes a line of its own
# above the track: in a row, a label of 110 px and the readout left the track 80 px (5 px per accum_steps step).
# A container query on each slider, so it follows the slider's width, not the window's. Scoped by the class.
_LAYOUT_CSS = (
    "<style>"
    ".accumlib-dashboard .widget-hslider{container-type:inline-size;flex-wrap:wrap;height:auto}"
    "@container (max-width: 22rem){.accumlib-dashboard .widget-hslider>.widget-label"
    "{flex:1 0 100%;max-width:none;text-align:left}}"
    "</style>"
)


def slider_layout() -> w.Layout:
    """A slider's box: a row of its own on a phone (it keeps about 200 px of track at 390 px: over 12 px per
    accum_steps step), two or three to a row on a desktop, growing to 36rem (about 28 px per step)."""
    # 100% less the widget's margins (2 px a side): a box of 100% overflowed a 280 px cell by 2 px
    return w.Layout(flex="1 1 22rem", min_width="min(100% - 4px, 18rem)", max_width="36rem")


def row_layout() -> w.Layout:
    """A row of controls that wraps onto the next line instead of squeezing or cutting them off."""
    return w.Layout(display="flex", flex_flow="row wrap", align_items="center", width="100%")


class _SizeSlider(w.SelectionSlider):
    """ipywidgets' SelectionSlider, refusing None as it refuses any other value not among its options: its own
    takes value=None (a trait that allows None skips its validation), then fails setting the index and keeps None:
    every later change then failed."""

    value = traitlets.Any(None, help="Selected value")
    value.allow_none = False  # None validated too, below (Any's allow_none=False argument leaves it allowed)

    @traitlets.validate("value")
    def _validate_value(self, proposal):
        if proposal.value is None:
            raise traitlets.TraitError(
                _("micro-batch size must be one of {sizes}, got None; it stays {value}").format(
                    sizes=", ".join(map(str, self.options)), value=self.value
                )
            )
        return super()._validate_value(proposal)


@dataclass
class Run:
    """One experiment, started by `show()` or by a change of a control; `Dashboard.runs` keeps them in that order."""

    settings: dict
    outcome: str = "running"  # "running", "done", "cancelled" (a newer change made it stale) or "failed"
    seconds: float | None = None  # from the change to its final figure (done runs only), seconds
    error: BaseException | None = None  # what a failed run raised


class _Job:
    """A run in progress: `check()` raises StopTraining once a newer change has made it stale; `draw()` shows
    partial figures while it is still the latest."""

    def __init__(self, dashboard: Dashboard, run: Run, generation: int):
        self.dashboard, self.run, self.generation = dashboard, run, generation
        self.started = time.perf_counter()

    @property
    def current(self) -> bool:
        return self.generation == self.dashboard._generation

    def check(self) -> None:
        if not self.current:
            raise StopTraining

    def draw(self, figures: list[plots.Plot]) -> None:
        outputs = tuple(figure.output() for figure in figures)
        with self.dashboard._lock:
            if self.current:
                self.dashboard.figures.outputs = outputs


def _message(text: str) -> dict:
    """A message in the figure area, as a notebook display_data output."""
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {"text/html": f"<p><b>{html.escape(text)}</b></p>", "text/plain": text},
    }


def _faded(output: dict) -> dict:
    """A figure output, faded: the previous settings' figure, shown while the new one computes."""
    png, alt = output["data"]["image/png"], output["data"]["text/plain"]
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {
            "text/html": f'<img src="data:image/png;base64,{png}" alt="{html.escape(alt)}" style="opacity:0.3">',
            "text/plain": alt,
        },
    }


@contextlib.contextmanager
def _one_thread():
    """torch on one thread in this block, as before afterwards. The dashboards' models are tiny: more threads cost
    more than they save (measured on 2 cores: a loss-dashboard change took 0.23-0.28 s with 2 threads, 0.15-0.16 s
    with one), and a run then leaves the other core to the kernel and the browser."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _integer_from_to(name: str, value, low: int, high: int, note: str = "") -> int:
    """`value` as an int if it is an integer (as Python converts one: a NumPy integer too) from `low` to `high`; a
    ValueError naming `name` and the valid range otherwise."""
    number = as_integer(value)
    if number is None or not low <= number <= high:
        raise ValueError(
            _("{name} must be an integer from {low} to {high}{note}, got {value!r}").format(
                name=name, low=low, high=high, note=note, value=value
            )
        )
    return number


# In a Voila app (which sets VOILA_SERVER_URL in its kernels' environment) no code and no cell output show: the
# dashboard shows its one summary itself, worded for the app, and each run replaces it.
IN_APP = "VOILA_SERVER_URL" in os.environ
_LIVE: weakref.WeakSet[Dashboard] = weakref.WeakSet()  # dashboards that have started a background run


@atexit.register
def _stop_every_run() -> None:
    """At interpreter exit (a script's end, a kernel's shutdown or restart) make every dashboard's run stale and wait
    for it. The runs are daemon threads (a computing dashboard never keeps a process alive); one still inside torch
    when the interpreter tears down aborts the process ("terminate called without an active exception", status
    134). atexit runs before that teardown, while the threads still run; a stale run stops at its next check."""
    for dashboard in list(_LIVE):
        dashboard._stop()


def _settings_line(settings: dict) -> str:
    return _("settings: {settings}").format(settings=", ".join(f"{key}={value}" for key, value in settings.items()))


class Dashboard:
    """Tasks, sliders, an effective-batch readout, a figure area and a settings line; subclasses implement
    `current_settings` (extended) and `compute`."""

    title: str  # each subclass's, marked with N_ and translated when shown
    tasks: tuple[str, ...]  # two or three: what to try and what to look for (marked with N_)

    def __init__(
        self,
        *,
        micro_batch_size: int = 8,
        accum_steps: int = 4,
        seed: int = 0,
        device=None,
        tasks=None,
        extra_controls=(),
        extra_label: str | None = None,
    ):
        """tasks: the numbers (from 1) of the dashboard's tasks to show, for a lesson that needs only some of them
        (its other tasks would repeat what the lesson already measured); None shows every task."""
        if tasks is not None:
            every = type(self).tasks
            if (
                isinstance(tasks, (str, bytes))
                or not hasattr(tasks, "__iter__")
                or not list(tasks)
                or any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(every) for n in tasks)
                or len(set(tasks)) != len(list(tasks))
            ):
                raise ValueError(
                    _("tasks must be distinct task numbers from 1 to {count} (or None for all), got {tasks!r}").format(
                        count=len(every), tasks=tasks
                    )
                )
            self.tasks = tuple(every[n - 1] for n in tasks)
        if as_integer(micro_batch_size) not in MICRO_BATCH_SIZES:  # a NumPy integer too; never True or 8.0
            raise ValueError(
                _("micro_batch_size must be one of {sizes}, got {value!r}").format(
                    sizes=MICRO_BATCH_SIZES, value=micro_batch_size
                )
            )
        micro_batch_size = as_integer(micro_batch_size)
        accum_steps = _integer_from_to("accum_steps", accum_steps, 1, MAX_ACCUM_STEPS)
        self.seed = non_negative_int("seed", seed)
        # where every model, batch and measurement of the dashboard goes: the lesson's device (accumlib.devices.pick)
        self.device = devices.pick() if device is None else torch.device(device)
        self.accum_steps = w.IntSlider(
            value=accum_steps,
            min=1,
            max=MAX_ACCUM_STEPS,
            description="accum_steps",
            continuous_update=False,
            style=STYLE,
            layout=slider_layout(),
        )
        self.micro_batch_size = _SizeSlider(
            options=MICRO_BATCH_SIZES,
            value=micro_batch_size,
            description=_("micro-batch size"),
            continuous_update=False,
            style=STYLE,
            layout=slider_layout(),
        )
        self.effective = w.HTML(layout=w.Layout(flex="1 1 100%", min_width="0"))  # a line of its own, below the sliders
        self.task_list = w.HTML(
            "<b>{}</b><ol>{}</ol>".format(
                html.escape(_("Try this:")), "".join(f"<li>{html.escape(_(task))}</li>" for task in self.tasks)
            )
        )
        self.figures = w.Output(layout=w.Layout(min_height="340px"))
        self.settings = w.HTML()
        self.controls = [self.micro_batch_size, self.accum_steps, *extra_controls]
        rows = [w.HBox(self.controls[:2] + [self.effective], layout=row_layout())]
        if extra_controls:
            label = [w.HTML(html.escape(extra_label), layout=w.Layout(margin="0 1em 0 0"))] if extra_label else []
            rows.append(w.HBox(label + list(extra_controls), layout=row_layout()))
        self.widget = w.VBox(
            [
                w.HTML(_LAYOUT_CSS, layout=w.Layout(display="none")),
                w.HTML(f"<h3>{html.escape(_(self.title))}</h3>"),
                self.task_list,
                *rows,
                self.figures,
                self.settings,
            ]
        )
        self.widget.add_class("accumlib-dashboard")
        self.plots: list[plots.Plot] = []  # the figures shown, once final
        self.summary = ""  # the finding of the figures shown
        self.shown: dict | None = None  # settings of the figures shown; None while computing or after a failure
        self.runs: list[Run] = []
        self._outputs: tuple = ()  # the figures shown, rendered
        self._reported = 0  # failed runs before this index have been raised by wait()
        self._generation = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        for control in self.controls:
            control.observe(self._changed, names="value")
        self._readout()

    # --- what a subclass provides -------------------------------------------------------------------------
    def compute(self, settings: dict, job: _Job) -> tuple[list[plots.Plot], str]:
        """Run the experiment for `settings`; call job.check() often (it raises StopTraining once stale).

        Returns the figures and the finding (text; the settings line is added in front of it).
        """
        raise NotImplementedError

    def current_settings(self) -> dict:
        """Every setting of the run the controls ask for, seed included: enough to reproduce it with accumlib."""
        return {
            "micro_batch_size": self.micro_batch_size.value,
            "accum_steps": self.accum_steps.value,
            "effective_batch": self.effective_batch,
            "seed": self.seed,
        }

    # --- mechanics ----------------------------------------------------------------------------------------
    @property
    def effective_batch(self) -> int:
        return self.micro_batch_size.value * self.accum_steps.value

    def _readout(self) -> None:
        readout = _(
            "effective batch = {micro_batch_size} (micro-batch) × {accum_steps} (accum_steps) = "
            "{effective_batch} samples"
        )
        self.effective.value = "<b>{}</b>".format(
            html.escape(
                readout.format(
                    micro_batch_size=self.micro_batch_size.value,
                    accum_steps=self.accum_steps.value,
                    effective_batch=self.effective_batch,
                )
            )
        )

    def _start(self) -> _Job:
        """Record a run for the current settings and mark the figure area as computing (the caller holds the lock)."""
        self._generation += 1
        run = Run(self.current_settings())
        self.runs.append(run)
        self.shown = None
        if self._outputs:
            note = _("Computing for your new settings … The faded figure below still shows the previous settings.")
        else:
            note = _("Computing …")
        self.figures.outputs = (_message(note), *(_faded(output) for output in self._outputs))
        self.settings.value = ""
        return _Job(self, run, self._generation)

    def _changed(self, _change=None) -> None:
        self._readout()
        with self._lock:
            job = self._start()
            previous = self._thread
            self._thread = threading.Thread(target=self._background, args=(job, previous), daemon=True)
            self._thread.start()
        _LIVE.add(self)

    def _stop(self, timeout: float = 60) -> None:
        """At exit: make the run in progress stale (it stops at its next check, within one training step; it is
        recorded as cancelled) and wait for it."""
        with self._lock:
            self._generation += 1
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _background(self, job: _Job, previous: threading.Thread | None) -> None:
        if previous is not None:
            previous.join()  # one run at a time: the stale one stops at its next check
        self._execute(job)

    def _execute(self, job: _Job) -> None:
        """Compute, render, then show the result if it is still the latest; record the outcome in job.run."""
        try:
            job.check()
            with _one_thread():
                figures, finding = self.compute(job.run.settings, job)
            rendered = {id(figure): output for figure, output in zip(self.plots, self._outputs, strict=True)}
            outputs = tuple(rendered.get(id(figure)) or figure.output() for figure in figures)
        except StopTraining:
            job.run.outcome = "cancelled"
            return
        except Exception as error:  # shown in the figure area and raised by wait(): never swallowed
            with self._lock:
                job.run.outcome, job.run.error = "failed", error
                if job.current:
                    self.plots, self._outputs, self.summary = [], (), ""
                    self.figures.outputs = (
                        _message(
                            _("This run failed, so there is no figure for these settings: {error}").format(
                                error=f"{type(error).__name__}: {error}"
                            )
                        ),
                    )
            return
        with self._lock:
            if not job.current:
                job.run.outcome = "cancelled"
                return
            self.plots, self._outputs, self.shown = figures, outputs, job.run.settings
            self.summary = f"{_settings_line(job.run.settings)}\n{finding}"
            self.figures.outputs = outputs
            # in a notebook the first run's summary is the cell's printed output and later ones show here; in the
            # app every run's shows here
            if IN_APP or len(self.runs) > 1:
                label = _("the figure above, with these settings:") if IN_APP else _("latest run, after your change:")
                self.settings.value = "<pre>{}\n{}</pre>".format(html.escape(label), html.escape(self.summary))
            job.run.outcome, job.run.seconds = "done", time.perf_counter() - job.started

    def wait(self, timeout: float = 120) -> None:
        """Block until every run started so far has finished; raise the error of any run that failed since the
        last wait(), and TimeoutError when runs are still going after `timeout` seconds. Safe from any thread: the
        latest run's thread is read under the lock that a change holds until it has started it."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(
                    _("the dashboard's runs were still going after timeout={timeout} seconds").format(timeout=timeout)
                )
        failed = [run for run in self.runs[self._reported :] if run.outcome == "failed"]
        self._reported = len(self.runs)
        if failed:
            raise RuntimeError(
                ngettext(
                    "{count} dashboard run failed, with settings {settings}: {error!r}",
                    "{count} dashboard runs failed, the first with settings {settings}: {error!r}",
                    len(failed),
                ).format(count=len(failed), settings=failed[0].settings, error=failed[0].error)
            ) from failed[0].error

    def show(self) -> None:
        """Display the dashboard, run once for the current settings in this cell, print the settings and finding.

        The printed text stays as the cell's output; the finding of each later change shows inside the dashboard.
        """
        self.wait()
        display(self)
        with self._lock:
            job = self._start()
        self._execute(job)
        if job.run.outcome == "failed":
            self._reported = len(self.runs)  # raised here, not again by wait()
            raise job.run.error
        if IN_APP:  # the summary is in the dashboard (_execute); the app shows no cell output beside it
            return
        print(_("when this cell ran (the dashboard above shows your later changes):"))
        print(self.summary)

    def __repr__(self) -> str:
        """The title, the controls and the tasks: what a text-only view of the notebook shows."""
        lines = [
            _("{title} (controls: {controls})").format(
                title=_(self.title), controls=", ".join(control.description for control in self.controls)
            ),
            _("Try this:"),
            *(f"{i}. {_(task)}" for i, task in enumerate(self.tasks, 1)),
        ]
        return "\n".join(lines)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = view_bundle(self.widget, include, exclude)
        bundle["text/plain"] = repr(self)
        return bundle


_CPU = torch.device("cpu")


def _digits(n: int | None = None, flat: bool = False, device: torch.device = _CPU):
    """The first n digits on `device`, copied from the cache for each caller: a dashboard (or a learner) that
    changes its tensors in place leaves every other dashboard's digits as they are."""
    return tuple(t.clone() for t in _cached_digits(n, flat, device))


@functools.lru_cache(maxsize=None)
def _cached_digits(n: int | None, flat: bool, device: torch.device):
    return tuple(t.to(device) for t in data.digits(n, flat=flat))


class LossDashboard(Dashboard):
    """Loss curves of (micro-batch, accum_steps) against one batch of the effective size on the same samples, drawn
    live; switches put the classic bugs into the loop (accumlib.lessons.pitfalls.classic_train) or BatchNorm into the
    model.

    The full batch is one batch of micro_batch_size x accum_steps samples (of all `samples` when the effective
    batch is larger), trained with accumlib.train. The accumulated run uses accumlib.train while every bug is off.
    Every training run is cached by its arguments, so the reference for an effective batch is trained once.
    """

    title = N_("Loss: accumulation against the full batch")
    tasks = (
        N_(
            "With every switch off, set accum_steps to 1, then to 16. Does the accumulated curve ever leave the "
            "full-batch curve? Read the largest gap in the title."
        ),
        N_(
            "Switch on “forget the division” and move accum_steps from 2 to 16. How far does the accumulated "
            "curve leave the full batch, and which way? Set accum_steps to 1: why does the switch stop mattering?"
        ),
    )
    # BatchNorm under accumulation is lesson 7's, with its own dashboard and tasks (BatchNormDashboard): the switch
    # stays here for exploring, without a task
    SWITCHES = {
        "forget_division": N_("forget the division"),
        "zero_every_micro_batch": N_("zero the gradients every micro-batch"),
        "step_every_micro_batch": N_("step the optimizer every micro-batch"),
        "batchnorm": N_("BatchNorm model"),
    }
    BUGS = ("forget_division", "zero_every_micro_batch", "step_every_micro_batch")

    def __init__(
        self,
        *,
        samples: int = 384,
        epochs: int = 2,
        lr: float = 0.5,
        redraw_seconds: float = 0.3,
        forget_division: bool = False,
        zero_every_micro_batch: bool = False,
        step_every_micro_batch: bool = False,
        batchnorm: bool = False,
        **kwargs,
    ):
        samples = _integer_from_to(
            "samples",
            samples,
            max(MICRO_BATCH_SIZES),
            data.DIGITS,
            _(" (from the largest micro-batch to all the digits)"),
        )
        self.samples, self.epochs = samples, positive_int("epochs", epochs)
        self.lr, self.redraw_seconds = positive_number("lr", lr), positive_number("redraw_seconds", redraw_seconds)
        switched = dict(
            forget_division=forget_division,
            zero_every_micro_batch=zero_every_micro_batch,
            step_every_micro_batch=step_every_micro_batch,
            batchnorm=batchnorm,
        )
        for name, value in switched.items():
            boolean(name, value)
        self.switches = {
            name: w.Checkbox(
                value=switched[name],
                description=_(label),
                indent=False,
                layout=w.Layout(width="auto", margin="0 1.5em 0 0"),
            )
            for name, label in self.SWITCHES.items()
        }
        self._curves: dict[tuple, dict[str, list]] = {}
        super().__init__(
            extra_controls=list(self.switches.values()), extra_label=_("Switch on a bug or a trap:"), **kwargs
        )

    def current_settings(self) -> dict:
        switched = {name: box.value for name, box in self.switches.items()}
        loop = "pitfalls.classic_train" if any(switched[bug] for bug in self.BUGS) else "accumlib.train"
        model = "mlp(64-64-10)+BatchNorm1d(64)" if switched["batchnorm"] else "mlp(64-64-10)"
        return {
            **super().current_settings(),
            "samples": self.samples,
            "epochs": self.epochs,
            "lr": self.lr,
            **switched,
            "model": model,
            "optimizer": "SGD",
            "loop": loop,
        }

    def _model(self, with_batchnorm: bool) -> torch.nn.Module:
        """The seeded MLP; with BatchNorm1d after its first layer (same weights: BatchNorm starts at 1 and 0)."""
        model = models.mlp(seed=self.seed)
        if with_batchnorm:
            model = torch.nn.Sequential(model[0], torch.nn.BatchNorm1d(model[0].out_features), *model[1:])
        return model.to(self.device)

    def _curve(
        self, m: int, k: int, with_batchnorm: bool, bugs: dict[str, bool], job: _Job, on_point=None
    ) -> dict[str, list]:
        """Loss per optimizer step of one run: {"samples_seen": [...], "loss": [...]}; cached by its arguments."""
        key = (m, k, with_batchnorm, tuple(sorted(bugs.items())))
        if key in self._curves:
            return self._curves[key]
        curve = {"samples_seen": [], "loss": []}

        def on_step(step):
            job.check()
            curve["samples_seen"].append(step.samples_seen)
            curve["loss"].append(step.loss)
            if on_point is not None:
                on_point(curve)

        model = self._model(with_batchnorm)
        optimizer = torch.optim.SGD(model.parameters(), lr=self.lr)
        samples = _digits(self.samples, flat=True, device=self.device)
        if any(bugs.values()):
            pitfalls.classic_train(
                model,
                samples,
                optimizer,
                micro_batch_size=m,
                accum_steps=k,
                epochs=self.epochs,
                seed=self.seed,
                last_cycle="weighted",
                divide=not bugs["forget_division"],
                zero_every_micro_batch=bugs["zero_every_micro_batch"],
                step_every_micro_batch=bugs["step_every_micro_batch"],
                on_step=on_step,
            )
        else:
            history = train(
                model,
                samples,
                optimizer,
                micro_batch_size=m,
                accum_steps=k,
                epochs=self.epochs,
                seed=self.seed,
                on_step=on_step,
                measure_memory=False,
                device=self.device,
            )
            if history.stopped:
                raise StopTraining
        self._curves[key] = curve
        return curve

    def compute(self, settings: dict, job: _Job):
        m, k = settings["micro_batch_size"], settings["accum_steps"]
        full = min(m * k, self.samples)  # one batch of the effective size: all samples when it is larger
        bugs = {bug: settings[bug] for bug in self.BUGS}
        reference = self._curve(full, 1, settings["batchnorm"], dict.fromkeys(self.BUGS, False), job)
        labels = self._labels(m, k, full, any(bugs.values()))
        steps = self.epochs * math.ceil(self.samples / (m if bugs["step_every_micro_batch"] else m * k))
        started = time.perf_counter()
        next_draw = [started + self.redraw_seconds]  # drawing takes at most a third of the time

        def on_point(curve):
            now, done = time.perf_counter(), len(curve["loss"])
            left = (now - started) / done * (steps - done)  # seconds, at the pace so far
            if now >= next_draw[0] and left > self.redraw_seconds:
                title = ngettext(
                    "Training {accum_steps} micro-batch of {micro_batch_size}: {samples_seen} samples seen so far …",
                    "Training {accum_steps} micro-batches of {micro_batch_size}: {samples_seen} samples seen so far …",
                    k,
                ).format(accum_steps=k, micro_batch_size=m, samples_seen=curve["samples_seen"][-1])
                job.draw([plots.loss_curves(dict(zip(labels, (reference, curve), strict=True)), title, title)])
                drawn = time.perf_counter()
                next_draw[0] = drawn + max(self.redraw_seconds, 2 * (drawn - now))

        accumulated = self._curve(m, k, settings["batchnorm"], bugs, job, on_point)
        title, finding = self._finding(m, k, full, reference, accumulated)
        if full < m * k:  # the sliders ask for more samples per step than the data holds: said, not silently clamped
            clamped = _(
                "(the effective batch of {effective} is more than the {samples} samples: every step takes "
                "all {samples})"
            ).format(effective=m * k, samples=full)
            title, finding = f"{title} {clamped}", f"{finding} {clamped}"
        alt = ngettext(
            "Line chart of the training loss against samples seen: one batch of {batch} (thick line) and "
            "{accum_steps} micro-batch of {micro_batch_size} (dashed, with markers). {finding}",
            "Line chart of the training loss against samples seen: one batch of {batch} (thick line) and "
            "{accum_steps} micro-batches of {micro_batch_size} (dashed, with markers). {finding}",
            k,
        ).format(batch=full, accum_steps=k, micro_batch_size=m, finding=title)
        finite = [loss for loss in accumulated["loss"] if math.isfinite(loss)]
        logy = len(finite) < len(accumulated["loss"]) or max(finite) > 2 * max(reference["loss"])
        curves = dict(zip(labels, (reference, accumulated), strict=True))
        return [plots.loss_curves(curves, title, alt, logy=logy)], finding

    def _labels(self, m: int, k: int, full: int, buggy: bool) -> tuple[str, str]:
        """Legend labels: the full batch, and the accumulated run (correct, or with the bugs switched on)."""
        if full < m * k:
            reference = _("one batch of all {samples} samples (full batch)").format(samples=full)
        else:
            reference = _("one batch of {batch} (full batch)").format(batch=full)
        if buggy:
            accumulated = ngettext(
                "{accum_steps} micro-batch of {micro_batch_size}, the loop with your bugs",
                "{accum_steps} micro-batches of {micro_batch_size}, the loop with your bugs",
                k,
            )
        else:
            accumulated = ngettext(
                "{accum_steps} micro-batch of {micro_batch_size}, accumulated",
                "{accum_steps} micro-batches of {micro_batch_size}, accumulated",
                k,
            )
        return reference, accumulated.format(accum_steps=k, micro_batch_size=m)

    @staticmethod
    def _finding(m: int, k: int, full: int, reference: dict, accumulated: dict) -> tuple[str, str]:
        """(title, summary line), both formatted from the two curves."""
        losses, reference_losses = accumulated["loss"], reference["loss"]
        steps = len(losses)
        values = dict(
            accum_steps=k,
            micro_batch_size=m,
            batch=full,
            steps=steps,
            final=losses[-1],
            reference=reference_losses[-1],
            reference_steps=len(reference_losses),
        )
        broken = next((i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)
        if broken is not None:
            values["step"] = broken + 1
            return (
                _(
                    "The accumulated loss became non-finite at optimizer step {step}; one batch of {batch} ends at "
                    "{reference:.3f}"
                ).format(**values),
                ngettext(
                    "{steps} optimizer step; the loss became non-finite (NaN or infinite) at step {step}; "
                    "full-batch reference {reference:.3f}",
                    "{steps} optimizer steps; the loss became non-finite (NaN or infinite) at step {step}; "
                    "full-batch reference {reference:.3f}",
                    steps,
                ).format(**values),
            )
        if accumulated["samples_seen"] != reference["samples_seen"]:
            return (
                ngettext(
                    "{steps} optimizer step where one batch of {batch} takes {reference_steps}: final loss "
                    "{final:.3f} against {reference:.3f}",
                    "{steps} optimizer steps where one batch of {batch} takes {reference_steps}: final loss "
                    "{final:.3f} against {reference:.3f}",
                    steps,
                ).format(**values),
                ngettext(
                    "{steps} optimizer step against {reference_steps} for the full batch; final loss "
                    "{final:.3f} (full-batch reference {reference:.3f})",
                    "{steps} optimizer steps against {reference_steps} for the full batch; final loss "
                    "{final:.3f} (full-batch reference {reference:.3f})",
                    steps,
                ).format(**values),
            )
        values["gap"] = max(abs(a - b) for a, b in zip(losses, reference_losses, strict=True))
        steps_line = ngettext(
            "{steps} optimizer step; final loss {final:.3f} (full-batch reference {reference:.3f})",
            "{steps} optimizer steps; final loss {final:.3f} (full-batch reference {reference:.3f})",
            steps,
        ).format(**values)
        if values["gap"] <= 1e-5:
            return (
                ngettext(
                    "{accum_steps} micro-batch of {micro_batch_size} trains like one batch of {batch}: the "
                    "losses differ by at most {gap:.0e}",
                    "{accum_steps} micro-batches of {micro_batch_size} train like one batch of {batch}: the "
                    "losses differ by at most {gap:.0e}",
                    k,
                ).format(**values),
                "; ".join([steps_line, _("curves equal to within 1e-5: yes")]),
            )
        return (
            ngettext(
                "{accum_steps} micro-batch of {micro_batch_size} leaves one batch of {batch}: final loss "
                "{final:.3f} against {reference:.3f}, largest gap {gap:.3f}",
                "{accum_steps} micro-batches of {micro_batch_size} leave one batch of {batch}: final loss "
                "{final:.3f} against {reference:.3f}, largest gap {gap:.3f}",
                k,
            ).format(**values),
            "; ".join([steps_line, _("the curves differ by up to {gap:.3g}").format(**values)]),
        )


class MemoryDashboard(Dashboard):
    """Peak memory by category of one step of (micro-batch, accum_steps) against one batch of the same size, and
    the card's budget. Measured with accumlib.measure_step on the dashboard's device (live tensor bytes on the CPU,
    the allocator's on CUDA), cached by (micro-batch, accum_steps): the card slider only redraws.
    """

    title = N_("Memory: one micro-batch at a time")
    tasks = (
        N_(
            "Keep the effective batch at 64: try micro-batch size 64 with accum_steps 1, then 8 with 8, then 4 "
            "with 16. Which parts of the accumulated bar shrink, which stay the same, and which grow?"
        ),
        N_(
            "Set the card to 0.5 MiB and find the largest micro-batch size whose accumulated step fits under the "
            "dashed line. Does accum_steps change the accumulated bar?"
        ),
        N_("Set accum_steps to 1: what do the two bars measure? Then raise accum_steps: which bar grows?"),
    )

    def __init__(self, *, budget_mib: float = 0.5, **kwargs):
        if isinstance(budget_mib, bool) or budget_mib not in CARD_MIB:
            raise ValueError(
                _("budget_mib must be a multiple of 0.25 from 0.25 to 4, got {value!r}").format(value=budget_mib)
            )
        self.budget = w.FloatSlider(
            value=budget_mib,
            min=CARD_MIB[0],
            max=CARD_MIB[-1],
            step=0.25,
            description=_("card (MiB)"),
            continuous_update=False,
            style=STYLE,
            layout=slider_layout(),
        )
        self._reports: dict[tuple[int, int], memory.MemoryReport] = {}
        super().__init__(extra_controls=[self.budget], **kwargs)
        self.model = models.cnn(seed=self.seed).to(self.device)

    def current_settings(self) -> dict:
        return {
            **super().current_settings(),
            "memory_budget": int(self.budget.value * plots.MIB),
            "model": "cnn(16, 32)",
            "optimizer": "SGD",
            "measured_with": "accumlib.measure_step",
        }

    def _report(self, size: int, steps: int, job: _Job) -> memory.MemoryReport:
        """Memory of one step of `steps` micro-batches of `size` digits; cached."""
        if (size, steps) not in self._reports:
            job.check()
            x, y = memory.batch_of(_digits(1, device=self.device), size)
            self._reports[size, steps] = memory.measure_step(self.model, x, y, accum_steps=steps)
        return self._reports[size, steps]

    def compute(self, settings: dict, job: _Job):
        m, k = settings["micro_batch_size"], settings["accum_steps"]
        budget = settings["memory_budget"]
        accumulated, one_batch = self._report(m, k, job), self._report(m * k, 1, job)
        values = dict(
            accum_steps=k,
            micro_batch_size=m,
            batch=m * k,
            budget=plots.mib(budget),
            accumulated=plots.mib(accumulated.peak),
            one_batch=plots.mib(one_batch.peak),
            accumulated_bytes=accumulated.peak,
            one_batch_bytes=one_batch.peak,
            budget_bytes=budget,
        )
        fits = accumulated.peak <= budget, one_batch.peak <= budget
        if fits == (True, True):
            title = ngettext(
                "{accum_steps} micro-batch of {micro_batch_size} peaks at {accumulated}, one batch of "
                "{batch} at {one_batch}: both fit the {budget} card",
                "{accum_steps} micro-batches of {micro_batch_size} peak at {accumulated}, one batch of "
                "{batch} at {one_batch}: both fit the {budget} card",
                k,
            )
        elif fits == (True, False):
            title = ngettext(
                "{accum_steps} micro-batch of {micro_batch_size} peaks at {accumulated} and fits the "
                "{budget} card; one batch of {batch} needs {one_batch} and does not",
                "{accum_steps} micro-batches of {micro_batch_size} peak at {accumulated} and fit the "
                "{budget} card; one batch of {batch} needs {one_batch} and does not",
                k,
            )
        elif fits == (False, True):
            title = ngettext(
                "One batch of {batch} peaks at {one_batch} and fits the {budget} card; {accum_steps} "
                "micro-batch of {micro_batch_size} needs {accumulated} and does not",
                "One batch of {batch} peaks at {one_batch} and fits the {budget} card; {accum_steps} "
                "micro-batches of {micro_batch_size} need {accumulated} and do not",
                k,
            )
        else:
            title = ngettext(
                "Neither fits the {budget} card: {accum_steps} micro-batch of {micro_batch_size} peaks "
                "at {accumulated}, one batch of {batch} at {one_batch}",
                "Neither fits the {budget} card: {accum_steps} micro-batches of {micro_batch_size} peak "
                "at {accumulated}, one batch of {batch} at {one_batch}",
                k,
            )
        title = title.format(**values)
        alt = ngettext(
            "Stacked bars of peak memory by category, with the card's budget as a dashed line. "
            "{accum_steps} micro-batch of {micro_batch_size}: {accumulated_bytes:,} bytes; one batch of "
            "{batch}: {one_batch_bytes:,} bytes; the card holds {budget_bytes:,} bytes.",
            "Stacked bars of peak memory by category, with the card's budget as a dashed line. "
            "{accum_steps} micro-batches of {micro_batch_size}: {accumulated_bytes:,} bytes; one batch of "
            "{batch}: {one_batch_bytes:,} bytes; the card holds {budget_bytes:,} bytes.",
            k,
        ).format(**values)
        bars = {
            ngettext(
                "{accum_steps} micro-batch of {micro_batch_size} (accumulated)",
                "{accum_steps} micro-batches of {micro_batch_size} (accumulated)",
                k,
            ).format(**values): accumulated.categories(),
            _("one batch of {batch}").format(**values): one_batch.categories(),
        }
        figure = plots.memory_stack(bars, title, alt, budget)
        if fits[0]:
            line = ngettext(
                "{accum_steps} micro-batch of {micro_batch_size}, accumulated: peak "
                "{accumulated_bytes:,} bytes, fits the card",
                "{accum_steps} micro-batches of {micro_batch_size}, accumulated: peak "
                "{accumulated_bytes:,} bytes, fits the card",
                k,
            )
        else:
            line = ngettext(
                "{accum_steps} micro-batch of {micro_batch_size}, accumulated: peak "
                "{accumulated_bytes:,} bytes, does NOT fit the card",
                "{accum_steps} micro-batches of {micro_batch_size}, accumulated: peak "
                "{accumulated_bytes:,} bytes, does NOT fit the card",
                k,
            )
        if fits[1]:
            one_line = _("one batch of {batch}: peak {one_batch_bytes:,} bytes, fits the card")
        else:
            one_line = _("one batch of {batch}: peak {one_batch_bytes:,} bytes, does NOT fit the card")
        return [figure], f"{line.format(**values)}\n{one_line.format(**values)}"


@functools.lru_cache(maxsize=4)
def _trained_batchnorm_cnn(samples: int, seed: int, device: torch.device) -> torch.nn.Module:
    """The CNN with BatchNorm, trained 2 epochs on the first `samples` digits in batches of 64, on `device`. Shared:
    never changed (the batchnorm functions work on copies)."""
    X, y = _digits(samples, device=device)
    model = models.cnn(norm="batch", seed=seed).to(device)
    train(
        model,
        (X, y),
        torch.optim.SGD(model.parameters(), lr=0.05),
        micro_batch_size=64,
        accum_steps=1,
        epochs=2,
        seed=seed,
        measure_memory=False,
        device=device,
    )
    return model


class BatchNormDashboard(Dashboard):
    """What BatchNorm sees under accumulation, on a trained CNN with BatchNorm (weights fixed).

    First chart: how far the mean and variance BatchNorm computes on each micro-batch stray from those of its
    effective batch (the full batch that one accumulated step stands for, which one batch of that size would
    normalise with). Second chart: the loss on held-out digits in eval mode, where BatchNorm uses its running
    statistics: collected from micro-batches (as an accumulated run updates them: once per micro-batch), and
    re-estimated with one batch of all training digits. The second chart depends on the micro-batch size only (the
    running statistics never see the effective batch), and is cached by it.
    """

    title = N_("BatchNorm: statistics of the micro-batch")
    tasks = (
        N_(
            "Set accum_steps to 1: the micro-batch is then the whole effective batch. What does the first chart "
            "show, and what does that mean for accumulation with BatchNorm?"
        ),
        N_(
            "At accum_steps 8, move the micro-batch size from 2 to 64. How does the gap between micro-batch and "
            "effective-batch statistics change?"
        ),
        N_(
            "Move accum_steps and watch the second chart: do the running statistics depend on accum_steps? Then "
            "compare the held-out loss with micro-batch size 2 and 64: how much does re-estimating change it?"
        ),
    )
    HELD_OUT = 512  # held-out digits (after the training digits) the eval-mode loss is measured on
    UPDATES = 100  # train-mode passes that collect the running statistics (momentum 0.1: 0.9 ** 100 of the
    # reset values, 3e-5, is left)
    BATCHES = 4  # effective batches (at most) the first chart averages over

    def __init__(self, *, samples: int = 512, **kwargs):
        samples = _integer_from_to(
            "samples",
            samples,
            max(MICRO_BATCH_SIZES),
            data.DIGITS - self.HELD_OUT,
            _(" (the digits that leave {held_out} held out)").format(held_out=self.HELD_OUT),
        )
        self.samples = samples
        super().__init__(**kwargs)
        self.model = _trained_batchnorm_cnn(samples, self.seed, self.device)
        X, y = _digits(device=self.device)
        self.X, self.held_out = (
            X[:samples],
            (X[samples : samples + self.HELD_OUT], y[samples : samples + self.HELD_OUT]),
        )
        self.statistics_data = X  # the first chart's effective batches: consecutive digits
        self._reestimated_loss = self._held_out_loss(batchnorm.reestimate(copy.deepcopy(self.model), self.X))
        self._running: dict[int, tuple[plots.Plot, str]] = {}

    def current_settings(self) -> dict:
        return {
            **super().current_settings(),
            "samples": self.samples,
            "held_out": self.HELD_OUT,
            "updates": self.UPDATES,
            "model": "cnn(16, 32, norm='batch')",
        }

    def _held_out_loss(self, model: torch.nn.Module) -> float:
        """Mean cross-entropy (nats) on the held-out digits in eval mode: BatchNorm normalises with its running
        statistics."""
        return batchnorm.evaluate(model, *self.held_out).loss

    def compute(self, settings: dict, job: _Job):
        m, k = settings["micro_batch_size"], settings["accum_steps"]
        deviation_plot, deviation_line = self._deviation(m, k, job)
        if m not in self._running:
            self._running[m] = self._running_statistics(m, job)
        running_plot, running_line = self._running[m]
        return [deviation_plot, running_plot], f"{deviation_line}\n{running_line}"

    def _deviation(self, m: int, k: int, job: _Job) -> tuple[plots.Plot, str]:
        batch = m * k
        count = min(self.BATCHES, len(self.statistics_data) // batch)
        per_batch = []
        for i in range(count):
            job.check()
            effective = self.statistics_data[i * batch : (i + 1) * batch]
            per_batch.append(batchnorm.micro_batch_deviation(self.model, effective, m))
        layers = [d.layer for d in per_batch[0]]
        average = {
            part: {
                _("layer {name}").format(name=layer): sum(getattr(b[j], part) for b in per_batch) / count
                for j, layer in enumerate(layers)
            }
            for part in ("mean", "variance")
        }
        mean, variance = (sum(average[part].values()) / len(layers) for part in ("mean", "variance"))
        values = dict(
            micro_batch_size=m,
            batch=batch,
            mean=mean,
            variance=variance,
            count=count,
            largest=max(max(average["mean"].values()), max(average["variance"].values())),
        )
        if k == 1:
            title = _(
                "With accum_steps = 1 each micro-batch is its whole effective batch: BatchNorm's statistics "
                "differ from it by at most {largest:.1e}"
            ).format(**values)
        else:
            title = _(
                "Micro-batches of {micro_batch_size} normalise with statistics that stray from their effective "
                "batch of {batch}: by {mean:.3f} in the mean, {variance:.3f} in the variance"
            ).format(**values)
        alt = ngettext(
            "Grouped bars, one group per BatchNorm layer: how far the mean and the variance of "
            "micro-batches of {micro_batch_size} stray from those of their effective batch of {batch}, "
            "averaged over {count} effective batch. {title}",
            "Grouped bars, one group per BatchNorm layer: how far the mean and the variance of "
            "micro-batches of {micro_batch_size} stray from those of their effective batch of {batch}, "
            "averaged over {count} effective batches. {title}",
            count,
        ).format(title=title, **values)
        figure = plots.deviation_bars(
            {_("mean"): average["mean"], _("variance"): average["variance"]},
            _("deviation from the effective batch's statistic (relative)"),
            title,
            alt,
        )
        line = ngettext(
            "micro-batch statistics against their effective batch of {batch}: mean {mean:.3f}, variance "
            "{variance:.3f} (relative, averaged over layers and {count} effective batch)",
            "micro-batch statistics against their effective batch of {batch}: mean {mean:.3f}, variance "
            "{variance:.3f} (relative, averaged over layers and {count} effective batches)",
            count,
        ).format(**values)
        return figure, line

    def _running_statistics(self, m: int, job: _Job) -> tuple[plots.Plot, str]:
        job.check()
        collected = self._held_out_loss(
            batchnorm_lab.collect_running_stats(self.model, self.X, m, updates=self.UPDATES)
        )
        values = dict(
            micro_batch_size=m,
            samples=self.samples,
            held_out=self.HELD_OUT,
            updates=self.UPDATES,
            collected=collected,
            reestimated=self._reestimated_loss,
        )
        title = _(
            "Eval-mode loss on {held_out} held-out digits: {collected:.3f} with running statistics from "
            "micro-batches of {micro_batch_size}, {reestimated:.3f} re-estimated with one batch of "
            "{samples}"
        ).format(**values)
        labels = [
            _("running statistics from micro-batches of {micro_batch_size} ({updates} updates)").format(**values),
            _("re-estimated with one batch of {samples}").format(**values),
        ]
        alt = _(
            "Two bars: the loss on {held_out} held-out digits in eval mode, where BatchNorm uses its running "
            "statistics, with the weights fixed. Statistics collected from micro-batches of {micro_batch_size}: "
            "{collected:.3f} nats; re-estimated with one batch of all {samples} training digits: "
            "{reestimated:.3f} nats."
        ).format(**values)
        figure = plots.bars(
            labels,
            [collected, self._reestimated_loss],
            _("held-out loss in eval mode (cross-entropy, nats)"),
            title,
            alt,
        )
        return figure, title
