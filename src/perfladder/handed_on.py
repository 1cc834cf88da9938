"""Names a module hands on from their new home, without importing it (no framework imports).

A name a user imports keeps working when its code moves. Where the new home sits above the old
module (the rungs above the parallel machinery), an import there would reverse the layers:
``handed_on`` gives the old module a ``__getattr__`` that imports the home by name at first use.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable


def handed_on(module: str, home: str, names: tuple[str, ...]) -> Callable[[str], object]:
    """The module-level ``__getattr__`` of ``module``: each of ``names`` is ``home``'s."""
    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(home), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
