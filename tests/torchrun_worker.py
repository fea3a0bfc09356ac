"""The training script tests/test_torchrun.py starts with torchrun: `accumlib.train` on every process of a gloo
group, with a DistributedDataParallel or an FSDP2 (fully_shard) model, float64 throughout.

    torchrun --standalone --nproc_per_node=2 tests/torchrun_worker.py OUT WRAP [SCENARIO ...]

WRAP is "ddp" or "fsdp2". Each scenario trains a fresh model; rank 0 saves {scenario: {"state": the full weights,
"records": history.deterministic()}} to OUT. The test imports this module for the same models and data, and builds
its one-process reference from them.
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_pipeline: the tiny causal LM and its batches
import test_pipeline as lm

import accumlib

SEED, LR, EPOCHS = 4, 0.5, 2
CLIP = 0.05  # below every step's gradient norm here: every step is clipped (the test checks that it is)
TOKEN_BATCH = 2  # sequences per loader batch


def mlp() -> nn.Module:
    """The classifier of the tensor scenarios, the same initial weights on every process."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """29 samples: with micro-batches of 2, 3 per step and 2 processes, steps of 12, 12 and 5 samples; the last
    shared 3 and 2: micro-batches of 2 and 1 on rank 0, of 2 and a padding one (weight 0) on rank 1."""
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(29, 5, dtype=torch.float64, generator=generator),
            torch.randint(0, 3, (29,), generator=generator))


def token_shards(rank: int, world: int, epoch: int, uneven: bool) -> list[dict]:
    """One process's loader batches of the causal LM for one epoch: a DistributedSampler's share of 17 sequences
    (shuffled by epoch), or with `uneven` the first 10 sequences for rank 0 and 5 for rank 1 (5 and 3 batches)."""
    items = lm.sequences(17)
    if uneven:
        share = items[:10] if rank == 0 else items[10:15]
        return [lm.pad(share[i:i + TOKEN_BATCH]) for i in range(0, len(share), TOKEN_BATCH)]
    sampler = torch.utils.data.DistributedSampler(items, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    sampler.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(items, batch_size=TOKEN_BATCH, sampler=sampler, collate_fn=lm.pad)
    return list(loader)


def tokens(batch: dict) -> torch.Tensor:
    """A batch's loss terms: its labelled next tokens (the causal LM's loss is their mean)."""
    return (batch["labels"][:, 1:] != lm.IGNORE).sum()


def wrap(model: nn.Module, how: str) -> nn.Module:
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model.children():  # each layer its own FSDP unit, then the root
        if any(True for _ in layer.parameters()):
            fully_shard(layer)
    return fully_shard(model)


def full_state(model: nn.Module) -> dict:
    """The whole weights on every process (FSDP2: each shard gathered, a collective every process calls)."""
    state = model.module.state_dict() if isinstance(model, nn.parallel.DistributedDataParallel) else model.state_dict()
    return {k: (v.full_tensor() if isinstance(v, dist.tensor.DTensor) else v).detach().clone()
            for k, v in state.items()}


class EpochLoader:
    """This process's own loader: `token_shards` per epoch; train calls sampler.set_epoch(epoch)."""

    def __init__(self, uneven: bool):
        self.uneven, self.epoch, self.sampler = uneven, 0, self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(token_shards(dist.get_rank(), dist.get_world_size(), self.epoch, self.uneven))


COUNTED = {"all_gather_single": "all-gathers", "reduce_scatter_single": "reduce-scatters"}  # FSDP2's collectives
calls = dict.fromkeys(COUNTED.values(), 0)


def _counting(name: str):
    collective = getattr(dist, name)

    def counted(*args, **kwargs):
        calls[COUNTED[name]] += 1
        return collective(*args, **kwargs)
    return counted


for _name in COUNTED:
    setattr(dist, _name, _counting(_name))  # FSDP2 calls them through the module: each call counted


def scenario(name: str, how: str) -> dict:
    """Train one scenario on this process; the result rank 0 saves, with FSDP2's collectives in each step."""
    steps, before = [], dict(calls)

    def count(record):
        steps.append({kind: calls[kind] - before[kind] - sum(step[kind] for step in steps) for kind in calls})

    if name in ("tensors", "clipped", "unsharded", "every"):
        model = wrap(mlp(), how)
        if name == "unsharded":
            model.set_reshard_after_backward(False)  # parameters kept whole between a step's micro-batches
        optimizer = (torch.optim.Adam if name == "clipped" else torch.optim.SGD)(model.parameters(), lr=LR)
        history = accumlib.train(model, tensors(), optimizer, micro_batch_size=2, accum_steps=3, epochs=EPOCHS,
                                 seed=SEED, device="cpu", clip_grad_norm=CLIP if name == "clipped" else None,
                                 ddp_no_sync=name != "every", on_step=count)
    else:  # "tokens", "uneven": each process's loader its own, the model's own mean loss weighted by its tokens
        model = wrap(lm.TinyCausalLM(), how)
        history = accumlib.train(model, EpochLoader(name == "uneven"), torch.optim.SGD(model.parameters(), lr=LR),
                                 accum_steps=2, epochs=EPOCHS, normalize="count", count=tokens, device="cpu")
    return {"state": full_state(model), "records": history.deterministic(), "collectives": steps}


def main(out: str, how: str, names: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        results = {name: scenario(name, how) for name in names}
        if dist.get_rank() == 0:
            torch.save(results, out)
        dist.barrier()
    finally:
        gc.collect()  # DDP's reducer sits in reference cycles: freed before the process group
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
