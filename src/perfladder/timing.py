"""The sync-correct timer's framework-free core: moved to ``perfladder.measure.timing`` (each
framework's ``throughput`` is ``perfladder.torch.throughput`` / ``perfladder.jax.throughput``);
its names stay importable from here."""
from perfladder.measure.timing import (  # noqa: F401
    DEFAULT_TARGET_SPREAD,
    MIN_MAX_WINDOWS,
    BatchShapeError,
    RecompileError,
    Throughput,
    TimerHooks,
    WindowSettings,
    measure,
    spread_of,
)
