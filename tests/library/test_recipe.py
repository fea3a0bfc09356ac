"""One recipe (issue 19): measure_step, fit_batch, train(memory_budget=...) and timing run train's own cycle
(`accumulate_and_step`), so the planned peak is the trained peak, byte for byte on the CPU, for a model with a large
buffer and for one with BatchNorm; the buffer snapshot holds only what a skipped cycle must put back.

Bytes are exact integers on the CPU (live tensor storages), so every comparison is ==.
"""

import gc

import pytest
import torch
from torch import nn

import accumlib
from accumlib import memory, timing
from builders import data

X, Y = data.digits(96, flat=True)


class Masked(nn.Module):
    """A small model with one large buffer its forward reads but never changes (a causal mask, say)."""

    def __init__(self, size=256):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(64, 10)
        self.register_buffer("mask", torch.ones(size, size))

    def forward(self, x):
        return self.linear(x) * self.mask[0, :10]


def batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))


def trained_peaks(model, optimizer, m, k, epochs=1):
    history = accumlib.train(
        model,
        (X[: m * k * 2], Y[: m * k * 2]),
        optimizer,
        micro_batch_size=m,
        accum_steps=k,
        epochs=epochs,
        measure_memory=True,
        device="cpu",
    )
    return [r.peak_memory_bytes for r in history]


@pytest.mark.parametrize("build", [Masked, batchnorm], ids=["a 256x256 buffer", "BatchNorm"])
@pytest.mark.parametrize("m, k", [(8, 1), (8, 4), (5, 3)])
def test_trains_peak_is_measure_steps_byte_for_byte(build, m, k):
    model = build()
    planned = memory.measure_step(
        model, X[:m], Y[:m], optimizer=torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=k
    )
    fake = memory.measure_step(
        model, X[:m], Y[:m], optimizer=torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=k, fake=True
    )
    checked = memory.check_fits(
        model,
        X[:m],
        Y[:m],
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=None,
        accum_steps=k,
        budget_bytes=10**9,
    )
    peaks = trained_peaks(model, torch.optim.SGD(model.parameters(), lr=0.1), m, k)
    assert peaks == [planned.peak] * 2 and fake.peak == planned.peak and checked.peak == planned.peak


@pytest.mark.parametrize("build", [Masked, batchnorm], ids=["a 256x256 buffer", "BatchNorm"])
def test_with_adam_the_first_and_a_later_step_are_each_measured(build):
    """measure_step reports the heavier of the run's first step (Adam makes its state in it) and a later one (the
    state alive through the passes); train traces the first cycle of a layout, so a second run on the same
    optimizer shows the later one."""
    model = build()
    planned = memory.measure_step(model, X[:8], Y[:8], optimizer=torch.optim.Adam(model.parameters()), accum_steps=4)
    optimizer = torch.optim.Adam(model.parameters())
    first = trained_peaks(model, optimizer, 8, 4)
    later = trained_peaks(model, optimizer, 8, 4)
    assert max(first + later) == planned.peak


def test_the_snapshot_copies_batchnorms_statistics_and_not_a_large_buffer():
    """The peak with a 1 MiB buffer is the peak without it plus the buffer itself: no copy of it is made per
    cycle. With BatchNorm, its running statistics (2 x 32 floats and a count) are copied, and counted."""
    small, large = Masked(size=16), Masked(size=512)

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    grown = trained_peaks(large, sgd(large), 8, 4)[0] - trained_peaks(small, sgd(small), 8, 4)[0]
    assert grown == (512 * 512 - 16 * 16) * 4  # the buffer once, as it is held
    plain = batchnorm()
    frozen = batchnorm().eval()  # eval mode: the statistics are read, not changed: nothing to copy
    statistics = 2 * 32 * 4 + 8
    report = memory.measure_step(plain, X[:8], Y[:8], accum_steps=2)
    report_frozen = memory.measure_step(frozen, X[:8], Y[:8], accum_steps=2)
    assert report.parameters == report_frozen.parameters  # weights and buffers alike
    assert report.other - report_frozen.other == statistics  # the copy a skipped cycle puts back


def test_a_skipped_cycle_puts_batchnorms_statistics_back():
    model = batchnorm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    assert accumlib.accumulate_and_step(model, bad, torch.optim.SGD(model.parameters(), lr=0.1), [0.5, 0.5]).skipped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_fit_batchs_plan_is_accepted_and_fits():
    # BatchNorm1d refuses one sample per pass in training: its plan starts from the smallest divisor above 1 (its
    # accumulated steps undercut the whole batch only at a larger target: its activations are small)
    for build, target in ((Masked, 16), (batchnorm, 96)):
        model = build()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        whole = memory.measure_step(model, X[:target], Y[:target], optimizer=optimizer).peak
        plan = memory.fit_batch(model, (X[:1], Y[:1]), target, whole - 1, optimizer=optimizer)
        assert plan.accum_steps > 1 and plan.peak_bytes <= plan.budget_bytes < whole
        history = accumlib.train(
            model,
            (X, Y),
            optimizer,
            micro_batch_size=plan.micro_batch_size,
            accum_steps=plan.accum_steps,
            memory_budget=plan.budget_bytes,
            measure_memory=True,
            device="cpu",
        )
        assert max(r.peak_memory_bytes for r in history) == plan.peak_bytes
        with pytest.raises(memory.OutOfMemory):
            accumlib.train(
                model,
                (X, Y),
                optimizer,
                micro_batch_size=plan.next_micro_batch_size,
                accum_steps=target // plan.next_micro_batch_size,
                memory_budget=plan.budget_bytes,
            )


def test_a_batchnorm_model_too_large_for_two_samples_per_pass_is_refused_naming_them():
    model = batchnorm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    two = memory.measure_step(model, X[:2], Y[:2], optimizer=optimizer, accum_steps=48).peak
    with pytest.raises(memory.OutOfMemory, match="even 2 samples per pass") as refused:
        memory.fit_batch(model, (X[:1], Y[:1]), 96, two - 1, optimizer=optimizer)
    assert refused.value.needed_bytes == two  # the smallest micro-batch BatchNorm accepts, measured as train runs it
    assert memory.fit_batch(model, (X[:1], Y[:1]), 96, two, optimizer=optimizer).micro_batch_size == 2


def test_decompose_time_times_trains_cycle():
    """Its passes are the cycle's: each timed step has accum_steps passes, each one forward and backward of the
    cycle (counted through loss_fn), and the model it times is trained by the cycle's weights 1/accum_steps."""
    calls = []

    def counting(output, target):
        calls.append(len(target))
        return nn.functional.cross_entropy(output, target)

    result = timing.decompose_time(
        batchnorm(), (X, Y), effective_batch=16, accum_steps=(1, 4), loss_fn=counting, repeats=2, warmup=0
    )
    assert calls == [16, 4, 4, 4, 4, 4, 4, 4, 4, 16]  # two rounds, ABBA: 1, 4 then 4, 1
    assert [len(p.all_seconds) for p in result.passes] == [8, 2]  # micro-batch 4: 2 rounds x 4; 16: 2 x 1


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
    weight, x = mode.from_tensor(on_meta.linear.weight), mode.from_tensor(X[:8])
    with mode, pytest.raises(FakeTensorDeviceMismatchError):
        nn.functional.linear(x, weight)  # what a measurement that forgot to move its data would meet

    def sgd(model):
        return torch.optim.SGD(model.parameters(), lr=0.1)

    expected = memory.measure_step(on_cpu, X[:8], Y[:8], optimizer=sgd(on_cpu), accum_steps=4, fake=True).peak
    assert memory.measure_step(on_meta, X[:8], Y[:8], optimizer=sgd(on_meta), accum_steps=4, fake=True).peak == expected
    assert (
        memory.check_fits(
            on_meta, X[:8], Y[:8], optimizer=sgd(on_meta), loss_fn=None, accum_steps=4, budget_bytes=expected
        ).peak
        == expected
    )
    assert memory.fit_batch(on_meta, (X[:1], Y[:1]), 32, expected).peak_bytes <= expected


@pytest.mark.slow
def test_a_compiled_ddp_model_is_recognised_and_syncs_once_per_step(tmp_path):
    """Issue 19: torch.compile(DDP(model)) is DDP: no_sync() on every micro-batch but the last (one all-reduce per
    step), and the step equals the plain model's (one process, gloo: DDP's mean over one process is the gradient)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = nn.Linear(64, 10)
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(64, 10))
        ddp.module.load_state_dict(plain.state_dict())
        compiled = torch.compile(ddp, backend="eager")  # eager: no compiler needed, the wrapper is what matters
        calls = []
        real = ddp.no_sync
        ddp.no_sync = lambda: calls.append(None) or real()
        micro_batches = list(zip(X[:12].split(4), Y[:12].split(4), strict=True))
        result = accumlib.accumulate_and_step(
            compiled, micro_batches, torch.optim.SGD(compiled.parameters(), lr=0.1), [1 / 3] * 3
        )
        reference = accumlib.accumulate_and_step(
            plain, micro_batches, torch.optim.SGD(plain.parameters(), lr=0.1), [1 / 3] * 3
        )
        assert len(calls) == 2  # micro-batches 1 and 2 under no_sync, the last one all-reduces
        assert result.loss == reference.loss and torch.equal(ddp.module.weight, plain.weight)
    finally:
        dist.destroy_process_group()


class Counting(nn.Module):
    """A forward pass that changes a buffer that is not a norm layer's statistics (a count of the forward passes)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(64, 10)
        self.register_buffer("passes", torch.zeros(()))

    def forward(self, x):
        self.passes += 1
        return self.linear(x)


def test_a_buffer_first_changed_in_a_skipped_cycle_is_named_and_kept_from_then_on():
    model = Counting()
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match="changed the buffer\\(s\\) passes, which were not copied"):
        assert accumlib.accumulate_and_step(model, bad, sgd, [0.5, 0.5]).skipped
    assert model.passes == 2  # said, not hidden: it could not be put back
    assert accumlib.accumulate_and_step(model, bad, sgd, [0.5, 0.5]).skipped  # now it is copied: no warning
    assert model.passes == 2


def test_a_buffer_remembered_as_changing_is_forgotten_with_its_model():
    from accumlib import restore

    model = Counting()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    bad = [(torch.full_like(X[:8], float("nan")), Y[:8])]
    with pytest.warns(RuntimeWarning, match="changed the buffer\\(s\\) passes"):
        accumlib.accumulate_and_step(model, bad, sgd, [1.0])
    key = id(model.passes)
    assert restore._CHANGED[key]() is model.passes  # copied from the next cycle on
    del model, sgd
    gc.collect()
    assert key not in restore._CHANGED  # the module keeps nothing of a model that is gone


class Stacked(nn.Module):
    """Layers in a ModuleList, run in order: ModuleList.insert edits the module dict directly (no registration
    hook sees it), the path a cached module walk would miss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("grow", ["insert", "append"])
def test_a_batchnorm_added_after_the_first_step_is_put_back_by_a_skipped_cycle(grow):
    """The snapshot follows the model as it is at each cycle: a BatchNorm added after a step (inserted into a
    ModuleList, or appended to a Sequential) has its running statistics put back, exactly, by a skipped cycle."""
    if grow == "insert":
        model = Stacked()
    else:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    good = [(X[:8], Y[:8]), (X[8:16], Y[8:16])]
    assert not accumlib.accumulate_and_step(model, good, optimizer, [0.5, 0.5]).skipped
    norm = nn.BatchNorm1d(32)
    model.layers.insert(1, norm) if grow == "insert" else model.append(norm)
    if grow == "append":
        model.append(nn.Linear(32, 10))
    assert not accumlib.accumulate_and_step(model, good, optimizer, [0.5, 0.5]).skipped  # the statistics move
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert before["layers.1.running_mean" if grow == "insert" else "3.running_mean"].abs().sum() > 0
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    assert accumlib.accumulate_and_step(model, bad, optimizer, [0.5, 0.5]).skipped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_skipped_cycle_gives_back_each_grad_it_found_none_or_not():
    """.grad found on some parameters and None on others: after a skipped cycle each is the very tensor (or None)
    the call found, and its values are unchanged (backward() added into fresh gradients, not into these)."""
    model = batchnorm()
    params = list(model.parameters())
    found = [torch.full_like(p, 0.25) if i % 2 else None for i, p in enumerate(params)]
    for p, grad in zip(params, found, strict=True):
        p.grad = grad
    bad = [(X[:8], Y[:8]), (torch.full_like(X[8:16], float("nan")), Y[8:16])]
    assert accumlib.accumulate_and_step(model, bad, torch.optim.SGD(params, lr=0.1), [0.5, 0.5]).skipped
    assert all(p.grad is grad for p, grad in zip(params, found, strict=True))
    assert all(torch.equal(grad, torch.full_like(grad, 0.25)) for grad in found if grad is not None)
