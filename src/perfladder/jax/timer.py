"""JAX's side of the measurement: the sync, the compile counter, and what we run on.

``throughput`` is ``perfladder.timing.measure`` with

* ``sync = jax.block_until_ready`` on the step's output (dispatch is asynchronous: without
  it a window would time how fast Python enqueues work, not how fast the device does it);
* ``compile_count`` = the number of XLA backend compilations so far, counted by a
  ``jax.monitoring`` listener on ``/jax/core/compile/backend_compile_duration``. That event
  fires once per executable XLA builds (jit's in-memory cache hits do not fire it), so a
  retrace with a new shape inside a timed window shows up as a count that moved.
"""
from __future__ import annotations

import jax

from ..results import python_versions
from ..timing import Throughput, measure

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_compiles = 0
_listening = False


def _on_duration(event: str, duration_secs: float, **kwargs) -> None:
    global _compiles
    if event == COMPILE_EVENT:
        _compiles += 1


def compile_count() -> int:
    """XLA compilations seen in this process since perfladder.jax was imported."""
    return _compiles


def _listen() -> None:
    global _listening
    if not _listening:   # registered once, at import
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listening = True


_listen()


def throughput(step, stream, warmup: int = 30, timed: int = 40, windows: int = 3) -> Throughput:
    """Tokens/s of ``step(X, Y)`` over fresh batches from ``stream`` (median of ``windows``).

    Raises ``perfladder.timing.RecompileError`` if XLA compiled anything inside a window.
    """
    return measure(step, stream, warmup=warmup, timed=timed, windows=windows,
                   sync=jax.block_until_ready, compile_count=compile_count,
                   num_tokens=lambda X: int(X.size), shape_of=lambda X: tuple(X.shape))


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def device_name() -> str:
    """``jax.devices()[0].device_kind`` on a GPU (e.g. 'NVIDIA H200'), ``'cpu'`` otherwise."""
    d = jax.devices()[0]
    return d.device_kind if d.platform == "gpu" else "cpu"


def versions() -> dict[str, str]:
    import flax
    import jaxlib
    import numpy
    import optax
    out = python_versions(jax=jax, jaxlib=jaxlib, flax=flax, optax=optax, numpy=numpy)
    out["backend"] = jax.default_backend()
    out["device_count"] = str(jax.device_count())
    return out
