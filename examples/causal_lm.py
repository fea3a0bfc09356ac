"""A small causal language model trained with gradient accumulation on every process torchrun starts.

    torchrun --standalone --nproc_per_node=2 examples/causal_lm.py            # DDP; gloo on the CPU, nccl on GPUs
    torchrun --standalone --nproc_per_node=2 examples/causal_lm.py --fsdp2    # the same model sharded (fully_shard)

The text is accumlib's own documentation (its docstrings), byte by byte (a vocabulary of 256), cut into sentences
of different lengths: dict batches (input_ids, attention_mask, labels with -100 on the padding), as a Hugging Face
collator makes them. Each process reads its own share through a DistributedSampler. The model returns its loss,
the mean over a batch's labelled next tokens; normalize="count" weights each micro-batch by its tokens, so every
step's gradient is the mean over all the step's tokens on every process, whatever the batches' lengths. Rank 0
prints each step; at the end every process's weights are compared.
"""

from __future__ import annotations

import argparse
import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)

import accumlib
from accumlib import (
    cycle,
    cycle_checks,
    failures,
    gaps,
    interrupts,
    loop,
    loss_weights,
    losses,
    memory,
    records,
    restore,
    sharded,
    source,
)

IGNORE = -100  # the label of a padding position: no loss term


class TinyGPT(nn.Module):
    """Token and position embeddings, causal self-attention blocks, a head; forward(input_ids, attention_mask,
    labels) returns {"loss": the mean over the labelled next tokens, "logits": ...}, as a Hugging Face model does."""

    def __init__(self, dim: int, layers: int, context: int, vocab: int = 256):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                dim, nhead=4, dim_feedforward=4 * dim, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, attention_mask, labels=None):
        length = input_ids.shape[1]
        h = self.tokens(input_ids) + self.positions(torch.arange(length, device=input_ids.device))
        causal = nn.Transformer.generate_square_subsequent_mask(length, device=input_ids.device)
        for block in self.blocks:  # right padding: a real position never attends to a later one
            h = block(h, src_mask=causal, is_causal=True)
        logits = self.head(h)
        loss = None
        if labels is not None:  # position t predicts token t + 1
            loss = nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE
            )
        return {"loss": loss, "logits": logits}


def sentences(context: int) -> list[torch.Tensor]:
    """accumlib's documentation (its modules' and their functions' docstrings) as byte sequences, one per sentence,
    at most `context` bytes long."""
    modules = (
        loop,
        records,
        source,
        loss_weights,
        gaps,
        cycle,
        cycle_checks,
        losses,
        restore,
        interrupts,
        failures,
        memory,
        sharded,
    )
    documented = [
        member
        for module in modules
        for member in (module, *vars(module).values())
        if (inspect.isfunction(member) or inspect.isclass(member) or inspect.ismodule(member))
        and getattr(member, "__module__", module.__name__) == module.__name__
    ]
    text = " ".join(member.__doc__ for member in documented if member.__doc__)
    pieces = [piece.strip() + "." for piece in " ".join(text.split()).split(". ") if len(piece.strip()) > 8]
    return [torch.tensor(list(piece.encode()[:context])) for piece in pieces]


def collate(batch: list[torch.Tensor]) -> dict:
    """Right-padded input_ids, attention_mask, and labels with -100 on the padding."""
    width = max(len(s) for s in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, s in enumerate(batch):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE)}


def tokens(batch: dict) -> torch.Tensor:
    """A batch's loss terms: its labelled next tokens."""
    return (batch["labels"][:, 1:] != IGNORE).sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp2", action="store_true", help="shard the model with fully_shard (default: DDP)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=64, help="longest sentence, in bytes")
    parser.add_argument("--batch", type=int, default=8, help="sentences per micro-batch and process")
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    device = sharded.start()  # nccl on this process's GPU, or gloo on the CPU
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every process
    model = TinyGPT(args.dim, args.layers, args.context).to(device)
    if args.fsdp2:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)  # each block's parameters gathered only while it runs
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    data = sentences(args.context)
    sampler = torch.utils.data.DistributedSampler(data, shuffle=True, seed=0)  # this process's share
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler, collate_fn=collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def report(record):
        if rank == 0:
            print(
                f"step {record.step}: loss {record.loss:.3f} per token, {record.samples} sentences, "
                f"gradient norm {record.grad_norm:.3f}",
                flush=True,
            )

    history = accumlib.train(
        model,
        loader,
        optimizer,
        accum_steps=args.accum_steps,
        epochs=args.epochs,
        normalize="count",
        count=tokens,
        clip_grad_norm=1.0,
        device=device,
        on_step=report,
    )
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # the whole weights
    digest = torch.stack([value.double().sum() for value in state.values()]).to(device)
    digests = [torch.zeros_like(digest) for _ in range(world)]
    dist.all_gather(digests, digest)
    if rank == 0:
        same = all(torch.equal(d, digests[0]) for d in digests)
        print(
            f"{'FSDP2' if args.fsdp2 else 'DDP'} on {world} processes ({device.type}, {dist.get_backend()}): "
            f"{len(history)} steps, loss {history[0].loss:.3f} -> {history[-1].loss:.3f} per token; "
            f"every process holds the same weights: {'yes' if same else 'NO'}"
        )
    dist.barrier()  # every process done with every collective before any closes its connections
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
