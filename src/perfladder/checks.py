"""Argument checks shared by the framework-free modules and both frameworks (no framework imports)."""
from __future__ import annotations

import numbers


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an ``int`` if it is an integer >= ``minimum``; a ValueError naming it otherwise.

    Booleans are refused: ``True`` is an ``int`` to Python, but ``batch_size=True`` is a
    mistake, not a batch of one. numpy integers are accepted.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


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
