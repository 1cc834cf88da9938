"""Run a ladder's steps in order, telling a progress callback about each (framework-free)."""
from __future__ import annotations

from typing import Callable, Iterable


def drive(steps: Iterable[tuple[str, Callable[[], object]]], progress=None) -> list:
    """Call each ``(name, thunk)`` in order and return their results.

    ``progress(event, name, result)`` (optional) hears ``("start", name, None)`` before and
    ``("end", name, result)`` after each; the CLI draws its progress display from these.
    """
    out = []
    for name, thunk in steps:
        if progress:
            progress("start", name, None)
        result = thunk()
        if progress:
            progress("end", name, result)
        out.append(result)
    return out
