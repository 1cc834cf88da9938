"""PyTorch's side of the timer: the sync and the compile counter (what we run on: ``device``)."""
from __future__ import annotations

import torch

from perfladder.checks import check_int
from perfladder.measure.timing import Throughput, measure

# Full-config defaults; the rungs pass their LadderConfig's numbers explicitly.
WARMUP, TIMED, WINDOWS = 30, 40, 3


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


def cache_hits() -> int:
    """How many compiled graphs this process has loaded from a cache so far: inductor's FX graph
    cache and AOTAutograd's (which, hit, skips inductor for the forward and backward alike)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:      # pragma: no cover - torch built without dynamo
        return 0
    return int(counters.get("inductor", {}).get("fxgraph_cache_hit", 0)
               + counters.get("aot_autograd", {}).get("autograd_cache_hit", 0))


def fingerprint(X) -> bytes:
    """The first rows of a batch, as bytes: read on the host during warm-up only."""
    return X[:2].detach().cpu().numpy().tobytes()


def throughput(step, stream, warmup: int = WARMUP, timed: int = TIMED,
               windows: int = WINDOWS, **settle) -> Throughput:
    """End-to-end tokens/s of ``step(X, Y)`` over batches from ``stream``.

    ``perfladder.measure.timing.measure`` with CUDA sync closing every window (and the stream
    asked, right after, whether it is done: ``SyncError`` if not) and dynamo's counters as the
    recompile guard (a compile inside a window raises ``RecompileError``).
    ``settle``: ``target_spread`` / ``max_windows`` of ``perfladder.measure.timing.measure``.
    """
    warmup, timed, windows = (check_int("warmup", warmup, 0), check_int("timed", timed, 1),
                              check_int("windows", windows, 1))
    return measure(step, stream, warmup=warmup, timed=timed, windows=windows,
                   sync=sync, ready=ready, compile_count=compile_count, fingerprint=fingerprint,
                   num_tokens=lambda X: X.numel(), shape_of=lambda X: tuple(X.shape), **settle)
