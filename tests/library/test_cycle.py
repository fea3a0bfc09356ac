"""accumlib.cycle: one optimizer step from a cycle of micro-batches. Here: what a step leaves (.grad freed) and what
it reads on the host (tensor weights once, not per micro-batch); `train(memory_budget=...)` with a loader measured,
cycle layout by cycle layout, instead of refused (issue 19); the old argument order refused (the cycle's options in
one object: test_options.py; what it is given, refused: test_cycle_checks.py; what it puts back: test_restore.py).

"Nothing changed" compares every weight and buffer exactly (torch.equal): a refusal computes nothing, so nothing may
differ in any digit. Bytes on the CPU are exact integers (live tensor storages), so the budget comparisons are exact
too.
"""

import copy

import pytest
import torch
import found
from torch import nn
from states import same

import accumlib
from accumlib import cycle, memory
from accumlib.timing import HostReads

X = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(1))


# --- memory_budget with a loader ------------------------------------------------------------------------------


def linear():
    torch.manual_seed(0)
    return nn.Linear(6, 3)


def cycle_peak(model, batches):
    """The traced peak of one cycle of `batches`, as train weighs a cycle of equal micro-batches."""
    weights = [len(x) / sum(len(b[0]) for b in batches) for x, _y in batches]
    return memory.check_cycle_fits(
        model,
        batches,
        torch.optim.SGD(model.parameters(), lr=0.1),
        weights,
        options=accumlib.CycleOptions(),
        budget_bytes=2**40,
        what="",
        advice="",
    ).peak


SMALL = [(X[i : i + 4], Y[i : i + 4]) for i in range(0, 32, 4)]  # 8 batches of 4: 4 cycles of 2 at accum_steps=2
LARGE = [(X[:32], Y[:32]), (X[32:64], Y[32:64])]  # a last cycle of two batches of 32 (a padded tail, say)


def test_a_loader_whose_last_cycle_crosses_the_budget_raises_before_that_cycle_changes_anything():
    model = linear()
    small, large = cycle_peak(model, SMALL[:2]), cycle_peak(model, LARGE)
    assert small < large  # 32-sample batches take more than 4-sample ones
    reference = linear()  # the run without the large cycle: what the weights must be when the error comes
    accumlib.train(reference, SMALL, torch.optim.SGD(reference.parameters(), lr=0.1), accum_steps=2, device="cpu")
    with pytest.raises(memory.OutOfMemory) as error:
        accumlib.train(
            model,
            SMALL + LARGE,
            torch.optim.SGD(model.parameters(), lr=0.1),
            accum_steps=2,
            memory_budget=small,
            device="cpu",
        )
    assert error.value.needed_bytes == large and error.value.available_bytes == small
    assert f"{large:,} bytes" in str(error.value) and f"budget is {small:,} bytes" in str(error.value)
    assert "step 5 (epoch 0, 2 batches, 64 samples)" in str(error.value)  # the cycle that does not fit
    assert len(error.value.history) == 4  # the four cycles that fit were trained
    assert torch.equal(model.weight, reference.weight) and torch.equal(model.bias, reference.bias)
    assert model.weight.grad is None  # nothing half-accumulated


def test_a_loader_that_fits_trains_within_the_budget_and_each_layout_is_traced_once(monkeypatch):
    model = linear()
    budget = cycle_peak(model, LARGE)
    traced = []
    check = memory.check_cycle_fits
    monkeypatch.setattr(memory, "check_cycle_fits", lambda *a, **k: traced.append(a[1]) or check(*a, **k))
    history = accumlib.train(
        model,
        SMALL + LARGE,
        torch.optim.SGD(model.parameters(), lr=0.1),
        accum_steps=2,
        memory_budget=budget,
        measure_memory=True,
        epochs=2,
        device="cpu",
    )
    assert len(history) == 10 and all(0 < r.peak_memory_bytes <= budget for r in history)
    assert [[len(x) for x, _y in batches] for batches in traced] == [[4, 4], [32, 32]]  # two layouts, two epochs


class OwnLoss(nn.Module):
    """A model that computes its own loss from a dict batch, as a Hugging Face model given labels does."""

    def __init__(self):
        super().__init__()
        self.linear = linear()

    def forward(self, inputs, labels):
        return {"loss": nn.functional.cross_entropy(self.linear(inputs), labels)}


def test_dict_batches_are_measured_once_each_though_they_are_inputs_and_target():
    """A dict batch is the model's inputs and loss_fn's target: the trace copies its tensors once (a second copy
    would count them twice), so its step peaks as the same step on (x, y) pairs does, byte for byte."""
    batches = [{"inputs": X[i : i + 8], "labels": Y[i : i + 8]} for i in range(0, 16, 8)]
    model, plain = OwnLoss(), linear()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    own = accumlib.CycleOptions(loss_fn=lambda output, batch: output["loss"])
    as_dicts = memory.check_cycle_fits(
        model,
        [(cycle.Inputs((), b), b) for b in batches],
        sgd(model),
        [0.5, 0.5],
        options=own,
        budget_bytes=2**40,
        what="",
        advice="",
    )
    as_pairs = memory.check_cycle_fits(
        plain,
        [(b["inputs"], b["labels"]) for b in batches],
        sgd(plain),
        [0.5, 0.5],
        options=accumlib.CycleOptions(),
        budget_bytes=2**40,
        what="",
        advice="",
    )
    assert as_dicts.inputs == as_pairs.inputs > 0 and as_dicts.peak == as_pairs.peak
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(memory.OutOfMemory):
        accumlib.train(model, batches, sgd(model), accum_steps=2, memory_budget=as_dicts.peak - 1, device="cpu")
    assert same(model.state_dict(), before)
    history = accumlib.train(
        model, batches, sgd(model), accum_steps=2, memory_budget=as_dicts.peak, measure_memory=True, device="cpu"
    )
    assert len(history) == 1 and history[0].peak_memory_bytes <= as_dicts.peak


# --- the recorded peak of a stateful optimizer -----------------------------------------------------------------


class Masked(nn.Module):
    """A small model with one large buffer its forward reads but never changes (a causal mask, say)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 3)
        self.register_buffer("mask", torch.ones(256, 256))

    def forward(self, x):
        return self.linear(x) * self.mask[0, :3]


@pytest.mark.parametrize(
    "make",
    [lambda p: torch.optim.Adam(p), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)],
    ids=["Adam", "SGD with momentum"],
)
@pytest.mark.parametrize("m, k", [(8, 2), (16, 2), (4, 4)])
def test_trains_recorded_peak_with_a_stateful_optimizer_is_measure_steps_from_the_first_step(make, m, k):
    """measure_step reports the heavier of a run's first step (the optimizer makes its state in it) and a later
    one; train records that same number for every full cycle of one run, the first included (before, its first
    record was the first step's alone, fewer bytes: the state did not yet live through its passes)."""
    model = Masked()
    planned = memory.measure_step(model, X[:m], Y[:m], optimizer=make(model.parameters()), accum_steps=k).peak
    history = accumlib.train(
        model, (X, Y), make(model.parameters()), micro_batch_size=m, accum_steps=k, measure_memory=True, device="cpu"
    )
    assert len(history) == 64 // (m * k) and [r.peak_memory_bytes for r in history] == [planned] * len(history)


class DictSamples(torch.utils.data.Dataset):
    """A map-style Dataset of dict samples (what a tokenised Hugging Face dataset gives)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return {"inputs": X[i], "labels": Y[i]}


def test_a_dataset_of_dict_samples_is_measured_cycle_by_cycle_under_the_budget():
    """Its samples are not two tensors, so no (x, y) step can be measured before the run: each cycle is traced as
    it comes, before it changes anything (it was refused before)."""
    model = OwnLoss()

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    own = accumlib.CycleOptions(loss_fn=lambda output, batch: output["loss"])
    batches = [{"inputs": X[i : i + 8], "labels": Y[i : i + 8]} for i in (0, 8)]
    peak = memory.check_cycle_fits(
        model,
        [(cycle.Inputs((), b), b) for b in batches],
        sgd(model),
        [0.5, 0.5],
        options=own,
        budget_bytes=2**40,
        what="",
        advice="",
    ).peak
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(memory.OutOfMemory) as error:
        accumlib.train(
            model, DictSamples(), sgd(model), micro_batch_size=8, accum_steps=2, memory_budget=peak - 1, device="cpu"
        )
    assert error.value.needed_bytes == peak and "step 1 (epoch 0, 2 batches, 16 samples)" in str(error.value)
    assert same(model.state_dict(), before)
    history = accumlib.train(
        model, DictSamples(), sgd(model), micro_batch_size=8, accum_steps=2, memory_budget=peak, device="cpu"
    )
    assert len(history) == 2


class Noisy(torch.utils.data.Dataset):
    """Samples with noise drawn from torch's global generator as they are fetched (a random augmentation)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return X[i] + 0.1 * torch.randn(6), Y[i]


def test_measuring_a_stateful_optimizers_later_step_changes_nothing_of_the_run():
    """The later-step trace fetches the cycle again (under its own random state) and traces copies: the run with
    measure_memory=True trains bit for bit as the one without, dropout and a random augmentation included."""

    def run(measure_memory):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
        history = accumlib.train(
            model,
            Noisy(),
            torch.optim.Adam(model.parameters()),
            micro_batch_size=4,
            accum_steps=2,
            epochs=2,
            measure_memory=measure_memory,
            device="cpu",
        )
        return [r.loss for r in history], model.state_dict()

    (measured, weights), (plain, plain_weights) = run(True), run(False)
    assert measured == plain and same(weights, plain_weights)


# --- accumulate_and_step in 0.x's order ------------------------------------------------------------------------


def test_accumulate_and_step_in_the_old_order_is_refused_by_name_before_anything_changes():
    """accumlib 0.x took (model, optimizer, micro_batches, loss_weights); 1.0 takes the data before the optimizer,
    as train does: the old order is refused naming the new one, with the model and the optimizer as found."""
    model = linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    with pytest.raises(
        TypeError,
        match=r"accumulate_and_step takes \(model, micro_batches, optimizer, loss_weights\): the optimizer comes after "
        r"the data, as in train\(model, data, optimizer\); got an optimizer \(SGD\) as micro_batches",
    ):
        accumlib.accumulate_and_step(model, optimizer, SMALL[:2], [0.5, 0.5])
    accumlib.set_language("hi")
    try:  # in the learner's language, as every refusal
        with pytest.raises(TypeError, match="optimizer data के बाद आता है"):
            accumlib.accumulate_and_step(model, optimizer, SMALL[:2], [0.5, 0.5])
    finally:
        accumlib.set_language("en")
    assert same((model.state_dict(), optimizer.state_dict()), before)
    assert all(p.grad is None for p in model.parameters())
    assert not accumlib.accumulate_and_step(model, SMALL[:2], optimizer, [0.5, 0.5]).skipped  # the new order steps
    assert not same(model.state_dict(), before[0])


# --- what a step leaves, and what it reads on the host ----------------------------------------------------------
# found.setup: a BatchNorm CNN, Adam with state, and a .grad left by the caller on every parameter; found.cycle(n):
# n micro-batches of 8 samples (this file's `cycle` is accumlib.cycle).


def test_after_a_step_the_gradients_are_freed():
    """What a step leaves, as its docstring says: .grad None (read grad_norm from the result), so a next cycle
    holds no second copy of the gradients."""
    model, optimizer = found.setup()
    result = accumlib.accumulate_and_step(model, found.cycle(), optimizer, [0.25] * 4)
    assert not result.skipped and result.grad_norm > 0
    assert all(p.grad is None for p in model.parameters())


def test_tensor_weights_are_read_once_not_per_micro_batch():
    counts = {}
    for n in (2, 6):
        model, _adam = found.setup()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # Adam's own step reads its step count per tensor
        with HostReads() as reads:
            accumlib.accumulate_and_step(model, found.cycle(n), optimizer, [torch.tensor(1 / n)] * n)
        counts[n] = reads.count
    assert counts[2] == counts[6] == 2  # the weights' one read and the cycle's one read (loss and norm)
