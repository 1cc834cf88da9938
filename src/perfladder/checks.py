"""Argument checks shared by the framework-free modules and both frameworks (no framework imports).

Each returns the value it accepted (as a plain ``int`` / ``float`` / tuple) or raises one
ValueError that names the argument, the bad value and what would have been valid.
Booleans are refused as numbers: ``True`` is an ``int`` to Python, but ``batch_size=True``
is a mistake, not a batch of one. numpy scalars are accepted.
"""
from __future__ import annotations

import math
import numbers


def _int_words(minimum: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")


def check_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an ``int`` if it is an integer >= ``minimum``; a ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}={value!r} must be {_int_words(minimum)}")
    return int(value)


def check_positive(name: str, value) -> float:
    """``value`` as a ``float`` if it is a finite real number > 0; a ValueError naming it otherwise."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or not value > 0):
        raise ValueError(f"{name}={value!r} must be a finite number > 0")
    return float(value)


def check_options(name: str, value, valid: tuple[str, ...]) -> tuple[str, ...]:
    """``value`` (a name or an iterable of names) as a tuple of ``valid`` names in ``valid``'s
    order; a ValueError naming the bad ones and the valid choices otherwise."""
    if isinstance(value, str):
        value = (value,)
    try:
        names = tuple(value)
    except TypeError:
        raise ValueError(f"{name}={value!r} must be a tuple of option names; valid choices: {valid}") from None
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"{name}={names!r}: unknown option(s) {bad}; valid choices: {valid}")
    return tuple(n for n in valid if n in names)
