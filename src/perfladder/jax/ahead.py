"""Moved to ``perfladder.ahead.jax`` (the compile-ahead annex lives behind one door,
``perfladder.ahead``); these names stay importable from here."""
from perfladder.ahead.jax import (  # noqa: F401
    TIMEOUT_S,
    by_default,
    compile_ahead,
    compiles,
    expected_jobs,
    ladder_ahead,
    stage,
    summary,
)
