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
