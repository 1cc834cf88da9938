"""JAX's side of the measurement: the sync and the compile counter (what we run on: ``device``).

``throughput`` is ``perfladder.measure.timing.measure`` with

* ``sync = jax.block_until_ready`` on the step's output (dispatch is asynchronous: a window
  closed without it would time the queueing of work, and the device could still be busy),
  and ``ready`` asked right after it (``Array.is_ready``: ``SyncError`` if it did not wait);
* ``compile_count`` = the number of XLA backend compilations so far, counted by a
  ``jax.monitoring`` listener on ``/jax/core/compile/backend_compile_duration``. That event
  fires once per executable XLA builds (jit's in-memory cache hits do not fire it), so a
  retrace with a new shape inside a timed window shows up as a count that moved.
"""
from __future__ import annotations

import threading

import jax
import numpy as np

from perfladder.checks import check_int
from perfladder.measure.timing import DEFAULT_TARGET_SPREAD, Throughput, measure

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_compiles = 0
_cache_hits = 0
_listening = False
_this_thread = threading.local()     # the listener runs in the thread that compiled


def _on_duration(event: str, duration_secs: float, **kwargs) -> None:
    global _compiles
    if event == COMPILE_EVENT:
        _compiles += 1
        _this_thread.compiles = getattr(_this_thread, "compiles", 0) + 1


def _on_event(event: str, **kwargs) -> None:
    global _cache_hits
    if event == CACHE_HIT_EVENT:
        _cache_hits += 1
        _this_thread.cache_hits = getattr(_this_thread, "cache_hits", 0) + 1


def cache_hit_count(this_thread: bool = False) -> int:
    """Programs loaded from JAX's persistent compilation cache in this process (each also counts
    in ``compile_count``: XLA's compile event spans the cache read); with ``this_thread``, only
    the calling thread's."""
    return getattr(_this_thread, "cache_hits", 0) if this_thread else _cache_hits


def compile_count(this_thread: bool = False) -> int:
    """XLA compilations seen in this process since perfladder.jax was imported; with
    ``this_thread``, only those the calling thread made (a rung compiles its gate programs in
    a helper thread while it compiles its step: ``perfladder.jax.beside``)."""
    return getattr(_this_thread, "compiles", 0) if this_thread else _compiles


def _listen() -> None:
    global _listening
    if not _listening:   # registered once, at import
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)
        _listening = True


_listen()
_verified = False


def _verify_counter() -> None:
    """Fail loudly if the listener does not see compilations (e.g. a renamed event).

    A counter that silently stays at zero would switch the recompile guard off.
    """
    global _verified
    if _verified:
        return
    before = _compiles
    jax.block_until_ready(jax.jit(lambda x: 2 * x + 1)(np.arange(3.0)))   # a fresh function: compiles
    if _compiles == before:
        raise RuntimeError(f"perfladder.jax's compile counter saw no XLA compilation (event "
                           f"{COMPILE_EVENT!r}, jax {jax.__version__}); the recompile guard "
                           "would be blind, so timing is refused")
    _verified = True


def ready(out) -> bool:
    """Are the step's outputs computed? (``Array.is_ready``: a query, it does not wait)."""
    return all(leaf.is_ready() for leaf in jax.tree.leaves(out) if hasattr(leaf, "is_ready"))


def fingerprint(X) -> bytes:
    """The first rows of a batch as bytes (a host read: the timer takes it during warm-up only)."""
    return np.asarray(X[:2]).tobytes()


def throughput(step, stream, warmup: int = 30, timed: int = 40, windows: int = 3, *,
               target_spread: float = DEFAULT_TARGET_SPREAD, max_windows: int | None = None,
               check_content: bool = True, budget_s: float | None = None,
               window_s: float | None = None) -> Throughput:
    """Tokens/s of ``step(X, Y)`` over fresh batches from ``stream``: the median of the last
    ``windows`` windows once they agree within ``target_spread`` (see ``perfladder.measure.timing``).

    Raises ``perfladder.measure.timing.RecompileError`` if XLA compiled anything inside a window.
    """
    warmup, timed, windows = (check_int("warmup", warmup, 0), check_int("timed", timed, 1),
                              check_int("windows", windows, 1))
    _verify_counter()
    return measure(step, stream, warmup=warmup, timed=timed, windows=windows,
                   sync=jax.block_until_ready, ready=ready, compile_count=compile_count,
                   num_tokens=lambda X: int(X.size), shape_of=lambda X: tuple(X.shape),
                   fingerprint=fingerprint if check_content else None,
                   target_spread=target_spread, max_windows=max_windows, budget_s=budget_s,
                   window_s=window_s)
