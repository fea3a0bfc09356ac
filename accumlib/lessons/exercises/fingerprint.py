"""A learner's accumulation loop, run on a tiny float64 model at learning rate 0, read off micro-batch by micro-batch.

With a learning rate of 0 the weights never change, so every micro-batch's gradient g_j is taken at the same
weights, and the gradient the optimizer sees at a step is a combination  sum_j c_j g_j  of the micro-batches run so
far. Least squares reads the coefficients c_j off. The exact reference has c_j = (samples of j) / (samples of its
cycle) for the micro-batches of the cycle that just ended and 0 for every other one; how the learner's coefficients
differ names the bug: all k times too large (the division is missing), only the last micro-batch of each cycle
(zeroing inside the loop), earlier cycles still inside (never zeroed), a step after every micro-batch, the first step
after one micro-batch (the `step % k == 0` off-by-one), the last incomplete cycle dropped, leaked into the next epoch
or divided by accum_steps.

`Recording` instruments everything the learner's code touches: the loader (the same micro-batches in the same
order as `accumlib.train(seed=...)`), the optimizer (every `step()` with the gradient it saw, every `zero_grad()`),
and on request a GradScaler and a DistributedDataParallel wrapper (every call, every all-reduce).

These loop checks run on the CPU on every machine, on purpose (issue 20): the learner's loop gets every model,
loader, optimizer and scaler from the check, all on the CPU, so its code has no device to get wrong; the read-off is
float64 least squares at learning rate 0 (float64 runs at a small fraction of float32's speed on consumer GPUs), the
AMP checks record autocast on the tensors' device (lesson 8's stub writes `torch.autocast(x.device.type, ...)`; where
the lesson runs on CUDA, `torch.autocast("cuda", ...)` counts too, as the lesson's own cells write it), and DDP runs
on gloo. The
checks that build a model to measure it (largest_batch, memory_plan, batchnorm_split, time_cost) run on the lesson's
device instead (`accumlib.devices.pick()`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ... import devices
from ...i18n import _, ngettext
from ...gaps import parameter_gap
from ...loop import train
from .. import data, models
from ..pitfalls import loss_weights
from .contained import kernel_side
from .core import Finding, explained, first_line, learner_code

ZERO = 1e-9  # a coefficient this small is no contribution (the reference's smallest is about 0.05)
CLOSE = 1e-6  # relative tolerance for "the same coefficient" and for a gradient that is a combination at all
NO_GRAD = -2  # a model call made with gradients off: no part of any step's gradient
EXACT = 1e-10  # float64 rounding: largest difference accepted between a learner's result and the reference

loss_fn = torch.nn.functional.cross_entropy  # mean over the micro-batch, as in the seed's loop


@dataclass(frozen=True)
class Problem:
    """The tiny problem a check runs on: digits in float64, micro-batches, cycles, epochs, the two-layer perceptron.

    Each epoch draws its own `samples` digits (epoch e: the digits e * samples to (e + 1) * samples - 1), so every
    micro-batch's gradient is independent of the others: with the same samples in every epoch, the gradients of one
    epoch's micro-batches (weighted by their samples) add up to those of the next, and a step could not be read off
    uniquely. The sample order within an epoch is accumlib.train's with `seed`.
    """

    samples: int  # per epoch
    micro_batch_size: int
    accum_steps: int
    epochs: int = 1
    seed: int = 0
    lr: float = 0.5  # learning rate of the run that confirms a right answer

    def data(self, epoch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        X, y = data.digits((epoch + 1) * self.samples, flat=True, dtype=torch.float64)
        return X[epoch * self.samples :], y[epoch * self.samples :]

    model_dtype = torch.float64  # so that every gradient the check compares is exact

    def model(self) -> torch.nn.Module:
        return models.mlp(dtype=self.model_dtype)

    def loader(self) -> MicroBatchLoader:
        return MicroBatchLoader(self)


class MicroBatchLoader:
    """Micro-batches (x, y): iterate once per epoch, like a DataLoader with shuffle=True.

    Pass e gives exactly the micro-batches of `accumlib.train(problem.data(e), ..., seed=problem.seed)`, in the same
    order; the last micro-batch of a pass is smaller when the samples do not divide evenly. len() is the number of
    micro-batches per pass.
    """

    def __init__(self, problem: Problem):
        self.problem = problem
        self.handed_out: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (epoch, x, y), every pass so far
        self.passes = 0

    def __len__(self) -> int:
        return math.ceil(self.problem.samples / self.problem.micro_batch_size)

    def __iter__(self):
        epoch, self.passes = self.passes, self.passes + 1
        X, y = self.problem.data(epoch)
        order = torch.randperm(len(X), generator=torch.Generator().manual_seed(self.problem.seed))
        for idx in order.split(self.problem.micro_batch_size):
            self.handed_out.append((epoch, X[idx], y[idx]))
            yield self.handed_out[-1][1:]

    def epochs(self, count: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """The next `count` passes, as lists of micro-batches."""
        return [list(self) for _ in range(count)]


@dataclass(frozen=True)
class StepSeen:
    forwards: int  # model calls before this step
    gradient: torch.Tensor  # every parameter's .grad, flattened (zeros where None), float64
    via_scaler: bool  # called by GradScaler.step (False: optimizer.step() called directly)
    unscaled: bool  # whether GradScaler.unscale_ had run on the gradient since the last update (no scaler: True)


class RecordingSGD(torch.optim.SGD):
    """SGD that tells its Recording about every step() (with the gradient it saw) and zero_grad()."""

    def __init__(self, params, lr: float, recording: Recording):
        super().__init__(params, lr=lr)
        self._recording = recording

    def step(self, closure=None):
        self._recording.on_step()
        result = super().step(closure)
        self._recording.left = self._recording.weights()  # what the optimizer made of them
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._recording.zeros.append((len(self._recording.forwards), len(self._recording.steps)))
        super().zero_grad(set_to_none)


class RecordingScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler("cpu") that tells its Recording which method ran after how many micro-batches."""

    def __init__(self, recording: Recording):
        super().__init__("cpu")
        self._recording = recording
        self.inside_step = False  # True while step() runs
        self.unscaled = False  # True from unscale_() (explicit, or inside step()) to the next update()

    def _note(self, method: str) -> None:
        self._recording.scaler_calls.append((method, len(self._recording.forwards)))

    def scale(self, outputs):
        self._note("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer) -> None:
        self._note("unscale_")
        super().unscale_(optimizer)
        self.unscaled = True

    def step(self, optimizer, *args, **kwargs):
        self._note("step")
        self.inside_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self.inside_step = False

    def update(self, new_scale=None) -> None:
        self._note("update")
        super().update(new_scale)
        self.unscaled = False


class RecordingDDP(DistributedDataParallel):
    """DistributedDataParallel that tells its Recording when no_sync() is entered; all-reduces counted by a hook."""

    def __init__(self, module: torch.nn.Module, recording: Recording):
        super().__init__(module)
        self._recording = recording
        self.register_comm_hook(recording, _count_allreduce)

    @contextlib.contextmanager
    def no_sync(self):
        self._recording.no_sync_entries.append(len(self._recording.forwards))
        with super().no_sync():
            yield


def _count_allreduce(recording: Recording, bucket):
    recording.allreduces.append(len(recording.forwards))
    return allreduce_hook(None, bucket)


class Recording:
    """A fresh tiny model, loader, optimizer (and scaler, DDP wrapper) whose every use is written down.

    lr: the optimizer's learning rate (0 for reading the fingerprint). ddp needs a process group (see ddp.py).
    """

    def __init__(self, problem: Problem, *, lr: float = 0.0, amp: bool = False, ddp: bool = False):
        self.problem = problem
        self.module = problem.model()
        self.initial = copy.deepcopy(self.module)
        self.loader = problem.loader()
        # per model call: index into loader.handed_out (-1: not a micro-batch of it; NO_GRAD: under torch.no_grad())
        self.forwards: list[int] = []
        self.autocast: list[torch.dtype | None] = []  # per model call: the autocast dtype in force (None: off) on
        # the CPU, or on the lesson's device where that is CUDA (lesson_device_type())
        self.steps: list[StepSeen] = []
        self.zeros: list[tuple[int, int]] = []  # (model calls, optimizer steps) before each zero_grad()
        self.scaler_calls: list[tuple[str, int]] = []  # (method, model calls before it)
        self.allreduces: list[int] = []  # model calls before each all-reduce
        self.no_sync_entries: list[int] = []  # model calls before each `with model.no_sync():`
        self.error: Exception | None = None
        self.backwards: list[int] = []  # model calls before each backward() (Tensor.backward, autograd.backward)
        self.reached: set[int] = set()  # model calls whose output a backward() sent a gradient through
        self.own_scaler = False  # whether the learner's code scaled a loss with a GradScaler of its own
        self.dtype_mismatch: tuple[int, torch.dtype] | None = None  # (model call, input dtype): the first input not
        # in the model's dtype
        self.autocast_devices = ("cpu",) + (("cuda",) if amp and lesson_device_type() == "cuda" else ())
        self.left = self.weights()  # the weights as the last optimizer step left them (at first: the initial ones)
        self.weights_changed: int | None = None  # the optimizer step (from 1) before which the learner's code changed
        # the weights itself (len(steps) + 1: after the last step); None while only optimizer.step() changed them
        self.module.register_forward_pre_hook(self._on_forward)
        self.module.register_forward_hook(self._after_forward)
        self.model = RecordingDDP(self.module, self) if ddp else self.module
        self.optimizer = RecordingSGD(self.model.parameters(), lr, self)
        self.scaler = RecordingScaler(self) if amp else None

    def _on_forward(self, module, args) -> None:
        self.autocast.append(
            next(
                (
                    torch.get_autocast_dtype(device)
                    for device in self.autocast_devices
                    if torch.is_autocast_enabled(device)
                ),
                None,
            )
        )
        x = args[0] if args else None
        dtype = next(p.dtype for p in module.parameters())
        if self.dtype_mismatch is None and isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            self.dtype_mismatch = (len(self.forwards) + 1, x.dtype)
        if not torch.is_grad_enabled():  # an evaluation (accuracy, a logged loss): it adds no gradient
            self.forwards.append(NO_GRAD)
            return
        x = args[0] if args else None
        handed = self.loader.handed_out
        found = next((j for j in range(len(handed) - 1, -1, -1) if handed[j][1] is x), None)
        if found is None and isinstance(x, torch.Tensor):
            found = next(
                (
                    j
                    for j in range(len(handed) - 1, -1, -1)
                    if handed[j][1].shape == x.shape and torch.equal(handed[j][1], x)
                ),
                None,
            )
        self.forwards.append(-1 if found is None else found)

    def _after_forward(self, module, args, output) -> None:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            call = len(self.forwards) - 1
            output.register_hook(lambda gradient: self.reached.add(call))

    @contextlib.contextmanager
    def _counting_backwards(self):
        """Note every backward() while the learner's code runs (its own, scaler.scale(loss).backward() too), and
        whether it scales a loss with a GradScaler other than the one it was given."""
        tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward
        scale = torch.amp.GradScaler.scale

        def noted(original):
            def backward(*args, **kwargs):
                self.backwards.append(len(self.forwards))
                return original(*args, **kwargs)

            return backward

        def scaled(scaler, outputs):  # a GradScaler the learner's code made itself, not the one it was given
            self.own_scaler = self.own_scaler or scaler is not self.scaler
            return scale(scaler, outputs)

        torch.Tensor.backward, torch.autograd.backward = noted(tensor_backward), noted(autograd_backward)
        torch.amp.GradScaler.scale = scaled
        try:
            yield
        finally:
            torch.Tensor.backward, torch.autograd.backward = tensor_backward, autograd_backward
            torch.amp.GradScaler.scale = scale

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.module.parameters()]

    def _note_weights(self) -> None:
        """Note the first place where the weights are no longer as the last optimizer step left them (a NaN where
        the optimizer left a NaN counts as unchanged)."""
        now = list(self.module.parameters())
        if self.weights_changed is None and (
            len(now) != len(self.left)
            or any(
                a.shape != b.shape or not bool(((a == b) | (a.isnan() & b.isnan())).all())
                for a, b in zip(now, self.left, strict=True)  # the lengths are equal: compared above
            )
        ):
            self.weights_changed = len(self.steps) + 1

    def on_step(self) -> None:
        self._note_weights()
        grads = [
            p.grad.detach().flatten() if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype)
            for p in self.module.parameters()
        ]
        via_scaler = self.scaler is not None and self.scaler.inside_step
        unscaled = self.scaler is None or self.scaler.unscaled
        self.steps.append(StepSeen(len(self.forwards), torch.cat(grads).double().clone(), via_scaler, unscaled))

    def run(self, call: Callable[[Recording], object]) -> Recording:
        """call(self), keeping what it raised (if anything) as `error`: a DtypeMismatch where a model input was in
        another dtype than the model (PyTorch then refuses the operation)."""
        try:
            with self._counting_backwards():
                call(self)
        except Exception as error:  # the learner's code: any failure is part of the verdict
            self.error = (
                error if self.dtype_mismatch is None else DtypeMismatch(*self.dtype_mismatch, self.problem.model_dtype)
            )
        self._note_weights()  # after the last step too
        return self


def call_with(function, arguments: dict) -> object:
    """function(*arguments.values()) after checking that it takes exactly these parameters, by position.

    Raises SignatureMismatch (whose message names the expected parameters) before calling anything else.
    """
    try:
        inspect.signature(function).bind(*arguments.values())
    except TypeError as error:
        raise SignatureMismatch(function, list(arguments)) from error
    with learner_code():  # counted against the check's time limit
        return function(*arguments.values())


class DtypeMismatch(TypeError):
    """Model call `call` got an input in `got`, while the model is in `model`: PyTorch refused an operation."""

    def __init__(self, call: int, got: torch.dtype, model: torch.dtype):
        self.call, self.got, self.model = call, got, model
        super().__init__(_("model call {call} got {got}, the model is {model}").format(call=call, got=got, model=model))


def lesson_device_type() -> str:
    """The type of the lesson's device ("cpu", "cuda", "mps"), as the kernel picks it (accumlib.devices.pick())."""
    return _lesson_device_type()


@kernel_side
def _lesson_device_type() -> str:
    return devices.pick().type


class SignatureMismatch(TypeError):
    """The learner's function does not take the parameters of the stub."""

    def __init__(self, function, parameters: list[str]):
        self.name = getattr(function, "__name__", "function")
        self.expected = ", ".join(parameters)
        try:
            self.found = ", ".join(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            self.found = "?"
        super().__init__(_("{name} must take ({expected})").format(name=self.name, expected=self.expected))


def frozen_finding(model: torch.nn.Module) -> Finding | None:
    """The finding when the learner's code froze every weight of the model (requires_grad=False), else None."""
    if any(p.requires_grad for p in model.parameters()):
        return None
    return Finding(
        "model-frozen",
        _(
            "Your code froze every weight of the model (requires_grad=False on all of them), so backward() has nothing "
            "to compute and nothing can train. Leave requires_grad as it is: accumulation needs every weight's "
            "gradient."
        ),
    )


def error_finding(error: Exception, micro_batch: int = 0) -> Finding:
    """The finding for an exception raised by the learner's code (at micro-batch `micro_batch`, 1-based, if known)."""
    if isinstance(error, DtypeMismatch):
        return Finding(
            "dtype-mismatch",
            _(
                "Model call {call} got x in {got}, but the check's model is in {model} (so that every gradient it "
                "compares is exact): PyTorch multiplies only tensors of one dtype, so it stopped your code. Pass x as "
                "the "
                "loader gives it, model(x): the loader's micro-batches are already in the model's dtype."
            ).format(
                call=error.call,
                got=str(error.got).removeprefix("torch."),
                model=str(error.model).removeprefix("torch."),
            ),
        )
    if isinstance(error, SignatureMismatch):
        return Finding(
            "signature",
            _(
                "{name} must take the parameters ({expected}), in this order, as in the stub; yours takes ({found})."
            ).format(name=error.name, expected=error.expected, found=error.found),
        )
    plain = explained(error)
    if plain is not None:
        if not micro_batch:
            return plain
        return Finding(
            plain.name,
            _("PyTorch stopped your code at micro-batch {number}: {explanation}").format(
                number=micro_batch, explanation=plain.message
            ),
        )
    message = first_line(error)
    if not micro_batch:
        return Finding(
            "error", _("Your code raised {error}: {message}").format(error=type(error).__name__, message=message)
        )
    return Finding(
        "error",
        _("Your code raised {error} at micro-batch {number}: {message}").format(
            error=type(error).__name__, number=micro_batch, message=message
        ),
    )


@dataclass(frozen=True)
class Reference:
    """What the exact loop does with the micro-batches of `problem`: its cycles and each micro-batch's share."""

    epoch_of: list[int]  # per micro-batch (global index j, in order over all epochs)
    position: list[int]  # per micro-batch: its place in its epoch, 0-based
    sizes: list[int]  # samples per micro-batch
    cycles: list[list[int]]  # micro-batch indices of each cycle, in order
    weights: list[float]  # per micro-batch: its samples over its cycle's samples
    accum_steps: int

    @classmethod
    def of(cls, problem: Problem) -> Reference:
        epoch_of, position, sizes, cycles, weights = [], [], [], [], []
        for epoch, batches in enumerate(problem.loader().epochs(problem.epochs)):
            first = len(sizes)
            epoch_sizes = [len(y) for x, y in batches]
            epoch_of += [epoch] * len(batches)
            position += list(range(len(batches)))
            sizes += epoch_sizes
            weights += loss_weights(epoch_sizes, problem.accum_steps, "weighted", True)
            cycles += [
                list(range(first + start, first + min(start + problem.accum_steps, len(batches))))
                for start in range(0, len(batches), problem.accum_steps)
            ]
        return cls(epoch_of, position, sizes, cycles, weights, problem.accum_steps)

    def is_tail(self, cycle: list[int]) -> bool:
        """Whether this cycle is an epoch's last, incomplete one."""
        return len(cycle) < self.accum_steps

    def cycle_of(self, j: int) -> list[int]:
        return next(cycle for cycle in self.cycles if j in cycle)


@dataclass
class Reading:
    """One optimizer step of the learner's loop, read off."""

    number: int  # 1-based
    fresh: list[int]  # micro-batches run since the previous step, in order
    earlier: set[int]  # micro-batches run before the previous step
    coefficients: dict[int, float]  # micro-batch -> its coefficient in this step's gradient
    residual: float  # |gradient - best combination| / |gradient|: not a combination of micro-batches if large
    gradient: torch.Tensor

    def share(self, j: int) -> float:
        return self.coefficients.get(j, 0.0)

    @property
    def last(self) -> int | None:
        return self.fresh[-1] if self.fresh else None


class Fingerprint:
    """A Recording read off: per step, the coefficient of every micro-batch run so far; the reference beside it."""

    def __init__(self, recording: Recording):
        self.recording = recording
        self.reference = Reference.of(recording.problem)
        self.micro_gradients = {j: self._gradient([j]) for j in sorted({j for j in recording.forwards if j >= 0})}
        self.readings: list[Reading] = []
        done = 0
        for number, seen in enumerate(recording.steps, 1):
            ran = [j for j in recording.forwards[: seen.forwards] if j >= 0]
            before = set(recording.forwards[:done])  # a micro-batch run again after its step (to evaluate it) is
            fresh = list(
                dict.fromkeys(
                    j
                    for j in recording.forwards[done : seen.forwards]  # not fresh again
                    if j >= 0 and j not in before
                )
            )
            self.readings.append(self._read(number, fresh, set(ran) - set(fresh), seen.gradient))
            done = seen.forwards

    def _gradient(self, micro_batches: list[int]) -> torch.Tensor:
        """The gradient of the mean loss over these micro-batches together, at the initial weights, flattened."""
        handed = self.recording.loader.handed_out
        x = torch.cat([handed[j][1] for j in micro_batches])
        y = torch.cat([handed[j][2] for j in micro_batches])
        model = self.recording.initial
        grads = torch.autograd.grad(loss_fn(model(x), y), list(model.parameters()))
        return torch.cat([g.flatten() for g in grads])

    def _read(self, number: int, fresh: list[int], earlier: set[int], gradient: torch.Tensor) -> Reading:
        candidates = sorted(earlier | set(fresh))
        if not candidates:
            return Reading(number, fresh, earlier, {}, 0.0 if gradient.abs().max() == 0 else 1.0, gradient)
        basis = torch.stack([self.micro_gradients[j] for j in candidates], dim=1)
        solution = torch.linalg.lstsq(basis, gradient.unsqueeze(1)).solution.squeeze(1)
        size = gradient.norm().item()
        residual = (gradient - basis @ solution).norm().item() / size if size else 0.0
        return Reading(
            number, fresh, earlier, dict(zip(candidates, solution.tolist(), strict=True)), residual, gradient
        )

    def full_batch_gradient(self, cycle: list[int]) -> torch.Tensor:
        """The gradient of one batch made of the whole cycle, at the initial weights."""
        return self._gradient(cycle)

    @property
    def handed_out(self) -> int:
        return len(self.recording.loader.handed_out)

    def gradient_gap(self) -> float:
        """Largest |step gradient - full-batch gradient of its cycle|, when the steps match the cycles one to one."""
        return max(
            (r.gradient - self.full_batch_gradient(cycle)).abs().max().item()
            for r, cycle in zip(self.readings, self.reference.cycles, strict=True)
        )


def _close(value: float, target: float) -> bool:
    return abs(value - target) <= CLOSE * max(abs(target), ZERO)


@dataclass
class _Findings:
    """Findings in the order they are first met, one per name (the first occurrence says where)."""

    found: dict[str, Finding] = field(default_factory=dict)

    def add(self, name: str, message: str) -> None:
        self.found.setdefault(name, Finding(name, message))

    def __contains__(self, name: str) -> bool:
        return name in self.found

    def list(self) -> list[Finding]:
        return list(self.found.values())


def loop_findings(fp: Fingerprint, *, contributions: bool = True, weights: bool = True) -> list[Finding]:
    """What is wrong with the learner's loop, read from its fingerprint; empty when it does what the reference does.

    contributions=False leaves out whether each micro-batch's gradient reaches its step (and only its step), and
    weights=False the comparison of each coefficient with the micro-batch's share: for exercises whose gradients
    change on purpose (clipping) or whose scaler mistakes already explain them.
    """
    rec, ref = fp.recording, fp.reference
    findings = _Findings()
    expected = len(ref.sizes)
    if fp.handed_out != expected or -1 in rec.forwards:
        if fp.handed_out != expected:
            one_epoch = ngettext(
                "Your loop took {count} micro-batch from the loader, but one pass over it gives {expected}: use every "
                "micro-batch once.",
                "Your loop took {count} micro-batches from the loader, but one pass over it gives {expected}: use "
                "every micro-batch once.",
                fp.handed_out,
            )
            epochs = ngettext(
                "Your loop took {count} micro-batch from the loader, but {epochs} passes over it give {expected}: "
                "use every micro-batch of every epoch once.",
                "Your loop took {count} micro-batches from the loader, but {epochs} passes over it give "
                "{expected}: "
                "use every micro-batch of every epoch once.",
                fp.handed_out,
            )
            findings.add(
                "micro-batch-count",
                (one_epoch if rec.problem.epochs == 1 else epochs).format(
                    count=fp.handed_out, expected=expected, epochs=rec.problem.epochs
                ),
            )
        if -1 in rec.forwards:
            findings.add(
                "unknown-input",
                _(
                    "Model call {call} was not on a micro-batch from the loader: call the model on each micro-batch x "
                    "as "
                    "it comes."
                ).format(call=rec.forwards.index(-1) + 1),
            )
        return findings.list()
    if rec.weights_changed is not None:  # every gradient after it is taken at other weights: nothing else is read
        if rec.weights_changed <= len(rec.steps):
            message = _(
                "Your code changed the weights itself before optimizer step {step}: only optimizer.step() may change "
                "them (an update of your own, such as `p -= lr * p.grad`, applies the gradient a second time, and "
                "every later gradient is taken at other weights)."
            ).format(step=rec.weights_changed)
        else:
            message = _(
                "Your code changed the weights itself after the last optimizer step: only optimizer.step() may "
                "change them."
            )
        findings.add("weights-changed", message)
        return findings.list()
    if not fp.readings:
        findings.add("no-step", _("optimizer.step() is never called, so the weights never change."))
        return findings.list()
    _structure(fp, findings)
    applied: set[int] = set()  # micro-batches some earlier step applied
    for reading in fp.readings:
        _read_step(fp, reading, applied, findings, contributions, weights)
        applied |= {j for j, c in reading.coefficients.items() if abs(c) > ZERO}
    left = [j for j in range(expected) if j not in applied and j not in {j for r in fp.readings for j in r.fresh}]
    if left and contributions and "off-by-one" not in findings:
        cycle = ref.cycle_of(left[0])
        if ref.is_tail(cycle) and left == cycle:
            _tail_dropped(fp, cycle, findings)
        else:
            findings.add(
                "not-stepped",
                ngettext(
                    "The last micro-batch never reaches an optimizer step.",
                    "The last {count} micro-batches never reach an optimizer step.",
                    len(left),
                ).format(count=len(left)),
            )
    return findings.list()


def _structure(fp: Fingerprint, findings: _Findings) -> None:
    """Findings about where the steps are: after every micro-batch, the off-by-one, or elsewhere."""
    ref = fp.reference
    k = ref.accum_steps
    mine = [r.last for r in fp.readings]
    cycle_ends = [cycle[-1] for cycle in ref.cycles]
    if mine == cycle_ends or mine == [c[-1] for c in ref.cycles if not ref.is_tail(c)]:
        return  # right, or right but for the last cycles (read from the coefficients: dropped or leaked)
    if k > 1 and len(mine) == len(ref.sizes) and all(len(r.fresh) == 1 for r in fp.readings):
        findings.add(
            "step-every-micro-batch",
            _(
                "It steps after every micro-batch: {steps} optimizer steps for {micro_batches} micro-batches, where "
                "the "
                "reference steps once per cycle of {accum_steps} ({reference} steps). Step only when "
                "(step + 1) % accum_steps == 0."
            ).format(steps=len(mine), micro_batches=len(ref.sizes), accum_steps=k, reference=len(ref.cycles)),
        )
        return
    positions = [ref.position[j] for j in mine if j is not None]
    per_epoch = [p for e in sorted(set(ref.epoch_of)) for p in range(ref.epoch_of.count(e)) if p % k == 0]
    if k > 1 and positions == per_epoch:
        left = len(ref.sizes) - len({j for r in fp.readings for j in r.fresh})
        findings.add(
            "off-by-one",
            ngettext(
                "Its first optimizer step comes after 1 micro-batch instead of {accum_steps}: step % accum_steps == 0 "
                "is "
                "already true at step 0. Every cycle is shifted by one, and the last micro-batch never reaches a step. "
                "Step when (step + 1) % accum_steps == 0.",
                "Its first optimizer step comes after 1 micro-batch instead of {accum_steps}: step % accum_steps == 0 "
                "is "
                "already true at step 0. Every cycle is shifted by one, and the last {left} micro-batches never reach "
                "a "
                "step. Step when (step + 1) % accum_steps == 0.",
                left,
            ).format(accum_steps=k, left=left),
        )
        return
    first_epoch = [ref.position[j] + 1 for j in mine if j is not None and ref.epoch_of[j] == 0]
    findings.add(
        "steps-misplaced",
        _(
            "In the first epoch it steps after micro-batches {mine}; the reference steps after {reference}, at the end "
            "of "
            "each cycle of {accum_steps}."
        ).format(
            mine=", ".join(map(str, first_epoch)) or "-",
            accum_steps=k,
            reference=", ".join(str(ref.position[c[-1]] + 1) for c in ref.cycles if ref.epoch_of[c[-1]] == 0),
        ),
    )


def _read_step(
    fp: Fingerprint, r: Reading, applied: set[int], findings: _Findings, contributions: bool, weights: bool
) -> None:
    """Findings about one step: is its gradient made of micro-batches, which ones reach it, and with what weight."""
    ref = fp.reference
    if r.residual > CLOSE:
        findings.add(
            "not-micro-batch-gradients",
            _(
                "The gradient at step {step} is not made of the micro-batches' gradients (the best combination misses "
                "{residual:.1%} of it): each gradient must come from backward() on a micro-batch's loss."
            ).format(step=r.number, residual=r.residual),
        )
        return
    nonzero = {j for j, c in r.coefficients.items() if abs(c) > ZERO}
    if not nonzero:
        rec = fp.recording
        since, until = rec.steps[r.number - 2].forwards if r.number > 1 else 0, rec.steps[r.number - 1].forwards
        zeroed = (until, r.number - 1) in rec.zeros
        backward = any(since <= b <= until for b in rec.backwards)
        reached = any(since <= call < until for call in rec.reached)
        if zeroed:
            message = _(
                "Step {step} sees no gradient at all: zero_grad() runs after the last backward() and before "
                "optimizer.step()."
            )
        elif backward and not reached:
            message = _(
                "Step {step} sees no gradient at all: backward() ran, but on a loss cut off from the model "
                "(by .detach(), by .item() turned back into a tensor, or by torch.no_grad()), so no gradient "
                "reaches the weights. Call backward() on the loss computed from model(x), as it is."
            )
        else:
            message = _("Step {step} sees no gradient at all: no backward() ran before it.")
        findings.add("empty-step", message.format(step=r.number))
        return
    if r.last is None or not contributions:
        return
    epoch = ref.epoch_of[r.last]
    inner = [j for j in r.fresh if ref.epoch_of[j] == epoch]
    crossing = [j for j in r.fresh if ref.epoch_of[j] < epoch]
    stale = sorted(j for j in nonzero & r.earlier if j in applied)
    if stale:
        findings.add(
            "never-zeroed",
            ngettext(
                "Step {step} still holds the gradient of a micro-batch that an earlier step already applied: "
                "zero_grad() never runs after optimizer.step(), so every step adds all the cycles before it again "
                "(its gradient is off by {error:.0%}). Zero the gradients once per cycle, after optimizer.step().",
                "Step {step} still holds the gradients of {stale} micro-batches that earlier steps already applied: "
                "zero_grad() never runs after optimizer.step(), so every step adds all the cycles before it again "
                "(its gradient is off by {error:.0%}). Zero the gradients once per cycle, after optimizer.step().",
                len(stale),
            ).format(step=r.number, stale=len(stale), error=_relative_error(fp, r)),
        )
    leaked = [j for j in crossing if j in nonzero]
    if leaked:
        findings.add(
            "leaked-tail",
            ngettext(
                "The micro-batch left over at the end of epoch {epoch} leaks into the first step of epoch {next_epoch} "
                "(step {step}): nothing steps or zeroes its gradient, so that step holds {held} micro-batches, 1 of "
                "them "
                "from epoch {epoch} (its gradient is off by {error:.0%}). Step the last cycle at the end of each "
                "epoch.",
                "The {count} micro-batches left over at the end of epoch {epoch} leak into the first step of epoch "
                "{next_epoch} (step {step}): nothing steps or zeroes their gradient, so that step holds {held} "
                "micro-batches, {count} of them from epoch {epoch} (its gradient is off by {error:.0%}). Step the last "
                "cycle at the end of each epoch.",
                len(leaked),
            ).format(
                count=len(leaked),
                epoch=ref.epoch_of[leaked[0]] + 1,
                next_epoch=epoch + 1,
                step=r.number,
                held=len(leaked) + len([j for j in inner if j in nonzero]),
                error=_relative_error(fp, r),
            ),
        )
    dropped = [j for j in crossing if j not in nonzero]
    if dropped and ref.is_tail(ref.cycle_of(dropped[0])):
        _tail_dropped(fp, ref.cycle_of(dropped[0]), findings)
    lost = [j for j in inner[:-1] if j not in nonzero]
    if lost:
        if inner[-1] in nonzero and len(lost) == len(inner) - 1:
            findings.add(
                "zeroed-inside",
                ngettext(
                    "Only the last micro-batch before each step reaches it: at step {step} the gradient of the "
                    "micro-batch before it was wiped out (its gradient is off by {error:.0%}), because zero_grad() "
                    "runs "
                    "inside the loop, before each backward(). Zero once per cycle, after optimizer.step().",
                    "Only the last micro-batch before each step reaches it: at step {step} the gradients of the {lost} "
                    "micro-batches before it were wiped out (its gradient is off by {error:.0%}), because zero_grad() "
                    "runs "
                    "inside the loop, before each backward(). Zero once per cycle, after optimizer.step().",
                    len(lost),
                ).format(step=r.number, lost=len(lost), error=_relative_error(fp, r)),
            )
        else:
            findings.add(
                "lost-gradients",
                ngettext(
                    "The gradient of a micro-batch run before step {step} never reaches it.",
                    "The gradients of {lost} micro-batches run before step {step} never reach it.",
                    len(lost),
                ).format(lost=len(lost), step=r.number),
            )
    if weights:
        _check_weights(fp, r, [j for j in inner if j in nonzero], findings)


def _check_weights(fp: Fingerprint, r: Reading, counted: list[int], findings: _Findings) -> None:
    """Compare each counted micro-batch's coefficient with its share; name the first pattern that explains it."""
    ref = fp.reference
    k = ref.accum_steps
    cycle = ref.cycle_of(counted[0]) if counted else []
    if ref.is_tail(cycle) and counted == cycle and not all(_close(r.share(j), ref.weights[j]) for j in cycle):
        micro = fp.recording.problem.micro_batch_size
        if all(_close(r.share(j), ref.sizes[j] / (micro * len(cycle))) for j in cycle):
            samples = sum(ref.sizes[j] for j in cycle)
            findings.add(
                "tail-full-size",
                ngettext(
                    "The last, incomplete cycle (step {step}) is weighted as if its micro-batch held {micro} samples, "
                    "but "
                    "it holds {samples}: it counts {total:.3g} of a step instead of 1. Divide by the samples the cycle "
                    "really holds: the len(y) of its micro-batches, added up.",
                    "The last, incomplete cycle (step {step}) is weighted as if each of its {count} micro-batches held "
                    "{micro} samples ({assumed} in all), but they hold {sizes} ({samples} in all): together they count "
                    "{total:.3g} of a step instead of 1. Divide by the samples the cycle really holds: the len(y) of "
                    "its "
                    "micro-batches, added up.",
                    len(cycle),
                ).format(
                    step=r.number,
                    count=len(cycle),
                    micro=micro,
                    assumed=micro * len(cycle),
                    samples=samples,
                    sizes=", ".join(str(ref.sizes[j]) for j in cycle),
                    total=samples / (micro * len(cycle)),
                ),
            )
            return
    for j in counted:
        c, w = r.share(j), ref.weights[j]
        cycle = ref.cycle_of(j)
        if _close(c, w):
            continue
        if _close(c, 1.0):
            findings.add(
                "missing-division",
                _(
                    "The division is missing: each micro-batch counts {ratio:.3g} times its share, so step {step}'s "
                    "gradient is {ratio:.3g} times too large (with SGD, like a learning rate {ratio:.3g} times too "
                    "high). Divide each micro-batch's loss by accum_steps."
                ).format(ratio=c / w, step=r.number),
            )
        elif ref.is_tail(cycle) and _close(c, 1 / k):
            findings.add(
                "tail-divided-by-steps",
                ngettext(
                    "The last, incomplete cycle (step {step}) has only {count} micro-batch, yet it is still divided by "
                    "accum_steps = {accum_steps}: it counts {total:.2f} of a step instead of 1. Weight each "
                    "micro-batch "
                    "by its samples over the cycle's {samples} samples.",
                    "The last, incomplete cycle (step {step}) has only {count} micro-batches, yet each is still "
                    "divided "
                    "by accum_steps = {accum_steps}: together they count {total:.2f} of a step instead of 1. Weight "
                    "each "
                    "micro-batch by its samples over the cycle's {samples} samples.",
                    len(cycle),
                ).format(
                    step=r.number,
                    count=len(cycle),
                    accum_steps=k,
                    total=len(cycle) / k,
                    samples=sum(ref.sizes[i] for i in cycle),
                ),
            )
        elif ref.is_tail(cycle) and all(_close(r.share(i), 1 / len(cycle)) for i in cycle):
            findings.add(
                "tail-mean-of-means",
                _(
                    "The micro-batches of the last cycle (step {step}) count equally, but they hold different numbers "
                    "of "
                    "samples ({sizes}): a sample in a smaller micro-batch counts more. Weight each micro-batch by its "
                    "samples over the cycle's {samples} samples."
                ).format(
                    step=r.number,
                    sizes=", ".join(str(ref.sizes[i]) for i in cycle),
                    samples=sum(ref.sizes[i] for i in cycle),
                ),
            )
        else:
            findings.add(
                "wrong-weight",
                _(
                    "At step {step}, micro-batch {micro_batch} of epoch {epoch} counts {weight:.3g}, but its share of "
                    "the "
                    "cycle is {share:.3g} ({ratio:.3g} times as much). Multiply each micro-batch's loss by its share: "
                    "1 / accum_steps in a full cycle."
                ).format(
                    step=r.number,
                    micro_batch=ref.position[j] + 1,
                    epoch=ref.epoch_of[j] + 1,
                    weight=c,
                    share=w,
                    ratio=c / w,
                ),
            )


def _tail_dropped(fp: Fingerprint, cycle: list[int], findings: _Findings) -> None:
    ref = fp.reference
    findings.add(
        "tail-dropped",
        ngettext(
            "The last, incomplete cycle of epoch {epoch} is dropped: its micro-batch ({samples} samples) never reaches "
            "an optimizer step. Dropping it, like DataLoader(drop_last=True), is a valid choice in practice, but this "
            "task asks to train on every sample: step once more at the end of each epoch, with what that cycle holds.",
            "The last, incomplete cycle of epoch {epoch} is dropped: its {count} micro-batches ({samples} samples) "
            "never "
            "reach an optimizer step. Dropping it, like DataLoader(drop_last=True), is a valid choice in practice, but "
            "this task asks to train on every sample: step once more at the end of each epoch, with what that cycle "
            "holds.",
            len(cycle),
        ).format(epoch=ref.epoch_of[cycle[0]] + 1, count=len(cycle), samples=sum(ref.sizes[j] for j in cycle)),
    )


def _relative_error(fp: Fingerprint, r: Reading) -> float:
    """|step gradient - full-batch gradient of the cycle ending where the step is| / |the latter|."""
    cycle = fp.reference.cycle_of(r.last)
    full = fp.full_batch_gradient(cycle)
    return ((r.gradient - full).norm() / full.norm()).item()


def trained_gap(
    problem: Problem, call: Callable[[Recording], object], reference: dict, *, amp: bool = False, ddp: bool = False
) -> tuple[float, Exception | None]:
    """Train for real at problem.lr with the learner's code (a Recording with amp, ddp) and with
    accumlib.train(**reference) (once per epoch, on that epoch's samples): the same micro-batches in the same order.

    Returns (largest parameter difference, what the learner's code raised or None).
    """
    recording = Recording(problem, lr=problem.lr, amp=amp, ddp=ddp).run(call)
    exact = problem.model()
    optimizer = torch.optim.SGD(exact.parameters(), lr=problem.lr)
    for epoch in range(problem.epochs):
        train(
            exact,
            problem.data(epoch),
            optimizer,
            micro_batch_size=problem.micro_batch_size,
            accum_steps=problem.accum_steps,
            seed=problem.seed,
            measure_memory=False,
            device="cpu",
            **reference,
        )
    return parameter_gap(recording.module, exact), recording.error
