"""Dashboards driven from pytest: set slider values, wait for the run, check the figure's data."""
import numpy as np
import pytest

from accumlib import widgets


@pytest.fixture(scope="module")
def loss():
    dashboard = widgets.LossDashboard(samples=300, epochs=1)
    dashboard.show()
    return dashboard


def line_data(plot):
    ax = plot.figure.axes[0]
    return {line.get_label(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata())) for line in ax.get_lines()}


def test_loss_dashboard_redraws_accumulated_against_reference(loss, capsys):
    loss.micro_batch_size.value = 4
    loss.accum_steps.value = 3
    loss.wait()
    assert loss.runs[-1] == (loss.current_settings(), "done")
    lines = line_data(loss.plots[0])
    (rx, ry), (ax_, ay) = lines["one batch of 12 (reference)"], lines["3 micro-batches of 4, accumulated"]
    assert len(rx) == len(ax_) == 25 and rx[-1] == ax_[-1] == 300  # 300 samples: 24 full cycles + one of 12
    assert np.max(np.abs(ry - ay)) < 1e-5
    assert "micro_batch_size=4, accum_steps=3, effective_batch=12, seed=0" in loss.summary
    assert "effective batch = 4 &times; 3 = <b>12</b>" in loss.effective.value
    assert loss.plots[0].figure.axes[0].get_xlabel() == "samples seen"
    assert "micro-batches of 4" in loss.plots[0].alt


def test_a_new_value_cancels_the_stale_run(loss):
    loss.micro_batch_size.value = 2
    loss.accum_steps.value = 16  # arrives while the run for (2, 3) is still training
    loss.wait()
    outcomes = [(s["micro_batch_size"], s["accum_steps"], outcome) for s, outcome in loss.runs[-2:]]
    assert outcomes == [(2, 3, "cancelled"), (2, 16, "done")]
    assert len(loss.figures.outputs) == 1  # figures are replaced, never piled up
    assert loss.update_seconds < 5


def test_memory_dashboard_budget_line_and_bars():
    dashboard = widgets.MemoryDashboard()
    dashboard.show()
    dashboard.accum_steps.value = 8
    dashboard.wait()
    ax = dashboard.plots[0].figure.axes[0]
    heights = {}
    for container in ax.containers:
        for bar, label in zip(container, ["8 x 8 (accumulated)", "1 x 64 (one batch)"]):
            heights[label] = heights.get(label, 0) + bar.get_height()
    assert heights["1 x 64 (one batch)"] > 2 * heights["8 x 8 (accumulated)"]
    budget_lines = [line for line in ax.get_lines() if "card budget" in line.get_label()]
    assert budget_lines[0].get_ydata()[0] == pytest.approx(0.5)
    assert "one batch of 64" in dashboard.summary and "does NOT fit" in dashboard.summary
    dashboard.budget.value = 4.0
    dashboard.wait()
    assert "does NOT fit" not in dashboard.summary


def test_batchnorm_dashboard_smaller_micro_batch_more_drift():
    dashboard = widgets.BatchNormDashboard()
    drift = {}
    for m in (2, 16):
        dashboard.micro_batch_size.value = m
        dashboard.accum_steps.value = 4
        dashboard.wait()
        bars = dashboard.plots[0].figure.axes[0].containers
        drift[m] = sum(bar.get_height() for bar in bars[0])  # the micro-batch series
        assert sum(bar.get_height() for bar in bars[0]) > sum(bar.get_height() for bar in bars[1])
    assert drift[2] > drift[16]
    assert "re-estimated with one large batch: error 0.0000" in dashboard.summary


def test_every_widget_has_a_label_and_bad_defaults_are_refused():
    dashboard = widgets.MemoryDashboard()
    assert all(c.description for c in dashboard.controls)
    with pytest.raises(ValueError, match="micro_batch_size must be one of"):
        widgets.LossDashboard(micro_batch_size=5)
    with pytest.raises(ValueError, match="accum_steps must be an integer from 1 to 16, got 0"):
        widgets.LossDashboard(accum_steps=0)


def test_models_built_in_parallel_threads_get_their_seeded_weights():
    import threading

    import torch

    from accumlib import models

    reference = models.mlp(seed=0)
    built = []
    threads = [threading.Thread(target=lambda: built.append(models.mlp(seed=0))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(m[0].weight, reference[0].weight) for m in built)
