"""No host synchronisation per micro-batch: the loop reads the device once per optimizer step.

Every read of a tensor's value on the host (`item`, `tolist`, `float()`, `bool()`, `int()`, use as an index) is
counted with a TorchFunctionMode. On a GPU each one makes the host wait until the device has caught up.
"""

import pytest
import torch

import accumlib
from accumlib.timing import HostReads
from builders import data, models


def test_the_counter_sees_every_kind_of_read():
    t, i = torch.tensor(2.0), torch.tensor(1)
    with HostReads() as reads:
        t.item(), t.tolist(), float(t), bool(t), int(t), [0, 1][i]
    assert reads.count == 6


def reads_of_a_run(normalize, extras):
    """Train while recording the read count at every micro-batch and after every step."""
    if normalize == "count":
        X, y = data.token_sequences(72, seed=2)
        model = models.sequence_model()
        options = dict(loss_fn=models.token_loss_sum, loss_reduction="sum", count=data.count_tokens)
    else:
        X, y = data.digits(72, flat=True)
        model = models.mlp()
        options = {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if "scheduler" in extras:
        options["scheduler"] = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    if "plateau" in extras:
        options["scheduler"] = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0)
    if "clipping" in extras:
        options["clip_grad_norm"] = 0.5
    if "unchecked" in extras:
        options["check_gradients"] = False
    if "bf16" in extras or "fp16" in extras:
        options["amp"] = "bf16" if "bf16" in extras else "fp16"
    loss_fn = options.pop("loss_fn", torch.nn.functional.cross_entropy)
    at_micro_batch, at_step = [], []

    def counting_loss(output, target):
        at_micro_batch.append(reads.count)
        return loss_fn(output, target)

    def on_step(record):
        at_step.append((reads.count, len(at_micro_batch), record.skipped))

    with HostReads() as reads:
        history = accumlib.train(
            model,
            (X, y),
            optimizer,
            micro_batch_size=4,
            accum_steps=5,
            epochs=2,
            normalize=normalize,
            loss_fn=counting_loss,
            device="cpu",
            on_step=on_step,
            **options,
        )
    return history, at_micro_batch, at_step


@pytest.mark.parametrize(
    "extras", [(), ("clipping", "scheduler"), ("bf16", "clipping", "plateau"), ("fp16",), ("unchecked",)]
)
@pytest.mark.parametrize("normalize", ["samples", "steps", "count"])
def test_one_read_per_optimizer_step_and_none_per_micro_batch(normalize, extras):
    history, at_micro_batch, at_step = reads_of_a_run(normalize, extras)
    assert len(history) == 8  # 72 samples / (4 x 5), 2 epochs: 3 full cycles and one of 12 samples each
    # before the first micro-batch: nothing, or the one read of the cycle's loss terms (normalize="count": the
    # counts are read a cycle at a time, before its first forward, so a long run starts at once)
    counted = normalize == "count"
    assert at_micro_batch[0] == counted
    first = 0
    reads_before = 0
    for reads_after, micro_batches_so_far, skipped in at_step:
        cycle = at_micro_batch[first:micro_batches_so_far]
        assert cycle == [cycle[0]] * len(cycle)  # no read between the micro-batches of a cycle
        # one read per step: loss and gradient norm together (the loss alone unchecked); a GradScaler's step reads
        # its own inf check; with normalize="count" one more, of the cycle's counts, before its first micro-batch
        assert cycle[0] - reads_before == counted
        assert reads_after - reads_before == (2 if "fp16" in extras and not skipped else 1) + counted
        first, reads_before = micro_batches_so_far, reads_after
