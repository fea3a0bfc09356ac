"""Accumulation across processes, for real: DistributedDataParallel on the CPU with the gloo backend.

`run_ddp` launches `world_size` worker processes on this machine with PyTorch's own launcher (torchrun, on
loopback only); each trains a DDP-wrapped model with `accumlib.train`, and a DDP communication hook counts the
gradient all-reduces. Rank 0's result comes back. Fresh processes (not forked or spawned from the caller) also
keep a Jupyter kernel out of the workers.
"""
from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
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


def _train_rank(job: Path) -> None:
    """This process's share of a run_ddp job; rank 0 writes the result. Its DDP objects die when it returns."""
    from .loop import train

    spec = torch.load(job / "job.pt", weights_only=False)
    model = DistributedDataParallel(spec["builder"]())
    counter = {"calls": 0}
    model.register_comm_hook(counter, _counting_allreduce)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"])
    history = train(model, spec["data"], optimizer, micro_batch_size=spec["micro_batch_size"],
                    accum_steps=spec["accum_steps"], epochs=spec["epochs"], seed=spec["seed"],
                    ddp_no_sync=spec["no_sync"], measure_memory=False, device="cpu")
    if dist.get_rank() == 0:
        torch.save({"steps": len(history), "calls": counter["calls"], "losses": tuple(r.loss for r in history),
                    "state": {k: v.detach().clone() for k, v in model.module.state_dict().items()}},
                   job / "result.pt")


def _worker(job: Path) -> None:
    """One process of a run_ddp job (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        _train_rank(job)
        dist.barrier()
    finally:
        # DDP's reducer holds the process group and sits in reference cycles. Left to the interpreter's shutdown,
        # gloo's threads are destroyed after Python is gone and the process aborts (SIGABRT, seen under load).
        gc.collect()
        dist.destroy_process_group()


def run_ddp(builder, data, *, world_size: int = 2, micro_batch_size: int, accum_steps: int, epochs: int = 1,
            lr: float = 0.5, seed: int = 0, no_sync: bool = True, timeout: float = 120) -> DDPResult:
    """Train builder() under DDP in `world_size` CPU processes; every process builds the same initial model.

    builder: a picklable zero-argument callable returning the model (e.g. functools.partial(models.mlp, ...)).
    data: (X, y); each cycle's micro_batch_size * accum_steps * world_size samples are shared out by rank.
    timeout: seconds before the job is stopped.
    """
    world_size = positive_int("world_size", world_size)
    with tempfile.TemporaryDirectory(prefix="accumlib-ddp-") as folder:
        job = Path(folder)
        torch.save(dict(builder=builder, data=data, micro_batch_size=micro_batch_size, accum_steps=accum_steps,
                        epochs=epochs, lr=lr, seed=seed, no_sync=no_sync), job / "job.pt")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for _ in range(2):  # a second try only when another program took the free port first
            command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size}",
                       "--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={_free_port()}", "-m", __name__,
                       str(job)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            if "address already in use" not in done.stderr.lower():
                break
        if done.returncode != 0:
            raise RuntimeError(f"DDP job failed (exit code {done.returncode}):\n{done.stderr[-2000:]}")
        result = torch.load(job / "result.pt", weights_only=False)
    return DDPResult(world_size, micro_batch_size, accum_steps, no_sync, result["steps"], result["calls"],
                     result["state"], result["losses"])


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
