"""perfladder.pages.plot: window whiskers, unsettled bars, verdict labels, values, the colour
legend, the axis scale, one ceiling per device, the comparison by key, and figures that fit."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from _ladders import H200, result, rung, seed_ladder  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402

from perfladder.pages.claims import ceiling  # noqa: E402
from perfladder.pages.plot import (
    BASE_COLOR,
    BEYOND_COLOR,
    CEILING_COLOR,
    GAIN_COLOR,
    LEGEND_TEXT,
    LOG_SPAN,
    LOSS_COLOR,
    NOISE_COLOR,
    PAGE_WIDTH_IN,
    UNSETTLED_HATCH,
    axis_scale,
    bar_colors,
    compare,
    comparison_table,
    device_ceilings,
    waterfall,
)
from perfladder.results.committed import read_run  # noqa: E402
from perfladder.results.record import LadderResult  # noqa: E402
from perfladder.words import rate  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOFS = {"matmul_bf16_tflops": 800.0, "source": "test probe"}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def bar_container(ax):
    return next(c for c in ax.containers if isinstance(c, BarContainer))


def ceiling_lines(ax):
    return [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and to_hex(ln.get_color()) == CEILING_COLOR]


def texts(ax, gid):
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def legend_texts(fig):
    legends = [*fig.legends, *(a.get_legend() for a in fig.axes if a.get_legend())]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def jax_like(roofs=None):
    """A ladder whose un-jitted floor is 7k tokens/s under a 3M top (JAX's shape)."""
    return result([rung("R0", "eager", [6.9e3, 7.0e3, 7.1e3]),
                   rung("R1", "compile", [340e3, 345e3, 350e3], "R0"),
                   rung("B1", "embed_fp32_lookup", [2.9e6, 2.95e6, 3.0e6], "R1", stage="beyond")],
                  framework="jax", baseline="R1", roofs=roofs)


def test_waterfall_png_bars_and_window_whiskers(tmp_path):
    r = seed_ladder()
    path = tmp_path / "out" / "torch.png"
    fig = waterfall(r, path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    ax = fig.axes[0]
    bars = bar_container(ax)
    names = [x.name for x in r.waterfall()]
    assert names == ["R0", "R1", "R2", "R3", "R4", "B1"]       # no control, no skipped rung
    assert [b.get_height() for b in bars] == pytest.approx([x.tokens_per_s / 1e3 for x in r.waterfall()])
    segments = bars.errorbar.lines[2][0].get_segments()       # one whisker per bar: low..high
    for seg, x in zip(segments, r.waterfall()):
        assert seg[0][1] == pytest.approx(x.timing.low / 1e3) and seg[1][1] == pytest.approx(x.timing.high / 1e3)
    assert "k tokens/s" in ax.get_ylabel() and "NVIDIA H200" in ax.get_title() and "torch" in ax.get_title()


def test_labels_follow_the_verdicts():
    r = seed_ladder()
    ax = waterfall(r).axes[0]
    labels = texts(ax, "verdict")
    assert labels == ["base", "2.00x\nover R0", "0.75x\nover R1", "4.01x\nover R2", "0.83x\nover R3",
                      "did not\nsettle"]
    # every label names its base in words; within the noise it says so, with no symbol
    skip = result([rung("R0", "eager", [1e5, 1e5, 1e5]), rung("B1", "cuda_graphs", [5e4, 5e4, 5e4], "R0"),
                   rung("B2", "batch_x2", [2e5, 2e5, 2e5], "R0"), rung("B3", "batch_x4", [2e5, 2.01e5, 2.02e5], "B2")])
    assert texts(waterfall(skip).axes[0], "verdict") == ["base", "0.50x\nover R0", "2.00x\nover R0",
                                                         "no gain\nover B2"]


def test_dead_ends_are_outlines_and_the_kept_chain_is_solid():
    """B1 (nothing builds on it) is an outline named in the legend; the fastest, B3, is solid."""
    from perfladder.pages.plot import dead_ends
    r = result([rung("R0", "eager", [1e5, 1e5, 1e5]),
                rung("B1", "cuda_graphs", [0.9e5, 0.9e5, 0.9e5], "R0", stage="beyond"),
                rung("B2", "batch_x2", [2e5, 2e5, 2e5], "R0", stage="beyond"),
                rung("B3", "batch_x4", [3e5, 3e5, 3e5], "B2", stage="beyond")])
    assert dead_ends(r) == {"B1"}
    bars = list(bar_container(waterfall(r).axes[0]))
    assert [b.get_gid() for b in bars] == [None, "dead-end", None, None]
    assert to_hex(bars[1].get_facecolor()) == "#ffffff" and to_hex(bars[2].get_facecolor()) != "#ffffff"
    assert any("dead end" in t for t in legend_texts(waterfall(r)))
    seed = seed_ladder()                   # B1 builds on R3: R4 is the seed rung the ladder left
    assert [x.builds_on for x in seed.waterfall()][-1] == "R3" and dead_ends(seed) == {"R4"}
    only_seed = result([x for x in seed.rungs if x.stage != "beyond"])
    assert dead_ends(only_seed) == set()   # a chain with nothing beyond it has no dead end
    assert not any("dead end" in t for t in legend_texts(waterfall(only_seed)))


def test_unsettled_bar_is_hatched_and_credited_with_nothing():
    r = seed_ladder()
    ax = waterfall(r).axes[0]
    bars = list(bar_container(ax))
    b1 = bars[[x.name for x in r.waterfall()].index("B1")]
    assert b1.get_hatch() == UNSETTLED_HATCH
    assert all(b.get_hatch() in (None, "") for b in bars if b is not b1)
    b1_label = texts(ax, "verdict")[5]
    assert "x" not in b1_label.replace("did not\nsettle", "")
    assert any("did not settle" in t for t in legend_texts(ax.figure))


def test_colours():
    r = seed_ladder()
    assert bar_colors(r) == [BASE_COLOR, GAIN_COLOR, LOSS_COLOR, GAIN_COLOR, LOSS_COLOR, NOISE_COLOR]
    beyond = result([rung("R0", "eager", [1e5, 1e5, 1e5]),
                     rung("B1", "fused_adamw", [2e5, 2e5, 2e5], "R0", stage="beyond"),
                     rung("B2", "cuda_graphs", [2e5, 2.01e5, 2.02e5], "B1", stage="beyond")])
    assert bar_colors(beyond) == [BASE_COLOR, BEYOND_COLOR, NOISE_COLOR]
    drawn = [to_hex(b.get_facecolor()) for b in bar_container(waterfall(beyond).axes[0])]
    assert drawn == [BASE_COLOR, BEYOND_COLOR, NOISE_COLOR]


def test_ceiling_line_exactly_when_the_run_has_roofs():
    plain = seed_ladder()
    ax = waterfall(plain).axes[0]
    assert ceiling_lines(ax) == []
    assert any("no measured roofs" in t for t in legend_texts(ax.figure))
    roofed = seed_ladder(roofs=ROOFS)
    assert waterfall(roofed, scale="auto").axes[0].get_yscale() == "log"   # 100k under a 6.8M ceiling
    ax = waterfall(roofed).axes[0]
    lines = ceiling_lines(ax)
    expected = ceiling(roofed)["tokens_per_s"]
    assert expected == pytest.approx(800e12 / 118_296_576)
    assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(expected / 1e6)   # M: the ceiling sets the unit
    assert "M tokens/s" in ax.get_ylabel()
    assert any("ceiling of the torch run on NVIDIA H200:\n6.76M tokens/s (its probe: bf16 matmul "
               "800 TFLOP/s)" in t for t in legend_texts(ax.figure))
    assert texts(ax, "ceiling") == ["ceiling 6.76M tokens/s"]


def test_committed_h200_waterfalls_render(tmp_path):
    for fw in ("torch", "jax"):
        r = read_run(H200 / f"{fw}.json")
        assert r.roofs is not None                            # from device.json of the same run
        fig = waterfall(r, tmp_path / f"{fw}.png")
        assert len(ceiling_lines(fig.axes[0])) == 1
        assert fig.get_figwidth() <= 7.5
        bare = LadderResult.read(H200 / f"{fw}.json")         # the file alone carries no roofs
        assert ceiling_lines(waterfall(bare).axes[0]) == []


def test_smoke_results_are_labelled_and_read_nothing():
    r = seed_ladder("smoke")
    ax = waterfall(r).axes[0]
    assert "SMOKE" in ax.get_title()
    assert texts(ax, "verdict") == ["base", "", "", "", "", "did not\nsettle"]   # no ratio, no verdict
    assert set(bar_colors(r)[1:]) == {NOISE_COLOR}
    skip = result([rung("R0", "eager", [1e3, 1e3, 1e3]), rung("B1", "cuda_graphs", [2e3, 2e3, 2e3], "R0"),
                   rung("B2", "batch_x2", [3e3, 3e3, 3e3], "R0")], config="smoke")
    assert texts(waterfall(skip).axes[0], "verdict") == ["base", "", ""]      # no base named either


def test_nothing_to_plot():
    r = result([rung("R0", "eager", None, error="no device")])
    with pytest.raises(ValueError, match="no measured rungs"):
        waterfall(r)
    with pytest.raises(ValueError, match="no measured rungs"):
        compare([seed_ladder(), r])
    with pytest.raises(ValueError, match="at least one"):
        compare([])
    with pytest.raises(ValueError, match="unit='G'.*valid choices"):
        waterfall(seed_ladder(), unit="G")


def test_compare_lines_up_by_technique_key(tmp_path):
    t = result([rung("R0", "eager", [1e5, 1e5, 1e5]), rung("R1", "compile", [2e5, 2e5, 2e5], "R0"),
                rung("B1", "fused_adamw", [3e5, 3e5, 3e5], "R1", stage="beyond")])
    j = result([rung("R0", "eager", [1e4, 1e4, 1e4]), rung("R1", "compile", [4e5, 4.1e5, 4.2e5], "R0"),
                rung("B1", "embed_fp32_lookup", [5e5, 7e5, 9e5], "R1", stage="beyond", stable=False)],
               framework="jax", baseline="R1", roofs=ROOFS)
    path = tmp_path / "both.png"
    fig = compare([t, j], path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    ax = fig.axes[0]
    keys = [x.get_text() for x in ax.get_yticklabels()]
    assert keys == ["eager", "compile", "embed fp32 lookup", "fused adamw"]   # each after its predecessor
    bars = [p for p in ax.patches if p.get_width() > 0]
    assert len(bars) == 6
    compile_bars = [b for b in bars if 0.5 < b.get_y() + b.get_height() / 2 < 1.5]
    assert sorted(b.get_width() for b in compile_bars) == pytest.approx([0.2, 0.41])     # M tokens/s
    hatched = [b for b in bars if b.get_hatch() == UNSETTLED_HATCH]
    assert len(hatched) == 1 and 1.5 < hatched[0].get_y() + hatched[0].get_height() / 2 < 2.5
    assert len(ceiling_lines(ax)) == 1                          # only the jax run has roofs
    assert fig.get_figwidth() <= 7.5


def test_comparison_table_for_the_cli():
    t = comparison_table([seed_ladder(), seed_ladder(framework="jax")])
    assert t.splitlines()[0] == "| technique | torch tokens/s | jax tokens/s |"
    assert any(line.startswith("| bf16 | R2 +bf16: 151k · 0.75x R1 · slower |") for line in t.splitlines())


# -- values, legend, scale, ceilings, fit -------------------------------------------------------
def test_every_bar_shows_its_throughput():
    r = seed_ladder()
    ax = waterfall(r).axes[0]
    inside, over = texts(ax, "value"), texts(ax, "verdict")
    for x in r.waterfall():                     # inside the bar, or over it when it is too short
        assert any(t == rate(x.tokens_per_s) for t in inside) or any(
            t.startswith(rate(x.tokens_per_s)) for t in over), x.name


def test_legend_names_each_colour_drawn_and_only_those():
    r = seed_ladder()                           # base, gain, loss, noise; nothing beyond
    legend = legend_texts(waterfall(r))
    for color in set(bar_colors(r)):
        assert LEGEND_TEXT[color] in legend
    assert LEGEND_TEXT[BEYOND_COLOR] not in legend
    assert "range of the settled windows" in legend


def test_a_floor_far_below_the_top_gets_a_log_axis_only_when_asked():
    r = jax_like()
    assert waterfall(r).axes[0].get_yscale() == "linear"        # both pages: the same linear axis
    ax = waterfall(r, scale="auto").axes[0]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel()
    bars = list(bar_container(ax))
    floor = bars[0].get_y()
    assert 0 < floor < 6.9e3                                    # R0 stands above the axis floor
    assert [b.get_y() + b.get_height() for b in bars] == pytest.approx([x.tokens_per_s for x in r.waterfall()])
    assert "7.00k" in texts(ax, "value") + texts(ax, "verdict")
    assert waterfall(seed_ladder(), scale="auto").axes[0].get_yscale() == "linear"   # 9x: linear stays
    assert waterfall(r, scale="linear").axes[0].get_yscale() == "linear"
    assert compare([r]).axes[0].get_xscale() == "linear"        # the comparison: linear unless asked
    assert compare([r], scale="log").axes[0].get_xscale() == "log"


def test_axis_scale_rule():
    assert axis_scale(1.0, LOG_SPAN * 1.01) == "log"
    assert axis_scale(1.0, LOG_SPAN * 0.99) == "linear"
    assert axis_scale(1.0, 1e9, "linear") == "linear"
    with pytest.raises(ValueError, match="scale='wide'.*valid choices"):
        axis_scale(1.0, 2.0, "wide")


def test_one_labelled_ceiling_per_run_each_at_its_own_probe():
    """Two runs on one device that probed different rates: each is drawn at its own ceiling (the
    number its own pages quote, ``kernels.ceiling.ceiling``), never at the higher of the two."""
    fast = {"matmul_bf16_tflops": 800.0}
    slow = {"matmul_bf16_tflops": 700.0}
    same = [seed_ladder(roofs=slow), seed_ladder(roofs=fast, framework="jax")]
    cs = device_ceilings(same)
    assert [(c["framework"], c["tflops"]) for c in cs] == [("torch", 700.0), ("jax", 800.0)]
    assert [c["tokens_per_s"] for c in cs] == [ceiling(res)["tokens_per_s"] for res in same]
    ax = compare(same).axes[0]
    assert len(ceiling_lines(ax)) == 2
    assert texts(ax, "ceiling") == ["torch ceiling 5.92M ", "jax ceiling 6.76M "]
    wf = waterfall(same[0], scale="linear").axes[0]              # the torch run's own, not 800
    assert [ln.get_ydata()[0] for ln in ceiling_lines(wf)] == [pytest.approx(cs[0]["tokens_per_s"] / 1e6)]
    other = result([rung("R0", "eager", [1e5, 1e5, 1e5])], device="RTX 4090", roofs=slow)
    two = compare([seed_ladder(roofs=fast), other])
    assert len(ceiling_lines(two.axes[0])) == 2
    legend = legend_texts(two)
    assert sum("model ceiling of the" in t for t in legend) == 2 and any("RTX 4090" in t for t in legend)


def test_the_chapter_and_beyond_are_divided_where_the_stages_change():
    ax = waterfall(seed_ladder()).axes[0]
    assert "the chapter's rungs" in [t.get_text() for t in ax.texts]
    plain = result([rung("R0", "eager", [1e5, 1e5, 1e5]), rung("R1", "compile", [2e5, 2e5, 2e5], "R0")])
    assert "the chapter's rungs" not in [t.get_text() for t in waterfall(plain).axes[0].texts]


def _fits(fig):
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())          # inches, everything drawn
    return fig.get_figwidth() <= PAGE_WIDTH_IN and box.x0 >= -0.01 and box.x1 <= fig.get_figwidth() + 0.01


def _ticks_apart(ax):
    """Adjacent rotated tick labels: their parallel baselines are at least a line apart."""
    import math
    ax.figure.canvas.draw()
    labels = ax.get_xticklabels()
    xs = [ax.transData.transform((t, 0))[0] for t in ax.get_xticks()]
    gap = min(b - a for a, b in zip(xs, xs[1:]))
    rot = math.radians(labels[0].get_rotation())
    height = max(lb.get_fontsize() for lb in labels) * ax.figure.dpi / 72
    return gap * math.sin(rot) >= 1.2 * height if rot else gap >= max(
        lb.get_window_extent().width for lb in labels)


def _verdicts_apart(ax) -> bool:
    """No verdict label prints over its neighbour's, and none leaves the axes."""
    ax.figure.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts if t.get_gid() == "verdict" and t.get_text()]
    inside = ax.get_window_extent().y1 + 1
    return (not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
            and all(b.y1 <= inside for b in boxes))


def test_committed_figures_fit_the_column_and_their_labels_do_not_collide():
    ladders = [read_run(H200 / f"{fw}.json") for fw in ("torch", "jax")]
    # the most crowded committed ladder: 22 bars, many of about one height
    crowded = read_run(H200.parent / "h100-book-2026-12-06" / "torch.json")
    assert len(crowded.waterfall()) > 20
    for r in [*ladders, crowded]:
        fig = waterfall(r)
        assert _fits(fig) and _ticks_apart(fig.axes[0]) and _verdicts_apart(fig.axes[0])
        assert all(f"{x.name} {x.label}" in [t.get_text() for t in fig.axes[0].get_xticklabels()]
                   for x in r.waterfall())
    assert _fits(compare(ladders))
    assert _fits(waterfall(seed_ladder("smoke")))
