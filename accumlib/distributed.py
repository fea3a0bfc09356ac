"""Accumulation across processes, for real: DistributedDataParallel on the CPU with the gloo backend.

`run_ddp` starts `world_size` processes on this machine (loopback only), trains a DDP-wrapped model with
`accumlib.train`, counts the gradient all-reduces with a DDP communication hook, and returns rank 0's result.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ._validate import positive_int


@dataclass(frozen=True)
class DDPResult:
    world_size: int
    micro_batch_size: int
    accum_steps: int
    no_sync: bool
    steps: int  # optimizer steps taken
    allreduce_calls: int  # gradient buckets all-reduced by DDP on rank 0, over the whole run
    state: dict  # rank 0's final parameters (name -> tensor)
    losses: tuple[float, ...]  # each step's mean loss over all processes

    @property
    def allreduce_per_step(self) -> float:
        return self.allreduce_calls / self.steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _counting_allreduce(state: dict, bucket):
    state["calls"] += 1
    return allreduce_hook(None, bucket)


def _worker(rank, world_size, port, builder, data, config, results):
    from .loop import train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model = DistributedDataParallel(builder())
        counter = {"calls": 0}
        model.register_comm_hook(counter, _counting_allreduce)
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        history = train(model, data, optimizer, micro_batch_size=config["micro_batch_size"],
                        accum_steps=config["accum_steps"], epochs=config["epochs"], seed=config["seed"],
                        ddp_no_sync=config["no_sync"], measure_memory=False, device="cpu")
        if rank == 0:
            # NumPy, not tensors: a tensor crosses the queue as shared memory that dies with this process
            state = {k: v.detach().numpy().copy() for k, v in model.module.state_dict().items()}
            results.put((len(history), counter["calls"], state, tuple(r.loss for r in history)))
    finally:
        dist.destroy_process_group()


def run_ddp(builder, data, *, world_size: int = 2, micro_batch_size: int, accum_steps: int, epochs: int = 1,
            lr: float = 0.5, seed: int = 0, no_sync: bool = True) -> DDPResult:
    """Train builder() under DDP in `world_size` CPU processes; every process builds the same initial model.

    builder: a picklable zero-argument callable returning the model (e.g. functools.partial(models.mlp, ...)).
    data: (X, y); each cycle's micro_batch_size * accum_steps * world_size samples are shared out by rank.
    """
    world_size = positive_int("world_size", world_size)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    config = dict(micro_batch_size=micro_batch_size, accum_steps=accum_steps, epochs=epochs, lr=lr, seed=seed,
                  no_sync=no_sync)
    mp.start_processes(_worker, args=(world_size, _free_port(), builder, data, config, results),
                       nprocs=world_size, join=True, start_method="spawn")
    steps, calls, state, losses = results.get()
    state = {k: torch.from_numpy(v) for k, v in state.items()}
    return DDPResult(world_size, micro_batch_size, accum_steps, no_sync, steps, calls, state, losses)
