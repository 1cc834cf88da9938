"""The roofline: every rung, and every kernel group of the fastest step, on the run's measured
ceilings (framework-free).

x is arithmetic intensity, the FLOPs a step (or a kernel group) must do per byte it must move,
both from the shapes (``perfladder.kernels.roofline.must_do``: the formulas the kernel report
prints); y is the FLOP rate achieved. A rung's rate is its model TFLOP/s (the rate the cards
quote); a kernel group's is its must-do FLOPs over its measured time. The roof is the run's own
device probe (``LadderResult.roofs``): the copy bandwidth as the slanted line, the bf16 matmul
rate flat (the TF32 rate dashed, the roof of the fp32 rungs). A point far under the roof at its
intensity is losing time to something the roof does not count: launches, the host, kernels that
move more bytes than they must.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfladder.kernels.roofline import must_do
from perfladder.pages.figures.workload import roofs_of, workload
from perfladder.pages.kernel_report import kernel_rung
from perfladder.pages.plot import PAGE_WIDTH_IN, dead_ends
from perfladder.results.record import LadderResult

TOP_GROUPS = ("matmul", "attention", "elementwise", "layernorm/reductions", "optimizer")
RUNG_COLOR, DEAD_COLOR, GROUP_COLOR = "#1f77b4", "#9e9e9e", "#d62728"
ROOF_COLOR = "#444444"


@dataclass(frozen=True)
class Point:
    name: str             # "R3" or a kernel group
    intensity: float      # FLOPs per byte it must move
    tflops: float         # achieved
    precision: str        # the rung's compute precision ("bf16" / "fp32"); groups: the fastest's
    dead_end: bool = False


def rung_points(result: LadderResult) -> list[Point]:
    """Every measured waterfall rung with a model rate: its step's intensity and TFLOP/s."""
    dead = dead_ends(result)
    out = []
    for r in result.waterfall():
        if not r.tflops:
            continue
        w = workload(result, r)
        need = must_do(w)
        b = sum(need[g][0] for g in TOP_GROUPS)
        f = sum(need[g][1] for g in TOP_GROUPS)
        out.append(Point(r.name, f / b, r.tflops, w.precision, r.name in dead))
    return out


def group_points(result: LadderResult) -> list[Point]:
    """The fastest step's kernel groups (its kernel report's roofline rows) that must both move
    bytes and do FLOPs: intensity and achieved TFLOP/s. Sub-rows ('elementwise: GELU') are
    left out: their parent is drawn."""
    r = kernel_rung(result)
    rl = (r.kernels or {}).get("roofline") if r is not None else None
    if not rl:
        return []
    prec = rl.get("workload", {}).get("precision", "bf16")
    return [Point(row["group"], row["flops"] / row["bytes"], row["flops"] / (row["time_ms"] / 1e3) / 1e12, prec)
            for row in rl.get("rows", []) if ": " not in row["group"]
            and row.get("time_ms") and row.get("flops") and row.get("bytes")]


def figure(result: LadderResult):
    """Two panels on the same roofs: the rungs (left) and the fastest step's kernel groups
    (right). A run without measured ceilings gets a figure that says so."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from perfladder.pages.claims import is_smoke
    roofs = roofs_of(result)
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH_IN, 4.6), layout="constrained", sharey=True,
                             gridspec_kw={"width_ratios": [1.35, 1]})
    smoke = " [SMOKE: not performance numbers]" if is_smoke(result) else ""
    fig.suptitle(f"{result.framework} on {result.device}: roofline of every rung, and of the fastest "
                 f"step's kernels{smoke}", fontsize=9)
    if roofs is None:
        for ax in axes:
            ax.text(0.5, 0.5, "this run measured no ceilings\n(no device probe): no roofline",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8, gid="no-roofs")
            ax.set_axis_off()
        return fig
    rungs, groups = rung_points(result), group_points(result)
    pts = rungs + groups
    lo = min([p.intensity for p in pts] + [1.0]) / 3
    hi = max([p.intensity for p in pts] + [1e3]) * 3
    tf32 = roofs_of(result, "fp32")
    fastest = kernel_rung(result)
    bottoms = [min([p.tflops for p in pts] + [1.0])]
    for ax, points, title in ((axes[0], rungs, "rungs: the step's model TFLOP/s"),
                              (axes[1], groups, f"{fastest.name if fastest else 'fastest'}'s kernel "
                                                "groups: must-do FLOPs / measured time")):
        x_lo, x_hi = (lo, hi) if points is groups else _rung_range(points)
        _roofs(ax, roofs, tf32, x_lo, x_hi)
        for p in points:
            color = GROUP_COLOR if points is groups else (DEAD_COLOR if p.dead_end else RUNG_COLOR)
            marker = "s" if points is groups else ("^" if p.precision == "fp32" else "o")
            ax.scatter([p.intensity], [p.tflops], s=22, color=color, marker=marker, zorder=3,
                       facecolors="none" if p.dead_end else color, gid=f"point:{p.name}")
        bottoms.append(_labels(ax, points, x_hi, GROUP_COLOR if points is groups else None))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(x_lo, x_hi)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("FLOPs per byte it must move (log)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("achieved TFLOP/s (log)", fontsize=8)
    axes[0].set_ylim(min(bottoms) / 2, roofs.matmul_flops_per_s / 1e12 * 2.5)
    handles = [Line2D([], [], color=ROOF_COLOR, label=f"roof: copy {roofs.copy_bytes_per_s / 1e12:.1f} TB/s, "
                      f"bf16 matmul {roofs.matmul_flops_per_s / 1e12:.0f} TFLOP/s (this run's probe)"),
               Line2D([], [], color=RUNG_COLOR, marker="o", linestyle="none", label="rung (bf16)"),
               Line2D([], [], color=RUNG_COLOR, marker="^", linestyle="none", label="rung (fp32 / TF32)"),
               Line2D([], [], color=DEAD_COLOR, marker="o", markerfacecolor="none", linestyle="none",
                      label="dead end (not built on)"),
               Line2D([], [], color=GROUP_COLOR, marker="s", linestyle="none", label="kernel group")]
    if tf32 is not None:
        handles.insert(1, Line2D([], [], color=ROOF_COLOR, linestyle="--",
                                 label=f"TF32 matmul roof {tf32.matmul_flops_per_s / 1e12:.0f} TFLOP/s"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=6.5, frameon=False)
    return fig


def _rung_range(points: list[Point]) -> tuple[float, float]:
    """The rungs sit within a factor of a few in intensity: a window around them, with room on
    the right for their labels."""
    xs = [p.intensity for p in points] or [100.0]
    return min(xs) / 2.5, max(xs) * 12


def _labels(ax, points: list[Point], x_hi: float, color: str | None) -> float:
    """Each point's name in a column at the right edge, its rank by rate kept, joined to the
    point by a thin line: points that crowd (the rungs share an intensity) stay readable."""
    if not points:
        return 1.0
    if color is not None:            # a few groups, apart: each named beside its point
        for i, p in enumerate(sorted(points, key=lambda p: p.intensity)):
            ax.annotate(p.name, (p.intensity, p.tflops), xytext=(5, 6 if i % 2 else -8),
                        textcoords="offset points", fontsize=6.5, color=color, gid=f"label:{p.name}")
        return min(p.tflops for p in points)
    import math
    ordered = sorted(points, key=lambda p: p.tflops)
    lo, hi = math.log10(ordered[0].tflops), math.log10(ordered[-1].tflops)
    span = max(hi - lo, 0.12 * (len(points) - 1))
    x = x_hi / (1.6 if color is None else 1.02)
    lowest = ordered[0].tflops
    for i, p in enumerate(ordered):
        y = 10 ** (lo + (hi - lo) / 2 - span / 2 + span * i / max(len(points) - 1, 1)) if len(points) > 1 \
            else p.tflops
        c = color or (DEAD_COLOR if p.dead_end else RUNG_COLOR)
        ax.annotate(p.name, (p.intensity, p.tflops), xytext=(x, y), textcoords="data", fontsize=6.3,
                    va="center", ha="left" if color is None else "right", color=c,
                    arrowprops={"arrowstyle": "-", "color": c, "linewidth": 0.4, "alpha": 0.6},
                    gid=f"label:{p.name}")
        lowest = min(lowest, y)
    return lowest


def _roofs(ax, roofs, tf32, lo: float, hi: float) -> None:
    import numpy as np
    x = np.geomspace(lo, hi, 200)
    bw = roofs.copy_bytes_per_s / 1e12
    ax.plot(x, np.minimum(x * bw, roofs.matmul_flops_per_s / 1e12), color=ROOF_COLOR, linewidth=1.2,
            gid="roof")
    if tf32 is not None:
        ax.plot(x, np.minimum(x * bw, tf32.matmul_flops_per_s / 1e12), color=ROOF_COLOR, linewidth=0.8,
                linestyle="--", gid="roof-tf32")
