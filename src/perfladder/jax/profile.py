"""Where one step's time goes, measured outside any timed window: a ``ProfileSummary``, and the
step-by-step evidence beside the ladder's windows (``per_step_times`` / ``step_stats``: how
steady the steps are, which a windows' median hides; ``host_overhead``: the host's cost of
issuing a step against the step's pace).

``host_ms``: the time Python takes to *issue* one step with the device idle, the median over
``steps`` steps (model-graph traversal, argument flattening, dispatch; ``issue_ms``): with no
queue of earlier steps ahead of it the call never waits on the device, so this is the host's
cost and cannot exceed the step. ``busy_ms``: the time per step the device ran a kernel (the
union of the kernels' intervals). ``device_ms``: the kernels' time per step, from a
``jax.profiler`` trace of ``steps`` more steps (``perfladder.jax.kernels``); on CPU the
"kernels" are XLA:CPU ops. ``shares``: the kernel-category shares of that time.
"""
from __future__ import annotations

import statistics
import time

from perfladder.jax.kernels import kernel_breakdown
from perfladder.jax.timer import sync
from perfladder.measure.evidence import ProfileSummary

ROWS = 8      # the profile's top kernels kept with the summary


def issue_and_finish_ms(step, stream, n: int, sync=sync) -> tuple[float, float]:
    """Milliseconds per step, of ``n`` steps issued back to back with the device idle at the
    start: until Python has issued the last one, and until the device has finished it."""
    sync(step(*next(stream)))
    t0 = time.perf_counter()
    out = None
    for _ in range(n):
        out = step(*next(stream))
    issued = time.perf_counter() - t0
    sync(out)
    done = time.perf_counter() - t0
    return 1e3 * issued / n, 1e3 * done / n


def issue_ms(step, stream, n: int, sync=sync) -> float:
    """Milliseconds Python spends issuing one step: the median over ``n`` steps of the time a
    call takes to return, each issued with the device idle (the previous step waited for).

    Issued back to back, a call can wait for the device (the runtime bounds how many steps
    may be queued), and the time to issue would then be the device's: above the step itself
    at a host-bound batch. With nothing queued, a call returns when Python and the runtime
    have done their part, which is the host cost of a step and never more than the step."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = step(*next(stream))                # the batch draw included, as in the timed loop
        times.append(time.perf_counter() - t0)
        sync(out)
    return 1e3 * statistics.median(times)


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
    # one timeline per device: the union over all of them is no one device's busy time
    busy = None if kb.busy_us is None or devices != 1 else kb.busy_us * per
    return ProfileSummary(tool="jax.profiler", steps=steps, host_ms=host,
                          device_ms=kb.total_us * per,
                          shares={c: s for c, s in kb.category_share.items() if s > 0},
                          rows=rows, busy_ms=busy,
                          wall_ms=None if kb.wall_us is None else kb.wall_us / (steps * 1e3))


def per_step_times(step, stream, n: int, sync=sync) -> list[float]:
    """Seconds of each of ``n`` steps, each closed by a device sync (batch draw included)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        X, Y = next(stream)
        sync(step(X, Y))
        times.append(time.perf_counter() - t0)
    return times


def step_stats(times: list[float]) -> dict:
    """median / min / max / p10 / p90 / mean / stdev in ms, and (max - min) / median."""
    ms = sorted(1e3 * t for t in times)
    if not ms:
        raise ValueError("step_stats needs at least one time")
    q = lambda p: ms[min(len(ms) - 1, int(round(p * (len(ms) - 1))))]  # noqa: E731
    med = statistics.median(ms)
    return {"median_ms": med, "min_ms": ms[0], "max_ms": ms[-1], "p10_ms": q(0.10),
            "p90_ms": q(0.90), "mean_ms": statistics.fmean(ms),
            "stdev_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
            "spread": (ms[-1] - ms[0]) / med if med > 0 else 0.0, "n": len(ms)}


def host_overhead(step, stream, n: int, sync=sync) -> dict:
    """Host time per call vs device time per step.

    ``dispatch_ms_per_step``: the host's cost of one step, each call issued with the device idle
    (``issue_ms``: no queue holds it back, so it cannot exceed the step). ``unsynced_ms_per_step``:
    ``n`` calls issued back to back, per step, until the device finished the last (the pace of
    the timed loop); ``synced_median_ms``: one step waited for at a time. If the host's cost is
    well under the unsynced pace, the host runs ahead and its cost is hidden; if it is close,
    the host sets the pace.
    """
    issued = issue_ms(step, stream, n, sync)
    _, done = issue_and_finish_ms(step, stream, n, sync)
    synced = step_stats(per_step_times(step, stream, n, sync))
    return {"n": n, "dispatch_ms_per_step": issued, "unsynced_ms_per_step": done,
            "synced_median_ms": synced["median_ms"]}
