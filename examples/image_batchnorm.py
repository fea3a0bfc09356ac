"""A small image classifier with BatchNorm trained with gradient accumulation on every process torchrun starts.

    torchrun --standalone --nproc_per_node=2 examples/image_batchnorm.py              # DDP; gloo on the CPU
    torchrun --standalone --nproc_per_node=2 examples/image_batchnorm.py --fsdp2      # sharded with fully_shard
    torchrun --standalone --nproc_per_node=2 examples/image_batchnorm.py --sync-bn    # GPUs only (nccl)

The data are the 1,797 handwritten 8x8 digits shipped with accumlib, 1,497 to train on, 300 held out; each process
reads its own share of the training digits through a DistributedSampler. BatchNorm normalises each micro-batch by
that micro-batch's own statistics: accumulation does not change that, so a step's gradient is not the gradient of
one batch of the whole step (lesson 7 measures the gap). The running statistics: DDP broadcasts rank 0's to the
other processes (broadcast_buffers=True, its default); FSDP2 leaves each process its own. --sync-bn
(nn.SyncBatchNorm, CUDA only in PyTorch) takes each micro-batch's statistics over all processes' micro-batches at
once: a BatchNorm batch of micro-batch x processes samples, at the price of an all-reduce in every forward,
no_sync() or not. Rank 0 prints each step and the
held-out accuracy (eval mode: the running statistics).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

import accumlib
from accumlib import sharded
from accumlib.lessons import data


def classifier(width: int) -> nn.Sequential:
    """Two convolutions, each followed by BatchNorm and ReLU, then a linear layer over the pooled features."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * width * 16, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp2", action="store_true", help="shard the model with fully_shard (default: DDP)")
    parser.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes (CUDA only)")
    parser.add_argument("--width", type=int, default=16, help="channels of the first convolution")
    parser.add_argument("--batch", type=int, default=16, help="digits per micro-batch and process")
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    device = sharded.start()  # nccl on this process's GPU, or gloo on the CPU
    if args.sync_bn and device.type != "cuda":
        raise SystemExit("--sync-bn: nn.SyncBatchNorm runs on CUDA GPUs only; on the CPU leave it out")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every process
    model = classifier(args.width)
    if args.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    if args.fsdp2:
        from torch.distributed.fsdp import fully_shard

        model = fully_shard(model)  # one unit: a model this small gains nothing from finer shards
    else:
        model = nn.parallel.DistributedDataParallel(model)
    X, y = data.digits()
    train_set = torch.utils.data.TensorDataset(X[:1497], y[:1497])
    sampler = torch.utils.data.DistributedSampler(train_set, shuffle=True, seed=0)  # this process's share
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def report(record):
        if rank == 0:
            print(
                f"step {record.step} (epoch {record.epoch}): loss {record.loss:.3f}, {record.samples} digits",
                flush=True,
            )

    history = accumlib.train(
        model, loader, optimizer, accum_steps=args.accum_steps, epochs=args.epochs, device=device, on_step=report
    )
    model.eval()  # BatchNorm's running statistics; every process runs the forward (FSDP2 gathers the shards)
    with torch.no_grad():
        right = (model(X[1497:].to(device)).argmax(1) == y[1497:].to(device)).sum()
    if rank == 0:
        print(
            f"{'FSDP2' if args.fsdp2 else 'DDP'} on {world} processes ({device.type}, {dist.get_backend()}"
            f"{', SyncBatchNorm' if args.sync_bn else ''}): {len(history)} steps, loss {history[0].loss:.3f} -> "
            f"{history[-1].loss:.3f}; held-out accuracy {right.item() / 300:.1%} of 300 digits"
        )
    dist.barrier()  # every process done with every collective before any closes its connections
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
