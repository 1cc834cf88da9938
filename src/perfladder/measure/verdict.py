"""What a rung's evidence says, computed (framework-free): a verdict against the rung it
builds on, judged against both measurements' noise, and the regime of its step, read from
its own profile and achieved rates.

Both return plain dicts that keep the numbers they were decided from, so a page can print
the decision and its reasons side by side.
"""
from __future__ import annotations

from perfladder.kernels.accounting import ROOF_ERROR
from perfladder.measure.timing import did_settle

VERDICTS = ("faster", "slower", "within noise", "unsettled")
# the regime words, one home: the verdict says them, the techniques and the pages name them
HOST, COMPUTE, MEMORY = "host-bound", "compute-bound", "memory-bound"
MIXED, DEVICE_BOUND, NOT_PROFILED = "mixed", "device-bound", "not profiled"
REGIMES = (HOST, COMPUTE, MEMORY, MIXED, DEVICE_BOUND, NOT_PROFILED)
DEVICE_REGIMES = (MEMORY, COMPUTE, MIXED, DEVICE_BOUND)   # the device sets the pace

# A window range is the settled windows' [min, max]. Two ranges that overlap cannot be told
# apart; ranges that do not are a real difference. An effect under MIN_EFFECT is called noise
# even when the ranges happen to be tight (two runs of one program differ by about that).
MIN_EFFECT = 0.01

# Regime thresholds, on the profile of one step. Busy is the kernels' time per step (from the
# profiler) over the step's wall time (from the timed windows, which no profiler perturbed):
HOST_BOUND = 0.75       # kernels busy under 75% of the step: the device waits on the host
MOSTLY_WAITING = 0.5    # busy under half the step: the stronger claim, "mostly waiting on the host"
COMPUTE_SHARE = 0.6     # matmul + attention >= 60% of kernel time ...
COMPUTE_ROOF = 0.5      # ... and the step's model TFLOP/s >= 50% of the measured matmul roof
MEMORY_SHARE = 0.4      # elementwise + norm + copies >= 40% of kernel time
MEMORY_CATEGORIES = ("elementwise", "reduction/norm", "memcpy/memset", "optimizer")
COMPUTE_CATEGORIES = ("matmul", "attention")
# Busy time and host time are parts of the step: a number over the step by more than this
# (clock granularity, a profile a little slower than the timed windows) is not what it is
# named, and is flagged in the regime's ``accounting`` instead of being reported or capped.
OVER_STEP = 0.05


def _range(r) -> tuple[float, float, bool]:
    t = r.timing
    if t is None:
        return r.tokens_per_s, r.tokens_per_s, True
    return t.low, t.high, did_settle(t)


def verdict(r, before) -> dict:
    """``r`` against ``before`` (both measured ``RungResult``s): faster / slower / within
    noise, or unsettled when either measurement did not settle (then nothing is credited)."""
    lo, hi, ok = _range(r)
    blo, bhi, bok = _range(before)
    ratio = r.tokens_per_s / before.tokens_per_s
    out = {"against": before.name, "ratio": ratio, "range": [lo, hi], "against_range": [blo, bhi],
           "min_effect": MIN_EFFECT}
    if before.timing is not None and before.timing.windows:
        out["against_all"] = [min(before.timing.windows), max(before.timing.windows)]
    if not (ok and bok):
        who = [x.name for x, s in ((r, ok), (before, bok)) if not s]
        out.update(verdict="unsettled", why=f"windows of {', '.join(who)} did not settle", unsettled=who)
    elif lo > bhi and ratio > 1 + MIN_EFFECT:
        out.update(verdict="faster", why="its slowest window beats the other's fastest")
    elif hi < blo and ratio < 1 - MIN_EFFECT:
        out.update(verdict="slower", why="its fastest window is below the other's slowest")
    else:
        out.update(verdict="within noise", why="the window ranges overlap or differ by under "
                   f"{100 * MIN_EFFECT:.0f}%")
    return out


def above_unsettled_base(v: dict | None) -> bool:
    """Did a settled rung beat every window its unsettled base ever showed?

    Its speedup is not credited (a disturbed base makes any ratio meaningless), but it is the
    better configuration to build on: a settled measurement above everything the base showed.
    """
    return (bool(v) and v.get("verdict") == "unsettled" and v.get("unsettled") == [v.get("against")]
            and v.get("against_all") is not None and v["range"][0] > v["against_all"][1])


def certain_gain(r, before) -> bool:
    """Is ``r`` faster than ``before`` whatever the noise: every window it ran above every window
    ``before`` ran, by more than ``MIN_EFFECT``? Where a measurement did not settle this is all a
    page may say of the two: the sign is certain, and still no ratio is credited (``credit``)."""
    a, b = r.windows, before.windows
    return bool(a and b) and min(a) > max(b) * (1 + MIN_EFFECT)


def credit(v: dict | None) -> float | None:
    """The credit rule, the one every card, table, inserted number and bar applies: the ratio a
    rung may be credited with against the rung it builds on is its verdict's ratio when the
    verdict is 'faster' (both measurements settled, the rung's slowest window above the other's
    fastest, by more than ``MIN_EFFECT``), and nothing otherwise. An unsettled comparison
    gets no credited ratio, not even a bound: whatever its windows show, one of the two
    measurements was disturbed."""
    if not v or v.get("verdict") != "faster":
        return None
    return v["ratio"]


def credited(r) -> bool:
    """May a waterfall credit ``r`` with a speedup over the rung it builds on? (``credit``)"""
    return credit(r.verdict) is not None


def regime(r, roof_tflops: float | None = None, copy_gbps: float | None = None) -> dict:
    """Classify ``r``'s step from its profile (host vs device time, kernel-category shares)
    and its achieved model TFLOP/s against the measured matmul roof."""
    p = r.profile
    out = {"tflops": r.tflops, "roof_tflops": roof_tflops,
           "fraction_of_roof": (r.tflops / roof_tflops) if (r.tflops and roof_tflops) else None}
    if p is None or not p.device_ms:
        out.update(regime=NOT_PROFILED, why="no profile of this rung's step")
        return out
    shares = p.shares or {}
    compute = sum(shares.get(c, 0.0) for c in COMPUTE_CATEGORIES)
    memory = sum(shares.get(c, 0.0) for c in MEMORY_CATEGORIES)
    step_ms = None
    if r.tokens_per_s and r.batch_size and r.seq_len:
        step_ms = 1e3 * r.batch_size * r.seq_len / r.tokens_per_s
    busy, host_ms, flags = step_shares(p, step_ms)
    frac = out["fraction_of_roof"]
    if frac is not None and frac > ROOF_ERROR:
        flags.append(f"{100 * frac:.0f}% of the measured matmul roof: the model FLOPs counted "
                     "are more than the step does (an accounting error, not a fast step)")
        out["fraction_of_roof"] = frac = None
    out.update(host_ms=host_ms, device_ms=p.device_ms, step_ms=step_ms, busy=busy,
               compute_share=compute, memory_share=memory, accounting=flags)
    if busy is not None and busy < HOST_BOUND:
        out.update(regime=HOST, why=f"kernels are busy {100 * busy:.0f}% of the "
                   f"{step_ms:.1f} ms step; the rest the device waits for the host")
    elif not shares:
        out.update(regime=DEVICE_BOUND, why="the kernels keep the device busy; the profile has "
                   "no kernel categories to say which kind")
    elif compute >= COMPUTE_SHARE and (frac is None or frac >= COMPUTE_ROOF):
        out.update(regime=COMPUTE, why=f"matmul and attention take {100 * compute:.0f}% of "
                   "kernel time" + ("" if frac is None else f" at {100 * frac:.0f}% of the matmul roof"))
    elif memory >= MEMORY_SHARE:
        out.update(regime=MEMORY, why=f"elementwise, norm, copy and optimizer kernels take "
                   f"{100 * memory:.0f}% of kernel time")
    else:
        out.update(regime=MIXED, why=f"matmul and attention {100 * compute:.0f}%, memory-bound "
                   f"kernels {100 * memory:.0f}% of kernel time")
    return out


def step_shares(p, step_ms: float | None) -> tuple[float | None, float | None, list[str]]:
    """``(busy, host_ms, accounting)`` of profile ``p`` against a step of ``step_ms`` (from the
    timed windows, which no profiler perturbed): the share of the step the device ran kernels
    and the host time to issue it, each only where it is what its name says, and why not
    where it is not.

    Busy is the kernels' busy time per step over the step: the union of their intervals where
    the profile recorded it (``busy_ms``), else their sum (``device_ms``). Over the step it is
    overlapping kernels counted twice (a sum) or profiled steps slower than the timed ones:
    flagged, never capped to 100%. A host time over the step was measured with steps queued
    ahead of the call (the call waited on the device): flagged, not kept.
    """
    flags: list[str] = []
    busy = None
    union = getattr(p, "busy_ms", None)
    kernel_ms = union if union is not None else p.device_ms
    if step_ms and kernel_ms is not None:
        if kernel_ms <= (1 + OVER_STEP) * step_ms:
            busy = min(1.0, kernel_ms / step_ms)
        elif union is None:
            flags.append(f"{kernel_ms:.1f} ms of kernels summed against a {step_ms:.1f} ms step: "
                         "a sum over the step counts overlapping kernels twice (or steps slower than "
                         "the timed ones) and is no busy fraction; the profile holds no kernel "
                         "intervals to take their union")
        else:
            flags.append(f"the device busy {kernel_ms:.1f} ms per profiled step against a "
                         f"{step_ms:.1f} ms timed step: the profiled steps ran slower than the timed "
                         "ones, so the profile gives no busy fraction of this step")
    host_ms = p.host_ms
    if host_ms is not None and step_ms and host_ms > (1 + OVER_STEP) * step_ms:
        flags.append(f"{host_ms:.1f} ms to issue a {step_ms:.1f} ms step: issuing cannot take longer "
                     "than the step it issues; measured with earlier steps queued, the call waited "
                     "on the device, so this is no host cost")
        host_ms = None
    return busy, host_ms, flags
