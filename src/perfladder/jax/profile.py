"""Where one step's time goes, measured outside any timed window: a ``ProfileSummary``.

``host_ms``: after a sync, the wall time Python takes to *issue* ``steps`` steps without
waiting, per step (model-graph traversal, argument flattening, dispatch; the batch draw is
included, as in the timed loop). ``device_ms``: the kernels' time per step, from a
``jax.profiler`` trace of ``steps`` more steps (``perfladder.jax.kernels``); on CPU the
"kernels" are XLA:CPU ops. ``shares``: the kernel-category shares of that time.
"""
from __future__ import annotations

import time

import jax

from perfladder.jax.kernels import kernel_breakdown
from perfladder.measure.evidence import ProfileSummary

ROWS = 8      # the profile's top kernels kept with the summary


def issue_and_finish_ms(step, stream, n: int) -> tuple[float, float]:
    """Milliseconds per step, of ``n`` steps issued back to back with the device idle at the
    start: until Python has issued the last one, and until the device has finished it."""
    jax.block_until_ready(step(*next(stream)))
    t0 = time.perf_counter()
    out = None
    for _ in range(n):
        out = step(*next(stream))
    issued = time.perf_counter() - t0
    jax.block_until_ready(out)
    done = time.perf_counter() - t0
    return 1e3 * issued / n, 1e3 * done / n


def issue_ms(step, stream, n: int) -> float:
    """Milliseconds Python spends issuing one of ``n`` steps, the device idle at the start."""
    return issue_and_finish_ms(step, stream, n)[0]


def profile_step(step, stream, *, steps: int, hlo_text: str | None = None, devices: int = 1,
                 perfetto: bool = True) -> ProfileSummary:
    """``ProfileSummary`` of a compiled, warmed-up ``step(X, Y)``.

    ``hlo_text`` (the step's compiled module) lets the kernels be categorized by what they
    hold; ``devices`` > 1 (a sharded step) divides the summed kernel time per device;
    ``perfetto=False`` reads the raw trace instead of converting it (faster to stop).
    """
    host = issue_ms(step, stream, steps)
    kb = kernel_breakdown(step, stream, steps=steps, warmup=0, top=ROWS, hlo_text=hlo_text,
                          perfetto=perfetto)
    per = 1.0 / (steps * devices * 1e3)            # summed µs -> ms per step per device
    rows = [{"name": k.name, "category": k.category, "device_ms": k.total_us * per,
             "calls": k.calls / steps} for k in kb.top]
    return ProfileSummary(tool="jax.profiler", steps=steps, host_ms=host,
                          device_ms=kb.total_us * per,
                          shares={c: s for c, s in kb.category_share.items() if s > 0},
                          rows=rows)
