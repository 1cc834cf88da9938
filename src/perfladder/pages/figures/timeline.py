"""One training step, device against host, at the small batch and at the big ones
(framework-free).

What the run recorded per profiled rung (``RungResult.regime``, from its ``ProfileSummary``):
the step's wall time (``step_ms``), the kernels' summed device time (``device_ms``) and the
fraction of the step they keep the device busy (``busy``), each kernel kind's share of the
kernel time (``profile.shares``), and, where the profiler saw it (JAX's), the host's time to
dispatch a step (``host_ms``). So the figure draws per step: the device lane, kernel time by
kind then the time the device sat waiting; the host lane, its dispatch time when recorded.

What it does not allow: the order of the kernels and of the host's work inside the step. The
profile keeps totals per step, not timestamps, so the kinds are drawn end to end (matmuls first)
and the idle time as one block at the end; where kernels overlap (summed kernel time above
the step's), the lane is scaled to the busy fraction.
"""
from __future__ import annotations

from perfladder.pages.plot import PAGE_WIDTH_IN
from perfladder.results.record import LadderResult, RungResult

KINDS = ("matmul", "attention", "elementwise", "reduction/norm", "optimizer", "memcpy/memset",
         "collective", "other")
COLORS = {"matmul": "#4c72b0", "attention": "#8172b3", "elementwise": "#dd8452",
          "reduction/norm": "#c44e52", "optimizer": "#55a868", "memcpy/memset": "#937860",
          "collective": "#da8bc3", "other": "#8c8c8c"}
IDLE_COLOR, HOST_COLOR = "#eeeeee", "#2b2b2b"


def profiled(r: RungResult) -> bool:
    reg = r.regime or {}
    return bool(reg.get("step_ms") and reg.get("busy") is not None and r.profile is not None)


def steps_shown(result: LadderResult) -> list[RungResult]:
    """The rungs drawn: the first profiled rung at the configuration's small batch (the eager
    step, or the first jitted one where the eager step was not profiled), the first at the big
    batch, and the fastest configuration when its batch is bigger still."""
    cfg = result.config or {}
    small, big = cfg.get("batch_size"), cfg.get("big_batch")
    chain = [r for r in result.waterfall() if profiled(r)]
    batch = lambda r: (r.recipe or {}).get("batch_size")  # noqa: E731
    out = []
    for want in (small, big):
        hit = next((r for r in chain if batch(r) == want), None)
        if hit is not None:
            out.append(hit)
    if result.waterfall():
        fast = result.fastest_rung()
        if profiled(fast) and fast not in out and (batch(fast) or 0) > (big or 0):
            out.append(fast)
    return out


def lanes(r: RungResult) -> dict:
    """``{'step_ms', 'device': [(kind, ms)] then ('idle', ms), 'host_ms' (None: not recorded),
    'overlap' (summed kernel time over the step's, when above 1)}``."""
    reg = r.regime
    step, busy = reg["step_ms"], min(1.0, reg["busy"])
    shares = r.profile.shares or {}
    total = sum(shares.values()) or 1.0
    dev = [(k, step * busy * shares[k] / total) for k in KINDS if shares.get(k)]
    dev.append(("idle", step * (1 - busy)))
    host = reg.get("host_ms") if reg.get("host_ms") is not None else r.profile.host_ms
    over = (reg.get("device_ms") or 0) / step
    return {"step_ms": step, "device": dev, "host_ms": host, "overlap": over if over > 1.02 else None}


def figure(result: LadderResult):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from perfladder.pages.claims import is_smoke
    shown = steps_shown(result)
    fig, axes = plt.subplots(max(len(shown), 1), 1, figsize=(PAGE_WIDTH_IN, 1.15 * max(len(shown), 1) + 1.3),
                             layout="constrained", squeeze=False)
    smoke = " [SMOKE: not performance numbers]" if is_smoke(result) else ""
    fig.suptitle(f"{result.framework} on {result.device}: one step, device and host{smoke}", fontsize=9)
    if not shown:
        axes[0][0].text(0.5, 0.5, "no profiled rung in this run: no timeline", ha="center", va="center",
                        fontsize=8, transform=axes[0][0].transAxes, gid="no-profile")
        axes[0][0].set_axis_off()
        return fig
    kinds_drawn = set()
    for ax, r in zip((a[0] for a in axes), shown):
        ln = lanes(r)
        left = 0.0
        for kind, ms in ln["device"]:
            ax.barh(1, ms, left=left, height=0.6, color=IDLE_COLOR if kind == "idle" else COLORS[kind],
                    edgecolor="#999999" if kind == "idle" else "none", linewidth=0.5, gid=f"device:{kind}")
            kinds_drawn.add(kind)
            left += ms
        if ln["host_ms"] is not None:
            ax.barh(0, ln["host_ms"], height=0.6, color=HOST_COLOR, gid="host")
            ax.text(ln["host_ms"], 0, f" {ln['host_ms']:.1f} ms to dispatch", va="center", fontsize=6.5)
        else:
            ax.text(0, 0, " host time per step: not recorded by this profiler", va="center", fontsize=6.5,
                    color="#666666", gid="host-missing")
        reg = r.regime
        batch = (r.recipe or {}).get("batch_size")
        ax.set_title(f"{r.name} {r.label}, batch {batch}: step {ln['step_ms']:.1f} ms, kernels busy "
                     f"{min(1.0, reg['busy']):.0%}" + (f" (kernel time {ln['overlap']:.2f}x the step: "
                                                       "kernels overlap)" if ln["overlap"] else ""),
                     fontsize=7.5, loc="left")
        ax.set_yticks([0, 1])
        ax.set_yticklabels(["host", "device"], fontsize=7)
        ax.set_xlim(0, max(ln["step_ms"], ln["host_ms"] or 0) * 1.25)
        ax.set_ylim(-0.5, 1.5)
        ax.tick_params(axis="x", labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1][0].set_xlabel("ms within one step (kernel kinds end to end: the profile records totals, "
                           "not their order)", fontsize=7)
    handles = [Patch(color=COLORS[k], label=k) for k in KINDS if k in kinds_drawn]
    handles.append(Patch(facecolor=IDLE_COLOR, edgecolor="#999999", label="device idle: waiting for the host"))
    handles.append(Patch(color=HOST_COLOR, label="host: dispatching the step"))
    fig.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=6.5, frameon=False)
    return fig
