"""Moved to ``perfladder.ahead.expected`` (the compile-ahead annex lives behind one door,
``perfladder.ahead``); these names stay importable from here."""
from perfladder.ahead import AHEAD_DIR_ENV, done_ahead  # noqa: F401
from perfladder.ahead.expected import (  # noqa: F401
    COLD,
    CONTEXT_BYTES,
    FLIP_SHARE,
    HELPER_BYTES,
    committed_runs,
    expected_costs,
    expected_needs,
    expected_recipes,
    guess,
    rung_of,
    summary,
    undecided,
)
