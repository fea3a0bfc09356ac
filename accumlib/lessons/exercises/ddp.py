"""Exercise of lesson 9: `no_sync()` in the right place, checked on real DistributedDataParallel in this process.

The check starts a gloo process group of world size 1 in the learner's own process (an in-memory HashStore: no
port, no launcher, works inside a Jupyter kernel), wraps the tiny model in DistributedDataParallel with a
communication hook that counts every all-reduce and notes after which micro-batch it happened, runs the learner's
loop, and destroys the group again. With one process an all-reduce averages a gradient with itself, so the
gradients show the loop's other bugs as usual, and the all-reduces show where synchronisation happens: DDP
all-reduces in the backward() of every micro-batch whose forward pass ran outside `no_sync()`.
"""

from __future__ import annotations

import contextlib
import gc
import sys

import torch.distributed as dist

from ...i18n import N_, _
from .core import Finding, Verdict
from .fingerprint import Fingerprint, Problem, loop_findings
from .loops import LoopExercise, error_or


@contextlib.contextmanager
def single_process_group():
    """A gloo process group of this process alone (world size 1) for the block, destroyed after it.

    An existing default group of world size 1 is used as it is (and left alone); a larger one is refused, since the
    check runs in one process.
    """
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(
                _(
                    "a process group of world size {size} is already running; the no_sync check needs world size 1 "
                    "(run it outside distributed training)"
                ).format(size=dist.get_world_size())
            )
        yield
        return
    excepthook = sys.excepthook  # init_process_group installs a hook that prefixes every traceback with [rank0]
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            yield
        finally:
            gc.collect()  # DDP's reducer sits in reference cycles and holds the group: free it before the group goes
            dist.destroy_process_group()
    finally:
        sys.excepthook = excepthook


def ddp_findings(fp: Fingerprint) -> list[Finding]:
    """Where DDP all-reduced, against where it should: once per step, in the backward() of the cycle's last one."""
    rec = fp.recording
    synced = [rec.forwards[count - 1] for count in rec.allreduces]  # the micro-batch whose backward all-reduced
    micro_batches = len(fp.reference.sizes)
    if len(synced) >= micro_batches and len(fp.readings) < micro_batches:
        if rec.no_sync_entries:
            return [
                Finding(
                    "no-sync-forward-outside",
                    _(
                        "model.no_sync() is used, yet DDP still all-reduces after every micro-batch ({allreduces} "
                        "all-reduces "
                        "for {steps} steps): the forward passes run outside no_sync(). DDP decides during the forward "
                        "pass "
                        "whether the next backward() all-reduces, so put the forward pass inside no_sync() too."
                    ).format(allreduces=len(synced), steps=len(fp.readings)),
                )
            ]
        return [
            Finding(
                "no-sync-missing",
                _(
                    "DDP all-reduces the gradients after every micro-batch: {allreduces} all-reduces for {steps} "
                    "steps, where "
                    "one per step is enough. The sum comes out the same (all-reducing is linear), but each extra "
                    "all-reduce "
                    "is time spent sending gradients between processes. Run every micro-batch but the last of each "
                    "cycle "
                    "inside with model.no_sync():, its forward pass included."
                ).format(allreduces=len(synced), steps=len(fp.readings)),
            )
        ]
    for reading in fp.readings:
        window = [j for j in synced if j in reading.fresh]
        findings = []
        if reading.last not in window:
            findings.append(
                Finding(
                    "no-allreduce-before-step",
                    _(
                        "No all-reduce comes right before step {step}: the last micro-batch of its cycle also runs "
                        "inside "
                        "no_sync(). With several processes, each would step with its own gradient and the copies of "
                        "the model "
                        "would drift apart. Leave the last micro-batch of each cycle outside no_sync()."
                    ).format(step=reading.number),
                )
            )
        early = [j for j in window if j != reading.last]
        if early:
            findings.append(
                Finding(
                    "allreduce-too-early",
                    _(
                        "Before step {step}, DDP all-reduces after micro-batch {position} of the cycle's {count}: the "
                        "gradients of the micro-batches after it are summed on each process alone, never shared. "
                        "Synchronise "
                        "only in the cycle's last backward()."
                    ).format(step=reading.number, position=reading.fresh.index(early[0]) + 1, count=len(reading.fresh)),
                )
            )
        if findings:
            return findings  # the first step where it shows
    return []


class NoSync(LoopExercise):
    lesson, name = 9, "no_sync"
    problem = Problem(samples=36, micro_batch_size=4, accum_steps=3)
    ddp = True
    stub = """\
def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    # The loop of lesson 3; `model` is wrapped in DistributedDataParallel. Where does model.no_sync() go?
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()


exercises.no_sync.check(accumulate)
"""
    solution_code = """\
import contextlib


def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        last = (step + 1) % accum_steps == 0  # the cycle's last micro-batch
        with contextlib.nullcontext() if last else model.no_sync():  # forward and backward inside
            loss = loss_fn(model(x), y) / accum_steps
            loss.backward()  # all-reduces only when last
        if last:
            optimizer.step()
            optimizer.zero_grad()


exercises.no_sync.check(accumulate)
"""
    hint_text = N_(
        "DDP all-reduces in the backward() of every micro-batch whose forward pass ran outside "
        "model.no_sync(). Put the forward and backward of every micro-batch but the last of each cycle "
        "inside `with model.no_sync():`; contextlib.nullcontext() is a context that does nothing."
    )

    def judge(self, function) -> Verdict:
        with single_process_group():
            return super().judge(function)

    def findings(self, fp: Fingerprint) -> list[Finding]:
        return error_or(fp, lambda: ddp_findings(fp) + loop_findings(fp))

    def confirmation(self, fp: Fingerprint, weight_gap: float) -> str:
        return _(
            "One all-reduce per optimizer step ({allreduces} for {steps} steps), in the backward() of each "
            "cycle's last micro-batch, and each step's gradient equals the full-batch gradient of its cycle "
            "(largest difference {gradient_gap:.1e}). Trained for real at learning rate {lr:g} under DDP, your "
            "weights match accumlib.train's (largest difference {weight_gap:.1e})."
        ).format(
            allreduces=len(fp.recording.allreduces),
            steps=len(fp.readings),
            gradient_gap=fp.gradient_gap(),
            lr=self.problem.lr,
            weight_gap=weight_gap,
        )


no_sync = NoSync()
