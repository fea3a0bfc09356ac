"""The training script tests/library/test_torchrun.py starts with torchrun: `accumlib.train` on every process of a gloo
group, with a DistributedDataParallel or an FSDP2 (fully_shard) model, float64 throughout.

    torchrun --standalone --nproc_per_node=2 tests/library/torchrun_worker.py OUT WRAP [SCENARIO ...]

WRAP is "ddp" or "fsdp2". Each scenario trains a fresh model; rank 0 saves {scenario: {"state": the full weights,
"records": stable_records(history)}} to OUT. The test imports this module for the same models and data, and builds
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
from states import stable_records

import accumlib
from accumlib.timing import HostReads

SEED, LR, EPOCHS = 4, 0.5, 2
CLIP = 0.05  # below every step's gradient norm here: every step is clipped (the test checks that it is)
TOKEN_BATCH = 2  # sequences per loader batch


def mlp() -> nn.Module:
    """The classifier of the tensor scenarios, the same initial weights on every process."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()


def tensors(nonfinite: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """29 samples: with micro-batches of 2, 3 per step and 2 processes, steps of 12, 12 and 5 samples; the last
    shared 3 and 2: micro-batches of 2 and 1 on rank 0, of 2 and a padding one (weight 0) on rank 1. nonfinite:
    sample 7 is NaN, on one process a step of each epoch (the step is skipped on every process, as on one)."""
    generator = torch.Generator().manual_seed(1)
    X, y = torch.randn(29, 5, dtype=torch.float64, generator=generator), torch.randint(0, 3, (29,), generator=generator)
    if nonfinite:
        X[7] = float("nan")
    return X, y


def token_shards(rank: int, world: int, epoch: int, uneven: bool) -> list[dict]:
    """One process's loader batches of the causal LM for one epoch: a DistributedSampler's share of 17 sequences
    (shuffled by epoch), or with `uneven` the first 10 sequences for rank 0 and 5 for rank 1 (5 and 3 batches)."""
    items = lm.sequences(17)
    if uneven:
        share = items[:10] if rank == 0 else items[10:15]
        return [lm.pad(share[i : i + TOKEN_BATCH]) for i in range(0, len(share), TOKEN_BATCH)]
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
    return {
        k: (v.full_tensor() if isinstance(v, dist.tensor.DTensor) else v).detach().clone() for k, v in state.items()
    }


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
    """Train one scenario on this process; the result rank 0 saves, with FSDP2's collectives and the host reads
    (tensor scenarios) in each step."""
    steps, before, reads = [], dict(calls), HostReads()

    def count(record):
        step = {kind: calls[kind] - before[kind] - sum(step[kind] for step in steps) for kind in calls}
        steps.append({**step, "host reads": reads.count - sum(step["host reads"] for step in steps)})

    if name in ("tensors", "clipped", "unsharded", "every", "nonfinite"):
        model = wrap(mlp(), how)
        if name == "unsharded":
            model.set_reshard_after_backward(False)  # parameters kept whole between a step's micro-batches
        optimizer = (torch.optim.Adam if name == "clipped" else torch.optim.SGD)(model.parameters(), lr=LR)
        with reads:
            history = accumlib.train(
                model,
                tensors(name == "nonfinite"),
                optimizer,
                micro_batch_size=2,
                accum_steps=3,
                epochs=EPOCHS,
                seed=SEED,
                device="cpu",
                clip_grad_norm=CLIP if name == "clipped" else None,
                ddp_no_sync=name != "every",
                on_step=count,
            )
    else:  # "tokens", "uneven": each process's loader its own, the model's own mean loss weighted by its tokens
        model = wrap(lm.TinyCausalLM(), how)
        history = accumlib.train(
            model,
            EpochLoader(name == "uneven"),
            torch.optim.SGD(model.parameters(), lr=LR),
            accum_steps=2,
            epochs=EPOCHS,
            normalize="count",
            count=tokens,
            device="cpu",
        )
    return {"state": full_state(model), "records": stable_records(history), "collectives": steps}


UNIT_BYTES = (64 * 512 + 512) * 4  # the first Linear's weights: the largest FSDP unit's whole gradient


def wide() -> nn.Module:
    """A model whose weights outweigh its activations (float32): 64 -> 512 -> 64."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64))


def memory() -> dict:
    """What one process holds in a step of `wide()` (Adam; 3 micro-batches of 4 per process), measured by train
    (measure_memory=True: each step's peak) and by memory.measure_step, under DDP and FSDP2 (gradient sync on the
    last micro-batch, then on every one); and memory_budget under FSDP2 below and above the measured peak by
    more than a collective's buffer (a busy CPU can move the peak by less than that: see the test)."""
    import warnings

    generator = torch.Generator().manual_seed(5)
    X, y = torch.randn(48, 64, generator=generator), torch.randint(0, 64, (48,), generator=generator)
    found = {}
    for name, how, no_sync in (("ddp", "ddp", True), ("fsdp2", "fsdp2", True), ("fsdp2 every", "fsdp2", False)):
        model = wrap(wide(), how)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        history = accumlib.train(
            model,
            (X, y),
            optimizer,
            micro_batch_size=4,
            accum_steps=3,
            max_steps=2,
            device="cpu",
            measure_memory=True,
            ddp_no_sync=no_sync,
        )
        found[name] = {"train": [r.peak_memory_bytes for r in history]}
        report = accumlib.measure_step(model, X[:4], y[:4], optimizer=optimizer, accum_steps=3, ddp_no_sync=no_sync)
        found[name]["report"] = report  # DDP: traced on its module, its gradient bucket added; FSDP2: a real step
        if how == "fsdp2":
            found[name].update(
                shards=sum(p.to_local().nbytes for p in model.parameters()),
                state=sum(sharded_bytes(v) for state in optimizer.state.values() for v in state.values()),
            )
    model = wrap(wide(), "fsdp2")
    before = [p.to_local().clone() for p in model.parameters()]
    peak, collective = found["fsdp2"]["report"].peak, UNIT_BYTES  # the peak moves by up to a collective's buffer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            accumlib.train(
                model,
                (X, y),
                torch.optim.Adam(model.parameters(), lr=1e-3),
                micro_batch_size=4,
                accum_steps=3,
                device="cpu",
                memory_budget=peak - collective - 1,
            )
            found["refused"] = None
        except accumlib.OutOfMemory as error:
            found["refused"] = str(error)
        found["unchanged"] = all(torch.equal(p.to_local(), b) for p, b in zip(model.parameters(), before, strict=True))
        history = accumlib.train(
            model,
            (X, y),
            torch.optim.Adam(model.parameters(), lr=1e-3),
            micro_batch_size=4,
            accum_steps=3,
            device="cpu",
            memory_budget=peak + collective,
            max_steps=1,
        )
    found["within budget"] = len(history)
    found["warnings"] = sorted({str(w.message) for w in caught})
    return found


def sharded_bytes(value) -> int:
    return value.to_local().nbytes if isinstance(value, dist.tensor.DTensor) else value.nbytes


def checkpointed() -> dict:
    """FSDP2 with Adam on the tensors (6 steps, shuffled): the uninterrupted run; a run stopped after step 3 with
    checkpoint=CHECKPOINT/run.pt (every step), then resumed from it into a model built from another seed. On
    another number of processes only the resumption is tried (the file of the 2-process run)."""
    import os

    path = Path(os.environ["CHECKPOINT"]) / "run.pt"

    def run(seed: int, **options):
        torch.manual_seed(seed)
        model = wrap(nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double(), "fsdp2")
        history = accumlib.train(
            model,
            tensors(),
            torch.optim.Adam(model.parameters(), lr=0.05),
            micro_batch_size=2,
            accum_steps=3,
            epochs=EPOCHS,
            seed=SEED,
            device="cpu",
            **options,
        )
        return {"state": full_state(model), "records": stable_records(history)}

    if dist.get_world_size() != 2:
        try:
            run(0, checkpoint=path)
        except ValueError as error:
            return {"refused": str(error)}
        return {"refused": None}

    def stop_at_3(record):
        if record.step == 3:
            raise accumlib.StopTraining

    found = {"uninterrupted": run(0), "stopped": run(0, checkpoint=path, checkpoint_every=1, on_step=stop_at_3)}
    found["folders"] = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
    found["resumed"] = run(1, checkpoint=path)
    return found


def sub_mesh() -> dict:
    """An FSDP2 model sharded over a mesh of this process alone (of 2): train refuses it by name."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(mlp(), mesh=DeviceMesh("cpu", [dist.get_rank()]))
    try:
        accumlib.train(
            model,
            tensors(),
            torch.optim.SGD(model.parameters(), lr=LR),
            micro_batch_size=2,
            accum_steps=3,
            device="cpu",
        )
    except ValueError as error:
        return {"refused": str(error)}
    return {"refused": None}


def main(out: str, how: str, names: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        special = {"memory": memory, "checkpoint": checkpointed, "sub-mesh": sub_mesh}
        results = {name: special[name]() if name in special else scenario(name, how) for name in names}
        if dist.get_rank() == 0:
            torch.save(results, out)
        dist.barrier()
    finally:
        gc.collect()  # DDP's reducer sits in reference cycles: freed before the process group
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
