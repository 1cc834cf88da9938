"""The waterfall and the two-framework comparison (matplotlib only, no framework imports)."""
from __future__ import annotations

from pathlib import Path

from .results import LadderResult

BASE_COLOR = "#7f7f7f"     # the baseline bar (and anything left of it)
GAIN_COLOR = "#1f77b4"     # a rung that paid
LOSS_COLOR = "#d62728"     # a negative rung: slower than the rung it builds on
BEYOND_COLOR = "#2ca02c"   # rungs past the seed's ladder (names starting with 'B')


def _figure(ax, size):
    if ax is None:
        import matplotlib.pyplot as plt
        return plt.subplots(figsize=size)
    return ax.figure, ax


def _wrap(label: str, width: int = 11) -> str:
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


def bar_colors(result: LadderResult) -> list[str]:
    """One color per waterfall bar: grey up to the baseline, red for a loss, blue/green for a gain."""
    colors, seen_base = [], False
    for r in result.waterfall():
        if r.name == result.baseline:
            seen_base = True
            colors.append(BASE_COLOR)
        elif not seen_base:
            colors.append(BASE_COLOR)
        elif r.ratio_prev is not None and r.ratio_prev < 1.0:
            colors.append(LOSS_COLOR)
        else:
            colors.append(BEYOND_COLOR if r.name.startswith("B") else GAIN_COLOR)
    return colors


UNITS = {"k": 1e3, "M": 1e6}


def _unit_for(top: float) -> str:
    return "M" if top >= 1e6 else "k"


def waterfall(result: LadderResult, path: str | Path | None = None, ax=None, title: str | None = None,
              unit: str | None = None):
    """Cumulative bars of the ladder, each labelled with its ratio to the baseline.

    ``unit`` (``'k'`` or ``'M'`` tokens/s) is picked from the tallest bar unless given
    (``compare`` gives one unit to every panel). Returns the figure; saves a PNG when
    ``path`` is given.
    """
    bars = result.waterfall()
    if not bars:
        raise ValueError(f"{result.framework} ladder has no measured rungs to plot")
    fig, ax = _figure(ax, (max(6.0, 1.05 * len(bars) + 1.5), 3.8))
    unit = unit or _unit_for(max(r.tokens_per_s for r in bars))
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is not valid; valid choices: {tuple(UNITS)}")
    scale = UNITS[unit]
    labels = [f"{r.name}\n{_wrap(r.label)}" for r in bars]
    heights = [r.tokens_per_s / scale for r in bars]
    drawn = ax.bar(range(len(bars)), heights, color=bar_colors(result))
    for b, r in zip(drawn, bars):
        ratio = "" if r.ratio_base is None else f"{r.ratio_base:.2f}x"
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), ratio,
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel(f"throughput ({unit} tokens/s)")
    ax.set_ylim(0, max(heights) * 1.15)
    cfg = result.config.get("name", "?")
    smoke = " [SMOKE: not performance numbers]" if cfg == "smoke" else ""
    ax.set_title(title or f"{result.framework}: cumulative rungs on {result.device}{smoke}\n"
                 f"labels: ratio to {result.baseline}", fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def compare(results: list[LadderResult], path: str | Path | None = None):
    """Waterfalls of several ladders (e.g. torch and jax from one machine) on one y scale.

    One panel per ladder, stacked, so that each keeps a readable width on a book page.
    """
    import matplotlib.pyplot as plt
    if not results:
        raise ValueError("compare() needs at least one ladder result")
    empty = [f"{res.framework} on {res.device}" for res in results if not res.waterfall()]
    if empty:
        raise ValueError(f"compare(): no measured rungs to plot in {empty}")
    width = min(11.0, max(6.0, 0.8 * max(len(r.waterfall()) for r in results) + 1.5))
    fig, axes = plt.subplots(len(results), 1, figsize=(width, 3.6 * len(results)), squeeze=False)
    top = max(r.tokens_per_s for res in results for r in res.waterfall())
    unit = _unit_for(top)                    # one unit and one y scale for every panel
    for ax, res in zip(axes[:, 0], results):
        waterfall(res, ax=ax, unit=unit)
        ax.set_ylim(0, top / UNITS[unit] * 1.15)
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def comparison_table(results: list[LadderResult]) -> str:
    """A markdown table: every rung of every ladder, side by side by rung name."""
    names: list[str] = []
    for res in results:                      # merge, keeping each ladder's own order:
        after = None                         # a new name goes right after its predecessor
        for r in res.rungs:
            if r.name not in names:
                names.insert(0 if after is None else names.index(after) + 1, r.name)
            after = r.name
    head = "| rung | " + " | ".join(
        f"{res.framework} tokens/s | {res.framework} x{res.baseline} | {res.framework} MFU" for res in results) + " |"
    sep = "|---|" + "---|---|---|" * len(results)
    rows = [head, sep]
    for n in names:
        cells = [n]
        for res in results:
            try:
                r = res.rung(n)
            except KeyError:
                cells += ["", "", ""]
                continue
            cells.append(f"{r.label}: " + ("skipped" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"))
            cells.append("" if r.ratio_base is None else f"{r.ratio_base:.2f}")
            cells.append("n/a" if r.mfu is None else f"{100 * r.mfu:.1f}%")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
