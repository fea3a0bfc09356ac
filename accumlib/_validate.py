"""Argument checks shared by every module: each error names the parameter, the value and the valid range."""
from __future__ import annotations

import numbers


def positive_int(name: str, value) -> int:
    """Return `value` if it is an integer >= 1; raise TypeError/ValueError naming `name` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer (1, 2, 3, ...), got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (1, 2, 3, ...), got {value!r}")
    return int(value)


def positive_number(name: str, value) -> float:
    """Return `value` as a float if it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r} of type {type(value).__name__}")
    if not 0 < float(value) < float("inf"):
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    return float(value)


def one_of(name: str, value, choices) -> object:
    """Return `value` if it is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value
