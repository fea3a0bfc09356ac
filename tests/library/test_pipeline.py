"""train with the input pipeline engineers have: DataLoaders and other iterables of batches (with or without len()),
dict batches (model(**batch)), tuple inputs (model(*inputs)), and models that return their own loss.

Each run is compared, in float64, with a plain loop that takes one optimizer step on all of a cycle's samples at once
(the whole cycle padded as one batch): accumulation is exact when the two agree to rounding, last short cycle
included. Tolerance: float64 rounds at 1.1e-16 relative; the sums and means here run over at most a few hundred
terms of size ~1 and the weights stay ~1, so 10 SGD steps stay far below 1e-13 (a lost or mis-weighted micro-batch
moves a weight by ~1e-3).
"""

import copy
import dataclasses
import functools
import math

import pytest
import torch
from torch import nn

import accumlib

VOCAB, PAD, IGNORE = 11, 0, -100
TOLERANCE = 1e-13  # see the module docstring


@dataclasses.dataclass
class CausalLMOutput:
    """What a Hugging Face causal LM returns: .loss (given labels) and .logits."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class TinyCausalLM(nn.Module):
    """A causal LM small enough for the CPU: each position sees the mean of the embeddings up to it (causal, so
    right-padding changes nothing before it). forward(input_ids, attention_mask=None, labels=None) returns .loss,
    the mean over the non-ignored shifted tokens, as Hugging Face models do."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, 8, dtype=torch.float64)
        self.mix = nn.Linear(8, 8, dtype=torch.float64)
        self.head = nn.Linear(8, VOCAB, dtype=torch.float64)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.embed(input_ids)
        if attention_mask is not None:
            h = h * attention_mask[..., None]
        positions = torch.arange(1, input_ids.shape[1] + 1, dtype=h.dtype)[None, :, None]
        logits = self.head(torch.tanh(self.mix(h.cumsum(1) / positions)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=IGNORE
            )
        return CausalLMOutput(loss, logits)


def sequences(n: int = 29, seed: int = 1) -> list[torch.Tensor]:
    """n token sequences of 2 to 9 tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (n,), generator=generator).tolist()
    return [torch.randint(1, VOCAB, (length,), generator=generator) for length in lengths]


def pad(batch: list[torch.Tensor]) -> dict:
    """A Hugging Face-style batch: right-padded input_ids, attention_mask, and labels with -100 on the padding."""
    width = max(len(s) for s in batch)
    ids = torch.full((len(batch), width), PAD)
    mask = torch.zeros(len(batch), width, dtype=torch.float64)
    for row, s in enumerate(batch):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, IGNORE)}


class Stream(torch.utils.data.IterableDataset):
    """The sequences as a stream: no len()."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def tokens(batch) -> torch.Tensor:
    """The loss terms of a causal LM batch: its non-ignored shifted labels."""
    return (batch["labels"][:, 1:] != IGNORE).sum()


def full_batch_reference(model, cycles, lr=0.5):
    """One SGD step per cycle on all of its sequences padded as one batch: the model's mean over all its tokens."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for cycle in cycles:
        optimizer.zero_grad()
        model(**pad(cycle)).loss.backward()
        optimizer.step()
    return model


def cycles_of(items, batch_size, accum_steps, epochs):
    """The sequences of each optimizer step: accum_steps batches of batch_size (the loader's order, unshuffled)."""
    per_step = batch_size * accum_steps
    return [items[i : i + per_step] for _ in range(epochs) for i in range(0, len(items), per_step)]


ITEMS = sequences()  # 29 sequences, batches of 3: 10 batches, the last of 2; accum_steps 4: cycles of 4, 4 and 2


@pytest.mark.parametrize("loader", ["DataLoader", "IterableDataset without len()", "list of batches", "generator"])
def test_hugging_face_style_call_equals_one_step_on_the_whole_cycle(loader):
    epochs = 1 if loader == "generator" else 2
    make = {
        "DataLoader": lambda: torch.utils.data.DataLoader(ITEMS, batch_size=3, collate_fn=pad),
        "IterableDataset without len()": lambda: torch.utils.data.DataLoader(
            Stream(ITEMS), batch_size=3, collate_fn=pad
        ),
        "list of batches": lambda: [pad(ITEMS[i : i + 3]) for i in range(0, len(ITEMS), 3)],
        "generator": lambda: (pad(ITEMS[i : i + 3]) for i in range(0, len(ITEMS), 3)),
    }[loader]
    data = make()
    if loader == "IterableDataset without len()":
        with pytest.raises(TypeError):
            len(data)
    model = TinyCausalLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    # the call of issue 19, as written there (epochs aside)
    history = accumlib.train(
        model,
        data,
        optimizer,
        accum_steps=4,
        normalize="count",
        count=lambda batch: (batch["labels"][:, 1:] != -100).sum(),
        epochs=epochs,
    )
    reference = full_batch_reference(TinyCausalLM(), cycles_of(ITEMS, 3, 4, epochs))
    assert [r.micro_batches for r in history] == [4, 4, 2] * epochs  # the last cycle is short
    assert [r.samples for r in history] == [12, 12, 5] * epochs
    assert history[-1].samples_seen == 29 * epochs
    assert accumlib.parameter_gap(model, reference) < TOLERANCE
    # the recorded loss is the cycle's mean over its tokens, as the full batch computes it (before its step)
    before = TinyCausalLM()
    first_cycle = pad(ITEMS[:12])
    assert history[0].loss == pytest.approx(before(**first_cycle).loss.item(), abs=TOLERANCE)


def test_a_sum_reduced_loss_and_a_mean_reduced_one_give_the_same_weights():
    """The same model's loss, reduced by sum (loss_reduction="sum") or by mean (loss_reduction="mean"): the same
    steps, both equal to the full batch."""

    def token_sum(output, batch):
        logits, labels = output.logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1)
        return nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")

    def token_mean(output, batch):
        return output.loss

    loader = torch.utils.data.DataLoader(ITEMS, batch_size=3, collate_fn=pad)
    reference = full_batch_reference(TinyCausalLM(), cycles_of(ITEMS, 3, 4, 1))
    for options in (dict(loss_fn=token_sum, loss_reduction="sum"), dict(loss_fn=token_mean, loss_reduction="mean")):
        model = TinyCausalLM()
        accumlib.train(
            model,
            loader,
            torch.optim.SGD(model.parameters(), lr=0.5),
            accum_steps=4,
            normalize="count",
            count=tokens,
            **options,
        )
        assert accumlib.parameter_gap(model, reference) < TOLERANCE, options
    # the sum-reduced loss said to be a mean is weighted by its tokens twice: far from the full batch
    model = TinyCausalLM()
    accumlib.train(
        model,
        loader,
        torch.optim.SGD(model.parameters(), lr=0.5),
        accum_steps=4,
        normalize="count",
        count=tokens,
        loss_fn=token_sum,
        loss_reduction="mean",
    )
    assert accumlib.parameter_gap(model, reference) > 1e-3


class TupleInputLM(TinyCausalLM):
    """forward(input_ids, attention_mask) -> logits: called as model(*inputs)."""

    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids, attention_mask).logits


def token_sum_of_logits(logits, labels):
    return nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="sum"
    )


def as_tuple(batch: dict) -> tuple:
    return (batch["input_ids"], batch["attention_mask"]), batch["labels"]


@pytest.mark.parametrize("with_len", [True, False])
def test_a_tuple_input_model_equals_one_step_on_the_whole_cycle(with_len):
    source = ITEMS if with_len else Stream(ITEMS)
    loader = torch.utils.data.DataLoader(source, batch_size=3, collate_fn=lambda b: as_tuple(pad(b)))
    model = TupleInputLM()
    history = accumlib.train(
        model,
        loader,
        torch.optim.SGD(model.parameters(), lr=0.5),
        accum_steps=4,
        epochs=2,
        loss_fn=token_sum_of_logits,
        normalize="count",
        loss_reduction="sum",
        count=lambda labels: (labels[:, 1:] != IGNORE).sum(),
    )
    reference = full_batch_reference(TinyCausalLM(), cycles_of(ITEMS, 3, 4, 2))
    assert len(history) == 6
    assert accumlib.parameter_gap(model.state_dict(), reference.state_dict()) < TOLERANCE


class PairDataset(torch.utils.data.Dataset):
    """A map-style Dataset of ((input_ids, attention_mask), labels) samples of one length: default_collate makes
    the inputs a list of two tensors (the 'list' object has no attribute 'to' crash of issue 19)."""

    def __init__(self, dict_samples=False):
        self.batch = pad([s for s in ITEMS if len(s) >= 6])
        self.batch = {k: v[:, :6] for k, v in self.batch.items()}
        self.dict_samples = dict_samples

    def __len__(self):
        return len(self.batch["input_ids"])

    def __getitem__(self, i):
        sample = {k: v[i] for k, v in self.batch.items()}
        return sample if self.dict_samples else ((sample["input_ids"], sample["attention_mask"]), sample["labels"])


def test_a_dataset_of_tuple_inputs_and_one_of_dict_samples_train_exactly():
    dataset = PairDataset()
    n = len(dataset)
    tuple_model = TupleInputLM()
    accumlib.train(
        tuple_model,
        dataset,
        torch.optim.SGD(tuple_model.parameters(), lr=0.5),
        micro_batch_size=2,
        accum_steps=3,
        shuffle=False,
        loss_fn=token_sum_of_logits,
        normalize="count",
        loss_reduction="sum",
        count=lambda labels: (labels[:, 1:] != IGNORE).sum(),
    )
    dict_model = TinyCausalLM()
    accumlib.train(
        dict_model,
        PairDataset(dict_samples=True),
        torch.optim.SGD(dict_model.parameters(), lr=0.5),
        micro_batch_size=2,
        accum_steps=3,
        shuffle=False,
        normalize="count",
        count=tokens,
    )
    reference = TinyCausalLM()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for start in range(0, n, 6):
        optimizer.zero_grad()
        reference(**{k: v[start : start + 6] for k, v in dataset.batch.items()}).loss.backward()
        optimizer.step()
    assert n % 6  # a short last cycle
    assert accumlib.parameter_gap(dict_model, reference) < TOLERANCE
    assert accumlib.parameter_gap(tuple_model.state_dict(), reference.state_dict()) < TOLERANCE


def test_a_loader_of_tensor_pairs_is_exactly_x_y_with_micro_batch_size():
    """The same micro-batches from a DataLoader and from (X, y): the same computation, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    X, y = torch.randn(50, 6, generator=generator, dtype=torch.float64), torch.randint(0, 3, (50,), generator=generator)

    def model():
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(6, 5, dtype=torch.float64), nn.Tanh(), nn.Linear(5, 3, dtype=torch.float64))

    a, b = model(), model()
    by_tensors = accumlib.train(
        a, (X, y), torch.optim.SGD(a.parameters(), lr=0.5), micro_batch_size=4, accum_steps=3, shuffle=False, epochs=2
    )
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=4)
    by_loader = accumlib.train(b, loader, torch.optim.SGD(b.parameters(), lr=0.5), accum_steps=3, epochs=2)
    assert accumlib.parameter_gap(a, b) == 0.0
    assert [r.loss for r in by_tensors] == [r.loss for r in by_loader]
    assert [r.samples for r in by_loader] == [12, 12, 12, 12, 2] * 2


def test_batches_of_any_sizes_are_weighted_by_their_samples():
    """normalize="samples" with batches of 5, 2, 4, 1, 3 and 6 samples: each cycle's gradient is that of its mean."""
    generator = torch.Generator().manual_seed(4)
    sizes = [5, 2, 4, 1, 3, 6]
    X, y = (
        torch.randn(sum(sizes), 6, generator=generator, dtype=torch.float64),
        torch.randint(0, 3, (21,), generator=generator),
    )
    batches = list(zip(torch.split(X, sizes), torch.split(y, sizes), strict=True))

    def model():
        torch.manual_seed(5)
        return nn.Linear(6, 3, dtype=torch.float64)

    trained, reference = model(), model()
    history = accumlib.train(trained, batches, torch.optim.SGD(trained.parameters(), lr=0.5), accum_steps=4)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for first in (0, 4):
        xs, ys = zip(*batches[first : first + 4], strict=True)
        optimizer.zero_grad()
        nn.functional.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
        optimizer.step()
    assert [r.samples for r in history] == [12, 9]
    assert accumlib.parameter_gap(trained, reference) < TOLERANCE
    summed = model()  # a sum-reduced loss, said so: weighted 1 over the cycle's samples, the same steps
    accumlib.train(
        summed,
        batches,
        torch.optim.SGD(summed.parameters(), lr=0.5),
        accum_steps=4,
        loss_fn=functools.partial(nn.functional.cross_entropy, reduction="sum"),
        loss_reduction="sum",
    )
    assert accumlib.parameter_gap(summed, reference) < TOLERANCE


def test_the_model_s_own_loss_with_normalize_samples_weights_each_batch_by_its_sequences():
    loader = torch.utils.data.DataLoader(ITEMS, batch_size=3, collate_fn=pad)
    model = TinyCausalLM()
    accumlib.train(model, loader, torch.optim.SGD(model.parameters(), lr=0.5), accum_steps=4)
    reference = TinyCausalLM()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for cycle in cycles_of(ITEMS, 3, 4, 1):  # the mean over sequences of each batch's mean over its tokens
        optimizer.zero_grad()
        batches = [pad(cycle[i : i + 3]) for i in range(0, len(cycle), 3)]
        sum(reference(**b).loss * len(b["input_ids"]) / len(cycle) for b in batches).backward()
        optimizer.step()
    assert accumlib.parameter_gap(model, reference) < TOLERANCE


@pytest.mark.parametrize(
    "case,call,error,names",
    [
        (
            "micro-batch-size-with-a-loader",
            dict(data=[({"a": 1}, 2)], micro_batch_size=4),
            ValueError,
            ["micro_batch_size=4", "list", "omit micro_batch_size"],
        ),
        (
            "micro-batch-size-missing",
            dict(data=(torch.zeros(4, 2), torch.zeros(4))),
            TypeError,
            ["micro_batch_size is missing", "(X, y)"],
        ),
        (
            "batch-of-one-tensor",
            dict(data=[[torch.zeros(2, 6)], [torch.zeros(2, 6)]]),
            TypeError,
            ["data[0] (batch 0 of the list)", "(x, y)"],
        ),
        (
            "batch-without-tensors",
            dict(data=[{"input_ids": [1, 2]}]),
            TypeError,
            ["data[0] (batch 0 of the list)", "no tensor"],
        ),
        ("empty-loader", dict(data=[]), ValueError, ["data gave no batch", "empty"]),
        ("a-string", dict(data="tokens.txt"), TypeError, ["data", "str"]),
        ("a-generator-twice", dict(data=(b for b in []), epochs=2), ValueError, ["epochs=2", "generator", "once"]),
        ("loss-reduction-unknown", dict(loss_reduction="avg"), ValueError, ["loss_reduction", "'avg'"]),
        (
            "loss-reduction-with-steps",
            dict(loss_reduction="sum", normalize="steps"),
            ValueError,
            ["loss_reduction='sum'", "normalize='steps'"],
        ),
    ],
)
def test_bad_pipelines_are_refused_before_anything_changes(case, call, error, names):
    model = nn.Linear(6, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    arguments = dict(data=[(torch.zeros(2, 6), torch.zeros(2, dtype=torch.long))], accum_steps=2) | call
    with pytest.raises(error) as info:
        accumlib.train(model, arguments.pop("data"), optimizer, **arguments)
    assert all(name in str(info.value) for name in names), str(info.value)
    assert accumlib.parameter_gap(model, before) == 0.0
    assert all(p.grad is None for p in model.parameters())


def test_a_model_without_loss_and_no_loss_fn_is_told_what_to_do():
    loader = [{"input_ids": pad(ITEMS[:3])["input_ids"]}]  # no labels: the model returns loss=None
    model = TinyCausalLM()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TypeError, match="CausalLMOutput without a loss.*put the labels in the batch"):
        accumlib.train(model, loader, torch.optim.SGD(model.parameters(), lr=0.5), accum_steps=1)
    assert accumlib.parameter_gap(model, before) == 0.0


WORKER = """
import gc, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, sys.argv[1])
import accumlib, test_pipeline as t

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, sizes, results = dist.get_rank(), [], {}
all_reduce = dist.all_reduce


def counting(tensor, *args, **kwargs):  # every Python-level all-reduce, by its tensor's size
    sizes.append(tensor.numel())
    return all_reduce(tensor, *args, **kwargs)


dist.all_reduce = counting
shard = t.ITEMS[:16] if rank == 0 else t.ITEMS[16:]  # 16 and 13 sequences: 6 and 5 batches of at most 3
try:
    for name in ("DataLoader", "IterableDataset", "tuple inputs"):
        del sizes[:]
        source = t.Stream(shard) if name == "IterableDataset" else shard
        collate = (lambda b: t.as_tuple(t.pad(b))) if name == "tuple inputs" else t.pad
        loader = torch.utils.data.DataLoader(source, batch_size=3, collate_fn=collate)
        model = DistributedDataParallel(t.TupleInputLM() if name == "tuple inputs" else t.TinyCausalLM())
        options = (dict(loss_fn=t.token_sum_of_logits, loss_reduction="sum",
                        count=lambda labels: (labels[:, 1:] != -100).sum())
                   if name == "tuple inputs" else dict(count=lambda batch: (batch["labels"][:, 1:] != -100).sum()))
        history = accumlib.train(model, loader, torch.optim.SGD(model.parameters(), lr=0.5), accum_steps=4,
                                 normalize="count", epochs=2, device="cpu", **options)
        results[name] = dict(state=model.module.state_dict(), sizes=list(sizes),
                             micro_batches=[r.micro_batches for r in history], samples=[r.samples for r in history])
    def stop_at_1(record):
        if record.step == 1:
            raise accumlib.StopTraining

    def loader():
        return torch.utils.data.DataLoader(shard, batch_size=3, collate_fn=t.pad)

    count = lambda batch: (batch["labels"][:, 1:] != -100).sum()
    model = DistributedDataParallel(t.TinyCausalLM())  # stopped after step 1, then resumed from its weights
    accumlib.train(model, loader(), torch.optim.SGD(model.parameters(), lr=0.5), accum_steps=4, normalize="count",
                   count=count, epochs=2, device="cpu", on_step=stop_at_1)
    resumed = DistributedDataParallel(t.TinyCausalLM())
    resumed.module.load_state_dict(model.module.state_dict())
    history = accumlib.train(resumed, loader(), torch.optim.SGD(resumed.parameters(), lr=0.5), accum_steps=4,
                             normalize="count", count=count, epochs=2, device="cpu", resume_from_step=1)
    results["resumed"] = dict(state=resumed.module.state_dict(), steps=[r.step for r in history],
                              samples_seen=[r.samples_seen for r in history])
    if rank == 0:
        torch.save(results, sys.argv[2])
    dist.barrier()
finally:
    gc.collect()  # DDP's reducer sits in reference cycles: freed before the process group (no abort at exit)
    dist.destroy_process_group()
"""


def run_on_two_processes(script: str, folder, *arguments: str, timeout: float) -> None:
    """Run `script` as 2 gloo processes (RANK 0 and 1) with this folder's modules importable, its arguments after
    the tests' folder; both must exit 0 within `timeout` seconds."""
    import os
    import pathlib
    import socket
    import subprocess
    import sys

    (folder / "worker.py").write_text(script)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    processes = [
        subprocess.Popen(
            [sys.executable, str(folder / "worker.py"), str(pathlib.Path(__file__).parent), *arguments],
            env={**env, "RANK": str(rank)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        errors = [p.communicate(timeout=timeout)[1] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in processes] == [0, 0], "\n".join(errors)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The HF-style call, its IterableDataset form and a tuple-input model on 2 gloo processes, each with its own
    loader (its own shard of the sequences, as a DistributedSampler gives)."""
    folder = tmp_path_factory.mktemp("ddp")
    run_on_two_processes(WORKER, folder, str(folder / "result.pt"), timeout=240)
    return torch.load(folder / "result.pt")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["DataLoader", "IterableDataset", "tuple inputs"])
def test_two_processes_equal_one_step_on_the_whole_cycle(two_processes, name):
    """Step 1: sequences 0-11 on process 0 and 16-27 on process 1; step 2 (the short one): 12-15 (batches of 3 and 1)
    and 28 (one batch, and a padding micro-batch of weight 0, not run: process 1 all-reduces in its one backward)."""
    result = two_processes[name]
    cycles = [ITEMS[:12] + ITEMS[16:28], ITEMS[12:16] + ITEMS[28:]] * 2
    reference = full_batch_reference(TinyCausalLM(), cycles)
    assert result["samples"] == [24, 5] * 2
    assert result["micro_batches"] == [4, 2] * 2  # process 0's; process 1 has one real and one padding in step 2
    assert accumlib.parameter_gap(result["state"], reference.state_dict()) < TOLERANCE
    # Python-level all-reduces: once before the run, the loaders' lengths (2 values: the longest, and whether one
    # has none); per step the cycle's batch counts (7 values: samples, and each process's batches, whether it
    # failed fetching and whether it never had a batch), its loss terms (4: terms, bad counts and each process's
    # failure flag) once, the failure flags before the cycle's first forward (in which DDP may broadcast) and
    # before the backward that all-reduces (2 each), and the loss (1); a short cycle (fewer than accum_steps
    # batches on every process) ends the epoch without another
    assert result["sizes"] == [2] + [7, 4, 2, 2, 1] * 4


def test_memory_is_measured_once_per_layout_of_a_loader_s_batches():
    """measure_memory=True with padded batches: the CPU traces one cycle per layout (the shapes of its batches);
    cycles of the same layout get the same bytes."""
    batches = [pad(ITEMS[:3]), pad(ITEMS[3:6])] * 3  # 3 cycles of 2 batches, all of one layout
    assert batches[0]["input_ids"].shape == batches[2]["input_ids"].shape
    model = TinyCausalLM()
    history = accumlib.train(
        model, batches, torch.optim.SGD(model.parameters(), lr=0.5), accum_steps=2, measure_memory=True, device="cpu"
    )
    peaks = [r.peak_memory_bytes for r in history]
    assert len(peaks) == 3 and peaks[0] > 0 and peaks == [peaks[0]] * 3


def test_an_iterable_dataset_of_samples_with_micro_batch_size_is_told_to_use_a_dataloader():
    model = nn.Linear(6, 3)
    with pytest.raises(
        ValueError,
        match=r"micro_batch_size=4 was given with data of type Stream.*"
        r"DataLoader\(data, batch_size=4\)",
    ):
        accumlib.train(
            model,
            Stream([(torch.zeros(6), 0)]),
            torch.optim.SGD(model.parameters(), lr=0.1),
            micro_batch_size=4,
            accum_steps=2,
        )


class Named(nn.Module):
    """forward(pixels) -> logits: called as model(**inputs) with inputs {"pixels": ...}."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.layer = nn.Linear(6, 3, dtype=torch.float64)

    def forward(self, pixels):
        return self.layer(pixels)


def test_a_dataset_of_dict_inputs_trains_as_x_y_does():
    """Samples ({"pixels": x}, y) (refused before: now model(**inputs)): bit for bit the run on (X, y)."""
    generator = torch.Generator().manual_seed(7)
    X, y = torch.randn(30, 6, generator=generator, dtype=torch.float64), torch.randint(0, 3, (30,), generator=generator)

    class DictInputs(torch.utils.data.Dataset):
        def __len__(self):
            return len(X)

        def __getitem__(self, i):
            return {"pixels": X[i]}, y[i]

    by_dict, by_tensors = Named(), Named()
    accumlib.train(
        by_dict,
        DictInputs(),
        torch.optim.SGD(by_dict.parameters(), lr=0.5),
        micro_batch_size=4,
        accum_steps=2,
        epochs=2,
    )
    accumlib.train(
        by_tensors,
        (X, y),
        torch.optim.SGD(by_tensors.parameters(), lr=0.5),
        micro_batch_size=4,
        accum_steps=2,
        epochs=2,
    )
    assert accumlib.parameter_gap(by_dict, by_tensors) == 0.0


@pytest.mark.slow
def test_two_processes_resumed_equal_the_uninterrupted_run(two_processes):
    """Stopped after step 1 and resumed from its weights (SGD keeps no state), each process skipping its own
    loader's batches of that step: the same weights as the uninterrupted DataLoader run, bit for bit."""
    resumed = two_processes["resumed"]
    assert resumed["steps"] == [2, 3, 4] and resumed["samples_seen"] == [29, 53, 58]
    assert accumlib.parameter_gap(resumed["state"], two_processes["DataLoader"]["state"]) == 0.0


# the start of a 2-process gloo worker given (accumlib's folder, its output, the case): both workers below
WORKER_START = """
import gc, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, sys.argv[1])
import accumlib

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, case = dist.get_rank(), sys.argv[3]
torch.manual_seed(0)
"""
REFUSING_WORKER = (
    WORKER_START
    + """\
good = [(torch.randn(2, 6), torch.zeros(2, dtype=torch.long)) for _ in range(4)]
if rank == 1:  # the other process's data is as rank 0's but for what the case breaks
    scalar = (torch.zeros(()), torch.zeros(()))  # a batch without a batch dimension: refused as its cycle comes
    good = {"bad batch": good[:3] + [scalar], "no batch": [], "loader error": good[:3] + [None],
            "list: empty": [], "list: a bad item": good[:1] + [None] + good[2:],
            "list: shorter, resumed": good[:2]}[case]


def batches(items):  # a stream (no len()): each batch is checked as its cycle is fetched
    for batch in items:
        if batch is None:
            raise OSError("the disk went away")
        yield batch


model = DistributedDataParallel(torch.nn.Linear(6, 3))
try:
    data = good if case.startswith("list") else batches(good)  # a list: every item checked before the run
    resume = int(case == "list: shorter, resumed")  # 2 steps for process 0, 1 alone for process 1
    accumlib.train(model, data, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=2, device="cpu",
                   resume_from_step=resume)
    outcome = "trained"
except Exception as error:
    outcome = f"{type(error).__name__}: {error}"
with open(sys.argv[2] + f".{rank}", "w") as out:
    out.write(outcome)
gc.collect()
dist.destroy_process_group()
"""
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["bad batch", "no batch", "loader error", "list: empty", "list: a bad item", "list: shorter, resumed"]
)
def test_a_process_that_refuses_its_batches_stops_every_process(tmp_path, case):
    """Under DDP a process whose batch is refused (or whose loader fails, or that has no batch; a list that is
    empty or holds a bad item) stops, and the others stop at the same cycle with a message that says which process
    failed and why, instead of waiting for it in an all-reduce (or gloo's "Connection closed by peer")."""
    # both exit: none waits
    run_on_two_processes(REFUSING_WORKER, tmp_path, str(tmp_path / "outcome"), case, timeout=120)
    ours, theirs = ((tmp_path / f"outcome.{rank}").read_text() for rank in range(2))
    bad_item = (
        "TypeError: data[1] (batch 1 of the list) must be (x, y), (inputs, y) with a tuple or dict of "
        "inputs, or a dict of model inputs, got None of type NoneType"
    )
    failed = (
        "ValueError: the process of rank 1 failed fetching or checking its batches for step {step} (epoch 0): "
        "process 1: "
    )
    stops = ". This process (rank 0) stops with it, before this step changes anything"
    no_batch = (
        "ValueError: data gave the process of rank 1 no batch while this one (rank 0) has some",
        "ValueError: data gave this process (rank 1) no batch while another process has some",
    )
    scalar = (
        "TypeError: data's batch 3 of epoch 0 holds no tensor with a batch dimension: its samples cannot be counted"
    )
    expected = {
        "bad batch": (failed.format(step=2) + scalar + stops, scalar),
        "no batch": no_batch,
        "list: empty": no_batch,
        "loader error": (failed.format(step=2) + "OSError: the disk went away" + stops, "OSError: the disk went away"),
        "list: a bad item": (failed.format(step=1) + bad_item + stops, bad_item),
        # the run's steps are the longer list's on both: neither refuses resume_from_step=1 alone
        "list: shorter, resumed": ("trained", "trained"),
    }[case]
    assert ours.startswith(expected[0]) and theirs.startswith(expected[1]), (ours, theirs)


def unlabelled(batch: dict) -> dict:
    """`batch` with every label ignored (-100): a micro-batch without loss terms (prompt masking, packing)."""
    return {**batch, "labels": torch.full_like(batch["labels"], IGNORE)}


BATCHES = [pad(ITEMS[i : i + 3]) for i in range(0, 18, 3)]  # 6 batches of 3 sequences


def hf_run(batches, optimizer=torch.optim.SGD, accum_steps=3, **options):
    """The README's Hugging Face recipe (the model's own mean loss, count = its shifted labels that are not -100)."""
    model = TinyCausalLM()
    opt = optimizer(model.parameters(), lr=0.5 if optimizer is torch.optim.SGD else 0.01)
    history = accumlib.train(
        model,
        batches,
        opt,
        accum_steps=accum_steps,
        normalize="count",
        count=lambda batch: (batch["labels"][:, 1:] != -100).sum(),
        **options,
    )
    return model, opt, history


def test_a_micro_batch_without_labelled_tokens_adds_nothing_to_its_cycle():
    """Its mean loss is NaN (a mean over 0 tokens): the cycle is the step on its other micro-batches, bit for bit,
    and one step on all their sequences at once to float64's rounding; it is not a skipped step."""
    model, _, history = hf_run([BATCHES[0], unlabelled(BATCHES[1]), BATCHES[2]])
    others, _, _ = hf_run([BATCHES[0], BATCHES[2]], accum_steps=2)
    assert [(r.skipped, r.empty, r.micro_batches) for r in history] == [(False, False, 3)]
    assert math.isfinite(history[0].loss)
    assert accumlib.parameter_gap(model, others) == 0
    reference = full_batch_reference(TinyCausalLM(), [ITEMS[0:3] + ITEMS[6:9]])
    assert accumlib.parameter_gap(model, reference) < TOLERANCE


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_a_cycle_without_labelled_tokens_is_not_stepped_and_the_run_goes_on(optimizer):
    """Step 2's micro-batches have no labelled token: no step (Adam's step count and moments untouched), recorded
    as empty (not as skipped, loss NaN, no norm), then step 3 trains: the run of steps 1 and 3 alone, bit for bit."""
    seen = []
    model, opt, history = hf_run(
        [BATCHES[0], BATCHES[1], unlabelled(BATCHES[2]), unlabelled(BATCHES[3]), BATCHES[4], BATCHES[5]],
        optimizer,
        accum_steps=2,
        on_step=seen.append,
    )
    alone, alone_opt, _ = hf_run([BATCHES[0], BATCHES[1], BATCHES[4], BATCHES[5]], optimizer, accum_steps=2)
    assert [(r.step, r.skipped, r.empty) for r in history] == [(1, False, False), (2, False, True), (3, False, False)]
    assert math.isnan(history[1].loss) and history[1].grad_norm is None and seen == list(history)
    assert accumlib.parameter_gap(model, alone) == 0
    state, alone_state = opt.state_dict()["state"], alone_opt.state_dict()["state"]
    assert all(torch.equal(state[i][key], alone_state[i][key]) for i in state for key in state[i])
    if optimizer is torch.optim.Adam:
        assert {float(s["step"]) for s in state.values()} == {2.0}


ZERO_WORKER = """
import gc, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
sys.path.insert(0, sys.argv[1])
import accumlib, test_pipeline as t

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, results = dist.get_rank(), {}
B, Z = t.BATCHES, t.unlabelled
# step 1: process 1's second micro-batch has no labelled token; step 2: none has any, on either process; step 3:
# process 1 has none in the whole cycle while process 0 has some
batches = ([B[0], B[1], Z(B[2]), Z(B[3]), B[4], B[5]] if rank == 0 else
           [t.pad(t.ITEMS[18:21]), Z(t.pad(t.ITEMS[21:24])), Z(B[0]), Z(B[1]), Z(B[2]), Z(B[3])])
try:
    for name, optimizer, options in (("SGD", torch.optim.SGD, {}), ("Adam", torch.optim.Adam, {}),
                                     ("SGD without no_sync", torch.optim.SGD, dict(ddp_no_sync=False))):
        model = DistributedDataParallel(t.TinyCausalLM())
        opt = optimizer(model.parameters(), lr=0.5 if optimizer is torch.optim.SGD else 0.01)
        history = accumlib.train(model, batches, opt, accum_steps=2, normalize="count", device="cpu",
                                 count=lambda batch: (batch["labels"][:, 1:] != -100).sum(), **options)
        results[name] = dict(state=model.module.state_dict(), records=[(r.skipped, r.empty) for r in history],
                             steps=sorted({float(s["step"]) for s in opt.state.values() if "step" in s}))
    if rank == 0:
        torch.save(results, sys.argv[2])
    dist.barrier()
finally:
    gc.collect()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_processes_without_tokens(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp-zero")
    run_on_two_processes(ZERO_WORKER, folder, str(folder / "result.pt"), timeout=240)
    return torch.load(folder / "result.pt")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SGD", "Adam", "SGD without no_sync"])
def test_two_processes_with_micro_batches_without_tokens_equal_one_step_on_the_rest(two_processes_without_tokens, name):
    """On 2 gloo processes: a micro-batch without labelled tokens adds nothing (step 1, on process 1: its last, so
    it all-reduces in its first); a cycle without any on either process is not stepped (step 2: no collective, Adam's
    step count untouched); a process without any in a cycle still takes part in the step of the other (step 3): one
    step per stepped cycle on all its labelled sequences at once, to float64's rounding."""
    result = two_processes_without_tokens[name]
    assert result["records"] == [(False, False), (False, True), (False, False)]
    model = TinyCausalLM()
    optimizer = (
        torch.optim.Adam(model.parameters(), lr=0.01) if name == "Adam" else torch.optim.SGD(model.parameters(), lr=0.5)
    )
    for cycle in (ITEMS[0:6] + ITEMS[18:21], ITEMS[12:18]):
        optimizer.zero_grad()
        model(**pad(cycle)).loss.backward()
        optimizer.step()
    assert accumlib.parameter_gap(result["state"], model.state_dict()) < TOLERANCE
    assert result["steps"] == ([2.0] if name == "Adam" else [])


class LogitsLM(TinyCausalLM):
    """forward(input_ids, attention_mask=None) -> logits, for batches whose labels are their target."""

    def forward(self, input_ids, attention_mask=None):
        return super().forward(input_ids, attention_mask).logits


SHAPES = {  # one batch of ITEMS[:3] in each shape train takes, and the model it goes with
    "(x, y)": (LogitsLM, lambda b: (b["input_ids"], b["labels"])),
    "((inputs), y)": (TupleInputLM, as_tuple),
    "(((inputs)), y) nested": (TupleInputLM, lambda b: ([b["input_ids"], b["attention_mask"]], b["labels"])),
    "({inputs}, y)": (
        LogitsLM,
        lambda b: ({"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}, b["labels"]),
    ),
    "dict": (TinyCausalLM, lambda b: b),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_count_and_loss_fn_get_the_micro_batch_s_target_for_every_batch_shape(shape):
    """One rule: count(target) and loss_fn(output, target), the target being y of a pair (however its inputs nest)
    and the batch itself for a dict; the weights are then those of the full batch (to float64's rounding)."""
    make, shaped = SHAPES[shape]
    batches = [shaped(pad(ITEMS[i : i + 3])) for i in range(0, 12, 3)]
    counted, losses = [], []

    def count(target):
        counted.append(target)
        labels = target["labels"] if isinstance(target, dict) else target
        return (labels[:, 1:] != IGNORE).sum()

    def loss_fn(output, target):
        losses.append(target)
        labels = target["labels"] if isinstance(target, dict) else target
        logits = output.logits if isinstance(output, CausalLMOutput) else output
        return token_sum_of_logits(logits, labels)

    model = make()
    accumlib.train(
        model,
        batches,
        torch.optim.SGD(model.parameters(), lr=0.5),
        accum_steps=4,
        normalize="count",
        count=count,
        loss_fn=loss_fn,
        loss_reduction="sum",
    )
    targets = [b if isinstance(b, dict) else b[1] for b in batches]
    for seen in (counted, losses):
        assert len(seen) == 4
        for got, target in zip(seen, targets, strict=True):
            assert type(got) is type(target)
            assert all(
                torch.equal(a, b)
                for a, b in zip(*(t.values() if isinstance(t, dict) else [t] for t in (got, target)), strict=True)
            )
    reference = full_batch_reference(TinyCausalLM(), [ITEMS[:12]])
    assert accumlib.parameter_gap(model.state_dict(), reference.state_dict()) < TOLERANCE


def test_the_old_count_of_x_and_y_still_works_with_a_deprecation_warning():
    batches = [as_tuple(pad(ITEMS[i : i + 3])) for i in range(0, 12, 3)]

    def run(count):
        model = TupleInputLM()
        accumlib.train(
            model,
            batches,
            torch.optim.SGD(model.parameters(), lr=0.5),
            accum_steps=4,
            normalize="count",
            count=count,
            loss_fn=token_sum_of_logits,
            loss_reduction="sum",
        )
        return model

    with pytest.warns(DeprecationWarning, match=r"count\(x, y\) is deprecated.*count\(y\)"):
        old = run(lambda inputs, labels: (labels[:, 1:] != IGNORE).sum())
    assert accumlib.parameter_gap(old, run(lambda labels: (labels[:, 1:] != IGNORE).sum())) == 0


def test_the_old_count_of_x_and_y_with_dict_batches_is_refused_by_name_with_nothing_changed():
    """A dict batch is no (x, y) pair: count(x, y) is refused saying count gets the batch (not the lambda's own
    "missing 1 required positional argument"), before the first step changes anything."""
    model = TinyCausalLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = copy.deepcopy(model.state_dict())
    with (
        pytest.warns(DeprecationWarning, match=r"count\(x, y\) is deprecated"),
        pytest.raises(TypeError, match=r"^count takes two arguments, count\(x, y\), .* count\(batch\)") as refused,
    ):
        accumlib.train(
            model, BATCHES[:2], optimizer, accum_steps=2, normalize="count", count=lambda x, y: len(y), device="cpu"
        )
    assert refused.value.history.records == []
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), before.values(), strict=True))


FAILING_WORKER = (
    WORKER_START
    + """\
batches = [(torch.randn(2, 6, dtype=torch.float64), torch.zeros(2, dtype=torch.long)) for _ in range(6)]
calls = {}


def fails_on_rank_1(name, where):  # name's call at micro-batch `where` of step 2 (accum_steps 3: its calls 4-6)
    calls[name] = calls.get(name, 0) + 1
    if rank == 1 and case.startswith(name) and calls[name] == 4 + where:
        raise ValueError(f"planted failure on rank 1 ({case})")


def count(y):
    fails_on_rank_1("count", 0)
    return len(y)


def loss_fn(output, y):
    fails_on_rank_1("loss_fn", 0 if case == "loss_fn, first micro-batch" else 2)
    return torch.nn.functional.cross_entropy(output, y)


class Model(torch.nn.Linear):
    def forward(self, x):
        fails_on_rank_1("forward", 1)
        return super().forward(x)


class Samples(torch.utils.data.Dataset):  # 2 steps of 3 micro-batches of 2 samples per process
    def __len__(self):
        return 24

    def __getitem__(self, i):  # its 8th call on process 1 (the first checks sample 0): step 2's first sample,
        calls["sample"] = calls.get("sample", 0) + 1  # fetched before the forward pass in which DDP rebuilds buckets
        if rank == 1 and case == "a Dataset's sample" and calls["sample"] == 8:
            raise ValueError(f"planted failure on rank 1 ({case})")
        return torch.randn(6, dtype=torch.float64), torch.tensor(0)


model = DistributedDataParallel(Model(6, 3, dtype=torch.float64) if case == "forward" else
                                torch.nn.Linear(6, 3, dtype=torch.float64))
options = {"count": dict(normalize="count", count=count, loss_fn=loss_fn, loss_reduction="mean"),
           "forward": {}, "a Dataset's sample": dict(micro_batch_size=2)}.get(case, dict(loss_fn=loss_fn))
if case == "a Dataset's sample":
    batches = Samples()
after_step_1 = []
try:
    accumlib.train(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), accum_steps=3, device="cpu",
                   on_step=lambda r: after_step_1.append(model.module.weight.detach().clone()), **options)
    outcome = "trained"
except Exception as error:
    unchanged = torch.equal(model.module.weight, after_step_1[0]) and model.module.weight.grad is None
    outcome = f"{type(error).__name__}: {error} | steps {[r.step for r in error.history]} | unchanged {unchanged}"
with open(sys.argv[2] + f".{rank}", "w") as out:
    out.write(outcome)
gc.collect()
dist.destroy_process_group()
"""
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["count", "loss_fn, first micro-batch", "loss_fn, last micro-batch", "forward", "a Dataset's sample"]
)
def test_a_callback_or_forward_that_raises_on_one_process_stops_every_process(tmp_path, case):
    """count, loss_fn (early in the cycle, or in its last micro-batch, whose backward all-reduces), the model's
    forward or a Dataset's sample (before the first forward pass of step 2, in which DDP broadcasts) raising on
    process 1 at step 2: both processes stop at step 2 (neither waits, neither gets gloo's 'Connection closed by
    peer'), process 1 with its own error, process 0 saying which process failed and why; both keep step 1's record
    and leave the weights and .grad as step 1 left them."""
    run_on_two_processes(FAILING_WORKER, tmp_path, str(tmp_path / "outcome"), case, timeout=120)
    ours, theirs = ((tmp_path / f"outcome.{rank}").read_text() for rank in range(2))
    planted = f"ValueError: planted failure on rank 1 ({case})"
    assert theirs.startswith(planted) and theirs.endswith("| steps [1] | unchanged True"), theirs
    assert ours.startswith(f"RuntimeError: process 1: {planted}"), ours
    assert (
        "count failed there for step 2" if case == "count" else "(fetching it, its forward pass or loss_fn)"
    ) in ours
    assert ours.endswith("| steps [1] | unchanged True"), ours


LIST_X = torch.randn(12, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
LIST_Y = torch.randint(0, 3, (12,), generator=torch.Generator().manual_seed(4))
LIST_BATCHES = [(LIST_X[i : i + 4], LIST_Y[i : i + 4]) for i in range(0, 12, 4)]


@pytest.mark.parametrize(
    "item, shown",
    [
        (None, "None of type NoneType"),
        (3, "3 of type int"),
        ("batch", "'batch' of type str"),
        ((LIST_X[:4], LIST_Y[:4], LIST_Y[:4]), r"\(tensor\(\[\[.*\.\.\..*\]\)\) \(\d+ characters\) of type tuple"),
        (LIST_X[:4], r"tensor\(\[\[.*\.\.\..*\]\], dtype=torch.float64\) \(\d+ characters\) of type Tensor"),
    ],
    ids=["None", "int", "str", "a triple", "a tensor"],
)
@pytest.mark.parametrize("resume_from_step", [0, 2])
def test_a_bad_item_in_a_list_of_batches_is_named_by_position_and_value(item, shown, resume_from_step):
    """[B0, bad, B2]: refused before the run naming data[1], its value (a long one shortened) and what a batch may
    be, also when resume_from_step passes over its step; not taken for (X, y) data. Nothing changes."""
    torch.manual_seed(0)
    model = nn.Linear(6, 3, dtype=torch.float64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    with pytest.raises(
        TypeError,
        match=r"^data\[1\] \(batch 1 of the list\) must be \(x, y\), \(inputs, y\) with a "
        r"tuple or dict of inputs, or a dict of model inputs, got " + shown + "$",
    ):
        accumlib.train(
            model,
            [LIST_BATCHES[0], item, LIST_BATCHES[2]],
            optimizer,
            accum_steps=1,
            resume_from_step=resume_from_step,
            device="cpu",
        )
    assert accumlib.parameter_gap(model, before[0]) == 0 and optimizer.state_dict() == before[1]


def test_a_list_of_two_tensors_is_still_x_y_data():
    def fit(data):
        torch.manual_seed(0)
        model = nn.Linear(6, 3, dtype=torch.float64)
        accumlib.train(
            model, data, torch.optim.SGD(model.parameters(), lr=0.1), micro_batch_size=4, accum_steps=1, device="cpu"
        )
        return model

    assert accumlib.parameter_gap(fit([LIST_X, LIST_Y]), fit((LIST_X, LIST_Y))) == 0
