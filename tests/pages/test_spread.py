"""perfladder.pages.spread: every committed run's batch-64 rungs, the one shown highlighted, and
the words the prose inserts about them."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib
import pytest

from perfladder.pages import spread
from perfladder.results.committed import committed_runs, read_run, reference_card, reference_run

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[2]


def shown(framework):
    return read_run(reference_run(ROOT, framework) / f"{framework}.json")


@pytest.mark.parametrize("framework", ("torch", "jax"))
def test_every_committed_run_is_a_dot_and_the_shown_one_is_marked(framework):
    runs = spread.evidence(framework, ROOT)
    card = reference_card(ROOT)
    on_card = [run for run in committed_runs(ROOT, framework) if card in run.device]
    assert len(runs) == len(on_card) > 1 and all(card in r.device for r in runs)
    # a committed run of another card is another population: drawn beside the strip, not a dot of it
    other = [run for run in committed_runs(ROOT, framework) if card not in run.device]
    assert other, "the test needs a committed run of another card"
    other_run = read_run(other[-1].path)
    assert not spread.joins(runs, other_run) and not any(d.shown for d in spread.dots(runs, "R1", other_run))
    assert all(json.loads(run.path.read_text())["schema_version"] == 2
               for run in committed_runs(ROOT, framework))
    show = shown(framework)
    for name in spread.BATCH64[framework]:
        dots = spread.dots(runs, name, show)
        assert len(dots) == sum(1 for r in runs if name in [x.name for x in r.rungs if x.measured])
        assert sum(d.shown for d in dots) == 1
        ratios = [d.ratio for d in dots if d.ratio is not None]
        if ratios:
            lo, hi = spread.range_text(dots).split(" to ")
            assert lo == f"{min(ratios):.2f}x" and hi == f"{max(ratios):.2f}x"


def test_the_figure_draws_a_strip_per_rung_and_one_highlighted_dot_on_each():
    fig = spread.figure("torch", shown("torch"), spread.evidence("torch", ROOT))
    left, right = fig.axes[:2]
    assert [t.get_text() for t in left.get_yticklabels()] == list(spread.BATCH64["torch"])
    big = [c for c in left.collections if c.get_sizes()[0] > 50]
    assert len(big) == len(spread.BATCH64["torch"])         # one highlighted dot per rung
    assert "shown: " in fig._suptitle.get_text()


def test_a_run_of_another_gpu_is_not_a_dot_among_the_committed_ones():
    other = copy.deepcopy(shown("torch"))
    other.device, other.created = "NVIDIA GeForce RTX 4090", "2030-01-01T00:00:00Z"
    runs = spread.evidence("torch", ROOT)
    assert not spread.joins(runs, other)
    assert not any(d.shown for d in spread.dots(runs, "R2", other))
    same = copy.deepcopy(shown("torch"))
    same.created = "2030-01-01T00:00:00Z"                     # a new build on the same GPU joins them
    assert spread.joins(runs, same) and len(spread.dots(runs, "R2", same)) == len(runs) + 1
    fig = spread.figure("torch", other, runs)                   # drawn, highlighted, not counted
    assert len([c for c in fig.axes[0].collections if c.get_sizes()[0] > 50]) == len(spread.BATCH64["torch"])
    assert "not counted among them" in fig._suptitle.get_text()
    numbers = spread.spread_numbers("torch", ROOT)
    assert numbers["sp_runs"](same) == f"{len(runs) + 1} runs on NVIDIA H200"
    assert numbers["sp_runs"](other) == f"{len(runs)} runs on NVIDIA H200"


def test_the_words_count_what_the_dots_show():
    runs = spread.evidence("torch", ROOT)
    dots = spread.dots(runs, "R2", None)
    said = spread.verdicts_text(dots)
    counts = {}
    for d in dots:
        counts[d.word] = counts.get(d.word, 0) + 1
    assert said.endswith(f"of the {len(dots)} runs") or said.endswith(f"all {len(dots)} runs")
    for word, n in counts.items():
        assert f"{spread.VERDICT_WORDS[word]} in {n}" in said
    host = sum(d.regime == "host-bound" for d in dots)
    assert spread.host_text(dots) in (f"host-bound in {host} of the {len(dots)} runs",
                                      f"host-bound in all {len(dots)} runs")


def test_what_makes_a_rung_vary_is_checked_across_the_runs():
    """The host sets the spread when the kernels take the same time in every run and the steps
    do not; a run whose kernels take longer (a slower GPU) breaks that, and the check says so."""
    show = shown("torch")
    holds, why = spread.host_sets_the_spread("torch", "R2", ROOT)(show)
    assert holds and "kernels" in why and "step" in why
    slow = copy.deepcopy(show)
    slow.created = "2030-01-01T00:00:00Z"
    slow.rung("R2").profile.device_ms *= 1.5                     # its kernels, not its host, changed
    holds, why = spread.host_sets_the_spread("torch", "R2", ROOT)(slow.finalize())
    assert not holds
    jax = shown("jax")
    assert spread.device_wanders("jax", "R2", ROOT)(jax)[0]       # the bf16 scatter's own time wanders
    assert not spread.device_wanders("jax", "R1", ROOT)(jax)[0]
