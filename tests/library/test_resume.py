"""Runs that stop and go on: a stopped, shuffled run resumed with `resume_from_step` gives the weights, the records
and the sample order of the uninterrupted run, bit for bit (the same micro-batches in the same order through the
same operations: nothing may differ, so the comparisons are exact). What the caller keeps: the model, optimizer,
scheduler and scaler state_dict()s, and the number of steps taken (history[-1].step)."""

import copy

import pytest
import torch
from torch import nn

import accumlib
from states import stable_records

generator = torch.Generator().manual_seed(0)
X, Y = torch.randn(50, 6, generator=generator), torch.randint(0, 3, (50,), generator=generator)
STEPS_PER_EPOCH = 5  # 50 samples in cycles of 4 x 3 = 12: four of 12 and one of 2


def build(amp=False):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3) if amp else None
    return model, optimizer, scheduler, scaler


def seen_by(model):
    """Every micro-batch's first sample, as the model is called with it."""
    inputs = []
    model.register_forward_pre_hook(lambda module, args: inputs.append(args[0][0].clone()))
    return inputs


def state(model, optimizer, scheduler, scaler):
    return copy.deepcopy(
        [model.state_dict(), optimizer.state_dict(), scheduler.state_dict(), scaler.state_dict() if scaler else None]
    )


def restored(saved, amp):
    model, optimizer, scheduler, scaler = build(amp)
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    scheduler.load_state_dict(saved[2])
    if scaler:
        scaler.load_state_dict(saved[3])
    return model, optimizer, scheduler, scaler


def stop_at(step):
    def on_step(record):
        if record.step == step:
            raise accumlib.StopTraining

    return on_step


@pytest.mark.parametrize("amp", [False, "fp16"], ids=["float32", "fp16-with-a-scaler"])
@pytest.mark.parametrize("stop", [3, STEPS_PER_EPOCH, 7])  # within epoch 0, at its end, within epoch 1
def test_a_resumed_shuffled_run_equals_the_uninterrupted_one(amp, stop):
    options = dict(micro_batch_size=4, accum_steps=3, epochs=3, seed=5, amp=amp, device="cpu")
    model, optimizer, scheduler, scaler = build(amp)
    inputs = seen_by(model)
    whole = accumlib.train(model, (X, Y), optimizer, scheduler=scheduler, scaler=scaler, **options)

    first = build(amp)
    first_inputs = seen_by(first[0])
    stopped = accumlib.train(
        first[0], (X, Y), first[1], scheduler=first[2], scaler=first[3], on_step=stop_at(stop), **options
    )
    assert stopped.stopped == "StopTraining" and stopped[-1].step == stop
    saved = state(*first)  # what a checkpoint holds
    second = restored(saved, amp)
    second_inputs = seen_by(second[0])
    resumed = accumlib.train(
        second[0],
        (X, Y),
        second[1],
        scheduler=second[2],
        scaler=second[3],
        resume_from_step=stopped[-1].step,
        **options,
    )

    assert accumlib.parameter_gap(second[0], model) == 0.0
    assert [r["step"] for r in stable_records(resumed)] == list(range(stop + 1, 3 * STEPS_PER_EPOCH + 1))
    assert stable_records(stopped) + stable_records(resumed) == stable_records(whole)
    assert all(torch.equal(a, b) for a, b in zip(first_inputs + second_inputs, inputs, strict=True))
    if amp:
        assert second[3].get_scale() == scaler.get_scale()


def test_without_resume_the_second_run_replays_epoch_0():
    """What resume_from_step fixes: a second call starts the sample order again (the 6.6e-2 of issue 19)."""
    options = dict(micro_batch_size=4, accum_steps=3, epochs=2, seed=5, device="cpu")
    model, optimizer, scheduler, _ = build()
    accumlib.train(model, (X, Y), optimizer, scheduler=scheduler, **options)
    first = build()
    accumlib.train(first[0], (X, Y), first[1], scheduler=first[2], on_step=stop_at(3), **options)
    accumlib.train(first[0], (X, Y), first[1], scheduler=first[2], **options)  # no resume_from_step
    assert accumlib.parameter_gap(first[0], model) > 1e-4


def loader(seed):
    """The caller's DataLoader, shuffled by a seeded generator: built again the same way when resuming."""
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(X, Y), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )


def test_a_resumed_run_over_the_caller_s_dataloader_equals_the_uninterrupted_one():
    model, optimizer, scheduler, _ = build()
    whole = accumlib.train(model, loader(7), optimizer, scheduler=scheduler, accum_steps=3, epochs=3)
    first = build()
    stopped = accumlib.train(
        first[0], loader(7), first[1], scheduler=first[2], accum_steps=3, epochs=3, on_step=stop_at(8)
    )
    second = restored(state(*first), False)
    resumed = accumlib.train(
        second[0], loader(7), second[1], scheduler=second[2], accum_steps=3, epochs=3, resume_from_step=8
    )
    assert accumlib.parameter_gap(second[0], model) == 0.0
    assert stable_records(stopped) + stable_records(resumed) == stable_records(whole)


def test_max_steps_and_a_one_cycle_lr_sized_to_it_resume_too():
    def one_cycle(optimizer):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=12)

    options = dict(micro_batch_size=4, accum_steps=3, max_steps=12, seed=2)  # epochs: as many as 12 steps take
    model, optimizer, _, _ = build()
    whole = accumlib.train(model, (X, Y), optimizer, scheduler=one_cycle(optimizer), **options)
    assert len(whole) == 12 and whole[-1].epoch == 2  # 5 + 5 + 2 steps
    first = build()
    first_scheduler = one_cycle(first[1])
    accumlib.train(first[0], (X, Y), first[1], scheduler=first_scheduler, on_step=stop_at(4), **options)
    saved = copy.deepcopy([first[0].state_dict(), first[1].state_dict(), first_scheduler.state_dict()])
    second = build()
    second_scheduler = one_cycle(second[1])  # built first, then every state loaded (PyTorch's order)
    second[0].load_state_dict(saved[0])
    second[1].load_state_dict(saved[1])
    second_scheduler.load_state_dict(saved[2])
    resumed = accumlib.train(second[0], (X, Y), second[1], scheduler=second_scheduler, resume_from_step=4, **options)
    assert len(resumed) == 8
    assert accumlib.parameter_gap(second[0], model) == 0.0


@pytest.mark.parametrize(
    "options,error,names",
    [
        (dict(resume_from_step=10), ValueError, ["resume_from_step=10", "10 optimizer steps", "0 to 9"]),
        (dict(resume_from_step=-1), ValueError, ["resume_from_step", "-1"]),
        (dict(resume_from_step=2.0), TypeError, ["resume_from_step", "2.0"]),
        (dict(max_steps=0), ValueError, ["max_steps", "0"]),
        (dict(max_steps=True), TypeError, ["max_steps", "True"]),
        (dict(max_steps=4, resume_from_step=4), ValueError, ["resume_from_step=4", "4 optimizer steps"]),
    ],
)
def test_bad_resumes_are_refused_before_anything_changes(options, error, names):
    model, optimizer, _, _ = build()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error) as info:
        accumlib.train(model, (X, Y), optimizer, micro_batch_size=4, accum_steps=3, epochs=2, **options)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert accumlib.parameter_gap(model, before) == 0.0


def test_a_resume_past_the_end_of_a_loader_without_len_is_refused_before_anything_changes():
    model, optimizer, _, _ = build()
    before = copy.deepcopy(model.state_dict())
    stream = [(X[i : i + 4], Y[i : i + 4]) for i in range(0, 50, 4)]  # 13 batches: 5 steps of 3
    with pytest.raises(ValueError, match="resume_from_step=9 is past the end of the run: data gives 5 optimizer"):
        accumlib.train(model, iter(stream), optimizer, accum_steps=3, resume_from_step=9)
    assert accumlib.parameter_gap(model, before) == 0.0
