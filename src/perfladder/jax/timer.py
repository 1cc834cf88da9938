"""JAX's side of the measurement: the sync and the compile counter (what we run on: ``device``).

``throughput`` is ``perfladder.measure.timing.measure`` with JAX's ``HOOKS``:

* ``sync = jax.block_until_ready`` on the step's output and on every live array (dispatch is
  asynchronous: a window closed without it would time the queueing of work). The output
  alone is not the whole step: a step's update is written to the model's and the optimizer's
  arrays, not returned, and where it runs as a program of its own (an un-jitted step op by
  op, a step split into its gradients and its update) the loss is ready before the update
  is done. Every array the step wrote or returned is live after it (a donated one is
  replaced by its successor), so waiting on all of them is JAX's device sync, as
  ``torch.cuda.synchronize`` is PyTorch's. ``ready`` is asked right after it, of the same
  arrays (``Array.is_ready``: ``SyncError`` if the sync did not wait);
* ``compile_count`` = the number of XLA backend compilations so far, counted by a
  ``jax.monitoring`` listener on ``/jax/core/compile/backend_compile_duration``. That event
  fires once per executable XLA builds (jit's in-memory cache hits do not fire it), so a
  retrace with a new shape inside a timed window shows up as a count that moved.
"""
from __future__ import annotations

import dataclasses
import threading

import jax
import numpy as np

from perfladder.measure.timing import Throughput, TimerHooks, WindowSettings, measure, window_settings

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
    """Are the step's outputs and every live array computed? (``Array.is_ready``: a query, it
    does not wait)."""
    return all(leaf.is_ready() for leaf in jax.tree.leaves((out, jax.live_arrays()))
               if hasattr(leaf, "is_ready"))


def fingerprint(X) -> bytes:
    """The first rows of a batch as bytes (a host read: the timer takes it during warm-up only)."""
    return np.asarray(X[:2]).tobytes()


def num_tokens(X) -> int:
    return int(X.size)


def shape_of(X) -> tuple:
    return tuple(X.shape)


def sync(out) -> None:
    """Wait for the step's outputs, then for every live array: what the step wrote besides
    what it returned (``jax.block_until_ready``; see the module docstring)."""
    jax.block_until_ready(out)
    jax.block_until_ready(jax.live_arrays())


HOOKS = TimerHooks(sync=sync, compile_count=compile_count, num_tokens=num_tokens,
                   shape_of=shape_of, fingerprint=fingerprint, ready=ready)


def throughput(step, stream, settings: WindowSettings | None = None, *, check_content: bool = True,
               **changes) -> Throughput:
    """Tokens/s of ``step(X, Y)`` over fresh batches from ``stream``: the median of the last
    ``windows`` windows once they agree within ``target_spread`` (``perfladder.measure.timing``),
    with JAX's ``HOOKS`` and ``settings`` (default: ``WindowSettings()``), ``changes``
    (``warmup=``, ``timed=``, ``windows=``, ...) on top. ``check_content=False``: batches' content
    is not compared (no host read of a sharded batch).

    Raises ``perfladder.measure.timing.RecompileError`` if XLA compiled anything inside a window.
    """
    settings = window_settings(settings, **changes)
    _verify_counter()
    hooks = HOOKS if check_content else dataclasses.replace(HOOKS, fingerprint=None)
    return measure(step, stream, hooks, settings)
