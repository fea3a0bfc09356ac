"""The hostile user against train's newer surface: the train-side cases of issue 23, and issue 19's silent overflow.

Which test answers which case of issue 23 ("Nothing torn, nothing silent, no abort"):
- case 6 (token counts computed a cycle at a time): test_case_6_a_counted_run_of_a_billion_epochs_starts_at_once,
  test_case_6_ctrl_c_while_counting_stops_cleanly, test_case_6_a_cycle_without_loss_terms_is_refused_before_it_changes
- case 8 (train's model mode): test_case_8_a_model_in_eval_mode_trains_in_training_mode_and_goes_back,
  test_case_8_a_model_in_training_mode_keeps_its_eval_submodules, test_case_8_modes_are_put_back_after_an_error,
  test_case_8_an_on_step_that_evaluates_does_not_freeze_training
- case 10 (sizes said out loud): test_case_10_an_effective_batch_larger_than_the_data_is_said_in_the_notes,
  test_case_10_a_loader_shorter_than_accum_steps_is_said_in_the_notes, test_case_10_data_on_the_meta_device_names_data
Issue 19 ("no silent overflow"): test_persistent_skips_raise_naming_the_count_and_the_scale (with and without a
GradScaler), test_a_few_skips_in_a_row_do_not_raise.

Comparisons of weights are exact (== 0.0) where both runs do the same operations on the same data in the same order.
"""

import copy
import math
import signal

import pytest
import torch
from torch import nn

import accumlib
from builders import data, models

X, Y = data.token_sequences(48, seed=3)  # token sequences for normalize="count": micro-batch 4 x 2 = 6 steps/epoch
COUNTED = dict(
    loss_fn=models.token_loss_sum,
    loss_reduction="sum",
    normalize="count",
    micro_batch_size=4,
    accum_steps=2,
    shuffle=False,
)


def counting(calls):
    """data.count_tokens, noting each call."""

    def count(y):
        calls.append(1)
        return data.count_tokens(y)

    return count


def reference(steps, **options):
    """The same run, stopped by max_steps after `steps` steps."""
    model = models.sequence_model()
    accumlib.train(
        model,
        (X, Y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        count=data.count_tokens,
        max_steps=steps,
        **(COUNTED | options),
    )
    return model


def stop_at(step):
    def on_step(record):
        if record.step == step:
            raise accumlib.StopTraining

    return on_step


def test_case_6_a_counted_run_of_a_billion_epochs_starts_at_once():
    """Stopped by StopTraining at step 2, the run has counted 2 cycles' micro-batches: 4, not 10**9 epochs' worth."""
    calls = []
    model = models.sequence_model()
    history = accumlib.train(
        model,
        (X, Y),
        torch.optim.SGD(model.parameters(), lr=0.5),
        count=counting(calls),
        epochs=10**9,
        on_step=stop_at(2),
        **COUNTED,
    )
    assert history.stopped == "StopTraining" and len(history) == 2
    assert len(calls) == 2 * 2
    assert accumlib.parameter_gap(model, reference(2)) == 0.0


def test_case_6_ctrl_c_while_counting_stops_cleanly():
    """A real SIGINT delivered inside count, at step 3's counting: history.stopped, the two steps taken, no more."""
    calls = []

    def interrupted(y):
        calls.append(1)
        if len(calls) == 5:  # the first micro-batch of step 3
            signal.raise_signal(signal.SIGINT)
        return data.count_tokens(y)

    model = models.sequence_model()
    history = accumlib.train(
        model, (X, Y), torch.optim.SGD(model.parameters(), lr=0.5), count=interrupted, epochs=10**9, **COUNTED
    )
    assert history.stopped == "KeyboardInterrupt"
    assert [r.step for r in history] == [1, 2]
    assert accumlib.parameter_gap(model, reference(2)) == 0.0
    assert all(p.grad is None for p in model.parameters())


def test_case_6_a_cycle_without_loss_terms_is_not_stepped_and_the_run_goes_on():
    """Counting a cycle at a time, the cycle without terms (step 2) has nothing to learn: it is recorded as empty
    (not skipped), not stepped, and the run goes on: the run without step 2's samples, bit for bit."""
    blank = Y.clone()
    blank[8:16] = data.PAD  # step 2's targets: nothing but padding
    model = models.sequence_model()
    history = accumlib.train(
        model, (X, blank), torch.optim.SGD(model.parameters(), lr=0.5), count=data.count_tokens, **COUNTED
    )
    assert [(r.step, r.empty, r.skipped) for r in history][:3] == [
        (1, False, False),
        (2, True, False),
        (3, False, False),
    ]
    assert [r.empty for r in history].count(True) == 1
    without = models.sequence_model()
    kept = torch.cat([torch.arange(8), torch.arange(16, len(X))])
    accumlib.train(
        without,
        (X[kept], blank[kept]),
        torch.optim.SGD(without.parameters(), lr=0.5),
        count=data.count_tokens,
        **COUNTED,
    )
    assert accumlib.parameter_gap(model, without) == 0.0


def bn_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Dropout(0.0), nn.ReLU(), nn.Linear(16, 10))


DIGITS = data.digits(40, flat=True)
OPTIONS = dict(micro_batch_size=4, accum_steps=2, seed=1)


def test_case_8_a_model_in_eval_mode_trains_in_training_mode_and_goes_back():
    modes = []
    left_in_eval = bn_model().eval()
    accumlib.train(
        left_in_eval,
        DIGITS,
        torch.optim.SGD(left_in_eval.parameters(), lr=0.1),
        on_step=lambda r: modes.append([m.training for m in left_in_eval.modules()]),
        **OPTIONS,
    )
    assert modes and all(all(step) for step in modes)  # every module in training mode during the run
    assert not any(m.training for m in left_in_eval.modules())  # and back in eval mode after it
    in_training = bn_model()
    accumlib.train(in_training, DIGITS, torch.optim.SGD(in_training.parameters(), lr=0.1), **OPTIONS)
    assert accumlib.parameter_gap(left_in_eval, in_training) == 0.0  # BatchNorm's statistics updated alike


def test_case_8_a_model_in_training_mode_keeps_its_eval_submodules():
    """Frozen BatchNorm (a submodule put in eval mode on purpose) stays frozen: its running statistics unchanged."""
    model = bn_model()
    model[1].eval()
    statistics = copy.deepcopy(model[1].state_dict())
    accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), **OPTIONS)
    assert not model[1].training and model.training
    assert all(torch.equal(statistics[k], v) for k, v in model[1].state_dict().items() if "running" in k)


def test_case_8_modes_are_put_back_after_an_error():
    model = bn_model().eval()

    def fails(output, target):
        raise RuntimeError("user code failed")

    with pytest.raises(RuntimeError, match="user code failed"):
        accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=fails, **OPTIONS)
    assert not any(m.training for m in model.modules())


def test_case_8_an_on_step_that_evaluates_does_not_freeze_training():
    """on_step evaluates (model.eval()) and forgets model.train(): the next steps still train in training mode."""
    modes = []
    model = bn_model()

    def evaluate(record):
        modes.append(model.training)
        model.eval()

    accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), on_step=evaluate, **OPTIONS)
    assert modes == [True] * 5
    assert model.training  # the mode train found


def test_case_10_an_effective_batch_larger_than_the_data_is_said_in_the_notes():
    """4 x 8 = 32 samples per step over 20 samples: accepted (the lessons' dashboards compare such runs with the
    whole data), one step of 20 samples per epoch, and said in the history's notes."""
    model = bn_model()
    history = accumlib.train(
        model,
        (DIGITS[0][:20], DIGITS[1][:20]),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=8,
        epochs=2,
    )
    assert [r.samples for r in history] == [20, 20]
    assert len(history.notes) == 1
    assert all(word in history.notes[0] for word in ("4", "8", "32", "20 samples", "one step"))
    fitting = accumlib.train(
        model,
        (DIGITS[0][:20], DIGITS[1][:20]),
        torch.optim.SGD(model.parameters(), lr=0.1),
        micro_batch_size=4,
        accum_steps=5,
    )
    assert fitting.notes == []


def test_case_10_a_loader_shorter_than_accum_steps_is_said_in_the_notes():
    model = bn_model()
    batches = [(DIGITS[0][i : i + 4], DIGITS[1][i : i + 4]) for i in range(0, 12, 4)]
    history = accumlib.train(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=5)
    assert [r.micro_batches for r in history] == [3]
    assert history.notes and "accum_steps=5" in history.notes[0] and "3 batches" in history.notes[0]


class MetaSamples(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.empty(64, device="meta"), torch.tensor(0)


@pytest.mark.parametrize("kind", ["tensors", "dataset", "loader"])
def test_case_10_data_on_the_meta_device_names_data(kind):
    meta_x = torch.empty(40, 64, device="meta")
    given = {"tensors": (meta_x, DIGITS[1]), "dataset": MetaSamples(), "loader": [(meta_x[:4], DIGITS[1][:4])]}[kind]
    model = bn_model()
    before = copy.deepcopy(model.state_dict())
    options = dict(micro_batch_size=4) if kind != "loader" else {}
    with pytest.raises(ValueError, match="data holds tensors on the meta device"):
        accumlib.train(model, given, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=2, **options)
    assert accumlib.parameter_gap(model, before) == 0.0


def nan_gradient(output, target):
    """A finite loss whose gradient is NaN on every step (sqrt's derivative at 0 is infinite, times 0): to a
    GradScaler, an overflow that no scale cures."""
    return nn.functional.cross_entropy(output, target) + torch.sqrt(output.sum() * 0)


@pytest.mark.parametrize("amp", [False, "fp16"], ids=["no-scaler", "grad-scaler"])
def test_persistent_skips_raise_naming_the_count_and_the_scale(amp):
    """240 steps' worth of data, every gradient non-finite: NonFiniteError after max_skipped_steps=50 skips (today's
    default), naming the count and, under a scaler, its scale; the 50 records travel with it."""
    model = bn_model()
    before = copy.deepcopy(model.state_dict())
    X, y = data.digits(40, flat=True)
    many = (X.repeat(48, 1), y.repeat(48))  # 1920 samples / 8 per step = 240 steps
    with pytest.raises(accumlib.NonFiniteError) as info:
        accumlib.train(
            model,
            many,
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=2,
            loss_fn=nan_gradient,
            amp=amp,
            device="cpu",
        )
    message = str(info.value)
    assert "50 optimizer steps in a row were skipped" in message and "max_skipped_steps=50" in message
    history = info.value.history
    assert len(history) == 50 and all(r.skipped for r in history)
    assert accumlib.parameter_gap(model, before) == 0.0  # no step was applied
    if amp:
        scale = 2.0**16 * 0.5**50  # the GradScaler's default initial scale, halved at each skip
        assert f"scale is now {scale:g}" in message


def test_a_few_skips_in_a_row_do_not_raise():
    calls = []

    def nan_at_first(output, target):  # the first 3 steps (6 micro-batches) NaN, then finite
        calls.append(1)
        loss = nn.functional.cross_entropy(output, target)
        return loss * math.nan if len(calls) <= 6 else loss

    model = bn_model()
    history = accumlib.train(
        model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=nan_at_first, max_skipped_steps=4, **OPTIONS
    )
    assert [r.skipped for r in history] == [True, True, True, False, False]


@pytest.mark.parametrize(
    "value,error", [(0, ValueError), (-1, ValueError), (2.5, TypeError), (True, TypeError), (None, TypeError)]
)
def test_max_skipped_steps_must_be_a_positive_integer(value, error):
    model = bn_model()
    with pytest.raises(error, match=f"max_skipped_steps must be a positive integer.*{value!r}"):
        accumlib.train(model, DIGITS, torch.optim.SGD(model.parameters(), lr=0.1), max_skipped_steps=value, **OPTIONS)
