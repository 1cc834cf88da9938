"""PyTorch's side of the timer: the sync and the compile counter, as the timer's ``HOOKS``
(what we run on: ``device``)."""
from __future__ import annotations

import contextlib
import logging

import torch

from perfladder.measure.timing import (
    TIMED,
    WARMUP,
    WINDOWS,
    Throughput,
    TimerHooks,
    WindowSettings,
    measure,
    window_settings,
)

__all__ = ["HOOKS", "WARMUP", "TIMED", "WINDOWS", "throughput", "sync", "ready", "compile_count",
           "cache_events", "loaded", "fingerprint"]


def sync(_out=None) -> None:
    """Wait for all queued device work. A no-op unless CUDA has been used in this process
    (no CUDA work can be pending before CUDA is initialised)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def ready(_out=None) -> bool:
    """Has the current CUDA stream finished its work? (a query: it does not wait). True
    before CUDA is initialised, when there can be none."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return bool(torch.cuda.current_stream().query())
    return True


def compile_count() -> int:
    """How many compilations dynamo/inductor have done in this process so far.

    ``frames.total`` grows by one for every frame dynamo (re)compiles -- including the
    recompile a new batch shape forces; the inductor ``fxgraph_cache_*`` counters grow
    for every graph inductor compiles or loads from its cache, which also catches the
    backward graph that AOTAutograd compiles lazily on the first ``backward()``.
    Verified on torch 2.13 (CPU): steady-state calls leave both unchanged.
    """
    try:
        from torch._dynamo.utils import counters
    except ImportError:      # pragma: no cover - torch built without dynamo
        return 0
    inductor = counters.get("inductor", {})
    return int(counters.get("frames", {}).get("total", 0)
               + sum(inductor.get(k, 0) for k in
                     ("fxgraph_cache_miss", "fxgraph_cache_hit", "fxgraph_cache_bypass")))


# (counter group, counter) of the compiler's caches: inductor's FX graph cache, AOTAutograd's
CACHE_COUNTERS = tuple((group, f"{prefix}_{event}") for group, prefix in
                       (("inductor", "fxgraph_cache"), ("aot_autograd", "autograd_cache"))
                       for event in ("hit", "miss", "bypass"))
# the loggers that say why a graph could not be cached
BYPASS_LOGGERS = ("torch._inductor.codecache", "torch._functorch._aot_autograd.autograd_cache")


def loaded(events: dict) -> int:
    """How many compiled graphs a ``cache_events`` record says were loaded from a cache:
    inductor's FX graph cache and AOTAutograd's (which, hit, skips inductor for the forward and
    backward alike)."""
    return events.get("fxgraph_cache_hit", 0) + events.get("autograd_cache_hit", 0)


class _Reasons(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.reasons: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Bypassing"):
            self.reasons.append(msg[:300])


@contextlib.contextmanager
def cache_events():
    """What the compiler's caches did inside the block, in the dict it yields (filled at exit):
    each of ``CACHE_COUNTERS`` that grew, by name, and ``bypass_reasons``, what the compiler
    said of each graph it would not cache (a rung whose graphs could not be loaded from the
    cache says why here). Those messages are kept from the console meanwhile."""
    from torch._dynamo.utils import counters
    before = {name: counters[group][name] for group, name in CACHE_COUNTERS}
    out: dict = {}
    handler = _Reasons()
    loggers = [logging.getLogger(n) for n in BYPASS_LOGGERS]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    try:
        yield out
    finally:
        for lg, (level, propagate) in zip(loggers, saved):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate
        out.update({name: counters[group][name] - before[name] for group, name in CACHE_COUNTERS
                    if counters[group][name] > before[name]})
        if handler.reasons:
            out["bypass_reasons"] = sorted(set(handler.reasons))


def fingerprint(X) -> bytes:
    """The first rows of a batch, as bytes: read on the host during warm-up only."""
    return X[:2].detach().cpu().numpy().tobytes()


def num_tokens(X) -> int:
    return X.numel()


def shape_of(X) -> tuple:
    return tuple(X.shape)


# CUDA sync closing every window (and the stream asked, right after, whether it is done:
# ``SyncError`` if not), dynamo's counters as the recompile guard
HOOKS = TimerHooks(sync=sync, compile_count=compile_count, num_tokens=num_tokens, shape_of=shape_of,
                   fingerprint=fingerprint, ready=ready)


def throughput(step, stream, settings: WindowSettings | None = None, **changes) -> Throughput:
    """End-to-end tokens/s of ``step(X, Y)`` over batches from ``stream``:
    ``perfladder.measure.timing.measure`` with PyTorch's ``HOOKS`` (a compile inside a window
    raises ``RecompileError``) and ``settings`` (default: ``WindowSettings()``), ``changes``
    (``warmup=``, ``timed=``, ``windows=``, ``target_spread=``, ...) on top."""
    return measure(step, stream, HOOKS, window_settings(settings, **changes))
