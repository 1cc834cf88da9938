"""Step-by-step evidence beside the ladder's windows (also used by benchmarks/).

* ``per_step_times`` / ``step_stats`` -- every step closed by a sync: how steady the steps
  are (a wandering step time is a symptom the windows' median hides);
* ``host_overhead`` -- the time Python takes to issue a step against the synced step time.
"""
from __future__ import annotations

import statistics
import time

import jax

from perfladder.jax.profile import issue_and_finish_ms


def per_step_times(step, stream, n: int, sync=jax.block_until_ready) -> list[float]:
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


def host_overhead(step, stream, n: int) -> dict:
    """Host time per call vs device time per step.

    After a sync (device idle), ``n`` calls are issued without waiting: the time until the
    last call returns is what Python spends per step; then we wait for the device. If the
    first number is well under the synced step time, the host runs ahead and its cost is
    hidden; if it is close, the host sets the pace.
    """
    issued, done = issue_and_finish_ms(step, stream, n)
    synced = step_stats(per_step_times(step, stream, n))
    return {"n": n, "dispatch_ms_per_step": issued, "unsynced_ms_per_step": done,
            "synced_median_ms": synced["median_ms"]}
