"""Argument checks shared by every module: each error names the parameter, the value and what is valid.

Types are checked strictly: `True` is not the integer 1, `0` is not `False`, the string "no" is not a boolean.
Numbers are taken as Python converts them (`operator.index` for an integer, `float()` for a real): NumPy scalars
and 0-d tensors too; a count past `sys.maxsize`, or a real past float's range, is refused by name.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import operator
import re
import sys

import torch

from .i18n import N_, _

# the largest count a run can use: Python's limit on an index or a length (itertools.islice, range, len)
LARGEST = sys.maxsize


class Shown:
    """`value` as an error message shows it (`{value!r}`): its repr on one line, shortened in the middle past 80
    characters (an integer of 400 digits, a tensor, a long list), so that a message stays readable."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        text = re.sub(r"\s*\n\s*", " ", repr(self.value))  # a tensor's repr spans lines
        return text if len(text) <= 80 else f"{text[:38]}...{text[-38:]} ({len(text)} characters)"


def _is_bool(value) -> bool:
    """True for what Python, NumPy or torch hold as a truth value: True, numpy.bool_, a bool tensor."""
    return (
        isinstance(value, bool)
        or type(value).__module__ == "numpy"
        and type(value).__name__ in ("bool", "bool_")
        or isinstance(value, torch.Tensor)
        and value.dtype == torch.bool
    )


def as_integer(value) -> int | None:
    """`value` as a Python int when Python would take it as one (`operator.index`: an int, a NumPy integer, a 0-d
    integer tensor), else None; never a truth value (True, numpy.bool_, a bool tensor) or a tensor with a shape."""
    if _is_bool(value) or isinstance(value, torch.Tensor) and value.dim() != 0:
        return None
    try:
        return operator.index(value)
    except (TypeError, RuntimeError):  # RuntimeError: a tensor without values (the meta device)
        return None


def as_real(value) -> float | None:
    """`value` as a Python float when it is a real number Python converts with float() (an int, a float, a NumPy
    number, a 0-d real tensor), else None; never a truth value, a string, a complex number or a tensor with a
    shape. An integer too large for a float is float('inf') (what it is past)."""
    if _is_bool(value) or isinstance(value, torch.Tensor) and (value.dim() != 0 or value.is_complex()):
        return None
    if not isinstance(value, (numbers.Real, torch.Tensor)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past float's range
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError, RuntimeError):
        return None


def _integer_in(name: str, value, low: int, high: float, not_integer: str, out_of_range: str) -> int:
    """Return `value` as an int if Python takes it as an integer (`as_integer`) with low <= value < high; otherwise
    raise TypeError(not_integer) or ValueError(out_of_range), two catalogue messages (marked N_) with the fields
    name, value, type, low and high (the largest valid value). Without an upper bound (high = inf), a value past
    `LARGEST` is refused as more than a run can use."""
    number = as_integer(value)
    if number is None:
        raise TypeError(_(not_integer).format(name=name, value=Shown(value), type=type(value).__name__))
    if high == math.inf and number > LARGEST:
        raise ValueError(
            _(
                "{name}={value!r} is more than a run can use: valid up to {high} (sys.maxsize, Python's largest index)"
            ).format(name=name, value=Shown(value), high=LARGEST)
        )
    if not low <= number < high:
        raise ValueError(_(out_of_range).format(name=name, value=Shown(value), low=low, high=high - 1))
    return number


def positive_int(name: str, value) -> int:
    """Return `value` if it is an integer >= 1; raise TypeError/ValueError naming `name` otherwise."""
    return _integer_in(
        name,
        value,
        1,
        math.inf,
        N_("{name} must be a positive integer (1, 2, 3, ...), got {value!r} of type {type}"),
        N_("{name} must be a positive integer (1, 2, 3, ...), got {value!r}"),
    )


def integer(name: str, value, low: int, high: int) -> int:
    """Return `value` if it is an integer with low <= value < high."""
    return _integer_in(
        name,
        value,
        low,
        high,
        N_("{name} must be an integer, got {value!r} of type {type}"),
        N_("{name} must be an integer from {low} to {high}, got {value!r}"),
    )


def non_negative_int(name: str, value) -> int:
    """Return `value` if it is an integer >= 0."""
    return _integer_in(
        name,
        value,
        0,
        math.inf,
        N_("{name} must be an integer >= 0 (0, 1, 2, ...), got {value!r} of type {type}"),
        N_("{name} must be an integer >= 0 (0, 1, 2, ...), got {value!r}"),
    )


def positive_number(name: str, value) -> float:
    """Return `value` as a float if it is a finite real number > 0 (`as_real`: NumPy numbers and 0-d tensors too)."""
    number = as_real(value)
    if number is None:
        raise TypeError(
            _("{name} must be a positive number, got {value!r} of type {type}").format(
                name=name, value=Shown(value), type=type(value).__name__
            )
        )
    if not 0 < number < math.inf:
        raise ValueError(
            _("{name} must be a positive, finite number, got {value!r}").format(name=name, value=Shown(value))
        )
    return number


def boolean(name: str, value) -> bool:
    """Return `value` if it is True or False (not 0, 1, "no" or None)."""
    if not isinstance(value, bool):
        raise TypeError(
            _("{name} must be True or False, got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__
            )
        )
    return value


def one_of(name: str, value, choices) -> object:
    """Return `value` if it is one of `choices`, of the same type (so 0 is not False and 1.0 is not 1)."""
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        raise ValueError(
            _("{name} must be one of {choices}; got {value!r}").format(
                name=name, choices=", ".join(repr(c) for c in choices), value=value
            )
        )
    return value


def function(name: str, value, *, optional: bool = False):
    """Return `value` if it is callable (a function or an object with __call__), not a class; None if optional."""
    if value is None and optional:
        return None
    if isinstance(value, type):
        raise TypeError(
            _("{name} is the class {cls}, not an instance: pass {cls}() (an instance), or a function").format(
                name=name, cls=value.__name__
            )
        )
    if not callable(value):
        raise TypeError(
            _("{name} must be callable (a function), got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__
            )
        )
    return value


def module(name: str, value):
    """Return `value` if it is a torch.nn.Module instance (not the class)."""
    if isinstance(value, type) and issubclass(value, torch.nn.Module):
        raise TypeError(
            _("{name} must be a model instance, got the class {cls}: call it, e.g. {cls}(...)").format(
                name=name, cls=value.__name__
            )
        )
    if not isinstance(value, torch.nn.Module):
        raise TypeError(
            _("{name} must be a torch.nn.Module, got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__
            )
        )
    return value


def trainable_parameters(name: str, model) -> list:
    """The parameters of `model` that require gradients; raise naming `name` when there are none."""
    params = [p for p in module(name, model).parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            _(
                "{name} has no trainable parameters (none with requires_grad=True): a training step needs at least one"
            ).format(name=name)
        )
    return params


def samples(name: str, x, y_name: str | None = None, y=None) -> None:
    """Check that `x` (and `y`) are tensors with a batch dimension of at least one sample (the same for both)."""
    for n, t in ((name, x), (y_name, y)) if y_name is not None else ((name, x),):
        if isinstance(t, dict):
            raise TypeError(
                _(
                    "{name} is a dict (keys {keys}): accumlib takes tensors, so pass the tensors "
                    "themselves, e.g. batch['input_ids'] and batch['labels'], with a loss_fn that takes "
                    "(model output, y)"
                ).format(name=n, keys=", ".join(map(repr, t)))
            )
        if not isinstance(t, torch.Tensor):
            raise TypeError(_("{name} must be a torch.Tensor, got {type}").format(name=n, type=type(t).__name__))
        if t.dim() == 0 or len(t) == 0:
            raise ValueError(
                _("{name} must hold at least one sample along its first dimension, got shape {shape}").format(
                    name=n, shape=tuple(t.shape)
                )
            )
    if y_name is not None and len(x) != len(y):
        raise ValueError(
            _("{name} has {n} samples but {y_name} has {m}; they must have the same length").format(
                name=name, n=len(x), y_name=y_name, m=len(y)
            )
        )


def pair(name: str, value) -> tuple:
    """Return `value` as (x, y) if it is a tuple or list of two tensors of the same length (at least one sample)."""
    if isinstance(value, dict) or not isinstance(value, (tuple, list)) or len(value) != 2:
        if isinstance(value, dict):
            described = _("a dict (keys {keys}): pass (batch['input_ids'], batch['labels'])").format(
                keys=", ".join(map(repr, value))
            )
        elif isinstance(value, torch.Tensor):
            described = _("one tensor of shape {shape}: pass the inputs and the targets, (x, y)").format(
                shape=tuple(value.shape)
            )
        elif isinstance(value, (tuple, list)):
            described = _("a {type} of {n} items").format(type=type(value).__name__, n=len(value))
        else:
            described = f"{type(value).__name__}"
        raise TypeError(
            _("{name} must be a tuple (x, y) of two tensors, got {described}").format(name=name, described=described)
        )
    x, y = value
    samples(f"{name}[0] (x)", x, f"{name}[1] (y)", y)
    return x, y


def optimizer_or_none(name: str, value):
    """Return `value` if it is None or a torch.optim.Optimizer instance (not the class) whose step() needs no
    closure (LBFGS re-evaluates the loss itself, which accumulation cannot give it)."""
    if isinstance(value, type):
        raise TypeError(
            _("{name} must be an optimizer instance, got the class {cls}: pass {cls}(model.parameters(), ...)").format(
                name=name, cls=value.__name__
            )
        )
    if value is not None and not isinstance(value, torch.optim.Optimizer):
        raise TypeError(
            _("{name} must be a torch.optim.Optimizer or None, got {value!r} of type {type}").format(
                name=name, value=value, type=type(value).__name__
            )
        )
    closure = inspect.signature(type(value).step).parameters.get("closure") if value is not None else None
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise ValueError(
            _(
                "{name} is a {type}, whose step() needs a closure that recomputes the loss; an "
                "accumulated step has none: use an optimizer such as SGD or Adam"
            ).format(name=name, type=type(value).__name__)
        )
    return value


def optimizer_fn(name: str, value, *, lr: float):
    """Return `value` if it can be a function from parameters to an optimizer (callable, not an optimizer itself);
    the refusal shows one, with SGD at learning rate `lr`."""
    if not callable(value) or isinstance(value, torch.optim.Optimizer):
        raise TypeError(
            _(
                "{name} must be a function from parameters to an optimizer, e.g. lambda params: "
                "torch.optim.SGD(params, lr={lr}), got {type}"
            ).format(name=name, lr=lr, type=type(value).__name__)
        )
    return value


def made_optimizer(name: str, optimizer):
    """Return what the function `name` made if it is a torch.optim.Optimizer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            _("{name} must return a torch.optim.Optimizer, returned {type}").format(
                name=name, type=type(optimizer).__name__
            )
        )
    return optimizer


def not_optimizer(function: str, order: str, name: str, value) -> None:
    """Refuse an optimizer given as `name`, the data's place in `function` (its parameters: `order`): accumlib 0.x
    took the optimizer before the data; 1.0 takes it after them, as `train` does."""
    if isinstance(value, torch.optim.Optimizer):
        raise TypeError(
            _(
                "{function} takes ({order}): the optimizer comes after the data, as in train(model, data, "
                "optimizer); got an optimizer ({type}) as {name}"
            ).format(function=function, order=order, type=type(value).__name__, name=name)
        )


RENAMED = {"budget_bytes": "memory_budget"}  # 0.x's keyword: its 1.0 name (train's word for the idea)


def renamed(fn):
    """Decorate `fn`, one of whose keywords accumlib 0.x called otherwise (`RENAMED`): a call with the old keyword
    is refused naming the new one and the value to pass, before anything runs."""

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        for old in RENAMED.keys() & kwargs.keys():
            raise TypeError(
                _(
                    "{function}: {old} is called {new} since accumlib 1.0, as in train({new}=...); pass {new}={value!r}"
                ).format(function=fn.__name__, old=old, new=RENAMED[old], value=kwargs[old])
            )
        return fn(*args, **kwargs)

    return checked


def new_order(fn):
    """Decorate `fn`, which accumlib 0.x took with more positional arguments, in another order: a call with more
    positional arguments than it takes is refused naming its parameters, before anything runs."""
    parameters = inspect.signature(fn).parameters.values()
    positional = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters)
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    order = ", ".join(
        ("*, " if p.kind is p.KEYWORD_ONLY and i == positional else "") + stars.get(p.kind, "") + p.name
        for i, p in enumerate(parameters)
    )

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if len(args) > positional:
            raise TypeError(
                _(
                    "{function} takes ({order}): {n} positional arguments were given, in the order of accumlib "
                    "0.x; pass the ones after the first {positional} by name"
                ).format(function=fn.__name__, order=order, n=len(args), positional=positional)
            )
        return fn(*args, **kwargs)

    return checked
