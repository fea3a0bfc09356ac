"""accumlib.lessons.show.ddp (lesson 9): the effective batch and the all-reduce findings follow the numbers they are given,
and the progress bar follows the job's reports. (The DDP job itself is tested in tests/test_distributed.py.)"""
import pytest
import torch

from accumlib.lessons import models
from accumlib.distributed import DDPResult
from accumlib.lessons.show import ddp


def result(no_sync: bool, allreduces, micro_batches, state=None) -> DDPResult:
    return DDPResult(world_size=2, micro_batch_size=4, accum_steps=3, no_sync=no_sync, allreduces=tuple(allreduces),
                     micro_batches=tuple(micro_batches), state=state or {},
                     losses=tuple(1.0 for _ in micro_batches))


@pytest.mark.parametrize("samples, lines", [
    (100, ["Effective batch: 4 × 3 × 2 = 24 samples per optimizer step.",
           "100 samples per epoch: 4 full steps and a last step of 4 samples."]),
    (96, ["Effective batch: 4 × 3 × 2 = 24 samples per optimizer step.", "96 samples per epoch: 4 full steps."]),
    (30, ["Effective batch: 4 × 3 × 2 = 24 samples per optimizer step.",
          "30 samples per epoch: 1 full step and a last step of 6 samples."]),
])
def test_effective_batch_and_how_an_epoch_splits(capsys, samples, lines):
    assert ddp.effective_batch(micro_batch_size=4, accum_steps=3, processes=2, samples=samples) == 24
    assert capsys.readouterr().out.splitlines() == lines


def test_allreduces_a_row_per_step_and_the_average_explained_by_the_short_steps(capsys):
    micro = (3, 3, 3, 3, 1, 3, 3, 3, 3, 1)
    counts = ddp.allreduces({False: result(False, micro, micro), True: result(True, [1] * 10, micro)})
    printed = capsys.readouterr().out
    assert counts == {False: micro, True: (1,) * 10}
    rows = printed.splitlines()[1:11]
    assert [row.split() for row in rows][4] == ["5", "1", "1", "1"]  # the short last step of epoch 1
    assert "as many all-reduces per step as micro-batches, 26 for 10 steps (2.6 per step on average, since the " \
           "short steps have fewer micro-batches)." in printed
    assert "one all-reduce per step, in the backward() of the cycle's last micro-batch: 10 for 10 steps, 16 fewer." \
        in printed


def test_allreduces_without_short_steps_has_no_average_and_other_counts_are_stated_plainly(capsys):
    micro = (3, 3, 3, 3)
    ddp.allreduces({False: result(False, micro, micro), True: result(True, [1] * 4, micro)})
    printed = capsys.readouterr().out
    assert "12 for 4 steps." in printed and "on average" not in printed
    two_buckets = (6, 6, 6, 6)  # a model whose gradient fills two buckets: not one all-reduce per micro-batch
    ddp.allreduces({False: result(False, two_buckets, micro), True: result(True, [2] * 4, micro)})
    printed = capsys.readouterr().out
    assert "Without no_sync(): 24 all-reduces for 4 steps." in printed
    assert "With no_sync(): 8 all-reduces for 4 steps." in printed


def test_allreduces_refuses_runs_of_different_jobs():
    with pytest.raises(ValueError, match="results: the two runs took different steps"):
        ddp.allreduces({False: result(False, (3, 1), (3, 1)), True: result(True, (1, 1, 1), (3, 3, 1))})


def test_same_weights_measures_each_run_against_the_single_process(capsys):
    single = models.mlp(dtype=torch.float64)
    state = {k: v.clone() for k, v in single.state_dict().items()}
    shifted = {k: v + (1e-3 if k == "0.bias" else 0) for k, v in state.items()}
    gaps = ddp.same_weights({False: result(False, (3,), (3,), shifted), True: result(True, (1,), (3,), state)},
                            single)
    assert gaps[False] == pytest.approx(1e-3) and gaps[True] == 0
    assert "one process trained on batches of 24: 1.0e-03 without no_sync(), 0.0e+00 with it." in \
        capsys.readouterr().out
    rounded = {k: v + (1e-15 if k == "0.bias" else 0) for k, v in state.items()}  # float64 rounding, both runs
    gaps = ddp.same_weights({False: result(False, (3,), (3,), rounded), True: result(True, (1,), (3,), state)},
                            single)
    assert 0 < gaps[False] <= ddp.FLOAT64_ROUNDING and "the DDP run ends with the weights of one process trained on " \
        "batches of 24: they differ by at most 1.0e-12 (float64 rounding)." in capsys.readouterr().out


def test_progress_bar_appears_once_at_the_first_report_and_follows_the_steps(monkeypatch):
    shown = []
    monkeypatch.setattr(ddp, "display", shown.append)
    bar = ddp.progress_bar()
    bar(0, 20)
    assert shown == [bar] and bar._repr_mimebundle_()["text/plain"] == \
        "Progress of the DDP job: starting the processes…"
    bar(5, 20)
    assert (bar.bar.value, bar.bar.max, bar.label.value) == (5, 20, "optimizer step 5 of 20")
    bar(20, 20)
    assert bar.label.value == "done: 20 optimizer steps" and shown == [bar]
