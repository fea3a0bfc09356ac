"""The real runs behind the quiz's "predict, then run it" questions.

Each experiment trains or measures with accumlib itself and returns its numbers (a dict); `RUNS` pairs it with the
message that shows them (English, marked for the catalogue; the quiz formats it in its own language). Every run
takes under two seconds on one CPU core: float64 where a difference is compared with rounding error. Each runs on
`device` (default: `accumlib.devices.pick()`, the device the lesson chose): every model and tensor is put there.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ... import devices, memory
from .. import data, models
from ...i18n import N_
from ...gaps import gradient_gap, parameter_gap
from ...loop import train


def _device(device) -> torch.device:
    return devices.pick() if device is None else torch.device(device)


def _snapshots(model, dataset, optimizer, device, **kwargs) -> list[dict]:
    """Train with accumlib.train on `device`; return the model's state after every optimizer step (copies)."""
    states = []
    train(
        model,
        dataset,
        optimizer,
        device=device,
        on_step=lambda _: states.append({k: v.detach().clone() for k, v in model.state_dict().items()}),
        measure_memory=False,
        **kwargs,
    )
    return states


def classic_division_last_cycle(device=None) -> dict:
    """50 samples, micro-batch 4, accum_steps 3, one epoch (5 steps: 4 full cycles of 12, then 2 samples).

    Largest weight difference from training with batches of 12, after the 4 full cycles and after the last one,
    for loss / accum_steps (the classic recipe, the last cycle stepped too) and for accumlib's weighting by samples.
    """
    device = _device(device)
    X, y = (t.to(device) for t in data.digits(50, flat=True, dtype=torch.float64))

    def run(micro_batch_size, accum_steps, normalize):
        model = models.mlp(dtype=torch.float64).to(device)
        return _snapshots(
            model,
            (X, y),
            torch.optim.SGD(model.parameters(), lr=0.5),
            device,
            micro_batch_size=micro_batch_size,
            accum_steps=accum_steps,
            normalize=normalize,
        )

    full, classic, weighted = run(12, 1, "samples"), run(4, 3, "steps"), run(4, 3, "samples")
    return {
        "steps": len(full),
        "full_cycles": parameter_gap(classic[-2], full[-2]),
        "classic": parameter_gap(classic[-1], full[-1]),
        "weighted": parameter_gap(weighted[-1], full[-1]),
    }


def no_division_sgd_adam(device=None) -> dict:
    """256 digits, micro-batch 16, accum_steps 4, 2 epochs (8 steps), with SGD and with Adam.

    Forgetting the division is a loss accum_steps times too large: for each optimizer, the largest weight
    difference between that run and the one that divides, next to how far the weights moved in the run that divides;
    and for SGD ("sgd_larger_lr"), the difference between forgetting the division and dividing with an accum_steps
    times larger learning rate (rounding error only: for plain SGD they are the same thing).
    """
    device = _device(device)
    X, y = (t.to(device) for t in data.digits(256, flat=True, dtype=torch.float64))
    accum_steps = 4
    result = {"steps": 2 * len(X) // (16 * accum_steps), "accum_steps": accum_steps}

    def run(optimizer, lr: float, forgot: bool) -> dict:
        model = models.mlp(dtype=torch.float64).to(device)
        loss_fn = (lambda out, target: accum_steps * F.cross_entropy(out, target)) if forgot else F.cross_entropy
        return _snapshots(
            model,
            (X, y),
            optimizer(model.parameters(), lr=lr),
            device,
            micro_batch_size=16,
            accum_steps=accum_steps,
            epochs=2,
            loss_fn=loss_fn,
        )[-1]

    initial = models.mlp(dtype=torch.float64).to(device).state_dict()
    for name, optimizer, lr in (("sgd", torch.optim.SGD, 0.1), ("adam", torch.optim.Adam, 1e-3)):
        divided = run(optimizer, lr, forgot=False)
        result[name] = parameter_gap(run(optimizer, lr, forgot=True), divided)
        result[f"{name}_moved"] = parameter_gap(divided, initial)
    result["sgd_larger_lr"] = parameter_gap(
        run(torch.optim.SGD, 0.1, forgot=True), run(torch.optim.SGD, 0.1 * accum_steps, forgot=False)
    )
    return result


def memory_categories(device=None) -> dict:
    """The lessons' CNN with Adam: bytes by category at the peak of one step, one batch of 64 against 8 x 8."""
    device = _device(device)
    X, y = (t.to(device) for t in data.digits(64))
    model = models.cnn().to(device)
    optimizer = torch.optim.Adam(model.parameters())
    reports = {
        "one": memory.measure_step(model, X, y, optimizer=optimizer),
        "split": memory.measure_step(model, X[:8], y[:8], optimizer=optimizer, accum_steps=8),
    }
    return {
        f"{category.replace(' ', '_')}_{name}": report.categories()[category]
        for name, report in reports.items()
        for category in memory.CATEGORIES
    } | {f"peak_{name}": report.peak for name, report in reports.items()}


def batchnorm_gradient_gap(device=None) -> dict:
    """gradient_gap of 4 micro-batches of 16 against the batch of 64, for the lessons' CNN with BatchNorm and with
    GroupNorm, in float64 so that GroupNorm's gap is rounding error only."""
    device = _device(device)
    X, y = (t.to(device) for t in data.digits(64, dtype=torch.float64))
    return {
        norm: gradient_gap(
            models.cnn(norm=norm, dtype=torch.float64).to(device), X, y, accum_steps=4, loss_fn=F.cross_entropy
        )
        for norm in ("batch", "group")
    }


# name in questions.json -> (the experiment, the message that shows its numbers)
RUNS = {
    "classic_division_last_cycle": (
        classic_division_last_cycle,
        N_(
            "50 samples, micro-batch 4, accum_steps 3: {steps} optimizer steps, the last with 2 samples.\n"
            "Largest weight difference from training with batches of 12:\n"
            "  loss / accum_steps, after the 4 full cycles: {full_cycles:.1e}\n"
            "  loss / accum_steps, after the last, short cycle: {classic:.1e}\n"
            "  weighted by samples (accumlib), at the end: {weighted:.1e}"
        ),
    ),
    "no_division_sgd_adam": (
        no_division_sgd_adam,
        N_(
            "accum_steps 4, {steps} optimizer steps. Largest weight difference between forgetting the division "
            "and dividing:\n"
            "  SGD: {sgd:.1e} (the weights moved by up to {sgd_moved:.1e})\n"
            "  Adam: {adam:.1e} (the weights moved by up to {adam_moved:.1e})"
        ),
    ),
    "memory_categories": (
        memory_categories,
        N_(
            "Bytes alive at the peak of one step: one batch of 64 → 8 micro-batches of 8\n"
            "  parameters: {parameters_one:,} → {parameters_split:,}\n"
            "  gradients: {gradients_one:,} → {gradients_split:,}\n"
            "  optimizer state: {optimizer_state_one:,} → {optimizer_state_split:,}\n"
            "  inputs: {inputs_one:,} → {inputs_split:,}\n"
            "  activations: {activations_one:,} → {activations_split:,}\n"
            "  activation gradients: {activation_gradients_one:,} → {activation_gradients_split:,}\n"
            "  peak: {peak_one:,} → {peak_split:,}"
        ),
    ),
    "batchnorm_gradient_gap": (
        batchnorm_gradient_gap,
        N_(
            "Largest |accumulated gradient - full-batch gradient|, 4 micro-batches of 16 against 64:\n"
            "  BatchNorm: {batch:.1e}\n"
            "  GroupNorm: {group:.1e}"
        ),
    ),
}
