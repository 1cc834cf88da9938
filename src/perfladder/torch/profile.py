"""Where one step's time goes, measured outside any timed window: a ``ProfileSummary``.

``device_ms``: the kernels' time per step from a ``torch.profiler`` run of a few steps
(``perfladder.torch.kernels``; on CPU, the operators' self time); ``busy_ms``: the time per
step the device ran a kernel (the union of the kernels' intervals, so kernels on several
streams are not counted twice); ``shares``: the kernel-category shares of that time;
``rows``: the top kernels, device time first. The profiler's CUPTI hooks are torn down when it
stops (``TEARDOWN_CUPTI``, set by ``import perfladder.torch``), so the windows
timed after a profile pay no tax for it.
"""
from __future__ import annotations

from perfladder.measure.evidence import ProfileSummary
from perfladder.torch.kernels import kernel_breakdown, quiet_kineto

ROWS = 10     # the profile's top kernels kept with the summary


def profile_step(step, stream, *, steps: int, warmup: int = 1, top: int = ROWS) -> ProfileSummary:
    """``ProfileSummary`` of ``step(X, Y)`` over ``steps`` steps of ``stream`` (after ``warmup``)."""
    with quiet_kineto():
        kb = kernel_breakdown(step, stream, steps=steps, warmup=warmup, top=top)
    return summary_of(kb)


def summary_of(kb) -> ProfileSummary:
    """A ``KernelBreakdown`` as the rung's ``ProfileSummary`` (per step; device time first)."""
    per = kb.steps * 1000.0
    rows = [{"name": k.name, "category": k.category, "device_ms": k.total_us / per,
             "calls": k.calls / kb.steps} for k in kb.top]
    return ProfileSummary(tool=f"torch.profiler ({'CUDA kernels' if kb.device == 'gpu' else 'CPU operators'})",
                          steps=kb.steps, host_ms=None, device_ms=kb.total_us / per,
                          shares=dict(kb.category_share), rows=rows,
                          busy_ms=None if kb.busy_us is None else kb.busy_us / per,
                          wall_ms=None if kb.wall_us is None else kb.wall_us / per)
