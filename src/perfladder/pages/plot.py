"""The waterfall and the two-framework comparison (matplotlib only, no framework imports).

Every bar carries the range of its settled windows as a whisker. A bar whose own windows did
not settle is hatched, labelled so, and never given a ratio; the other labels follow
``perfladder.pages.claims.call`` (a ratio where the verdict is beyond the noise, '≈' within it).
Where the run measured its device's matmul rate (``LadderResult.roofs``), a dashed line marks
the model's ceiling: that rate over the model's training FLOPs per token; a run without roofs
says so in the legend. Figures are sized for the book's content column.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from perfladder.pages.claims import call, ceiling, is_smoke, settled
from perfladder.pages.words import rate
from perfladder.results.record import LadderResult, RungResult

BASE_COLOR = "#7f7f7f"     # the baseline bar (and anything left of it)
GAIN_COLOR = "#1f77b4"     # a credited step (verdict 'faster')
LOSS_COLOR = "#d62728"     # slower than the configuration it builds on
BEYOND_COLOR = "#2ca02c"   # a credited step past the seed's ladder (stage 'beyond')
NOISE_COLOR = "#9ecae1"    # within the noise, or a comparison that did not settle
CEILING_COLOR = "#444444"
FRAMEWORK_COLORS = {"torch": "#ee4c2c", "jax": "#4a7fd6"}
UNSETTLED_HATCH = "///"
PAGE_WIDTH_IN = 7.5        # the book's content column at 100 dpi
UNITS = {"k": 1e3, "M": 1e6}


def _figure(ax, size):
    if ax is None:
        import matplotlib.pyplot as plt
        return plt.subplots(figsize=size)
    return ax.figure, ax


def _wrap(label: str, width: int = 10) -> str:
    """Break a bar label into lines of about ``width`` characters (long labels overlap)."""
    lines, line = [], ""
    for word in label.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "\n".join(lines)


def _unit_for(top: float) -> str:
    return "M" if top >= 1e6 else "k"


def _range(r: RungResult) -> tuple[float, float]:
    t = r.timing
    return (t.low, t.high) if t is not None and t.windows else (r.tokens_per_s, r.tokens_per_s)


def _bar_of(res: LadderResult, key: str) -> RungResult | None:
    """The waterfall bar of technique ``key`` in ``res`` (None: no such measured rung)."""
    return next((r for r in res.waterfall() if r.key == key), None)


def bar_colors(result: LadderResult) -> list[str]:
    """One colour per waterfall bar: grey up to the baseline; then by what may be said of it
    against its base: credited (blue, green past the seed), slower (red), neither (light)."""
    colors, seen_base = [], False
    for r in result.waterfall():
        seen_base = seen_base or r.name == result.baseline
        word = call(result, r).word
        if not seen_base or r.name == result.baseline or word == "start":
            colors.append(BASE_COLOR)
        elif word == "faster":
            colors.append(BEYOND_COLOR if r.stage == "beyond" else GAIN_COLOR)
        elif word == "slower":
            colors.append(LOSS_COLOR)
        else:
            colors.append(NOISE_COLOR)
    return colors


def bar_label(result: LadderResult, r: RungResult, left: RungResult | None = None) -> str:
    """The text over a bar: 'did not settle' (no ratio), a ratio, '≈' within the noise,
    'no credit' against a base that did not settle; the base's name when it is not ``left``."""
    if settled(r) is False:
        return "did not\nsettle"
    c = call(result, r)
    if c.word == "start":
        return "base" if r.name == result.baseline else ""
    if c.word == "unsettled":
        return "no\ncredit"
    text = "≈" if c.word == "within noise" else c.label
    if left is None or c.against != left.name:
        text += f"\nvs {c.against}"
    return text


def _legend(ax, result_or_results, hatched: bool, ceilings: list[dict]):
    handles = [Line2D([], [], color="black", marker="|", linestyle="none", markersize=8,
                      label="range of the settled windows")]
    if hatched:
        handles.append(Patch(facecolor="white", edgecolor="#555", hatch=UNSETTLED_HATCH,
                             label="did not settle: no ratio credited"))
    if ceilings:
        c = ceilings[0]
        handles.append(Line2D([], [], color=CEILING_COLOR, linestyle="--",
                              label=f"ceiling at the measured bf16 matmul rate ({c['tflops']:.0f} TFLOP/s)"))
    else:
        handles.append(Line2D([], [], linestyle="none",
                              label="no measured roofs in this run: no ceiling line"))
    return handles


def waterfall(result: LadderResult, path: str | Path | None = None, ax=None, title: str | None = None,
              unit: str | None = None):
    """Cumulative bars of the ladder with window whiskers, verdict labels and the ceiling.

    ``unit`` (``'k'`` or ``'M'`` tokens/s) is picked from the tallest bar unless given.
    Returns the figure; saves a PNG when ``path`` is given.
    """
    bars = result.waterfall()
    if not bars:
        raise ValueError(f"{result.framework} ladder has no measured rungs to plot")
    fig, ax = _figure(ax, (PAGE_WIDTH_IN, 4.3))
    ceil = ceiling(result)
    top = max([_range(r)[1] for r in bars] + ([ceil["tokens_per_s"]] if ceil else []))
    unit = unit or _unit_for(top)
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is not valid; valid choices: {tuple(UNITS)}")
    scale = UNITS[unit]
    heights = [r.tokens_per_s / scale for r in bars]
    lows, highs = zip(*(_range(r) for r in bars))
    err = [[h - lo / scale for h, lo in zip(heights, lows)], [hi / scale - h for h, hi in zip(heights, highs)]]
    colors = bar_colors(result)
    drawn = ax.bar(range(len(bars)), heights, color=colors, yerr=err, capsize=2,
                   error_kw={"elinewidth": 0.9, "ecolor": "black"})
    hatched = False
    for i, (b, r) in enumerate(zip(drawn, bars)):
        if settled(r) is False:
            hatched = True
            b.set_hatch(UNSETTLED_HATCH)
            b.set_edgecolor("#555555")
            b.set_alpha(0.55)
        ax.text(b.get_x() + b.get_width() / 2, highs[i] / scale, bar_label(result, r, bars[i - 1] if i else None),
                ha="center", va="bottom", fontsize=7, linespacing=0.95)
    if ceil:
        ax.axhline(ceil["tokens_per_s"] / scale, color=CEILING_COLOR, linestyle="--", linewidth=1)
        ax.text(len(bars) - 0.5, ceil["tokens_per_s"] / scale, f"ceiling {rate(ceil['tokens_per_s'])} tokens/s",
                ha="right", va="bottom", fontsize=7, color=CEILING_COLOR)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([f"{r.name}\n{_wrap(r.label, 9)}" for r in bars], fontsize=6.5)
    ax.set_ylabel(f"throughput ({unit} tokens/s)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylim(0, top / scale * 1.4)
    smoke = " [SMOKE: not performance numbers]" if is_smoke(result) else ""
    ax.set_title(title or f"{result.framework} on {result.device}: cumulative waterfall{smoke}\n"
                 "labels: x the configuration each rung builds on, where the verdict allows", fontsize=9)
    ax.legend(handles=_legend(ax, result, hatched, [ceil] if ceil else []), loc="upper left",
              fontsize=7, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def compare(results: list[LadderResult], path: str | Path | None = None):
    """Several ladders lined up by technique key: one row per key, one bar per ladder (that
    ladder's configuration with the technique, cumulative as in its waterfall)."""
    import matplotlib.pyplot as plt

    from perfladder.pages.report import keys_in_order
    if not results:
        raise ValueError("compare() needs at least one ladder result")
    empty = [f"{res.framework} on {res.device}" for res in results if not res.waterfall()]
    if empty:
        raise ValueError(f"compare(): no measured rungs to plot in {empty}")
    keys = [k for k in keys_in_order(results) if any(_bar_of(res, k) for res in results)]
    ceilings = [c for c in (ceiling(res) for res in results) if c]
    top = max([_range(r)[1] for res in results for r in res.waterfall()] + [c["tokens_per_s"] for c in ceilings])
    unit = _unit_for(top)
    scale = UNITS[unit]
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN, 0.36 * len(keys) * max(1, len(results) / 2) + 1.6))
    h = 0.8 / len(results)
    hatched = False
    for j, res in enumerate(results):
        color = FRAMEWORK_COLORS.get(res.framework, "#555555")
        for i, k in enumerate(keys):
            r = _bar_of(res, k)
            if r is None:
                continue
            lo, hi = _range(r)
            y = i + (j - (len(results) - 1) / 2) * h
            bar = ax.barh(y, r.tokens_per_s / scale, height=h * 0.92, color=color,
                          xerr=[[(r.tokens_per_s - lo) / scale], [(hi - r.tokens_per_s) / scale]],
                          error_kw={"elinewidth": 0.8, "capsize": 1.5})[0]
            if settled(r) is False:
                hatched = True
                bar.set_hatch(UNSETTLED_HATCH)
                bar.set_edgecolor("#555555")
                bar.set_alpha(0.55)
            ax.text(hi / scale, y, f" {r.name} {rate(r.tokens_per_s)}", va="center", fontsize=6.5)
    for c in {round(c["tokens_per_s"]): c for c in ceilings}.values():
        ax.axvline(c["tokens_per_s"] / scale, color=CEILING_COLOR, linestyle="--", linewidth=1)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([k.replace("_", " ") for k in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, top / scale * 1.18)
    ax.set_xlabel(f"throughput ({unit} tokens/s)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    smoke = " [SMOKE: not performance numbers]" if any(is_smoke(res) for res in results) else ""
    where = "; ".join(f"{res.framework} on {res.device}" for res in results)
    ax.set_title(f"by technique: {where}{smoke}", fontsize=9)
    handles = [Patch(color=FRAMEWORK_COLORS.get(res.framework, "#555555"), label=res.framework) for res in results]
    handles += _legend(ax, results, hatched, ceilings)
    ax.legend(handles=handles, loc="lower right", fontsize=7, frameon=True, framealpha=0.9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def comparison_table(results: list[LadderResult]) -> str:
    """The two ladders lined up by technique key, as markdown (the CLI's ``table``)."""
    from perfladder.pages.report import comparison_markdown
    return comparison_markdown(results)
