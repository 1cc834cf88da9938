"""perfladder.plot: waterfall PNG, bar colours, titles, the side-by-side comparison."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from conftest import make_result  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from perfladder.plot import (BASE_COLOR, BEYOND_COLOR, GAIN_COLOR, LOSS_COLOR, bar_colors,  # noqa: E402
                             compare, comparison_table, waterfall)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_waterfall_png(tmp_path, synthetic_result):
    path = tmp_path / "out" / "torch.png"
    fig = waterfall(synthetic_result, path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 4                                   # R0..R3; control and skipped are not bars
    assert [b.get_height() for b in bars] == pytest.approx([100, 250, 200, 600])   # k tokens/s
    assert "k tokens/s" in ax.get_ylabel()
    assert "NVIDIA H200" in ax.get_title() and "torch" in ax.get_title()
    labels = [t.get_text() for t in ax.texts]
    assert labels == ["1.00x", "2.50x", "2.00x", "6.00x"]   # ratio to the baseline on each bar


def test_negative_rung_gets_the_loss_colour(synthetic_result):
    assert bar_colors(synthetic_result) == [BASE_COLOR, GAIN_COLOR, LOSS_COLOR, GAIN_COLOR]
    fig = waterfall(synthetic_result)
    drawn = [to_hex(b.get_facecolor()) for b in fig.axes[0].patches]
    assert drawn == [BASE_COLOR, GAIN_COLOR, LOSS_COLOR, GAIN_COLOR]


def test_beyond_rungs_and_millions():
    r = make_result(rates=(5e5, 1.5e6, 2e6), names=["R0", "R1", "B1"])
    assert bar_colors(r) == [BASE_COLOR, GAIN_COLOR, BEYOND_COLOR]
    ax = waterfall(r).axes[0]
    assert "M tokens/s" in ax.get_ylabel()
    assert [b.get_height() for b in ax.patches] == pytest.approx([0.5, 1.5, 2.0])


def test_smoke_results_are_labelled(synthetic_result):
    r = make_result(device="cpu", config_name="smoke")
    title = waterfall(r).axes[0].get_title()
    assert "cpu" in title and "SMOKE" in title


def test_nothing_to_plot():
    r = make_result(rates=(1.0,))
    r.rungs = [x for x in r.rungs if x.kind == "skipped"]
    with pytest.raises(ValueError, match="no measured rungs"):
        waterfall(r)
    with pytest.raises(ValueError, match="no measured rungs"):
        compare([make_result(), r])
    with pytest.raises(ValueError, match="at least one"):
        compare([])


def test_compare_two_ladders_on_one_scale(tmp_path):
    torch_r = make_result("torch", rates=(2e5, 1.2e6))
    jax_r = make_result("jax", rates=(1e5, 3e5, 9e5))
    path = tmp_path / "both.png"
    fig = compare([torch_r, jax_r], path)
    assert path.read_bytes()[:8] == PNG_MAGIC
    a, b = fig.axes
    assert "torch" in a.get_title() and "jax" in b.get_title()
    assert a.get_position().y0 > b.get_position().y1            # stacked, torch on top
    assert fig.get_figwidth() <= 11.0                           # readable at page width
    assert a.get_ylim() == b.get_ylim() == pytest.approx((0, 1.2 * 1.15))
    # both panels in the same unit (M tokens/s), even though jax alone stays below 1M
    assert "M tokens/s" in a.get_ylabel() and "M tokens/s" in b.get_ylabel()
    assert [p.get_height() for p in b.patches] == pytest.approx([0.1, 0.3, 0.9])


def test_comparison_table():
    t = comparison_table([make_result("torch"), make_result("jax", rates=(50.0, 100.0))])
    lines = t.splitlines()
    assert lines[0].startswith("| rung | torch tokens/s | torch xR0 | torch MFU | jax tokens/s")
    row_r3 = next(line for line in lines if line.startswith("| R3 |"))
    assert "step 3: 600,000" in row_r3 and row_r3.endswith("|  |  |  |")   # jax has no R3
    row_r5 = next(line for line in lines if line.startswith("| R5 |"))
    assert row_r5.count("skipped") == 2
