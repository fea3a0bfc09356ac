"""accumlib under torchrun, the way engineers scale: `torchrun --standalone --nproc_per_node=2` (gloo, CPU) starting
tests/library/torchrun_worker.py, whose every process calls `accumlib.train` with a DistributedDataParallel or an FSDP2
(fully_shard) model; two nodes simulated on this machine through torchrun's c10d rendezvous.

Each run is compared, in float64, with one process: `train` on one process (tensors: the same samples per step) or a
plain loop that takes one optimizer step on all of a step's micro-batches of both processes together (loaders).
Tolerance: float64 rounds at 1.1e-16 relative; the losses and gradients here are sums of at most a few hundred terms
of size ~1 and the weights stay ~1, so 6 to 10 steps stay far below 1e-12, while a lost or mis-weighted micro-batch,
a gradient synchronised twice or a stale parameter moves a weight by 1e-3 or more.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import accumlib
from states import stable_records

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchrun_worker as job

pytestmark = pytest.mark.slow  # each test starts torchrun: several processes, seconds

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "torchrun_worker.py"
TOLERANCE = 1e-12  # see the module docstring


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def torchrun(*launches: list[str], timeout: float = 60) -> list[str]:
    """Start each launch (torchrun's arguments, then the script's) as `python -m torch.distributed.run`, each in a
    session of its own; wait for all, at most `timeout` seconds together. Every launch and its processes are killed
    on the way out, whatever happened (a failure, the time-out, an interrupt): none is left behind. Returns their
    output; a launch that fails raises with it."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *arguments],
            env=_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            cwd=ROOT,
        )
        for arguments in launches
    ]
    try:
        outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # torchrun's agent and the processes it started
            except ProcessLookupError:
                pass
            process.wait()
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0, f"torchrun {launches} exited {process.returncode}:\n{output[-4000:]}"
    return outputs


def standalone(tmp_path: Path, how: str, *names: str) -> dict:
    out = tmp_path / f"{how}.pt"
    torchrun(["--standalone", "--nproc_per_node=2", str(WORKER), str(out), how, *names])
    return torch.load(out, weights_only=False)


def one_process(name: str):
    """The tensor scenarios on one process: micro-batches of 4 (the 2 processes' 2 x 2), the same 3 per step, so
    each step takes the same samples of the same order as the two processes together."""
    model = job.mlp()
    optimizer = (torch.optim.Adam if name == "clipped" else torch.optim.SGD)(model.parameters(), lr=job.LR)
    history = accumlib.train(
        model,
        job.tensors(name == "nonfinite"),
        optimizer,
        micro_batch_size=4,
        accum_steps=3,
        epochs=job.EPOCHS,
        seed=job.SEED,
        device="cpu",
        clip_grad_norm=job.CLIP if name == "clipped" else None,
    )
    return model.state_dict(), stable_records(history)


def one_step_per_cycle(uneven: bool):
    """The loader scenarios by hand, on one process: each step is one SGD step on both processes' micro-batches of
    that step together, each mean loss weighted by its tokens over the step's (the count-normalised mean).
    Returns (weights, [(samples, loss) per step])."""
    model = lm_model = job.lm.TinyCausalLM()
    optimizer = torch.optim.SGD(lm_model.parameters(), lr=job.LR)
    steps = []
    for epoch in range(job.EPOCHS):
        shards = [job.token_shards(rank, 2, epoch, uneven) for rank in (0, 1)]
        for start in range(0, max(map(len, shards)), 2):  # accum_steps=2 batches per process and step
            batches = [batch for shard in shards for batch in shard[start : start + 2]]
            total = sum(job.tokens(batch) for batch in batches)
            optimizer.zero_grad()
            loss = sum(model(**batch).loss * job.tokens(batch) / total for batch in batches)
            loss.backward()
            optimizer.step()
            steps.append((sum(len(batch["labels"]) for batch in batches), loss.item()))
    return model.state_dict(), steps


def assert_like_one_process(result: dict, name: str) -> None:
    state, records = result["state"], result["records"]
    if name in ("tokens", "uneven"):
        reference, steps = one_step_per_cycle(name == "uneven")
        assert [r["samples"] for r in records] == [samples for samples, _loss in steps]
        assert [r["loss"] for r in records] == pytest.approx([loss for _samples, loss in steps], abs=TOLERANCE)
    else:
        reference, expected = one_process(name)
        for key in ("samples", "samples_seen", "loss", "grad_norm", "lr", "skipped"):
            # a skipped step records NaN
            expected_values = pytest.approx([r[key] for r in expected], abs=TOLERANCE, nan_ok=True)
            assert [r[key] for r in records] == expected_values, key
    assert accumlib.parameter_gap(state, reference) <= TOLERANCE


SCENARIOS = ("tensors", "clipped", "tokens", "uneven", "nonfinite")


@pytest.mark.parametrize("how", ["ddp", "fsdp2"])
def test_torchrun_trains_as_one_process(tmp_path, how):
    """2 processes under torchrun equal one process in float64: (X, y) tensors sharded by train (the last, short
    step's micro-batches differ between the processes, one pads), Adam with the gradient clipped over all shards
    (every step), and each process's own loader of dict batches, token-count normalised (a DistributedSampler's
    shuffled shares; then one process with 5 batches, the other with 3); a NaN sample on one process skips that
    step on every process, as on one."""
    results = standalone(tmp_path, how, *SCENARIOS, *(("unsharded", "every", "sub-mesh") if how == "fsdp2" else ()))
    for name in SCENARIOS:
        assert_like_one_process(results[name], name)
    assert [r["samples"] for r in results["tensors"]["records"]] == [12, 12, 5] * job.EPOCHS
    # rank 0: batches of 2, 2, 2, 2, 2 sequences; rank 1: 2, 2, 1 (and a padding batch in the last 2 steps)
    assert [r["samples"] for r in results["uneven"]["records"]] == [8, 5, 2] * job.EPOCHS
    assert min(r["grad_norm"] for r in results["clipped"]["records"]) > job.CLIP  # clipping took part in every step
    # a NaN sample on one process: that step skipped on both (once per epoch), the weights as one process's
    assert sum(r["skipped"] for r in results["nonfinite"]["records"]) == job.EPOCHS
    # host reads per step: the loss and the norm, once; and the processes' failure flags (one all-reduce) before
    # each forward and backward that communicates, which a failed process would never reach: under DDP the cycle's
    # first forward (its buffers, its buckets) and last backward; under FSDP2 every micro-batch's forward (which
    # gathers the weights) and backward; micro-batches run: 3, 3, then 2 per epoch
    reads = [step["host reads"] for step in results["tensors"]["collectives"]]
    assert reads == ([3] * 3 if how == "ddp" else [7, 7, 5]) * job.EPOCHS
    if how == "fsdp2":  # set_reshard_after_backward(False): kept whole between micro-batches, resharded for the step
        assert_like_one_process(results["unsharded"], "tensors")
        assert_like_one_process(results["every"], "tensors")  # ddp_no_sync=False: a reduce-scatter per micro-batch
        assert_fsdp2_collectives(results)
        # sharded over this process alone: its data shares would not be the group's
        assert "a mesh of 1 processes but the process group has 2" in results["sub-mesh"]["refused"]


def assert_fsdp2_collectives(results: dict) -> None:
    """FSDP2's collectives per full step, counted on rank 0 (2 FSDP units with parameters, 3 micro-batches): one
    reduce-scatter per unit and step with gradient sync on the last micro-batch only, one per micro-batch with
    ddp_no_sync=False; with set_reshard_after_backward(False) the next micro-batch's forward gathers nothing."""
    full, every, unsharded = (
        [
            step
            for step, record in zip(results[name]["collectives"], results[name]["records"], strict=True)
            if record["samples"] == 12
        ]
        for name in ("tensors", "every", "unsharded")
    )
    units, micro_batches = 2, 3
    assert {step["reduce-scatters"] for step in full} == {units}
    assert {step["reduce-scatters"] for step in every} == {units * micro_batches}
    assert {step["reduce-scatters"] for step in unsharded} == {units}
    # each forward all-gathers every unit, and the backward again each one resharded after its forward
    assert {step["all-gathers"] for step in full} == {2 * units * micro_batches}
    # kept unsharded after a backward, a unit is not gathered again by the next micro-batch's forward
    assert {step["all-gathers"] for step in unsharded} == {2 * units * micro_batches - units * (micro_batches - 1)}


def test_memory_per_process_under_fsdp2(tmp_path):
    """measure_step of an FSDP2 model reports what one process holds, as a real step measures it: the peak train
    records for a step with Adam's state (to a collective's buffers), this process's shards of the weights
    and of Adam's state; below DDP's, whose every process holds everything (and whose measure_step is its real
    step's peak, byte for byte); memory_budget refuses a budget below that peak before any weight changes, and
    trains above it, saying that a real step measured it."""
    found = standalone(tmp_path, "fsdp2", "memory")["memory"]
    # a process's peak can move on a busy CPU (58,240 bytes seen under load, cause not yet found; gloo's thread
    # frees no counted storage since tracker._collective): at most the largest unit's whole gradient, the first
    # Linear's 64 x 512 + 512 floats
    collective = job.UNIT_BYTES
    for name in ("fsdp2", "fsdp2 every"):
        report = found[name]["report"]
        # the second step of train: Adam's state made, as measure_step's later step
        assert abs(found[name]["train"][1] - report.peak) <= collective
        assert report.parameters >= found[name]["shards"]  # the shards, and what is gathered at the peak
        assert report.optimizer_state == found[name]["state"]  # Adam's state: this process's shards only
        assert sum(report.categories().values()) == report.peak
    # DDP: measure_step traces the module without collectives and adds DDP's gradient bucket; a real step's tracked
    # peak is the same, byte for byte (no collective buffer moves it: DDP all-reduces the bucket in place)
    assert found["ddp"]["report"].peak == found["ddp"]["train"][1]
    whole = sum(p.numel() * 4 for p in job.wide().parameters())
    assert found["fsdp2"]["shards"] == whole // 2  # each of the 2 processes holds half of the weights
    assert found["fsdp2"]["report"].peak < found["ddp"]["train"][1]
    assert found["refused"] is not None and "out of memory" in found["refused"]
    assert found["unchanged"] and found["within budget"] == 1
    assert any("measured with a real step" in message for message in found["warnings"])


def test_an_fsdp2_checkpoint_resumes_bit_for_bit_and_refuses_another_number_of_processes(tmp_path, monkeypatch):
    """train(checkpoint=...) with an FSDP2 model: every process's shards in a folder beside the file
    (torch.distributed.checkpoint), the run stopped after step 3 and resumed into a model built from another seed
    equals the uninterrupted run bit for bit (weights and records: Adam, shuffled samples); one process cannot go
    on from the file of two, refused by name before anything changes."""
    monkeypatch.setenv("CHECKPOINT", str(tmp_path))
    found = standalone(tmp_path, "fsdp2", "checkpoint")["checkpoint"]
    uninterrupted, resumed = found["uninterrupted"], found["resumed"]
    assert len(found["stopped"]["records"]) == 3 and len(resumed["records"]) == len(uninterrupted["records"]) == 6
    assert resumed["records"] == uninterrupted["records"]
    assert all(torch.equal(resumed["state"][k], v) for k, v in uninterrupted["state"].items())
    assert len(found["folders"]) == 2 and all(f.startswith(".run.pt.shards-") for f in found["folders"])
    out = tmp_path / "one.pt"
    torchrun(["--standalone", "--nproc_per_node=1", str(WORKER), str(out), "fsdp2", "checkpoint"])
    refused = torch.load(out, weights_only=False)["checkpoint"]["refused"]
    assert refused is not None and "processes is 2 in the file, 1 here" in refused


def test_two_nodes_through_a_c10d_rendezvous(tmp_path):
    """Two torchrun launches, one process each, meet at a c10d rendezvous on localhost as two nodes would: FSDP2
    trains as one process."""
    out, endpoint = tmp_path / "nodes.pt", f"127.0.0.1:{free_port()}"
    torchrun(
        *(
            [
                "--nnodes=2",
                f"--node_rank={node}",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                str(WORKER),
                str(out),
                "fsdp2",
                "tensors",
            ]
            for node in (0, 1)
        )
    )
    assert_like_one_process(torch.load(out, weights_only=False)["tensors"], "tensors")


def test_a_failing_launch_stops_with_its_processes(tmp_path):
    """The harness itself: a script that fails on one process while the other sleeps raises with the failing
    process's error, and no process of the launch is left running."""
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "open(sys.argv[1] + os.environ['RANK'], 'w').write(str(os.getpid()))\n"
        "if os.environ['RANK'] == '0':\n    raise SystemExit('rank 0 fails here')\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(AssertionError, match="rank 0 fails here"):
        torchrun(["--standalone", "--nproc_per_node=2", str(script), str(tmp_path / "pid")])
    for rank in (0, 1):
        status = Path(f"/proc/{(tmp_path / f'pid{rank}').read_text()}/status")
        assert not status.exists() or "\nState:\tZ" in status.read_text()  # gone, or dead and not yet reaped


@pytest.mark.parametrize(
    "script, arguments",
    [
        ("causal_lm.py", ["--fsdp2", "--dim", "32", "--layers", "1", "--context", "32", "--epochs", "1"]),
        ("image_batchnorm.py", ["--width", "8", "--epochs", "1"]),
    ],
)
def test_the_examples_run_with_one_torchrun_command(script, arguments):
    """Each example, small, as its docstring's command starts it (gloo on the CPU): its loss falls, and the causal
    LM's processes end with the same weights, the classifier beats chance (10%) on the held-out digits."""
    output = torchrun(["--standalone", "--nproc_per_node=2", str(ROOT / "examples" / script), *arguments])[0]
    summary = output.strip().splitlines()[-1]
    first, last = (float(v) for v in re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", summary).groups())
    assert last < first, summary
    assert "on 2 processes (cpu, gloo)" in summary
    if script == "causal_lm.py":
        assert "every process holds the same weights: yes" in summary
    else:
        assert float(re.search(r"accuracy (\d+\.\d)%", summary).group(1)) > 50, summary
