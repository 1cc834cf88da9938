"""The waterfall and the two-framework comparison (matplotlib only, no framework imports).

Every bar carries the range of its settled windows as a whisker and its throughput as text.
A bar whose own windows did not settle is hatched, labelled so, and never given a ratio; the
other labels follow ``perfladder.pages.claims.call`` (a ratio where the verdict is beyond the
noise, '≈' within it). A legend names every colour drawn.

The waterfall's axis is linear for both frameworks (``scale='linear'``, the default): a log
axis flattens the climb a reader compares between the pages, and a floor too short to see
still reads from its value, printed over it. ``scale='auto'`` picks log when the bars span more
than ``LOG_SPAN``; the axis label says which scale was used.

A rung that nothing later builds on (a dead end: a technique the ladder tried and left) is
drawn as an outline, so the kept chain reads as the solid bars (``dead_ends``). Each label
says what a reader needs: its speed-up over the rung it builds on ("1.08x over B5"), or "no
gain over B1" within the noise.

Where a run measured its device's matmul rate (``LadderResult.roofs``), a dashed line marks
the model's ceiling, one per run, each at its own probe (``perfladder.kernels.ceiling``, the
number every page quotes for that run), labelled on the line and in the legend; a run without
roofs says so in the legend. Figures fit the book's text column.
"""
from __future__ import annotations

import math
from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from perfladder.pages import rerun
from perfladder.pages.claims import call, ceiling, is_smoke, settled
from perfladder.results.record import LadderResult, RungResult
from perfladder.words import rate

BASE_COLOR = "#7f7f7f"     # the baseline bar (and anything left of it)
GAIN_COLOR = "#1f77b4"     # a credited step (verdict 'faster')
LOSS_COLOR = "#d62728"     # slower than the configuration it builds on
BEYOND_COLOR = "#2ca02c"   # a credited step past the chapter's ladder (stage 'beyond')
NOISE_COLOR = "#9ecae1"    # within the noise, or a comparison that did not settle
CEILING_COLOR = "#444444"
FRAMEWORK_COLORS = {"torch": "#ee4c2c", "jax": "#4a7fd6"}
UNSETTLED_HATCH = "///"
PAGE_WIDTH_IN = 7.5        # the book's text column at 100 dpi
CROWDED_BARS = 14          # past this many bars a waterfall staggers its verdict labels
UNITS = {"k": 1e3, "M": 1e6}
SCALES = ("auto", "linear", "log")
LOG_SPAN = 25              # auto: log when the top drawn is more than 25x the lowest bar
LEGEND_TEXT = {
    BASE_COLOR: "baseline (or a floor below it)",
    GAIN_COLOR: "faster than the rung it builds on",
    BEYOND_COLOR: "faster, beyond the chapter's ladder",
    LOSS_COLOR: "slower than the rung it builds on",
    NOISE_COLOR: "within the noise, or no verdict",
}
DARK_TEXT = {NOISE_COLOR}  # light fills take dark text


def _figure(ax, size):
    if ax is None:
        import matplotlib.pyplot as plt
        return plt.subplots(figsize=size, layout="constrained")
    return ax.figure, ax


def _unit_for(top: float) -> str:
    return "M" if top >= 1e6 else "k"


def _range(r: RungResult) -> tuple[float, float]:
    t = r.timing
    return (t.low, t.high) if t is not None and t.windows else (r.tokens_per_s, r.tokens_per_s)


def _bar_of(res: LadderResult, key: str) -> RungResult | None:
    """The waterfall bar of technique ``key`` in ``res`` (None: no such measured rung)."""
    return next((r for r in res.waterfall() if r.key == key), None)


def axis_scale(lowest: float, top: float, scale: str = "auto") -> str:
    """'linear' or 'log': ``scale`` itself, or for 'auto' log when ``top`` is more than
    ``LOG_SPAN`` times ``lowest`` (the lowest bar would be a sliver on a linear axis)."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not valid; valid choices: {SCALES}")
    if scale != "auto":
        return scale
    return "log" if lowest > 0 and top / lowest > LOG_SPAN else "linear"


def device_ceilings(results: list[LadderResult]) -> list[dict]:
    """One ceiling per run among ``results`` (``perfladder.kernels.ceiling.ceiling``: each run
    at its own probe, never another run's), in order; runs without roofs have none."""
    return [c for c in (ceiling(res) for res in results) if c]


def bar_colors(result: LadderResult) -> list[str]:
    """One colour per waterfall bar: grey up to the baseline; then by what may be said of it
    against its base: credited (blue, green past the chapter), slower (red), neither (light)."""
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


def dead_ends(result: LadderResult) -> set[str]:
    """The waterfall rungs the ladder tried and left: a beyond rung recorded as not kept, and a
    rung nothing later builds on that is neither the fastest nor the last bar (a seed rung the
    beyond rungs skip). A ladder with nothing beyond its seed rungs has none."""
    bars = result.waterfall()
    if not bars or not any(b.stage == "beyond" for b in bars):
        return set()
    built_on = {r.builds_on for r in result.rungs if r.builds_on}
    fastest = result.fastest_rung().name
    return {r.name for r in bars if r.kept is False
            or (r.kept is None and r.name not in built_on and r.name not in (fastest, bars[-1].name))}


def bar_label(result: LadderResult, r: RungResult, left: RungResult | None = None) -> str:
    """The text over a bar, in words: 'did not settle' (no ratio), '1.23x over R0', 'no gain
    over B1' within the noise, 'no credit' against a base that did not settle. The base is
    always named (``left`` is kept for callers; every bar names its own base)."""
    if settled(r) is False:
        return "did not\nsettle"
    c = call(result, r)
    if c.word == "start":
        return "base" if r.name == result.baseline else rerun.bar_mark(r)
    if c.word == "unsettled":
        return "no\ncredit"
    if c.word == "within noise":
        return f"no gain\nover {c.against}"
    if not c.label:           # nothing may be read (a smoke run): no base to name either
        return "base" if r.name == result.baseline else ""
    return f"{c.label}\nover {c.against}"


def _ceiling_handle(c: dict) -> Line2D:
    return Line2D([], [], color=CEILING_COLOR, linestyle="--",
                  label=f"model ceiling of the {c['framework']} run on {c['device']}:\n"
                        f"{rate(c['tokens_per_s'])} tokens/s "
                        f"(its probe: bf16 matmul {c['tflops']:.0f} TFLOP/s)")


def _legend_handles(colors: list[str], hatched: bool, ceilings: list[dict]) -> list:
    handles = [Patch(color=col, label=LEGEND_TEXT[col]) for col in LEGEND_TEXT if col in colors]
    handles.append(Line2D([], [], color="black", marker="|", linestyle="none", markersize=8,
                          label="range of the settled windows"))
    if hatched:
        handles.append(Patch(facecolor="white", edgecolor="#555", hatch=UNSETTLED_HATCH,
                             label="did not settle: no ratio credited"))
    handles += [_ceiling_handle(c) for c in ceilings]
    if not ceilings:
        handles.append(Line2D([], [], linestyle="none",
                              label="no measured roofs in this run: no ceiling line"))
    return handles


def tokens_tick(v, _pos=None) -> str:
    """A decade as a short number: 1k, 10k, 100k, 1M, 10M."""
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def _set_scale(axis_setter, axis, which: str, unit: str, what: str) -> str:
    """Scale one axis; returns its label."""
    if which == "log":
        axis_setter("log")
        axis.set_major_locator(LogLocator(base=10))
        axis.set_major_formatter(FuncFormatter(tokens_tick))
        axis.set_minor_formatter(NullFormatter())
        return f"{what} (tokens/s, log scale)"
    return f"{what} ({unit} tokens/s)"


def _shade(b, r: RungResult) -> bool:
    """Hatch an unsettled bar; True when it was hatched."""
    if settled(r) is not False:
        return False
    b.set_hatch(UNSETTLED_HATCH)
    b.set_edgecolor("#555555")
    b.set_alpha(0.55)
    return True


def _beyond_divider(ax, bars: list[RungResult]) -> None:
    """A dotted line where the chapter's rungs end and the rungs beyond them begin."""
    first = next((i for i, r in enumerate(bars) if r.stage == "beyond"), None)
    if not first:
        return
    ax.axvline(first - 0.5, color="#bbbbbb", linestyle=":", linewidth=1)
    trans = ax.get_xaxis_transform()
    ax.text(first - 0.6, 0.99, "the chapter's rungs", transform=trans, ha="right", va="top",
            fontsize=7, color="#666666")
    ax.text(first - 0.4, 0.99, "beyond the chapter", transform=trans, ha="left", va="top",
            fontsize=7, color="#666666")


def _save(fig, path):
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")   # the legend below the axes too
    return fig


def waterfall(result: LadderResult, path: str | Path | None = None, ax=None, title: str | None = None,
              unit: str | None = None, scale: str = "linear"):
    """Cumulative bars of the ladder with window whiskers, values, verdict labels, a colour
    legend and the ceiling.

    ``unit`` (``'k'`` or ``'M'`` tokens/s, linear axis) is picked from the tallest bar unless
    given; ``scale``: 'linear' (both pages), 'auto' (see the module) or 'log'. Dead ends
    (``dead_ends``) are outlines. Returns the figure; saves it
    when ``path`` is given.
    """
    bars = result.waterfall()
    if not bars:
        raise ValueError(f"{result.framework} ladder has no measured rungs to plot")
    if unit is not None and unit not in UNITS:
        raise ValueError(f"unit={unit!r} is not valid; valid choices: {tuple(UNITS)}")
    own_figure = ax is None
    fig, ax = _figure(ax, (PAGE_WIDTH_IN, 5.2))
    ceilings = device_ceilings([result])
    lows, highs = zip(*(_range(r) for r in bars))
    top = max(list(highs) + [c["tokens_per_s"] for c in ceilings])
    which = axis_scale(min(lows), top, scale)
    if which == "log" and min(lows) <= 0:
        raise ValueError("scale='log' needs every bar above zero tokens/s")
    unit = unit or _unit_for(top)
    s = 1.0 if which == "log" else UNITS[unit]
    floor = 10 ** math.floor(math.log10(min(lows) / 1.5)) if which == "log" else 0.0
    heights = [r.tokens_per_s / s for r in bars]
    err = [[h - lo / s for h, lo in zip(heights, lows)], [hi / s - h for h, hi in zip(heights, highs)]]
    colors = bar_colors(result)
    drawn = ax.bar(range(len(bars)), [h - floor for h in heights], bottom=floor, color=colors,
                   yerr=err, capsize=2, error_kw={"elinewidth": 0.9, "ecolor": "black"})
    ylabel = _set_scale(ax.set_yscale, ax.yaxis, which, unit, "throughput")
    ymax = top / s * (2.5 if which == "log" else 1.2)
    ax.set_ylim(floor if which == "log" else 0, ymax)
    hatched = False
    dead = dead_ends(result)
    crowded, verdicts = len(bars) > CROWDED_BARS, []
    for i, (b, r) in enumerate(zip(drawn, bars)):
        hatched = _shade(b, r) or hatched
        if r.name in dead:
            b.set_facecolor("white")
            b.set_edgecolor(colors[i])
            b.set_linewidth(1.4)
            b.set_gid("dead-end")
        x = b.get_x() + b.get_width() / 2
        label = bar_label(result, r, bars[i - 1] if i else None)
        short = (math.log10(heights[i] / floor) / math.log10(ymax / floor) if which == "log"
                 else heights[i] / ymax) < 0.06
        if short:             # no room inside: the value goes over the bar, under its verdict
            label = rate(r.tokens_per_s) + ("\n" + label if label else "")
        else:
            inside = floor * (heights[i] / floor) ** 0.04 if which == "log" else 0.012 * ymax
            ax.text(x, inside, rate(r.tokens_per_s), ha="center", va="bottom", fontsize=6,
                    color="#222222" if colors[i] in DARK_TEXT or r.name in dead else "white", gid="value")
        verdicts.append(ax.text(x, highs[i] / s, label, ha="center", va="bottom",
                                fontsize=6.5 if crowded else 7, linespacing=0.95, gid="verdict"))
    for c in ceilings:
        ax.axhline(c["tokens_per_s"] / s, color=CEILING_COLOR, linestyle="--", linewidth=1)
        ax.text(len(bars) - 0.5, c["tokens_per_s"] / s, f"ceiling {rate(c['tokens_per_s'])} tokens/s",
                ha="right", va="bottom", fontsize=7, color=CEILING_COLOR, gid="ceiling")
    _beyond_divider(ax, bars)
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([f"{r.name} {r.label}" for r in bars], fontsize=7.5, rotation=35,
                       ha="right", rotation_mode="anchor")
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    smoke = " [SMOKE: not performance numbers]" if is_smoke(result) else ""
    ax.set_title(title or f"{result.framework} on {result.device}: cumulative waterfall{smoke}\n"
                 "over each bar: its speed-up over the rung it builds on, where the verdict allows",
                 fontsize=9)
    handles = _legend_handles(colors, hatched, ceilings)
    if dead:
        handles.append(Patch(facecolor="white", edgecolor="#555", linewidth=1.4,
                             label="outline: a dead end (nothing later builds on it)"))
    if own_figure:
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7, frameon=False)
    else:
        ax.legend(handles=handles, loc="upper left", ncols=2, fontsize=6.5, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    _unstack(ax, verdicts)
    return _save(fig, path)


def _unstack(ax, labels) -> None:
    """Raise each label that would print over its left neighbour's to just above it (bars of
    about one height side by side), and the axis top with them when one would leave it."""
    ax.figure.draw_without_rendering()   # the layout first, no pixels: it moves the axes and labels
    renderer = ax.figure.canvas.get_renderer()
    prev, top = None, None
    for t in labels:
        box = t.get_window_extent(renderer)
        if prev is not None and t.get_text() and box.overlaps(prev):
            x, y = t.get_position()
            shown = ax.transData.transform((x, y))
            t.set_position((x, ax.transData.inverted().transform((shown[0], shown[1] + prev.y1 + 2 - box.y0))[1]))
            box = t.get_window_extent(renderer)
        if t.get_text():
            prev, top = box, box.y1 if top is None else max(top, box.y1)
    if top is not None and top > ax.get_window_extent(renderer).y1:
        x0, _ = ax.transData.inverted().transform((0, 0))
        ax.set_ylim(top=ax.transData.inverted().transform((x0, top + 4))[1])


def compare(results: list[LadderResult], path: str | Path | None = None, title: str | None = None,
            scale: str = "linear"):
    """Several ladders lined up by technique key: one row per key, one bar per ladder (that
    ladder's configuration with the technique, cumulative as in its waterfall), its value
    beside it.

    Linear by default: what this figure compares is the frameworks' absolute throughputs at
    the same technique, which differ by a few percent at the top of the ladders, where a log
    axis would flatten them; a floor too short to see still reads from its value."""
    import matplotlib.pyplot as plt

    from perfladder.pages.report import keys_in_order
    if not results:
        raise ValueError("compare() needs at least one ladder result")
    empty = [f"{res.framework} on {res.device}" for res in results if not res.waterfall()]
    if empty:
        raise ValueError(f"compare(): no measured rungs to plot in {empty}")
    keys = [k for k in keys_in_order(results) if any(_bar_of(res, k) for res in results)]
    ceilings = device_ceilings(results)
    drawn_bars = [r for res in results for r in res.waterfall() if r.key in keys]
    top = max([_range(r)[1] for r in drawn_bars] + [c["tokens_per_s"] for c in ceilings])
    which = axis_scale(min(_range(r)[0] for r in drawn_bars), top, scale)
    unit = _unit_for(top)
    s = 1.0 if which == "log" else UNITS[unit]
    floor = (10 ** math.floor(math.log10(min(_range(r)[0] for r in drawn_bars) / 1.5))
             if which == "log" else 0.0)
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN, 0.3 * len(keys) * max(1, len(results) / 2) + 2.2),
                           layout="constrained")
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
            bar = ax.barh(y, r.tokens_per_s / s - floor, left=floor, height=h * 0.92, color=color,
                          xerr=[[(r.tokens_per_s - lo) / s], [(hi - r.tokens_per_s) / s]],
                          error_kw={"elinewidth": 0.8, "capsize": 1.5})[0]
            hatched = _shade(bar, r) or hatched
            ax.text(hi / s, y, f" {r.name} {rate(r.tokens_per_s)}", va="center", fontsize=7.5)
    for i, c in enumerate(ceilings):     # one label a row, so that close ceilings stay legible
        ax.axvline(c["tokens_per_s"] / s, color=CEILING_COLOR, linestyle="--", linewidth=1)
        ax.text(c["tokens_per_s"] / s, -0.7 + 0.9 * i, f"{c['framework']} ceiling {rate(c['tokens_per_s'])} ",
                ha="right", va="center", fontsize=6.5, color=CEILING_COLOR, gid="ceiling")
    xlabel = _set_scale(ax.set_xscale, ax.xaxis, which, unit, "throughput")
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([k.replace("_", " ") for k in keys], fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -1.1)
    ax.set_xlim(floor, top / s * (2.2 if which == "log" else 1.18))
    ax.set_xlabel(xlabel, fontsize=8.5)
    ax.tick_params(axis="x", labelsize=7.5)
    smoke = " [SMOKE: not performance numbers]" if any(is_smoke(res) for res in results) else ""
    where = "; ".join(f"{res.framework} on {res.device}" for res in results)
    ax.set_title(title or f"by technique: {where}{smoke}", fontsize=9)
    devices = {res.device for res in results}
    handles = [Patch(color=FRAMEWORK_COLORS.get(res.framework, "#555555"),
                     label=res.framework + (f" ({res.device})" if len(devices) > 1 else ""))
               for res in results]
    handles += _legend_handles([], hatched, ceilings)
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=7.5, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _save(fig, path)


def comparison_table(results: list[LadderResult]) -> str:
    """The two ladders lined up by technique key, as markdown (the CLI's ``table``)."""
    from perfladder.pages.report import comparison_markdown
    return comparison_markdown(results)
