"""What a cycle does differently across processes: DistributedDataParallel (DDP) and FSDP2 (`fully_shard`).

Both average the processes' gradients, so `train`'s loss weights are the same for both. They differ in what each
process holds: under DDP every process has the whole gradient, under FSDP2 (`torch.distributed.fsdp.fully_shard`)
each holds a shard of every parameter and gradient (a DTensor). So under FSDP2 the gradient's L2 norm (recorded,
checked for NaN/inf and clipped) is summed over the shards: each process's sum of squares, all-reduced with the
cycle's loss in one all-reduce and read from the device once: every process sees the same loss and norm, clips by
the same factor and takes (or skips) the same step.

Gradient synchronisation once per optimizer step: DDP's `no_sync()` around every micro-batch's forward but the
last; FSDP2's `set_requires_gradient_sync(False)` before every micro-batch but the last, True for the last (FSDP's
no_sync: its reduce-scatter runs in the last backward only; until then each process accumulates a whole,
unsharded gradient). A model on which you called `set_reshard_after_backward(False)` keeps its parameters unsharded
between a cycle's micro-batches (no all-gather in the next forward); the cycle reshards them in the last
micro-batch's backward, as the step updates the shards, and puts your setting back after it (docs/scaling.md says
what each choice costs).
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from .i18n import _

__all__ = ["start", "is_ddp", "is_fsdp", "world_and_rank", "local"]  # the rest is the cycle's


def start() -> torch.device:
    """In a script that torchrun started: join its process group and return this process's device: its GPU
    (LOCAL_RANK's) with the nccl backend where CUDA is there, else the CPU with gloo. Refused by name outside
    torchrun (no LOCAL_RANK, RANK or WORLD_SIZE in the environment)."""
    missing = [name for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE") if name not in os.environ]
    if missing:
        raise RuntimeError(
            _(
                "{names} not set: this script runs one process per device under torchrun, e.g. "
                "torchrun --standalone --nproc_per_node=2 {script}"
            ).format(names=", ".join(missing), script=sys.argv[0])
        )
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
        )
    return device


def local(t: torch.Tensor) -> torch.Tensor:
    """What this process holds of `t`: a DTensor's local shard, any other tensor itself."""
    return t._local_tensor if isinstance(t, dist.tensor.DTensor) else t


def held_gradients(model: torch.nn.Module) -> list[torch.Tensor]:
    """The gradients an FSDP2 model holds on this process: its shards (`.grad`) and, while gradient sync is off,
    the whole, unsharded gradients FSDP accumulates between micro-batches; [] for any other model."""
    inner = _unwrapped(model)
    if not isinstance(inner, FSDPModule):
        return []
    held = []
    for group in _groups(inner):
        for param in group.fsdp_params:
            unsharded = getattr(param, "_unsharded_param", None)
            held += [
                t
                for t in (
                    param.sharded_param.grad,
                    param.unsharded_accumulated_grad,
                    None if unsharded is None else unsharded.grad,
                )
                if t is not None
            ]
    return [local(t) for t in held]


@contextlib.contextmanager
def storage_resizes(resized):
    """Context manager: resized(tensor) after FSDP2 gives a storage its bytes back or frees them (the unsharded
    parameters are one storage per parameter group, allocated before its all-gather and set to 0 bytes on
    resharding, `untyped_storage().resize_()`: no tensor operation a TorchDispatchMode sees)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def allocated(tensor):
        alloc(tensor)
        resized(tensor)

    def freed(tensor):
        free(tensor)
        resized(tensor)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = allocated
    _fsdp_param.free_storage = freed
    try:
        yield
    finally:
        _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc
        _fsdp_param.free_storage = free


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside torch.compile's wrapper (which keeps it as `_orig_mod`), or the model itself."""
    return model._modules.get("_orig_mod") or model


def _is(module: torch.nn.Module, kind: type) -> bool:
    """Whether `module` is a `kind` (a subclass's instance too), from its type's MRO: isinstance() with DDP, whose
    base is an abc class, would run Python at every cycle."""
    return kind in type(module).__mro__


def is_fsdp(model: torch.nn.Module) -> bool:
    """An FSDP2 model (`fully_shard(model)`), also inside torch.compile's wrapper."""
    return _is(_unwrapped(model), FSDPModule)


def is_ddp(model: torch.nn.Module) -> bool:
    """A DistributedDataParallel model, also inside torch.compile's wrapper."""
    return _is(_unwrapped(model), DistributedDataParallel)


def world_and_rank(model: torch.nn.Module) -> tuple[int, int]:
    """(processes, this process's rank) that train shares the data out by: the default process group's under DDP
    or FSDP2, (1, 0) for a model on one process. An FSDP2 model sharded over a mesh of fewer processes than the
    group (tensor or pipeline parallelism beside it) is refused: its data shards would not be the group's."""
    if is_ddp(model):
        return dist.get_world_size(), dist.get_rank()
    if not is_fsdp(model):
        return 1, 0
    world, groups = dist.get_world_size(), _groups(_unwrapped(model))
    size = groups[0].mesh_info.mesh.size() if groups else world  # processes the parameters are sharded over
    if size != world:
        raise ValueError(
            _(
                "model is sharded with fully_shard over a mesh of {size} processes but the process "
                "group has {world}: train shares the data out over every process; shard the model over "
                "all of them (a 1-D mesh, or HSDP's 2-D mesh over every process)"
            ).format(size=size, world=world)
        )
    return world, dist.get_rank()


def cycle_sync(model: torch.nn.Module, no_sync: bool):
    """What the cycle enters around micro-batch i (`.micro_batch(i, n)`) and how it reads the loss and norm: None
    for a model on one process, else a `_DDPSync` or `_FSDPSync` (no_sync: gradients synchronised in the last
    micro-batch's backward only)."""
    inner = _unwrapped(model)
    if _is(inner, DistributedDataParallel):
        return _DDPSync(inner, no_sync)
    if _is(inner, FSDPModule):
        return _FSDPSync(inner, no_sync)
    return None


_NOTHING = contextlib.nullcontext()  # a context that does nothing (reusable)


class _DDPSync:
    """DDP: no_sync() around the forward of every micro-batch but the last (DDP all-reduces in a backward whose
    forward ran outside it); the loss averaged over the processes, as DDP averages their gradients."""

    fsdp = False

    def __init__(self, model: DistributedDataParallel, no_sync: bool):
        self.model, self.no_sync = model, no_sync

    def micro_batch(self, i: int, n: int):
        return self.model.no_sync() if self.no_sync and i < n - 1 else _NOTHING

    def done(self) -> None:
        pass


_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # FSDP2 model -> its parameter groups


def _groups(model: FSDPModule) -> list:
    """The FSDP parameter groups of every fully_shard'ed module in `model` (found once per model)."""
    groups = _GROUPS.get(model)
    if groups is None:
        groups = _GROUPS[model] = [
            group
            for module in model.modules()
            if isinstance(module, FSDPModule)
            for group in module._get_fsdp_state()._fsdp_param_groups
        ]
    return groups


class _FSDPSync:
    """FSDP2: gradient sync (reduce-scatter) in the last micro-batch's backward only; parameters kept unsharded
    between micro-batches where `set_reshard_after_backward(False)` asked for it, resharded in the last backward.

    `micro_batch(i, n)` is entered around micro-batch i's forward and sets what its backward does (FSDP reads both
    flags in its post-backward hook); `done()` after the last backward puts back the reshard setting found. A cycle
    that fails on the way (a micro-batch, loss_fn) leaves no half-accumulated gradient inside FSDP: the unsharded
    gradients of its micro-batches so far are dropped and the settings put back, as the cycle puts back `.grad`.
    """

    fsdp = True

    def __init__(self, model: FSDPModule, no_sync: bool):
        self.model, self.no_sync = model, no_sync
        self.groups = _groups(model)
        self.reshard = [group.reshard_after_backward for group in self.groups]  # as the user set them
        self.last = False

    def micro_batch(self, i: int, n: int):
        self.last = i == n - 1
        return self

    def __enter__(self) -> None:
        last = self.last
        for group, reshard in zip(self.groups, self.reshard, strict=True):
            group.reduce_grads = group.all_reduce_grads = last or not self.no_sync  # set_requires_gradient_sync
            group.reshard_after_backward = last or reshard  # the step updates the shards: the last backward reshards

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None:
            for group in self.groups:
                for param in group.fsdp_params:
                    param.unsharded_accumulated_grad = None  # the failed cycle's gradient so far (no_sync)
                    if hasattr(param, "_unsharded_param"):
                        param._unsharded_param.grad = None
            self.done()

    def done(self) -> None:
        for group, reshard in zip(self.groups, self.reshard, strict=True):
            group.reduce_grads = group.all_reduce_grads = True
            group.reshard_after_backward = reshard

    def loss_and_norm(
        self, total: torch.Tensor, params: list[torch.Tensor], clip_grad_norm: float | None, with_norm: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """After the cycle's last backward, its settings put back: (the cycle's loss averaged over the processes,
        [the gradient's L2 norm over every shard], or [] without with_norm and clipping), on the device."""
        self.done()
        return _loss_and_norm(total, params, clip_grad_norm, with_norm)


def _loss_and_norm(
    total: torch.Tensor, params: list[torch.Tensor], clip_grad_norm: float | None, with_norm: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """FSDP2's loss and norm, from one all-reduce of [loss, this process's sum of squares of its shards]. With
    clip_grad_norm the local shards are clipped by the factor torch.nn.utils.clip_grad_norm_ computes from that
    global norm (the norm returned is the one before clipping): the same clipping as on one process."""
    with_norm = with_norm or clip_grad_norm is not None
    local = [
        grad.to_local() if isinstance(grad, dist.tensor.DTensor) else grad
        for p in params
        if (grad := p.grad) is not None
    ]
    if with_norm and local:
        squares = torch.stack(torch._foreach_norm(local)).to(total.device, total.dtype).square().sum()
    else:
        squares = torch.zeros_like(total)  # no gradient here: this process adds 0 to the sum of squares
    values = torch.stack([total, squares])
    dist.all_reduce(values)  # the loss and the squares, summed over the processes: one all-reduce
    loss = values[0] / dist.get_world_size()
    if not with_norm:
        return loss, []
    norm = values[1].sqrt()
    if clip_grad_norm is not None:  # torch.nn.utils.clip_grad_norm_'s factor, from the global norm
        factor = torch.clamp(clip_grad_norm / (norm + 1e-6), max=1.0)
        for device in {grad.device for grad in local}:
            torch._foreach_mul_([grad for grad in local if grad.device == device], factor.to(device))
    return loss, [norm]
