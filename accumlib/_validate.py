"""Argument checks shared by every module: each error names the parameter, the value and what is valid.

Types are checked strictly: `True` is not the integer 1, `0` is not `False`, the string "no" is not a boolean.
"""
from __future__ import annotations

import functools
import inspect
import numbers

from .i18n import _


def positive_int(name: str, value) -> int:
    """Return `value` if it is an integer >= 1; raise TypeError/ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(_("{name} must be a positive integer (1, 2, 3, ...), got {value!r} of type {type}").format(
            name=name, value=value, type=type(value).__name__))
    if value < 1:
        raise ValueError(_("{name} must be a positive integer (1, 2, 3, ...), got {value!r}").format(
            name=name, value=value))
    return int(value)


def integer(name: str, value, low: int, high: int) -> int:
    """Return `value` if it is an integer with low <= value < high."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(_("{name} must be an integer, got {value!r} of type {type}").format(
            name=name, value=value, type=type(value).__name__))
    if not low <= value < high:
        raise ValueError(_("{name} must be an integer from {low} to {high}, got {value!r}").format(
            name=name, value=value, low=low, high=high - 1))
    return int(value)


def positive_number(name: str, value) -> float:
    """Return `value` as a float if it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(_("{name} must be a positive number, got {value!r} of type {type}").format(
            name=name, value=value, type=type(value).__name__))
    if not 0 < float(value) < float("inf"):
        raise ValueError(_("{name} must be a positive, finite number, got {value!r}").format(name=name, value=value))
    return float(value)


def boolean(name: str, value) -> bool:
    """Return `value` if it is True or False (not 0, 1, "no" or None)."""
    if not isinstance(value, bool):
        raise TypeError(_("{name} must be True or False, got {value!r} of type {type}").format(
            name=name, value=value, type=type(value).__name__))
    return value


def one_of(name: str, value, choices) -> object:
    """Return `value` if it is one of `choices`, of the same type (so 0 is not False and 1.0 is not 1)."""
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        raise ValueError(_("{name} must be one of {choices}; got {value!r}").format(
            name=name, choices=", ".join(repr(c) for c in choices), value=value))
    return value


def function(name: str, value, *, optional: bool = False):
    """Return `value` if it is callable (a function or an object with __call__), not a class; None if optional."""
    if value is None and optional:
        return None
    if isinstance(value, type):
        raise TypeError(_("{name} is the class {cls}, not an instance: pass {cls}() (an instance), or a "
                          "function").format(name=name, cls=value.__name__))
    if not callable(value):
        raise TypeError(_("{name} must be callable (a function), got {value!r} of type {type}").format(
            name=name, value=value, type=type(value).__name__))
    return value


def checked_by(check):
    """Decorator: call check(**arguments) before the function (its arguments bound by name, defaults filled in).

    The undecorated function stays reachable as `__wrapped__`, for a caller that has checked everything itself.
    """
    def decorate(function):
        signature = inspect.signature(function)

        @functools.wraps(function)
        def checked(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            check(**bound.arguments)
            return function(*args, **kwargs)
        return checked
    return decorate
