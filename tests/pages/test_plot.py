"""perfladder.pages.plot: window whiskers, unsettled bars, verdict labels, the ceiling, the comparison by key."""
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
    LOSS_COLOR,
    NOISE_COLOR,
    UNSETTLED_HATCH,
    bar_colors,
    compare,
    comparison_table,
    waterfall,
)
from perfladder.results.committed import read_run  # noqa: E402
from perfladder.results.record import LadderResult  # noqa: E402

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
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["base", "2.00x", "0.75x", "4.01x", "0.83x", "did not\nsettle"]
    # a rung that builds on a bar other than its left neighbour names it
    skip = result([rung("R0", "eager", [1e5, 1e5, 1e5]), rung("B1", "cuda_graphs", [5e4, 5e4, 5e4], "R0"),
                   rung("B2", "batch_x2", [2e5, 2e5, 2e5], "R0"), rung("B3", "batch_x4", [2e5, 2.01e5, 2.02e5], "B2")])
    assert [t.get_text() for t in waterfall(skip).axes[0].texts] == ["base", "0.50x", "2.00x\nvs R0", "≈"]


def test_unsettled_bar_is_hatched_and_credited_with_nothing():
    r = seed_ladder()
    ax = waterfall(r).axes[0]
    bars = list(bar_container(ax))
    b1 = bars[[x.name for x in r.waterfall()].index("B1")]
    assert b1.get_hatch() == UNSETTLED_HATCH
    assert all(b.get_hatch() in (None, "") for b in bars if b is not b1)
    b1_label = [t.get_text() for t in ax.texts][5]
    assert "x" not in b1_label.replace("did not\nsettle", "")
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("did not settle" in t for t in legend)


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
    assert any("no measured roofs" in t.get_text() for t in ax.get_legend().get_texts())
    roofed = seed_ladder(roofs=ROOFS)
    ax = waterfall(roofed).axes[0]
    lines = ceiling_lines(ax)
    expected = ceiling(roofed)["tokens_per_s"]
    assert expected == pytest.approx(800e12 / 118_296_576)
    assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(expected / 1e6)   # M: the ceiling sets the unit
    assert "M tokens/s" in ax.get_ylabel()
    assert any("ceiling at the measured bf16 matmul rate (800 TFLOP/s)" in t.get_text()
               for t in ax.get_legend().get_texts())


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
    assert [t.get_text() for t in ax.texts] == ["base", "", "", "", "", "did not\nsettle"]   # no ratio, no verdict
    assert set(bar_colors(r)[1:]) == {NOISE_COLOR}


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
