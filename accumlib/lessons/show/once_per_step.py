"""Lesson 8: the scheduler, clipping and the GradScaler belong to the optimizer step.

Each function takes the lesson's own training run as a function of the mistake (`run(per_micro_batch)` or
`run(**switches)` of `pitfalls.classic_train`), runs it the right way and the wrong way, and prints what differs:
the learning rates, the norm of the gradient each optimizer step used, what PyTorch raised or warned. The gradient
an optimizer step uses is read by a hook that runs just before every `optimizer.step()` (`step_gradients`).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import plots
from ...i18n import _, pgettext
from ...gaps import parameter_gap
from ._format import figure, print_table

# The GradScaler calls of the optimizer step that lesson 8 moves into the micro-batch loop, one or both at a time
# (pitfalls.classic_train's switches), after the right loop (no switch).
SCALER_MISTAKES = (
    {},
    {"unscale_per_micro_batch": True},
    {"update_per_micro_batch": True},
    {"unscale_per_micro_batch": True, "update_per_micro_batch": True},
)
_CALLS = {"unscale_per_micro_batch": "unscale_()", "update_per_micro_batch": "update()"}


@contextlib.contextmanager
def step_gradients():
    """Record, for every optimizer step taken inside the block (any optimizer), the gradient it used: one flat
    float64 copy of all its parameters' gradients per step, appended to the list the block gets. A step that a
    GradScaler skips (inf or NaN in the gradient) calls no optimizer.step() and records nothing."""
    gradients: list[torch.Tensor] = []

    def record(optimizer, args, kwargs):
        grads = [p.grad.flatten() for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        where = optimizer.param_groups[0]["params"][0].device if optimizer.param_groups[0]["params"] else None
        gradients.append(torch.cat(grads).double() if grads else torch.zeros(0, dtype=torch.float64, device=where))

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield gradients
    finally:
        handle.remove()


def _first_sentence(message: str) -> str:
    return message.split(". ")[0].rstrip(".") + "."


def pytorch_says(message: str) -> str:
    """One of PyTorch's own messages, as PyTorch words it (in English, in every language), followed by what it means
    where the course language's catalogue explains it; in English the message is shown alone."""
    meanings = {  # the messages this lesson shows; the catalogue's translation of each is its meaning
        "Detected call of `lr_scheduler.step()` before `optimizer.step()`.": pgettext(
            "what a PyTorch message means", "Detected call of `lr_scheduler.step()` before `optimizer.step()`."
        ),
        "unscale_() has already been called on this optimizer since the last update().": pgettext(
            "what a PyTorch message means",
            "unscale_() has already been called on this optimizer since the last update().",
        ),
        "No inf checks were recorded prior to update.": pgettext(
            "what a PyTorch message means", "No inf checks were recorded prior to update."
        ),
    }
    meaning = meanings.get(message, message)
    return (
        message if meaning == message else _("{message} (that is: {meaning})").format(message=message, meaning=meaning)
    )


def schedules(run: Callable[[bool], list[float]], *, shown_steps: int = 6) -> dict[bool, list[float]]:
    """The scheduler stepped once per optimizer step against after every micro-batch.

    run(per_micro_batch) trains with a fresh scheduler and returns the learning rate of each optimizer step.
    Prints the first `shown_steps` learning rates of both, when the fast schedule reaches the last learning rate of
    the right one (and whether it climbs again after), and what PyTorch warned; draws both schedules. Returns
    {per_micro_batch: learning rates}.
    """
    rates, warned = {}, {}
    for per_micro_batch in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rates[per_micro_batch] = list(run(per_micro_batch))
        warned[per_micro_batch] = [_first_sentence(str(w.message)) for w in caught]
    right, fast = rates[False], rates[True]
    steps, last = len(right), right[-1]
    reached = next((i for i, lr in enumerate(fast) if lr <= last * (1 + 1e-9)), None)
    labels = {False: _("once per optimizer step"), True: _("after every micro-batch")}
    print_table(
        [_("scheduler.step()"), *(_("step {number}").format(number=i) for i in range(1, shown_steps + 1))],
        [[labels[key], *(f"{lr:.3f}" for lr in rates[key][:shown_steps])] for key in (False, True)],
    )
    for key in (False, True):
        for message in warned[key]:
            print(
                _("PyTorch warned while the scheduler stepped {how}: {message}").format(
                    how=labels[key], message=pytorch_says(message)
                )
            )
    if reached is None:
        finding = _(
            "With the scheduler stepped after every micro-batch, the learning rate never falls to {low:.3f}, "
            "the last learning rate of the schedule stepped once per optimizer step (step {slow})."
        ).format(low=last, slow=steps)
    elif max(fast[reached:]) > fast[reached]:
        finding = _(
            "With the scheduler stepped after every micro-batch, the learning rate falls to {low:.3f} by step "
            "{fast} instead of step {slow}, then climbs back to {peak:.3f}."
        ).format(low=last, fast=reached + 1, slow=steps, peak=max(fast[reached:]))
    else:
        finding = _(
            "With the scheduler stepped after every micro-batch, the learning rate falls to {low:.3f} by step "
            "{fast} instead of step {slow}."
        ).format(low=last, fast=reached + 1, slow=steps)
    print(finding)
    alt = _(
        "Line chart of the learning rate of each of {steps} optimizer steps: stepped once per optimizer step, "
        "the schedule falls from {start:.3f} to {low:.3f}; stepped after every micro-batch, it starts at "
        "{fast_start:.3f} and ranges from {fast_low:.3f} to {fast_high:.3f}."
    ).format(steps=steps, start=right[0], low=last, fast_start=fast[0], fast_low=min(fast), fast_high=max(fast))
    xs = list(range(1, steps + 1))
    figure(
        plots.lines(
            {labels[key]: (xs, rates[key]) for key in (False, True)},
            _("optimizer step"),
            _("learning rate"),
            finding.rstrip("."),
            alt,
        )
    )
    return rates


def clipping(run: Callable[[bool], torch.nn.Module], *, max_norm: float) -> dict[bool, list[torch.Tensor]]:
    """Clipping once per optimizer step against inside the micro-batch loop (after every backward()).

    run(per_micro_batch) trains a fresh model with clip_grad_norm=max_norm and returns it; both runs start from the
    same weights and see the same micro-batches, so their first optimizer steps use comparable gradients. Prints the
    norms of the gradients the steps used, how far step 1's gradient is from the right one, and how far apart the
    runs' weights ended. Returns {per_micro_batch: the gradient (flat) of each optimizer step}.
    """
    gradients, models = {}, {}
    for per_micro_batch in (False, True):
        with step_gradients() as seen:
            models[per_micro_batch] = run(per_micro_batch)
        gradients[per_micro_batch] = seen
    for per_micro_batch, message in (
        (
            False,
            _(
                "Clipped once per optimizer step: the {steps} steps used gradients of "
                "norm {low:.4f} to {high:.4f} (max_norm = {max_norm:g})."
            ),
        ),
        (
            True,
            _(
                "Clipped after every micro-batch: the {steps} steps used gradients of "
                "norm {low:.4f} to {high:.4f} (max_norm = {max_norm:g})."
            ),
        ),
    ):
        norms = [g.norm().item() for g in gradients[per_micro_batch]]
        print(message.format(steps=len(norms), low=min(norms), high=max(norms), max_norm=max_norm))
    right, wrong = gradients[False][0], gradients[True][0]
    print(
        _(
            "Step 1, same weights, same micro-batches: the gradient clipped after every micro-batch differs from the "
            "right one by {share:.0%} of the right one's length."
        ).format(share=((wrong - right).norm() / right.norm()).item())
    )
    print(
        _("The two runs' weights differ by up to {gap:.1e} after {steps} steps.").format(
            gap=parameter_gap(models[True], models[False]), steps=len(gradients[True])
        )
    )
    return gradients


@dataclass(frozen=True)
class ScalerOutcome:
    """What one GradScaler placement did: the exception it raised (None if it trained) and the gradient norm of
    each optimizer step it took."""

    switches: dict
    error: BaseException | None
    step_norms: list[float]


def scaler_mistakes(run: Callable[..., object]) -> list[ScalerOutcome]:
    """Which GradScaler calls PyTorch refuses when they run after every micro-batch, and which run silently.

    run(**switches) trains a fresh model with a GradScaler through `pitfalls.classic_train(..., **switches)`; it is
    called once per entry of SCALER_MISTAKES, the right loop first. Prints one row per placement (what ran after
    every micro-batch, what happened, step 1's gradient against the right loop's), PyTorch's messages and the
    finding. Returns the outcomes in SCALER_MISTAKES's order.
    """
    outcomes = []
    for switches in SCALER_MISTAKES:
        with step_gradients() as seen:
            try:
                run(**switches)
                error = None
            except (RuntimeError, AssertionError) as raised:
                error = raised
        outcomes.append(ScalerOutcome(dict(switches), error, [g.norm().item() for g in seen]))
    right = outcomes[0].step_norms[0]
    rows = []
    for outcome in outcomes:
        calls = ", ".join(_CALLS[name] for name in outcome.switches) or _("nothing: all once per step")
        if outcome.error is not None:
            happens = _("PyTorch raises {error}").format(error=type(outcome.error).__name__)
            ratio = "-"
        else:
            happens = _("trains") if not outcome.switches else _("trains, silently")
            ratio = f"{outcome.step_norms[0] / right:.1e}"
        rows.append([calls, happens, ratio])
    print_table([_("after every micro-batch"), _("what happens"), _("step 1's gradient / the right one")], rows)
    for outcome in outcomes:
        if outcome.error is not None:
            print(f"{type(outcome.error).__name__}: {pytorch_says(str(outcome.error))}")
    silent = [o for o in outcomes[1:] if o.error is None]
    for outcome in silent:
        print(
            _(
                "Silent: with {calls} after every micro-batch, step 1's gradient is {ratio:.1e} times the right one "
                "(its norm {norm:.2e} instead of {right:.2e})."
            ).format(
                calls=" + ".join(_CALLS[name] for name in outcome.switches),
                ratio=outcome.step_norms[0] / right,
                norm=outcome.step_norms[0],
                right=right,
            )
        )
    return outcomes


def unreached(model: torch.nn.Sequential, X: torch.Tensor) -> torch.Tensor:
    """Per entry of the flattened gradient of a perceptron (Linear, ReLU, Linear, as models.mlp) on the samples X,
    whether no sample reaches it: a first-layer weight from an input that is 0 in every sample where its hidden unit
    is active, or a weight or bias to or from a hidden unit that ReLU switches off in every sample. The gradient of
    such an entry is exactly 0 in any dtype: a sum of products with a 0 in each."""
    first, _relu, last = model
    with torch.no_grad():
        active = first(X) > 0  # per sample, the hidden units ReLU lets through
    inputs, off = X != 0, ~active.any(0)
    return torch.cat(
        [
            (active.T.double() @ inputs.double() == 0).flatten(),
            off,  # layer 1: weights, biases
            off.repeat(last.out_features),
            torch.zeros(last.out_features, dtype=torch.bool, device=X.device),
        ]
    )  # layer 2


def zeros_explained(found: dict[str, torch.Tensor], model: torch.nn.Sequential, X: torch.Tensor) -> dict[str, int]:
    """Print how many gradient entries no sample reaches (`unreached`) and how many each type of `found` (its name ->
    which entries came out exactly 0) rounds to 0 beyond them; return those counts."""
    mask = unreached(model, X)
    inputs, hidden = model[0].in_features, model[0].out_features
    with torch.no_grad():
        units_off = int((~(model[0](X) > 0).any(0)).sum())
    beyond = {name: int((zero & ~mask).sum()) for name, zero in found.items()}
    counts = ", ".join(f"{name} {count:,}" for name, count in beyond.items())
    values = dict(
        share=mask.double().mean().item(),
        pixels=int((~(X != 0).any(0)).sum()),
        inputs=inputs,
        samples=len(X),
        units=units_off,
        hidden=hidden,
        counts=counts,
    )
    if all(bool(zero[mask].all()) for zero in found.values()):
        print(
            _(
                "No sample reaches {share:.1%} of the entries ({pixels} of {inputs} pixels are 0 in all {samples} "
                "samples, {units} of {hidden} hidden units are off in all {samples}): their gradient is 0 in every "
                "type. Rounded to 0 beyond those: {counts}."
            ).format(**values)
        )
    else:
        print(
            _(
                "No sample reaches {share:.1%} of the entries ({pixels} of {inputs} pixels are 0 in all {samples} "
                "samples, {units} of {hidden} hidden units are off in all {samples}), but not every type gives "
                "them a gradient of 0. Rounded to 0 beyond those: {counts}."
            ).format(**values)
        )
    return beyond
