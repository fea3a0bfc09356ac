"""Cycles from a DataLoader or any iterable of batches (`_Loader`, a `batches._Producer`): its batches taken
`accum_steps` at a time, each checked as it comes and held until its step, each moved to the device as the loop
reaches it (`batches._MicroBatches`). Under DDP
one small all-reduce per cycle of every process's counts pads the others' cycles to the busiest's and stops every
process, each saying why, when one's batch is refused, its loader fails or it has none.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator as _Iterator

import torch
import torch.distributed as dist

from .batches import _Cycle, _check_batch, _MicroBatches, _Producer, _tensors
from .failures import _told
from .i18n import _, ngettext


class _Loader(_Producer):
    """Cycles of a loader's batches, `accum_steps` at a time, held until their step (see `train`)."""

    fetches_ahead = True  # a cycle's batches, fetched as it is made (a DataLoader's shuffle and workers draw there)

    def __init__(self, data, accum_steps, world, rank, device, notes):
        super().__init__(accum_steps, world, rank, device, notes)
        self.data = data
        self.once = isinstance(data, _Iterator)  # a generator, say: read once
        try:
            self.length = len(data)
        except TypeError:  # no len(): a stream, or a DataLoader over an IterableDataset
            self.length = None
        if world > 1:  # the run's steps are the busiest process's (the others pad): alike on every process, so
            # none refuses alone what depends on them (resume_from_step, a OneCycleLR); one all-reduce, before the run
            lengths = torch.tensor([self.length or 0, self.length is None], dtype=torch.float64, device=device)
            dist.all_reduce(lengths, op=dist.ReduceOp.MAX)
            longest, unknown = lengths.tolist()
            self.length = None if unknown else int(longest)
        if self.length == 0 and world == 1:  # under DDP the first cycle's all-reduce says it, to every process
            raise ValueError(_("data gave no batch in epoch {epoch}: it is empty").format(epoch=0))
        # a list's batches, each checked before the run (one in a step that resume_from_step passes over too); under
        # DDP the refusal waits for the first cycle's all-reduce, which stops every process with it
        self.refused = None
        if isinstance(data, list):
            try:
                for i, batch in enumerate(data):
                    _check_batch(batch, _("data[{i}] (batch {i} of the list)").format(i=i))
            except (TypeError, ValueError) as error:
                if world == 1:
                    raise
                self.refused = error

    def check_epochs(self, epochs) -> None:
        if self.once and epochs is not None and epochs > 1:
            raise ValueError(
                _(
                    "epochs={value}: data is an iterator of type {type}, which can be read only once; give "
                    "epochs=1, or data that can be read again (a DataLoader, a list)"
                ).format(value=epochs, type=type(self.data).__name__)
            )

    def steps(self, epochs: int | None) -> int | None:
        if self.length is None or epochs is None or self.length == 0:  # 0: under DDP, the first cycle says it
            return None
        return epochs * math.ceil(self.length / self.accum_steps)

    def _busiest(
        self, batches: int, samples: int, failed: bool = False, empty: bool = False
    ) -> tuple[int, int, list[int], list[int]]:
        """(the most batches any process holds in this cycle, the cycle's samples over all processes, the ranks of
        the processes that failed fetching or checking their batches, the ranks of those that never had a batch),
        from one all-reduce (one host read) of every process's counts: a process that stops, stops every process,
        none waits for it."""
        world = self.world
        counts = torch.zeros(1 + 3 * world, dtype=torch.float64, device=self.device)
        counts[0], counts[1 + self.rank] = samples, batches
        counts[1 + world + self.rank], counts[1 + 2 * world + self.rank] = float(failed), float(empty)
        dist.all_reduce(counts)
        total, *per_process = counts.tolist()
        failures, empties = per_process[world : 2 * world], per_process[2 * world :]
        return (
            int(max(per_process[:world])),
            int(total),
            [rank for rank, f in enumerate(failures) if f],
            [rank for rank, e in enumerate(empties) if e],
        )

    def cycles(self, epochs: int | None):
        pad = None  # one of this process's batches, for a padding micro-batch (weight 0: see _Plan)
        made = 0  # cycles given so far, all epochs
        for epoch in range(epochs) if epochs is not None else itertools.count():
            if self.once and epoch:
                return
            sampler = getattr(self.data, "sampler", None)
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(epoch)  # a DistributedSampler's new order for this epoch
            batches, cycle = iter(self.data), 0
            while True:
                try:
                    if self.refused is not None:  # a list's bad batch: every process stops at the first cycle
                        raise self.refused
                    held = list(itertools.islice(batches, self.accum_steps))  # this cycle's batches, until its step
                    sizes = [
                        _check_batch(
                            b,
                            _("data's batch {i} of epoch {epoch}").format(i=cycle * self.accum_steps + i, epoch=epoch),
                        )
                        for i, b in enumerate(held)
                    ]
                except Exception as error:  # under DDP the other processes learn of it in the counts' all-reduce
                    if self.world > 1:  # and stop too, with its words, instead of waiting for this one
                        self._busiest(0, 0, failed=True)
                        _told(error, [self.rank])
                    raise
                pad = held[-1] if held else pad
                if self.world == 1:
                    busiest, samples, failures, empties = len(held), sum(sizes), [], []
                else:
                    busiest, samples, failures, empties = self._busiest(len(held), sum(sizes), empty=pad is None)
                if failures:
                    why = _told(None, failures)
                    raise ValueError(
                        ngettext(
                            "the process of rank {ranks} failed fetching or checking its batches for step {step} "
                            "(epoch "
                            "{epoch}): {reasons}. This process (rank {rank}) stops with it, before this step changes "
                            "anything",
                            "the processes of ranks {ranks} failed fetching or checking their batches for step {step} "
                            "(epoch {epoch}): {reasons}. This process (rank {rank}) stops with them, before this step "
                            "changes anything",
                            len(failures),
                        ).format(
                            ranks=", ".join(map(str, failures)), step=made + 1, epoch=epoch, rank=self.rank, reasons=why
                        )
                    )
                if busiest == 0:  # the epoch has ended on every process
                    if cycle == 0:
                        raise ValueError(_("data gave no batch in epoch {epoch}: it is empty").format(epoch=epoch))
                    break
                if empties:  # every process stops: the one without a batch says so, the others which it is
                    raise ValueError(
                        _(
                            "data gave this process (rank {rank}) no batch while another process has "
                            "some: give every process a share of the data (a DistributedSampler)"
                        ).format(rank=self.rank)
                        if pad is None
                        else ngettext(
                            "data gave the process of rank {ranks} no batch while this one (rank {rank}) has some: "
                            "give "
                            "every process a share of the data (a DistributedSampler)",
                            "data gave the processes of ranks {ranks} no batch while this one (rank {rank}) has some: "
                            "give every process a share of the data (a DistributedSampler)",
                            len(empties),
                        ).format(ranks=", ".join(map(str, empties)), rank=self.rank)
                    )
                padding = busiest - len(held)
                if epoch == 0 and cycle == 0 and busiest < self.accum_steps:
                    self.notes.append(
                        _(
                            "accum_steps={k} is more than the {n} batches of an epoch of data: every "
                            "epoch is one step of {n} micro-batches"
                        ).format(k=self.accum_steps, n=busiest)
                    )
                moved = _MicroBatches(held + [pad] * padding, None, self.device)
                layout = tuple(tuple(tuple(t.shape) for t in _tensors(b)) for b in held)
                yield _Cycle(epoch, moved, sizes + [0] * padding, samples, layout, functools.partial(iter, held))
                made += 1
                if busiest < self.accum_steps:  # the loader has ended, on every process
                    break
                cycle += 1

    def advice(self) -> str:
        return _("give the loader a smaller batch_size and train with more accum_steps")
