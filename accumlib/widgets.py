"""Interactive dashboards: sliders for accum_steps and micro-batch size re-run a real experiment and redraw.

The first run happens when the dashboard is shown (in the cell, so its printed summary is deterministic and
nbval checks it). Every later slider change starts a fresh run in a background thread and cancels the stale one,
so the widgets never freeze. Figures go into an ipywidgets Output by assigning its `outputs` (widget state,
which nbval does not compare); the cell's own output is the text summary with every setting, seed included.
"""
from __future__ import annotations

import threading
import time
from functools import lru_cache

import ipywidgets as w
import torch
from IPython.display import display

from . import batchnorm, data, memory, models, plots
from .loop import StopTraining, train

MICRO_BATCH_SIZES = (2, 4, 8, 16, 32, 64)


class Dashboard:
    """Sliders, an effective-batch readout, a figure area and a settings line; subclasses implement `compute`."""

    title = "dashboard"

    def __init__(self, *, micro_batch_size: int = 8, accum_steps: int = 4, seed: int = 0, extra_controls=()):
        if micro_batch_size not in MICRO_BATCH_SIZES:
            raise ValueError(f"micro_batch_size must be one of {MICRO_BATCH_SIZES}, got {micro_batch_size!r}")
        if not (isinstance(accum_steps, int) and 1 <= accum_steps <= 16):
            raise ValueError(f"accum_steps must be an integer from 1 to 16, got {accum_steps!r}")
        self.seed = seed
        style = {"description_width": "initial"}
        self.accum_steps = w.IntSlider(value=accum_steps, min=1, max=16, description="accum_steps",
                                       continuous_update=False, style=style)
        self.micro_batch_size = w.SelectionSlider(options=MICRO_BATCH_SIZES, value=micro_batch_size,
                                                  description="micro-batch size", continuous_update=False,
                                                  style=style)
        self.effective = w.HTML(layout=w.Layout(margin="0 0 0 1em"))
        self.figures = w.Output(layout=w.Layout(min_height="320px"))
        self.settings = w.HTML()
        self.controls = [self.micro_batch_size, self.accum_steps, *extra_controls]
        self.widget = w.VBox([w.HTML(f"<h3>{self.title}</h3>"), w.HBox(self.controls[:2] + [self.effective]),
                              *[w.HBox([c]) for c in self.controls[2:]], self.figures, self.settings])
        self.plots: list[plots.Plot] = []
        self.summary = ""
        self.update_seconds: float | None = None  # seconds from the last slider change to its final figure
        self.runs: list[tuple[dict, str]] = []  # (settings, "done" or "cancelled"), in order of completion
        self._generation = 0
        self._thread: threading.Thread | None = None
        for control in self.controls:
            control.observe(self._changed, names="value")
        self._readout()

    # --- what a subclass provides -------------------------------------------------------------------------
    def compute(self, check) -> tuple[list[plots.Plot], str]:
        """Run the experiment for the current values; call check() often (it raises when the run is stale)."""
        raise NotImplementedError

    # --- mechanics ----------------------------------------------------------------------------------------
    @property
    def effective_batch(self) -> int:
        return self.micro_batch_size.value * self.accum_steps.value

    def current_settings(self) -> dict:
        return {"micro_batch_size": self.micro_batch_size.value, "accum_steps": self.accum_steps.value,
                "effective_batch": self.effective_batch, "seed": self.seed}

    def _readout(self) -> None:
        m, k = self.micro_batch_size.value, self.accum_steps.value
        self.effective.value = f"effective batch = {m} &times; {k} = <b>{m * k}</b> samples"

    def _changed(self, _change=None) -> None:
        self._readout()
        self._generation += 1
        self._thread = threading.Thread(target=self.run, args=(self._generation,), daemon=True)
        self._thread.start()

    def run(self, generation: int | None = None) -> None:
        """Run the experiment for the current values in this thread, then redraw; a newer change cancels it."""
        generation = self._generation if generation is None else generation
        started = time.perf_counter()
        settings = self.current_settings()

        def check():
            if generation != self._generation:
                raise StopTraining

        try:
            figures, summary = self.compute(check)
            check()
        except StopTraining:
            self.runs.append((settings, "cancelled"))
            return
        self.draw(figures)
        self.summary = summary
        if self.runs:  # the first run's summary is the cell's printed output; later ones show here
            self.settings.value = f"<pre>latest run, after your change:\n{summary}</pre>"
        self.update_seconds = time.perf_counter() - started
        self.runs.append((settings, "done"))

    def draw(self, figures: list[plots.Plot]) -> None:
        """Replace the figures shown (assigning `outputs` really clears; appended outputs would pile up)."""
        self.plots = figures
        self.figures.outputs = tuple(p.output() for p in figures)

    def wait(self, timeout: float = 60) -> None:
        """Block until the run started by the last slider change has finished."""
        if self._thread is not None:
            self._thread.join(timeout)

    def show(self) -> None:
        """Run once for the current values, display the widgets, print the settings and the finding."""
        self.run()
        display(self)
        print(self.summary)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        labels = ", ".join(c.description for c in self.controls)
        bundle["text/plain"] = f"{self.title} (sliders: {labels})"
        return bundle


@lru_cache(maxsize=None)
def _digits_flat(n: int):
    return data.digits(n, flat=True)


class LossDashboard(Dashboard):
    """Loss curves of (micro-batch, accum_steps) against the full-batch run on the same samples, drawn live."""

    title = "Loss: accumulation against the full batch"

    def __init__(self, *, samples: int = 1000, epochs: int = 2, lr: float = 0.5, redraw_seconds: float = 0.25,
                 **kwargs):
        self.samples, self.epochs, self.lr, self.redraw_seconds = samples, epochs, lr, redraw_seconds
        super().__init__(**kwargs)
        self._references: dict[int, dict] = {}

    def current_settings(self) -> dict:
        return {**super().current_settings(), "samples": self.samples, "epochs": self.epochs, "lr": self.lr,
                "model": "mlp(64-64-10)", "optimizer": "SGD"}

    def _fit(self, m: int, k: int, on_step=None) -> dict:
        model = models.mlp(seed=self.seed)
        history = train(model, _digits_flat(self.samples), torch.optim.SGD(model.parameters(), lr=self.lr),
                        micro_batch_size=m, accum_steps=k, epochs=self.epochs, seed=self.seed, on_step=on_step,
                        measure_memory=False)
        if history.stopped:
            raise StopTraining
        return history.columns()

    def compute(self, check):
        m, k = self.micro_batch_size.value, self.accum_steps.value
        label_ref, label_acc = f"one batch of {m * k} (reference)", f"{k} micro-batches of {m}, accumulated"
        if m * k not in self._references:
            self._references[m * k] = self._fit(m * k, 1, on_step=lambda r: check())
        reference = self._references[m * k]
        live = {"samples_seen": [], "loss": []}
        last_draw = [time.perf_counter()]

        def on_step(record):
            check()
            live["samples_seen"].append(record.samples_seen)
            live["loss"].append(record.loss)
            if time.perf_counter() - last_draw[0] > self.redraw_seconds:
                self.draw([self._plot({label_ref: reference, label_acc: live}, m, k, done=False)])
                last_draw[0] = time.perf_counter()

        accumulated = self._fit(m, k, on_step)
        gap = max(abs(a - b) for a, b in zip(accumulated["loss"], reference["loss"]))
        plot = self._plot({label_ref: reference, label_acc: accumulated}, m, k, done=True, gap=gap)
        settings = ", ".join(f"{key}={value}" for key, value in self.current_settings().items())
        summary = (f"settings: {settings}\n"
                   f"{len(accumulated['loss'])} optimizer steps; final loss {accumulated['loss'][-1]:.3f} "
                   f"(full-batch reference {reference['loss'][-1]:.3f}); curves equal to within 1e-5: "
                   f"{'yes' if gap < 1e-5 else 'no'}")
        return [plot], summary

    def _plot(self, curves, m, k, *, done: bool, gap: float | None = None) -> plots.Plot:
        if done:
            title = f"{k} micro-batches of {m} train exactly like one batch of {m * k} (max loss gap {gap:.0e})"
        else:
            title = f"training {k} micro-batches of {m} ..."
        alt = (f"Line chart of training loss against samples seen. The accumulated run ({k} micro-batches of {m}) "
               f"lies on top of the reference run with one batch of {m * k}.")
        return plots.loss_curves(curves, title, alt)


class MemoryDashboard(Dashboard):
    """Peak memory by category of one step with (micro-batch, accum_steps) against one batch of the same size."""

    title = "Memory: one micro-batch at a time"

    def __init__(self, *, budget_mib: float = 0.5, **kwargs):
        self.budget = w.FloatSlider(value=budget_mib, min=0.25, max=4.0, step=0.25, description="card (MiB)",
                                    continuous_update=False, style={"description_width": "initial"})
        self.model = models.cnn(seed=0)
        self.example = data.digits(1)
        super().__init__(extra_controls=[self.budget], **kwargs)

    def current_settings(self) -> dict:
        return {**super().current_settings(), "budget_bytes": int(self.budget.value * plots.MIB),
                "model": "cnn(16, 32)", "optimizer": "SGD", "method": memory.FAKE}

    def compute(self, check):
        m, k = self.micro_batch_size.value, self.accum_steps.value
        budget = int(self.budget.value * plots.MIB)
        reports = {}
        for label, (size, steps) in {f"{k} x {m} (accumulated)": (m, k), f"1 x {m * k} (one batch)": (m * k, 1)}.items():
            check()
            x, y = memory.batch_of(self.example, size)
            reports[label] = memory.measure_step(self.model, x, y, accum_steps=steps, fake=True)
        accumulated, full = reports.values()
        fits = lambda r: "fits" if r.peak <= budget else "does NOT fit"
        title = (f"Accumulating {k} x {m} peaks at {plots.mib(accumulated.peak)}; "
                 f"one batch of {m * k} needs {plots.mib(full.peak)}")
        alt = (f"Stacked bars of peak memory by category. {k} micro-batches of {m}: {accumulated.peak:,} bytes, "
               f"{fits(accumulated)} the {plots.mib(budget)} card. One batch of {m * k}: {full.peak:,} bytes, "
               f"{fits(full)}.")
        plot = plots.memory_stack({label: r.categories() for label, r in reports.items()}, title, alt, budget)
        settings = ", ".join(f"{key}={value}" for key, value in self.current_settings().items())
        summary = (f"settings: {settings}\n"
                   f"accumulated {k} x {m}: peak {accumulated.peak:,} bytes ({fits(accumulated)} the card)\n"
                   f"one batch of {m * k}: peak {full.peak:,} bytes ({fits(full)} the card)")
        return [plot], summary


class BatchNormDashboard(Dashboard):
    """What BatchNorm sees: micro-batch statistics against the effective batch, and running-statistic error."""

    title = "BatchNorm: statistics of the micro-batch"

    def __init__(self, *, samples: int = 512, **kwargs):
        self.samples = samples
        X, y = data.digits(samples)
        self.X = X
        self.model = models.cnn(norm="batch", seed=0)
        train(self.model, (X, y), torch.optim.SGD(self.model.parameters(), lr=0.05), micro_batch_size=64,
              accum_steps=1, epochs=2, seed=0, measure_memory=False)
        super().__init__(**kwargs)

    def current_settings(self) -> dict:
        return {**super().current_settings(), "samples": self.samples, "model": "cnn(16, 32, norm='batch')"}

    def compute(self, check):
        m, k = self.micro_batch_size.value, self.accum_steps.value
        series, running = {}, {}
        for size in (m, m * k):
            check()
            deviations = batchnorm.micro_batch_deviation(self.model, self.X[:max(m * k, 64)], size)
            series[f"batches of {size}"] = {f"layer {d.layer} {part}": getattr(d, part)
                                            for d in deviations for part in ("mean", "variance")}
            collected = batchnorm.collect_running_stats(self.model, self.X, size, updates=100)
            running[f"running stats from batches of {size}"] = batchnorm.running_stats_error(collected, self.X)
        check()
        fixed = batchnorm.reestimate(batchnorm.collect_running_stats(self.model, self.X, m, updates=100), self.X)
        running["re-estimated with one large batch"] = batchnorm.running_stats_error(fixed, self.X)
        small, large = (sum(series[s].values()) for s in series)
        title = f"Micro-batches of {m} normalise with statistics {small / max(large, 1e-12):.1f}x noisier than batches of {m * k}"
        alt = (f"Grouped bars of how far each BatchNorm layer's batch mean and variance stray from the full-batch "
               f"values: micro-batches of {m} stray {small / max(large, 1e-12):.1f} times as much as batches of {m * k}.")
        deviation_plot = plots.deviation_bars(series, "deviation from full-batch statistic (relative)", title, alt)
        totals = {label: sum(d.mean + d.variance for d in devs) for label, devs in running.items()}
        run_plot = plots.bars(list(totals), list(totals.values()), "running-statistic error (relative, summed)",
                                    "Re-estimating the statistics after training removes the micro-batch noise",
                                    "Bars of running-statistic error: " + "; ".join(
                                        f"{label}: {value:.4f}" for label, value in totals.items()))
        settings = ", ".join(f"{key}={value}" for key, value in self.current_settings().items())
        summary = (f"settings: {settings}\n"
                   f"batch-statistic deviation: micro-batches of {m}: {small:.3f}, batches of {m * k}: {large:.3f}\n"
                   + "\n".join(f"{label}: error {value:.4f}" for label, value in totals.items()))
        return [deviation_plot, run_plot], summary
