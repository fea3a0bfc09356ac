"""accumlib.memory: what a step's peak is made of, by category, and plans that train() accepts: train's peak is
measure_step's byte for byte (one recipe, issue 19), for every optimizer torch ships (issue 23, case 2), at a plan's
exact boundary (case 10); bad input to fit_batch, measure_step and batch_of refused naming the parameter, with the
caller's model and optimizer untouched (refusals.py)."""

import warnings

import pytest
import refusals
import torch
from peaks import Masked, batchnorm, trained_peaks
from torch import nn

import accumlib
from accumlib import measured_step, memory
from builders import data, models
from states import stable_records

X, Y = data.digits(256)
XF, YF = data.digits(256, flat=True)
BATCH_SIZED = ("inputs", "activations", "activation gradients")  # what one micro-batch brings
MODEL_SIZED = ("parameters", "gradients", "optimizer state")


def test_activation_bytes_are_proportional_to_micro_batch_size():
    per_sample = [memory.measure_step(models.cnn(), X[:m], Y[:m]).activations / m for m in (8, 16, 32, 64, 128)]
    assert max(per_sample) / min(per_sample) < 1.05


def test_at_a_fixed_effective_batch_only_what_the_micro_batch_brings_shrinks():
    one, split = (
        memory.measure_step(models.cnn(), X[:m], Y[:m], accum_steps=k).categories() for m, k in [(64, 1), (16, 4)]
    )
    for category in BATCH_SIZED:  # a quarter of the samples per pass: a quarter of the bytes (a 4-byte scalar aside)
        assert split[category] == pytest.approx(one[category] / 4, abs=4)
    assert split["parameters"] == one["parameters"]
    # at 1 x 64 the peak comes halfway through backward, with part of the gradient built; accumulating keeps it whole
    assert split["gradients"] == split["parameters"] > one["gradients"]
    # what was called "other" is backward's gradients with respect to activations; only the scalar losses remain:
    # with accumulation the micro-batch's loss and the loss summed so far (one op per micro-batch adds the loss times
    # its weight); a single micro-batch of weight 1 is its own sum: one 4-byte scalar fewer
    assert one["activation gradients"] > one["activations"] > 0
    assert one["other"] + 4 == split["other"] <= 16


def test_weights_gradients_and_state_do_not_depend_on_micro_batch_or_accum_steps():
    net = models.cnn()
    adam = torch.optim.Adam(net.parameters())
    reports = {
        (m, k): memory.measure_step(net, X[:m], Y[:m], optimizer=adam, accum_steps=k)
        for m, k in [(8, 1), (64, 1), (8, 8)]
    }
    full_gradient = 4 * sum(p.numel() for p in net.parameters())
    for r in reports.values():
        assert r.parameters == full_gradient
        assert r.optimizer_state == 2 * full_gradient + 4 * len(list(net.parameters()))  # exp_avg, exp_avg_sq, step
        assert 0 < r.gradients <= full_gradient  # at the peak, never more than one gradient
        assert r.peak_phase == "backward"
    assert reports[8, 8].gradients == full_gradient  # accumulating keeps the whole gradient alive through the cycle
    assert net.parameters().__next__().grad is None and not adam.state  # the real model and optimizer untouched


def test_peak_of_accumulation_is_that_of_one_micro_batch_not_the_effective_batch():
    net = models.cnn()
    small, accumulated, big = (
        memory.measure_step(net, X[:m], Y[:m], accum_steps=k) for m, k in [(16, 1), (16, 8), (128, 1)]
    )
    assert accumulated.peak <= 1.1 * small.peak
    assert big.peak > 2.5 * accumulated.peak


def test_when_weights_and_adam_state_dominate_accumulation_barely_helps():
    wide = models.wide_mlp()
    adam = torch.optim.Adam(wide.parameters())
    one = memory.measure_step(wide, XF[:16], YF[:16], optimizer=adam, accum_steps=8)
    full = memory.measure_step(wide, XF[:128], YF[:128], optimizer=adam)
    assert one.peak > 0.95 * full.peak  # saving under 5% of the peak
    assert one.peak_phase == full.peak_phase == "step"  # Adam's update, after backward has freed the activations
    assert one.activations == one.activation_gradients == 0
    # at the step only what the model fixes, the micro-batch and the loss summed so far (one 4-byte scalar: the
    # last micro-batch's loss and graph are dropped before the step) are live
    assert one.parameters + one.gradients + one.optimizer_state + one.optimizer_temporaries + one.inputs + 4 == one.peak
    assert one.other == 4
    assert one.optimizer_temporaries > one.parameters  # Adam's update works on whole-layer temporaries


def test_with_sgd_accumulation_can_raise_the_peak_by_the_incoming_gradient_of_a_layer():
    wide = models.wide_mlp()
    one_batch = memory.measure_step(wide, XF[:64], YF[:64], fake=True)
    accumulated = memory.measure_step(wide, XF[:8], YF[:8], accum_steps=8, fake=True)
    assert one_batch.incoming_gradients == 0  # with one pass per step the gradient becomes .grad directly
    middle = wide[2]  # the 2048 x 2048 layer: its micro-batch gradient exists beside the whole .grad for a moment
    assert accumulated.incoming_gradients == 4 * (middle.weight.numel() + middle.bias.numel())
    assert accumulated.peak > 1.4 * one_batch.peak


def test_cpu_measurement_is_deterministic_and_fake_mode_agrees_without_computing():
    net = models.cnn(norm="batch")
    a = memory.measure_step(net, X[:32], Y[:32])
    b = memory.measure_step(net, X[:32], Y[:32])
    fake = memory.measure_step(net, X[:32], Y[:32], fake=True)
    assert a == b
    assert a.method == measured_step.TRACKER and fake.method == measured_step.FAKE
    assert fake.categories() == a.categories() and fake.peak_phase == a.peak_phase


def test_a_model_on_the_meta_device_is_measured_without_weights():
    with torch.device("meta"):
        ghost = models.cnn()
    assert memory.measure_step(ghost, X[:8], Y[:8], fake=True) == memory.measure_step(
        models.cnn(), X[:8], Y[:8], fake=True
    )


@pytest.mark.parametrize("m,k", [(1, 1), (1, 4), (8, 1), (64, 4)])
def test_categories_are_what_was_alive_at_the_peak_and_add_up_to_it(m, k):
    r = memory.measure_step(
        models.cnn(norm="batch"), X[:m], Y[:m], optimizer=torch.optim.Adam(models.cnn().parameters()), accum_steps=k
    )
    assert list(r.categories()) == list(memory.CATEGORIES)
    assert all(value >= 0 for value in r.categories().values())
    assert sum(r.categories().values()) == r.peak  # the tracker's own peak, not a sum by definition


def test_every_pass_after_the_second_peaks_like_the_second():
    net = models.cnn()
    peaks = {k: memory.measure_step(net, X[:8], Y[:8], accum_steps=k, fake=True).peak for k in (1, 2, 3, 8)}
    assert peaks[1] < peaks[2] == peaks[3] == peaks[8]  # why check_fits measures min(accum_steps, 2) passes


def test_measuring_leaves_the_callers_random_state_alone():
    dropout_net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 10))
    state = torch.random.get_rng_state()
    memory.measure_step(dropout_net, X[:8], Y[:8], accum_steps=2)
    assert torch.equal(state, torch.random.get_rng_state())


def test_history_records_carry_the_cpu_peak():
    net = models.cnn()
    h = accumlib.train(
        net,
        (X[:100], Y[:100]),
        torch.optim.SGD(net.parameters(), lr=0.1),
        micro_batch_size=8,
        accum_steps=4,
        measure_memory=True,
    )
    peaks = [r.peak_memory_bytes for r in h]
    assert peaks[0] == peaks[1] == peaks[2] > peaks[3] > 0  # the last cycle (4 samples) is smaller
    assert peaks[0] == memory.measure_step(models.cnn(), X[:8], Y[:8], accum_steps=4).peak  # the same step, measured
    big = models.cnn()
    h_big = accumlib.train(
        big,
        (X[:100], Y[:100]),
        torch.optim.SGD(big.parameters(), lr=0.1),
        micro_batch_size=32,
        accum_steps=1,
        measure_memory=True,
    )
    assert h_big[0].peak_memory_bytes > 1.5 * peaks[0]


def train_quickly(model, optimizer, plan, **kwargs):
    """One optimizer step of the plan on real images (builders.data) under its own budget."""
    n = plan.micro_batch_size * plan.accum_steps
    Xs, Ys = data.digits(n) if n <= data.DIGITS else (X.repeat(-(-n // 256), 1, 1, 1)[:n], Y.repeat(-(-n // 256))[:n])
    return accumlib.train(
        model,
        (Xs, Ys),
        optimizer,
        micro_batch_size=plan.micro_batch_size,
        accum_steps=plan.accum_steps,
        memory_budget=plan.memory_budget,
        measure_memory=True,
        **kwargs,
    )


@pytest.mark.parametrize("budget,target", [(2**19, 256), (2**19, 96), (400_000, 64), (2**21, 64), (2**20, 120)])
def test_a_plan_trains_under_its_budget_and_the_next_larger_micro_batch_is_refused(budget, target):
    net = models.cnn()
    plan = memory.fit_batch(net, (X[:1], Y[:1]), target, budget)
    assert plan.micro_batch_size * plan.accum_steps == plan.target_batch == target
    assert plan.peak_bytes <= budget
    history = train_quickly(net, torch.optim.SGD(net.parameters(), lr=0.1), plan)
    assert len(history) == 1 and history[0].peak_memory_bytes <= budget  # accepted, and it really stayed under
    if plan.next_micro_batch_size is None:
        assert plan.accum_steps == 1  # the whole effective batch fits in one pass
        return
    assert target % plan.next_micro_batch_size == 0 and plan.next_micro_batch_size > plan.micro_batch_size
    assert not any(target % d == 0 for d in range(plan.micro_batch_size + 1, plan.next_micro_batch_size))
    assert plan.next_peak_bytes > budget
    bigger = memory.FitPlan(
        target,
        budget,
        plan.next_micro_batch_size,
        target // plan.next_micro_batch_size,
        plan.next_peak_bytes,
        0,
        None,
        None,
    )
    fresh = models.cnn()
    with pytest.raises(accumlib.OutOfMemory):
        train_quickly(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), bigger)
    assert plan.micro_batch_size <= plan.largest_fitting < plan.next_micro_batch_size


def test_the_plan_for_lesson_four_card_accumulates_micro_batches_of_eight():
    """micro-batch 16 accumulating peaks above 0.5 MiB (the whole gradient lives through the cycle)."""
    net = models.cnn()
    plan = memory.fit_batch(net, (X[:1], Y[:1]), 256, 2**19)
    assert plan.next_micro_batch_size == 16
    assert plan.next_peak_bytes == memory.measure_step(net, X[:16], Y[:16], accum_steps=16).peak > 2**19
    assert (plan.micro_batch_size, plan.accum_steps) == (8, 32)


def test_a_plan_with_adam_counts_its_state_and_fits_under_train():
    net = models.cnn()
    adam = torch.optim.Adam(net.parameters())
    sgd_plan = memory.fit_batch(net, (X[:1], Y[:1]), 128, 2**19)
    adam_plan = memory.fit_batch(net, (X[:1], Y[:1]), 128, 2**19, optimizer=adam)
    m = adam_plan.micro_batch_size
    assert adam_plan.peak_bytes > memory.measure_step(net, X[:m], Y[:m], accum_steps=adam_plan.accum_steps).peak
    assert adam_plan.micro_batch_size <= sgd_plan.micro_batch_size
    assert len(train_quickly(net, adam, adam_plan)) == 1


def test_a_whole_batch_that_fits_needs_no_accumulation_and_one_sample_that_does_not_is_refused():
    net = models.cnn()
    plan = memory.fit_batch(net, (X[:1], Y[:1]), 32, 2**21)
    assert (plan.micro_batch_size, plan.accum_steps, plan.next_micro_batch_size) == (32, 1, None)
    with pytest.raises(accumlib.OutOfMemory, match="even one sample per pass needs") as info:
        memory.fit_batch(net, (X[:1], Y[:1]), 256, 1000)
    assert info.value.available_bytes == 1000 and "smaller micro_batch_size" not in str(info.value)


def test_fit_batch_allocates_nothing_of_the_size_of_a_huge_target():
    plan = memory.fit_batch(models.mlp(), (XF[:1], YF[:1]), 10**8, 2**22)  # 10**8 samples would be 25.6 GB
    assert plan.micro_batch_size * plan.accum_steps == 10**8 and plan.peak_bytes <= 2**22


def test_training_over_budget_raises_before_any_change_and_a_smaller_micro_batch_works():
    net = models.cnn()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    before = [p.detach().clone() for p in net.parameters()]
    budget = memory.measure_step(net, X[:16], Y[:16], accum_steps=4, fake=True).peak
    with pytest.raises(accumlib.OutOfMemory) as info:
        accumlib.train(net, (X, Y), opt, micro_batch_size=64, accum_steps=1, memory_budget=budget)
    assert isinstance(info.value, torch.OutOfMemoryError)
    assert info.value.available_bytes == budget and info.value.needed_bytes > budget
    assert f"{budget:,} bytes" in str(info.value)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    history = accumlib.train(
        net, (X, Y), opt, micro_batch_size=16, accum_steps=4, memory_budget=budget, measure_memory=True
    )
    assert len(history) == 4
    assert all(r.peak_memory_bytes == budget for r in history)  # the estimate is the step train runs


@pytest.mark.parametrize(
    "make", [lambda p: torch.optim.SGD(p, lr=0.1), lambda p: torch.optim.Adam(p, lr=0.01)], ids=["SGD", "Adam"]
)
def test_an_amp_step_is_planned_and_recorded_with_its_autocast_byte_for_byte(make):
    """train(amp="bf16") on the CPU: the budget's trace and measure_step run the forward passes under autocast as
    the step does, so the plan is the trained peak; the bf16 activations are fewer bytes than float32's."""
    net = models.cnn()
    amp = memory.measure_step(
        net, X[:16], Y[:16], optimizer=make(net.parameters()), accum_steps=4, amp="bf16", fake=True
    )
    full = memory.measure_step(net, X[:16], Y[:16], optimizer=make(net.parameters()), accum_steps=4, fake=True)
    assert amp.activations < full.activations and amp.peak < full.peak
    with pytest.raises(accumlib.OutOfMemory):
        accumlib.train(
            net,
            (X[:128], Y[:128]),
            make(net.parameters()),
            micro_batch_size=16,
            accum_steps=4,
            amp="bf16",
            memory_budget=amp.peak - 1,
            device="cpu",
        )
    history = accumlib.train(
        net,
        (X[:128], Y[:128]),
        make(net.parameters()),
        micro_batch_size=16,
        accum_steps=4,
        amp="bf16",
        memory_budget=amp.peak,
        measure_memory=True,
        device="cpu",
    )
    assert [r.peak_memory_bytes for r in history] == [amp.peak] * 2  # the trace is the step train runs


def test_an_optimizer_of_the_head_alone_keeps_state_for_the_head_alone():
    net = models.cnn()
    head = net[-1]
    for p in net.parameters():
        p.requires_grad_(p is head.weight or p is head.bias)
    report = memory.measure_step(net, X[:8], Y[:8], optimizer=torch.optim.Adam(head.parameters()), accum_steps=2)
    head_bytes = 4 * (head.weight.numel() + head.bias.numel())
    assert report.optimizer_state == 2 * head_bytes + 2 * 4  # two moments and a step count per head parameter
    assert report.gradients == head_bytes  # frozen parameters get no gradient
    body_trains_too = models.cnn()  # an optimizer of the head on an unfrozen model: backward still fills every .grad
    both = memory.measure_step(
        body_trains_too, X[:8], Y[:8], optimizer=torch.optim.Adam(body_trains_too[-1].parameters()), accum_steps=2
    )
    assert both.optimizer_state == report.optimizer_state and both.gradients == both.parameters


AUG_X = torch.randn(24, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
AUG_Y = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(6))


class Augmenting(torch.utils.data.Dataset):
    """torchvision-style random augmentation in __getitem__, drawing from torch's, Python's and NumPy's random
    states (albumentations-style libraries draw from the last two)."""

    def __len__(self):
        return len(AUG_X)

    def __getitem__(self, i):
        import random

        import numpy as np

        noise = 0.1 * torch.randn(6, dtype=torch.float64) + 0.01 * random.random() + 0.01 * np.random.rand()
        return AUG_X[i] + noise, AUG_Y[i]


class AugmentingDicts(Augmenting):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return {"x": x, "y": y}


class Classifier(torch.nn.Module):
    """forward(x) -> logits, or forward(x=..., y=...) -> {"loss": ...} for dict batches."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(6, 3, dtype=torch.float64)

    def forward(self, x, y=None):
        out = self.layer(x)
        return out if y is None else {"loss": torch.nn.functional.cross_entropy(out, y)}


@pytest.mark.parametrize("dataset", [Augmenting(), AugmentingDicts()], ids=["pairs", "dicts"])
def test_memory_budget_leaves_a_randomly_augmenting_dataset_as_it_trains_without_it(dataset):
    """The budget's trace fetches its micro-batch under its own random state: the seeded run is bit-identical with
    and without the budget, and torch's, Python's and NumPy's random states end where they would without it."""
    import random

    import numpy as np

    def run(budget):
        torch.manual_seed(0), random.seed(0), np.random.seed(0)
        model = Classifier()
        history = accumlib.train(
            model,
            dataset,
            torch.optim.Adam(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=2,
            epochs=2,
            memory_budget=budget,
            device="cpu",
        )
        return model.state_dict(), stable_records(history), torch.get_rng_state(), random.random(), np.random.rand()

    without, within = run(None), run(2**30)
    assert accumlib.parameter_gap(within[0], without[0]) == 0 and within[1] == without[1]
    assert torch.equal(within[2], without[2]) and within[3:] == without[3:]
    # the augmentation is real: another seed trains other weights
    torch.manual_seed(1)
    assert accumlib.parameter_gap(Classifier().state_dict(), without[0]) > 0


DDP_BUDGET_WORKER = """
import dataclasses, gc, json, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, sys.argv[1])
import accumlib
from accumlib import memory

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
X, Y = torch.randn(48, 6, dtype=torch.float64), torch.randint(0, 3, (48,))
batches = [(X[i:i + 4], Y[i:i + 4]) for i in range(rank * 24, rank * 24 + 24, 4)]


def build(view=False):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).double()
    return DistributedDataParallel(net, gradient_as_bucket_view=view)


out = {}
for name, data, options in [("X, y", (X, Y), dict(micro_batch_size=4)), ("list", batches, {})]:
    states = []
    for budget in (None, 2 ** 30):
        model = build()
        history = accumlib.train(model, data, torch.optim.Adam(model.parameters(), lr=0.1), accum_steps=3,
                                 memory_budget=budget, device="cpu", **options)
        states.append((model.module.state_dict(), [dataclasses.replace(r, seconds=0) for r in history]))
    out[name] = accumlib.parameter_gap(*[s for s, _ in states]), states[0][1] == states[1][1]
for view in (False, True):
    model = build(view)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    traced, module = (memory.check_fits(m, X[:4], Y[:4], optimizer=optimizer, accum_steps=3, memory_budget=2 ** 30)
                      for m in (model, model.module))
    out[f"peak, view={view}"] = traced.peak
    reported = 0 if view else sum(map(int, str(model._get_ddp_logging_data()["bucket_sizes"]).split(",")))
    out[f"view={view}"] = (traced.peak - module.peak, traced.gradients - module.gradients, reported)
model = build()
before = [t.clone() for t in model.module.state_dict().values()]
try:
    accumlib.train(model, (X, Y), torch.optim.Adam(model.parameters(), lr=0.1), micro_batch_size=4, accum_steps=3,
                   memory_budget=1000, device="cpu")
    out["too small"] = "trained"
except memory.OutOfMemory as error:
    out["too small"] = [error.needed_bytes, error.available_bytes]
out["unchanged"] = all(torch.equal(a, b) for a, b in zip(before, model.module.state_dict().values()))
# each process its own batch shapes: rank 1's do not fit a budget between the two peaks, rank 0's do
rows = [2, 200]
peaks = [memory.check_fits(build().module, X.repeat(5, 1)[:n], Y.repeat(5)[:n],
                           optimizer=torch.optim.SGD(build().parameters(), lr=0.1), accum_steps=3,
                           memory_budget=2 ** 40).peak for n in rows]
uneven = [(X.repeat(5, 1)[:rows[rank]], Y.repeat(5)[:rows[rank]])] * 6
model = build()
try:
    accumlib.train(model, uneven, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=3,
                   memory_budget=sum(peaks) // 2, device="cpu")
    out["uneven"] = "trained"
except Exception as error:
    out["uneven"] = f"{type(error).__name__}: {error}"
out["uneven budget"] = sum(peaks) // 2
out["uneven unchanged"] = all(torch.equal(a, b) for a, b in zip(before, model.module.state_dict().values()))
with open(sys.argv[2] + f".{rank}", "w") as f:
    json.dump(out, f)
# both processes done with every collective, and no DDP model (its reducer holds the group) left, before the group
# goes: one run in several CI runs had rank 0 abort at exit ("terminate called without an active exception")
dist.barrier()
del model
gc.collect()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_memory_budget_with_ddp_measures_one_process_without_collectives(tmp_path):
    """2 gloo processes: train(DDP(model), memory_budget=...) trains bit for bit as without the budget, for (X, y)
    and a list of batches (before: INTERNAL ASSERT FAILED at c10d/comm.cpp from the trace running DDP's hook);
    the peak is the module's plus DDP's gradient buckets (the sizes DDP itself reports; none when the .grad are
    views of them); a budget too small stops both processes with OutOfMemory before anything changes; a
    process whose own batches do not fit stops the other, which says which rank and why."""
    from test_pipeline import run_on_two_processes

    run_on_two_processes(DDP_BUDGET_WORKER, tmp_path, str(tmp_path / "out"), timeout=180)
    import json

    for rank in range(2):
        out = json.loads((tmp_path / f"out.{rank}").read_text())
        assert out["X, y"] == [0.0, True] and out["list"] == [0.0, True]
        buckets, gradients, reported = out["view=False"]
        assert buckets == gradients == reported == 8 * (6 * 16 + 16 + 16 * 3 + 3)
        assert out["view=True"] == [0, 0, 0]
        assert out["too small"] == [out["peak, view=False"], 1000]
        assert out["unchanged"] and out["uneven unchanged"]
    ours, theirs = (json.loads((tmp_path / f"out.{rank}").read_text()) for rank in range(2))
    budget = ours["uneven budget"]
    assert theirs["uneven"].startswith(
        "OutOfMemory: out of memory: the cycle of step 1 (epoch 0, 3 batches, 600 samples) needs "
    )
    assert ours["uneven"] == (
        f"ValueError: the cycle of the process of rank 1 does not fit memory_budget={budget} "
        f"for step 1 (epoch 0): process 1: {theirs['uneven']}. This process (rank 0) stops "
        f"with it, before this step changes anything"
    )


def test_the_memory_checks_in_the_old_order_are_refused_by_name():
    """accumlib 0.x took the optimizer before the data; 1.0 after them, as train (a keyword in check_fits, as in
    measure_step): each old call is refused naming the new order, before anything is traced."""
    model = models.cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches, weights = [(X[:4], Y[:4])] * 2, [0.5, 0.5]
    with pytest.raises(TypeError, match=r"check_fits takes \(model, x, y, \*, optimizer, accum_steps, memory_budget"):
        memory.check_fits(model, optimizer, X[:4], Y[:4], accum_steps=2, memory_budget=2**30)
    options = accumlib.CycleOptions()
    with pytest.raises(TypeError, match=r"check_cycle_fits takes \(model, batches, optimizer, loss_weights, \*"):
        memory.check_cycle_fits(
            model, optimizer, batches, weights, options=options, memory_budget=2**30, what="", advice=""
        )
    with pytest.raises(TypeError, match=r"measured_cycle_peak takes \(model, batches, optimizer, loss_weights"):
        memory.measured_cycle_peak(model, optimizer, batches, weights, options)
    new = memory.check_fits(model, X[:4], Y[:4], optimizer=optimizer, accum_steps=2, memory_budget=2**30).peak
    assert memory.measured_cycle_peak(model, batches, optimizer, weights, options) == new


def test_the_budget_s_old_keyword_is_refused_naming_its_new_name():
    """0.x's `budget_bytes` is `memory_budget` in 1.0, as train calls it (one word for one idea): a call with the old
    keyword is refused naming the new one and the value to pass, in each measurement that takes a budget."""
    model = models.cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = {
        "check_fits": lambda: memory.check_fits(model, X[:4], Y[:4], accum_steps=2, budget_bytes=2**30),
        "check_cycle_fits": lambda: memory.check_cycle_fits(
            model, [(X[:4], Y[:4])], optimizer, [1.0], options=accumlib.CycleOptions(), budget_bytes=2**30, what=""
        ),
        "fit_batch": lambda: memory.fit_batch(model, (X[:1], Y[:1]), 8, budget_bytes=2**30),
    }
    for function, call in calls.items():
        with pytest.raises(TypeError) as refused:
            call()
        assert str(refused.value) == (
            f"{function}: budget_bytes is called memory_budget since accumlib 1.0, as in train(memory_budget=...); "
            f"pass memory_budget={2**30!r}"
        )


class _OwnLoss(torch.nn.Module):
    """A model that returns its own loss in a dict, as a Hugging Face model given labels does."""

    def __init__(self):
        super().__init__()
        self.net = models.mlp()

    def forward(self, x):
        return {"loss": self.net(x).square().mean()}


def test_without_loss_fn_a_measurement_takes_the_models_own_loss_as_train_does():
    """The library's one default loss (the output's `.loss` or 'loss' key, else cross-entropy): measure_step,
    check_fits and fit_batch measure the step train takes without loss_fn."""
    model = _OwnLoss()
    report = memory.measure_step(model, XF[:8], YF[:8], accum_steps=2)
    assert report.peak == memory.measure_step(model, XF[:8], YF[:8], accum_steps=2, loss_fn=lambda o, t: o["loss"]).peak
    assert memory.check_fits(model, XF[:8], YF[:8], accum_steps=2, memory_budget=report.peak).peak == report.peak
    assert memory.fit_batch(model, (XF[:1], YF[:1]), 16, 2**30).micro_batch_size == 16


def test_a_measurement_takes_the_cycles_options_as_keywords_or_in_options_not_both():
    """As train and accumulate_and_step take them: the same step from `amp="bf16"` and from
    `options=CycleOptions(amp="bf16")`, in measure_step and check_fits; both at once refused naming the option."""
    net = models.mlp()
    plain = memory.measure_step(net, XF[:8], YF[:8], accum_steps=2).peak
    by_keyword = memory.measure_step(net, XF[:8], YF[:8], accum_steps=2, amp="bf16").peak
    options = accumlib.CycleOptions(amp="bf16")
    assert memory.measure_step(net, XF[:8], YF[:8], accum_steps=2, options=options).peak == by_keyword != plain
    fits = {"accum_steps": 2, "memory_budget": 2**30}
    checked = memory.check_fits(net, XF[:8], YF[:8], amp="bf16", **fits).peak
    assert checked == memory.check_fits(net, XF[:8], YF[:8], options=options, **fits).peak == by_keyword
    with pytest.raises(TypeError, match=r"^measure_step\(\) got 'amp' both as a keyword and in options="):
        memory.measure_step(net, XF[:8], YF[:8], options=options, amp="bf16")
    with pytest.raises(TypeError, match=r"^check_fits\(\) got 'loss_fn' both as a keyword and in options="):
        memory.check_fits(net, XF[:8], YF[:8], options=options, loss_fn=torch.nn.functional.cross_entropy, **fits)
    with pytest.raises(TypeError, match="^check_fits got scaler: the options of the cycle it takes are amp, "):
        memory.check_fits(net, XF[:8], YF[:8], scaler=torch.amp.GradScaler("cpu"), **fits)


# --- bad input, refused naming the parameter, with the caller's model and optimizer untouched (refusals.py) ------


@pytest.mark.parametrize("case", list(refusals.MEMORY))
def test_bad_input_is_refused_naming_the_parameter_and_nothing_changes(case):
    refusals.check(refusals.MEMORY[case])


# --- issue 23, case 2: every optimizer torch ships (AdamW included), in measure_step, fit_batch and train ---------

XF24, YF24 = data.digits(24, flat=True)


def torch_optimizers():
    """Every optimizer class torch.optim exports (but LBFGS, refused above), built with its defaults."""
    found = [getattr(torch.optim, name) for name in dir(torch.optim)]
    found = [
        c
        for c in found
        if isinstance(c, type)
        and issubclass(c, torch.optim.Optimizer)
        and c is not torch.optim.Optimizer
        and c is not torch.optim.LBFGS
    ]
    assert {torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD, torch.optim.Muon} <= set(found)
    return sorted(found, key=lambda c: c.__name__)


def small():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))


@pytest.mark.parametrize("optimizer_class", torch_optimizers(), ids=lambda c: c.__name__)
def test_every_optimizer_in_torch_optim_is_measured_as_it_trains(optimizer_class):
    if optimizer_class is torch.optim.Muon:  # Muon takes 2-D weights only: the biases go to another optimizer

        def build(model):
            return optimizer_class([p for p in model.parameters() if p.dim() == 2], lr=0.02)
    else:

        def build(model):
            return optimizer_class(model.parameters(), **({"lr": 0.01} if optimizer_class is torch.optim.SGD else {}))

    model = small()
    if optimizer_class is torch.optim.SparseAdam:  # it refuses dense gradients: in training and measuring alike
        with pytest.raises((RuntimeError, ValueError), match="dense"):
            accumlib.train(model, (XF24, YF24), build(model), micro_batch_size=4, accum_steps=2)
        with pytest.raises(ValueError, match="dense"):
            memory.measure_step(model, XF24[:4], YF24[:4], optimizer=build(small()), accum_steps=2, fake=True)
        return
    real = memory.measure_step(model, XF24[:4], YF24[:4], optimizer=build(model), accum_steps=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fake = memory.measure_step(model, XF24[:4], YF24[:4], optimizer=build(model), accum_steps=2, fake=True)
        plan = memory.fit_batch(model, (XF24[:1], YF24[:1]), 8, real.peak, optimizer=build(model))
    # the same storages, nothing computed; or, for an optimizer whose step reads a value (ASGD, Adafactor), said
    # and measured with a real step
    assert fake.peak == real.peak
    assert all("the optimizer's step (" in str(w.message) and "/optim/" in str(w.message) for w in caught)
    assert plan.micro_batch_size * plan.accum_steps == 8 and plan.peak_bytes <= real.peak
    optimizer = build(model)
    history = accumlib.train(
        model,
        (XF24, YF24),
        optimizer,
        micro_batch_size=4,
        accum_steps=2,
        epochs=2,
        memory_budget=real.peak,
        measure_memory=True,
        device="cpu",
    )
    assert max(r.peak_memory_bytes for r in history) <= real.peak
    # and a step once the optimizer has its state (the heavier of the two measure_step reports) is within it too
    later = accumlib.train(
        model,
        (XF24[:8], YF24[:8]),
        optimizer,
        micro_batch_size=4,
        accum_steps=2,
        memory_budget=real.peak,
        measure_memory=True,
        device="cpu",
    )
    assert later[0].peak_memory_bytes <= real.peak
    assert max(later[0].peak_memory_bytes, history[0].peak_memory_bytes) == real.peak  # exact, not a bound


# --- issue 23, case 10: a fit_batch plan at its exact boundary with Adam fits the step it trains ------------------

X48, Y48 = data.digits(48)


def test_a_plan_at_its_exact_boundary_with_adam_trains_within_it():
    model = models.cnn(norm="batch")

    def adam(m):
        return torch.optim.Adam(m.parameters(), lr=0.01)

    loose = memory.fit_batch(model, (X48[:1], Y48[:1]), 16, 10**9, optimizer=adam(model))
    wanted = memory.measure_step(model, X48[:4], Y48[:4], optimizer=adam(model), accum_steps=4).peak
    plan = memory.fit_batch(model, (X48[:1], Y48[:1]), 16, wanted, optimizer=adam(model))  # the exact boundary
    assert loose.micro_batch_size == 16 and (plan.micro_batch_size, plan.peak_bytes) == (4, wanted)
    optimizer = adam(model)
    history = accumlib.train(
        model,
        (X48, Y48),
        optimizer,
        micro_batch_size=4,
        accum_steps=4,
        epochs=2,
        memory_budget=plan.memory_budget,
        measure_memory=True,
        device="cpu",
    )
    later = accumlib.train(
        model,
        (X48[:16], Y48[:16]),
        optimizer,
        micro_batch_size=4,
        accum_steps=4,
        memory_budget=plan.memory_budget,
        measure_memory=True,
        device="cpu",
    )
    peaks = [r.peak_memory_bytes for r in history] + [later[0].peak_memory_bytes]
    assert max(peaks) == plan.memory_budget  # the step it trains reaches its plan, and not a byte over
    with pytest.raises(memory.OutOfMemory):  # one byte less is refused before anything changes
        accumlib.train(
            model, (X48, Y48), optimizer, micro_batch_size=4, accum_steps=4, memory_budget=plan.memory_budget - 1
        )


# --- one recipe (issue 19): measure_step, fit_batch, train(memory_budget=...) run train's own cycle ---------------
# So the planned peak is the trained peak, byte for byte on the CPU, for a model with a large buffer and for one with
# BatchNorm (peaks.py). Bytes are exact integers on the CPU (live tensor storages), so every comparison is ==.

X96, Y96 = data.digits(96, flat=True)  # peaks.X, peaks.Y: the data of peaks.trained_peaks


@pytest.mark.parametrize("build", [Masked, batchnorm], ids=["a 256x256 buffer", "BatchNorm"])
@pytest.mark.parametrize("m, k", [(8, 1), (8, 4), (5, 3)])
def test_trains_peak_is_measure_steps_byte_for_byte(build, m, k):
    model = build()
    planned = memory.measure_step(
        model, X96[:m], Y96[:m], optimizer=torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=k
    )
    fake = memory.measure_step(
        model, X96[:m], Y96[:m], optimizer=torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=k, fake=True
    )
    checked = memory.check_fits(
        model,
        X96[:m],
        Y96[:m],
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=None,
        accum_steps=k,
        memory_budget=10**9,
    )
    peaks = trained_peaks(model, torch.optim.SGD(model.parameters(), lr=0.1), m, k)
    assert peaks == [planned.peak] * 2 and fake.peak == planned.peak and checked.peak == planned.peak


@pytest.mark.parametrize("build", [Masked, batchnorm], ids=["a 256x256 buffer", "BatchNorm"])
def test_with_adam_the_first_and_a_later_step_are_each_measured(build):
    """measure_step reports the heavier of the run's first step (Adam makes its state in it) and a later one (the
    state alive through the passes); train traces the first cycle of a layout, so a second run on the same
    optimizer shows the later one."""
    model = build()
    planned = memory.measure_step(
        model, X96[:8], Y96[:8], optimizer=torch.optim.Adam(model.parameters()), accum_steps=4
    )
    optimizer = torch.optim.Adam(model.parameters())
    first = trained_peaks(model, optimizer, 8, 4)
    later = trained_peaks(model, optimizer, 8, 4)
    assert max(first + later) == planned.peak


def test_fit_batchs_plan_is_accepted_and_fits():
    # BatchNorm1d refuses one sample per pass in training: its plan starts from the smallest divisor above 1 (its
    # accumulated steps undercut the whole batch only at a larger target: its activations are small)
    for build, target in ((Masked, 16), (batchnorm, 96)):
        model = build()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        whole = memory.measure_step(model, X96[:target], Y96[:target], optimizer=optimizer).peak
        plan = memory.fit_batch(model, (X96[:1], Y96[:1]), target, whole - 1, optimizer=optimizer)
        assert plan.accum_steps > 1 and plan.peak_bytes <= plan.memory_budget < whole
        history = accumlib.train(
            model,
            (X96, Y96),
            optimizer,
            micro_batch_size=plan.micro_batch_size,
            accum_steps=plan.accum_steps,
            memory_budget=plan.memory_budget,
            measure_memory=True,
            device="cpu",
        )
        assert max(r.peak_memory_bytes for r in history) == plan.peak_bytes
        with pytest.raises(memory.OutOfMemory):
            accumlib.train(
                model,
                (X96, Y96),
                optimizer,
                micro_batch_size=plan.next_micro_batch_size,
                accum_steps=target // plan.next_micro_batch_size,
                memory_budget=plan.memory_budget,
            )


def test_a_batchnorm_model_too_large_for_two_samples_per_pass_is_refused_naming_them():
    model = batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    two = memory.measure_step(model, X96[:2], Y96[:2], optimizer=optimizer, accum_steps=48).peak
    with pytest.raises(memory.OutOfMemory, match="even 2 samples per pass") as refused:
        memory.fit_batch(model, (X96[:1], Y96[:1]), 96, two - 1, optimizer=optimizer)
    assert refused.value.needed_bytes == two  # the smallest micro-batch BatchNorm accepts, measured as train runs it
    assert memory.fit_batch(model, (X96[:1], Y96[:1]), 96, two, optimizer=optimizer).micro_batch_size == 2


def test_the_measurements_move_the_data_to_the_models_device():
    """Issue 20: a device mix-up in the measurements fails here without a GPU. Under FakeTensorMode a model on
    another device than its data raises FakeTensorDeviceMismatchError (the control below); the library moves the
    micro-batch to the model's device (here the meta device, the one besides the CPU this build can trace; a fake
    'cuda' model aborts the process in backward on a CPU build), so a meta model measures as the CPU one does."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError, FakeTensorMode

    on_cpu = Masked()
    with torch.device("meta"):
        on_meta = Masked()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    weight, x = mode.from_tensor(on_meta.linear.weight), mode.from_tensor(X96[:8])
    with mode, pytest.raises(FakeTensorDeviceMismatchError):
        nn.functional.linear(x, weight)  # what a measurement that forgot to move its data would meet

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    expected = memory.measure_step(on_cpu, X96[:8], Y96[:8], optimizer=sgd(on_cpu), accum_steps=4, fake=True).peak
    assert (
        memory.measure_step(on_meta, X96[:8], Y96[:8], optimizer=sgd(on_meta), accum_steps=4, fake=True).peak
        == expected
    )
    assert (
        memory.check_fits(
            on_meta, X96[:8], Y96[:8], optimizer=sgd(on_meta), loss_fn=None, accum_steps=4, memory_budget=expected
        ).peak
        == expected
    )
    assert memory.fit_batch(on_meta, (X96[:1], Y96[:1]), 32, expected).peak_bytes <= expected
