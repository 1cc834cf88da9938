"""Moved to ``perfladder.ahead.torch`` (the compile-ahead annex lives behind one door,
``perfladder.ahead``); these names stay importable from here."""
from perfladder.ahead.torch import (  # noqa: F401
    CALLS,
    STOP_GRACE_S,
    TIMEOUT_S,
    by_default,
    compile_ahead,
    compiles,
    default_workers,
    device_room,
    forget_tuning,
    ladder_ahead,
    stage,
    stop_all,
    summary,
)
