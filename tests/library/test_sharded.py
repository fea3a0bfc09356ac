"""accumlib.sharded in this process: an FSDP2 (fully_shard) model on a gloo group of one process, float64.

What the cycle sets on FSDP's parameter groups is put back after every cycle, a failed one included, and a failed
cycle leaves no half-accumulated gradient inside FSDP. (Two and more processes: tests/library/test_torchrun.py.)
Tolerance: one SGD step on 12 samples of a 5-7-3 network in float64, ~1e-16 relative per operation: far below 1e-12.
A compiled DDP model (torch.compile(DDP(model))) is DDP: one all-reduce per step (issue 19).
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import accumlib
from accumlib import sharded
from builders import data


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def network():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def sharded_network():
    model = network()
    fully_shard(model[0])
    return fully_shard(model)


def micro_batches():
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 5, dtype=torch.float64, generator=generator), torch.randint(0, 3, (12,), generator=generator)
    return [(x[i : i + 4], y[i : i + 4]) for i in range(0, 12, 4)]


def full(model):
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def settings(model):
    return [(g.reduce_grads, g.reshard_after_backward) for g in sharded._groups(model)]


def test_an_fsdp2_model_is_told_apart_from_ddp_and_a_plain_one(group):
    model = sharded_network()
    assert sharded.is_fsdp(model) and not sharded.is_ddp(model)
    assert sharded.world_and_rank(model) == (1, 0)
    assert sharded.world_and_rank(network()) == (1, 0) and sharded.cycle_sync(network(), True) is None


@pytest.mark.parametrize("keep_unsharded", [False, True])
def test_a_cycle_that_fails_midway_leaves_nothing_behind_in_fsdp(group, keep_unsharded):
    """The second micro-batch's loss_fn raises: the first one's unsharded gradient (FSDP keeps it while gradient
    sync is off) is dropped and the settings put back, so the next cycle is one clean step."""
    model, reference = sharded_network(), network()
    if keep_unsharded:
        model.set_reshard_after_backward(False)
    before = settings(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    calls = []

    def failing(output, target):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("loss_fn fails")
        return nn.functional.cross_entropy(output, target)

    with pytest.raises(RuntimeError, match="loss_fn fails"):
        accumlib.accumulate_and_step(model, micro_batches(), optimizer, [1 / 3] * 3, loss_fn=failing)
    assert settings(model) == before
    assert all(p.grad is None for p in model.parameters())
    accumlib.accumulate_and_step(model, micro_batches(), optimizer, [1 / 3] * 3)
    accumlib.accumulate_and_step(
        reference, micro_batches(), torch.optim.SGD(reference.parameters(), lr=0.5), [1 / 3] * 3
    )
    assert accumlib.parameter_gap(full(model), reference) <= 1e-12
    assert settings(model) == before  # put back after a cycle that stepped too


def test_gradient_sync_is_off_before_the_last_micro_batch_only(group):
    """What each micro-batch's backward sees: sync off and the reshard setting as set, then sync on and reshard."""
    model = sharded_network()
    model.set_reshard_after_backward(False)
    seen = []
    groups = sharded._groups(model)

    def loss_fn(output, target):
        seen.append([(g.reduce_grads, g.reshard_after_backward) for g in groups])
        return nn.functional.cross_entropy(output, target)

    accumlib.accumulate_and_step(
        model, micro_batches(), torch.optim.SGD(model.parameters(), lr=0.5), [1 / 3] * 3, loss_fn=loss_fn
    )
    assert seen == [[(False, False)] * len(groups)] * 2 + [[(True, True)] * len(groups)]
    accumlib.accumulate_and_step(
        model,
        micro_batches(),
        torch.optim.SGD(model.parameters(), lr=0.5),
        [1 / 3] * 3,
        loss_fn=loss_fn,
        ddp_no_sync=False,
    )
    assert seen[3:] == [[(True, False)] * len(groups)] * 2 + [[(True, True)] * len(groups)]


def test_start_outside_torchrun_is_refused_by_name(monkeypatch):
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match=r"^LOCAL_RANK, WORLD_SIZE not set: .* torchrun --standalone"):
        sharded.start()
    assert not dist.is_initialized()


# --- DDP: no_sync() on every micro-batch but the last, under torch.compile too --------------------------------

X, Y = data.digits(96, flat=True)


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
