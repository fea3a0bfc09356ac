"""The CPU's count of a step's memory: the bytes of the tensor storages alive while it runs, by category.

On the CPU, `LiveTensorBytes` (a TorchDispatchMode) counts the bytes of every tensor storage alive while a step
runs: byte-exact and identical from run to run, unlike process RSS. Under FakeTensorMode the same count comes
without computing anything (`measure_step(..., fake=True)`), fast enough for "does this fit?" questions.

Every storage alive at the moment of the peak is put in one category (`CATEGORIES`, defined one line each in
`MemoryReport`), so the categories add up to the peak. A storage is named by the part of the step that created it
(forward pass, backward pass, optimizer step) and then by what it turns out to be (saved for backward, a parameter's
gradient, optimizer state); tensors that existed before the step (weights, the micro-batch, `.grad`, optimizer
state) keep their own names.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Iterable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import budget, phases, sharded
from .budget import allocation_bytes

# What each category holds (one line each); the order is that of the stacked bars: first what the model fixes,
# then what one micro-batch brings.
CATEGORY_DEFINITIONS = {
    "parameters": "the model's weights and buffers (BatchNorm's running statistics, a registered mask); fixed "
    "by the model",
    "gradients": "the .grad of every trainable parameter, summed over the micro-batches of the step; fixed by "
    "the model (during a step's first backward pass only the part built so far)",
    "incoming gradients": "a parameter's gradient from the current micro-batch, computed by backward() and not "
    "yet added into .grad: from the second micro-batch of a step on, at most the size of "
    "the model (with one micro-batch per step it becomes .grad itself)",
    "optimizer state": "what the optimizer keeps between steps (Adam: two moments per parameter and a step "
    "count; plain SGD: nothing); fixed by the model",
    "optimizer temporaries": "tensors optimizer.step() creates and frees while it updates the weights; "
    "fixed by the model",
    "inputs": "the micro-batch itself (x and y); proportional to the micro-batch",
    "activations": "intermediate results of the forward pass saved for backward() (the input batch and the "
    "weights are counted under their own names); proportional to the micro-batch",
    "activation gradients": "gradients with respect to the activations, which backward() computes layer by "
    "layer on its way to the parameters; proportional to the micro-batch",
    "other": "everything else alive at the peak: results of the forward pass that backward() does not need "
    "(the loss, the logits while they live), the 1 that backward() starts from, with accumulation the step's "
    "loss summed so far, the copy of BatchNorm's running statistics that a skipped step puts back; on CUDA also "
    "the allocator's rounding and workspaces",
}
CATEGORIES = tuple(CATEGORY_DEFINITIONS)

# The category of a storage created during each phase of a step, until it turns out to be something more specific.
_CREATED_IN = {"forward": "other", "backward": "activation gradients", "step": "optimizer temporaries"}


class _Storage:
    """One live storage: its bytes, what it holds (one of CATEGORIES), and whether that name is final."""

    __slots__ = ("nbytes", "category", "final")

    def __init__(self, nbytes: int, category: str, final: bool):
        self.nbytes, self.category, self.final = nbytes, category, final


class LiveTensorBytes(TorchDispatchMode):
    """Counts bytes of live tensor storages: those adopted with `track` and every one created under the mode.

    `current` and `peak` are in bytes (on CUDA, `allocation_bytes`: the allocator's 512-byte blocks, real or fake
    tensors alike). A storage is counted once however many views share it, and stops
    counting when it is freed (a weakref finalizer on the storage). Storages carry a category: adopted ones the
    category given to `track` (final); created ones that of the current `phase` ("forward", "backward" or
    "step", see `_CREATED_IN`) until `tag` names what they hold. `peak_categories()` splits the peak by what was
    alive at that moment, so the categories add up to it; `peak_phase` is the phase the peak came in.
    """

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self.phase: str | None = None
        self.peak_phase: str | None = None
        self._live: dict[int, _Storage] = {}
        self._at_peak: list[_Storage] = []
        self._finalizers: list[weakref.finalize] = []
        # the storages of the copies a collective hands the backend (by id; weak: an entry dies with its storage, so
        # an id used again is another storage's): never counted, also when the backend writes into one later from
        # this thread (gloo's reduce-scatter copies its result into the output as the caller waits)
        self._handed: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def track(self, tensors: Iterable[torch.Tensor], category: str = "other") -> None:
        """Count these (already existing) tensors' storages from now on, under `category` (final)."""
        for t in tensors:
            self._track(t, category, final=True)

    def tag(self, tensors: Iterable[torch.Tensor], category: str, final: bool = False) -> None:
        """Name what these live storages hold, unless they were adopted with `track` under a name of their own
        (final=True: this name stays, as if adopted with it)."""
        for t in tensors:
            record = self._live.get(id(sharded.local(t).untyped_storage()))
            if record is not None and not record.final:
                record.category, record.final = category, final

    def peak_categories(self) -> dict[str, int]:
        """Bytes by category of the storages alive at the peak; they add up to `peak`."""
        totals = dict.fromkeys(CATEGORIES, 0)
        for record in self._at_peak:
            totals[record.category] += record.nbytes
        return totals

    def now(self) -> str | None:
        """The part of the step running: "backward" while autograd runs a backward(), else the phase last set."""
        return "backward" if phases.in_backward() else self.phase

    def _track(self, t: torch.Tensor, category: str, final: bool) -> None:
        storage = sharded.local(t).untyped_storage()  # an FSDP2 DTensor: the shard this process holds
        key = id(storage)
        if key in self._live or self._handed.get(key) is storage:
            return
        record = self._live[key] = _Storage(allocation_bytes(storage.nbytes(), t.device), category, final)
        self.current += record.nbytes
        if self.current > self.peak:
            self.peak, self.peak_phase = self.current, self.now()
            self._at_peak = list(self._live.values())  # the records themselves: later tags still apply
        self._finalizers.append(weakref.finalize(storage, self._free, key))

    def _free(self, key: int) -> None:
        record = self._live.pop(key, None)
        if record is not None:
            self.current -= record.nbytes

    def resized(self, t: torch.Tensor) -> None:
        """`t`'s storage was given other bytes in place (FSDP2's unsharded parameters, `sharded.storage_resizes`):
        counted from now on with its new size (0 bytes: freed), as parameters."""
        storage = t.untyped_storage()
        record = self._live.get(id(storage))
        if record is None:
            self._track(t, "parameters", final=True)
            return
        nbytes = allocation_bytes(storage.nbytes(), t.device) if storage.nbytes() else 0
        self.current += nbytes - record.nbytes
        # a new record: one alive at the peak keeps the bytes it had then
        self._live[id(storage)] = _Storage(nbytes, record.category, record.final)
        if self.current > self.peak:
            self.peak, self.peak_phase = self.current, self.now()
            self._at_peak = list(self._live.values())

    def __enter__(self):
        self._resizes = sharded.storage_resizes(self.resized)
        self._resizes.__enter__()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _collective(func, args, kwargs, self._handed) if func.namespace == "c10d" else func(*args, **kwargs)
        category = _CREATED_IN.get(self.now(), "other")
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t, category, final=False)
        return out

    def __exit__(self, *exc):
        for f in self._finalizers:
            f.detach()
        self._resizes.__exit__(*exc)
        return super().__exit__(*exc)


def _collective(func, args, kwargs, handed: weakref.WeakValueDictionary):
    """Run a collective (an op of the c10d namespace: FSDP2's all-gathers and reduce-scatters) on copies of its
    tensors, the counted ones held by this thread alone: wait for it, write what it left in the copies back into
    the caller's tensors, and return its result with the caller's tensors in place of the copies.

    A backend such as gloo keeps the tensors of a collective in its own thread and drops them there, at a moment of
    its own: a counted storage freed by that thread would end its count at a moment that moves from run to run (and
    with it the peak, by up to a collective's buffer). With copies the backend holds only uncounted ones; each
    counted storage is freed where this thread drops it, as it is on CUDA, where the caching allocator frees a block
    on its stream's order. The copies are made inside the mode's dispatch and so are not counted, as the step itself
    does not make them; the collective's values are the same. The Work returned gives the caller's tensors back
    from its future too (DDP's reducer reads the all-reduced bucket there: a copy it kept was counted then). Each
    copy's storage goes into `handed`, which the tracker never counts."""
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id of the caller's tensor: (it, its copy)

    def copy_of(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) not in copies:
            copy = t.clone()
            storage = copy.untyped_storage()
            handed[id(storage)] = storage
            copies[id(t)] = (t, copy)
        return copies[id(t)][1]

    out = func(*tree_map(copy_of, args), **tree_map(copy_of, kwargs))
    for leaf in tree_leaves(out):
        if hasattr(leaf, "wait"):  # a c10d Work: the copies are written once it is done
            leaf.wait()
    with torch.no_grad():
        for original, copy in copies.values():
            original.copy_(copy)
    back = {_bytes_of(copy): (original, copy) for original, copy in copies.values()}
    return tree_map(lambda leaf: _the_callers(leaf, back), out)


def _bytes_of(t: torch.Tensor):
    """What tells `t`'s bytes apart from another tensor's: its storage's address (itself, for no bytes)."""
    storage = t.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else id(t)


def _the_callers(leaf, back: dict):
    """A leaf of a collective's result with the caller's tensors for the copies (`back`: a copy's `_bytes_of`:
    (the caller's tensor, its copy)): a copy, a view of one (gloo's all-gather: its future's chunks), and a c10d
    Work (boxed), whose future then gives the caller's tensors."""
    if isinstance(leaf, torch.Tensor):
        original, copy = back.get(_bytes_of(leaf), (leaf, leaf))
        if leaf is copy or copy.stride() != original.stride():
            return original if leaf is copy else leaf
        offset = original.storage_offset() + leaf.storage_offset() - copy.storage_offset()
        return original.as_strided(leaf.shape, leaf.stride(), offset)  # the same view of the caller's tensor
    if not hasattr(leaf, "wait"):
        return leaf
    work = dist.Work.unbox(leaf)
    try:
        value = work.get_future().value()
    except RuntimeError:  # a Work without a future (gloo's reduce-scatter): nothing reads the copies from it
        return leaf
    done = torch.futures.Future()
    done.set_result(tree_map(lambda inner: _the_callers(inner, back), value))
    return torch._C._distributed_c10d._create_work_from_future(done).boxed()


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _persistent_tensors(params, optimizer) -> list[torch.Tensor]:
    grads = [p.grad for p in params if p.grad is not None]
    return list(params) + grads + optimizer_state_tensors(optimizer)


class _Peak:
    bytes: int | None = None


@contextlib.contextmanager
def step_peak(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device):
    """Context manager: `.bytes` is the peak bytes of the block's steps of `model` (its parameters, gradients and
    the optimizer's state included; on the CPU the model's frozen parameters and its buffers too; on CUDA the
    allocator's peak over what the block did not hold, so those few buffers are left out there)."""
    result = _Peak()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if device.type == "cuda":  # the allocator's peak of the block, less what was allocated before it and is not the
        # step's (the data, other models, cuBLAS's workspace, taken first), as check_fits traces it
        budget._take_workspaces(device)
        torch.cuda.synchronize(device)
        held = {
            id(t.untyped_storage()): allocation_bytes(t.untyped_storage().nbytes(), device)
            for t in _persistent_tensors(params, optimizer)
        }
        before = torch.cuda.memory_allocated(device) - sum(held.values())
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        torch.cuda.synchronize(device)
        result.bytes = torch.cuda.max_memory_allocated(device) - before
    else:
        tracker = LiveTensorBytes()
        tracker.track(_persistent_tensors(params, optimizer))
        tracker.track(_model_tensors(model), "parameters")  # what the model holds besides, as measure_step counts it
        with tracker, _no_collection():
            yield result
        result.bytes = tracker.peak


@contextlib.contextmanager
def _no_collection(collect_first: bool = False):
    """Context manager: Python's garbage collector collects nothing until the block ends, so that no storage of
    before (held in a reference cycle) is freed inside it at a moment of the collector's: a block's CPU peak is the
    same from run to run. collect_first: collect once before the block (some 70 ms in a lesson's kernel), so that
    what was garbage is freed before the peak is counted rather than after (FSDP2's step, whose peak every process
    must agree on)."""
    collecting = gc.isenabled()
    if collect_first:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _model_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter (frozen ones too) and buffer of the model: what it holds on the card whatever the batch."""
    return [*model.parameters(), *model.buffers()]
