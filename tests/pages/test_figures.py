"""The figures a ladder page draws from its run (``perfladder.pages.figures``): what each puts
where, read back from the figure, on the committed reference runs and on small ladders."""
from __future__ import annotations

import copy

import dataclasses

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from _ladders import seed_ladder  # noqa: E402

from perfladder.pages.figures import learning, memory, roofline, timeline  # noqa: E402
from perfladder.pages.figures.workload import roofs_of, workload  # noqa: E402
from perfladder.pages.plot import dead_ends  # noqa: E402
from perfladder.results.committed import read_run, reference_run  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return {fw: read_run(reference_run(framework=fw) / f"{fw}.json") for fw in ("torch", "jax")}


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def gids(fig, prefix: str) -> list[str]:
    return [a.get_gid() for ax in fig.axes for a in ax.get_children()
            if isinstance(a.get_gid(), str) and a.get_gid().startswith(prefix)]


# -- roofline ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fw", ["torch", "jax"])
def test_roofline_places_every_rung_and_every_kernel_group_on_the_runs_own_ceilings(runs, fw):
    res = runs[fw]
    pts = roofline.rung_points(res)
    assert [p.name for p in pts] == [r.name for r in res.waterfall() if r.tflops]
    assert {p.name for p in pts if p.dead_end} == dead_ends(res) & {p.name for p in pts}
    for p in pts:                                  # y is the rate the cards quote
        assert p.tflops == res.rung(p.name).tflops
    # fp32 moves twice the activation bytes: lower intensity than bf16 at the same batch
    fp32 = [p for p in pts if p.precision == "fp32"]
    assert fp32 and max(p.intensity for p in fp32) < min(p.intensity for p in pts if p.precision == "bf16")
    groups = roofline.group_points(res)
    rows = res.fastest_rung().kernels["roofline"]["rows"]
    assert {g.name for g in groups} == {r["group"] for r in rows if ": " not in r["group"] and r["time_ms"]
                                        and r["flops"] and r["bytes"]}
    mm = next(g for g in groups if g.name == "matmul")
    assert mm.intensity > 100 > next(g for g in groups if g.name == "elementwise").intensity
    fig = roofline.figure(res)
    left, right = fig.axes
    assert left.get_xscale() == left.get_yscale() == right.get_xscale() == "log"
    roof = next(a for a in left.get_lines() if a.get_gid() == "roof")
    assert max(roof.get_ydata()) == pytest.approx(roofs_of(res).matmul_flops_per_s / 1e12)
    assert sorted(gids(fig, "point:")) == sorted([f"point:{p.name}" for p in pts + groups])
    assert sorted(gids(fig, "label:")) == sorted([f"label:{p.name}" for p in pts + groups])


def test_a_run_without_measured_ceilings_says_so():
    res = seed_ladder()                            # no roofs
    assert roofs_of(res) is None
    assert gids(roofline.figure(res), "no-roofs") == ["no-roofs", "no-roofs"]


# -- memory -----------------------------------------------------------------------------------
def test_memory_computed_parts_follow_the_shapes(runs):
    res = runs["torch"]
    r3, r4, b5 = (memory.need(res, res.rung(n)) for n in ("R3", "R4", "B5"))
    P = workload(res, res.rung("R3")).params
    assert (r3["parameters"], r3["gradients"], r3["optimizer state"]) == (4 * P, 4 * P, 8 * P)
    assert r4["activations"] < r3["activations"] / 3          # checkpointing keeps block inputs only
    assert b5["activations"] == pytest.approx(2 * r3["activations"], rel=1e-9)   # twice the batch
    rows = {row["name"]: row for row in memory.rows(res)}
    assert rows["R3"]["measured"] == res.rung("R3").memory.bytes and rows["R3"]["outside"] == 0


def test_memory_adds_weights_and_moments_to_xlas_temporaries(runs):
    res = runs["jax"]
    row = next(r for r in memory.rows(res) if r["name"] == "R3")
    n = row["need"]
    assert res.rung("R3").memory.kind == memory.TEMPORARIES
    assert row["measured"] == res.rung("R3").memory.bytes + n["parameters"] + n["optimizer state"]
    fig = memory.figure(res)
    measured = [r["name"] for r in memory.rows(res) if r["measured"] is not None]
    assert sorted(g.split(":")[1] for g in gids(fig, "measured:")) == sorted(measured)
    assert len(gids(fig, "computed:")) == 4 * len(memory.rows(res))


def test_a_measured_figure_far_under_the_computed_is_marked(runs):
    res = copy.deepcopy(runs["torch"])
    res.rung("B3").memory.bytes = 1 << 20        # a peak read before the step took its memory
    rows = {r["name"]: r for r in memory.rows(res)}
    assert memory.under(rows["B3"])
    fig = memory.figure(res)

    def value(name):
        [text] = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == f"value:{name}"]
        return text
    assert value("B3").endswith("*")
    fine = [n for n, r in rows.items() if r["measured"] is not None and not memory.under(r)]
    assert fine and not any(value(n).endswith("*") for n in fine)


# -- timeline ---------------------------------------------------------------------------------
def test_timeline_shows_the_small_batch_the_big_one_and_the_fastest(runs):
    fastest = runs["torch"].fastest_rung().name
    assert [r.name for r in timeline.steps_shown(runs["torch"])] == ["R0", "R3", fastest]
    # JAX R0: not profiled; R3's kernels add up past its step, so its busy fraction is flagged
    # (perfladder.kernels.accounting) and the big batch is drawn from the next rung with one
    assert runs["jax"].rung("R3").regime.get("busy") is None
    assert [r.name for r in timeline.steps_shown(runs["jax"])] == ["R1", "B1", runs["jax"].fastest_rung().name]
    for fw in ("torch", "jax"):
        for r in timeline.steps_shown(runs[fw]):
            ln = timeline.lanes(r)
            assert sum(ms for _, ms in ln["device"]) == pytest.approx(ln["step_ms"])
            idle = dict(ln["device"])["idle"]
            assert idle == pytest.approx(ln["step_ms"] * (1 - min(1.0, r.regime["busy"])))


def test_timeline_draws_the_host_where_the_profiler_recorded_it(runs):
    torch_fig, jax_fig = timeline.figure(runs["torch"]), timeline.figure(runs["jax"])
    assert gids(torch_fig, "host") == ["host-missing"] * 3
    assert gids(jax_fig, "host") == ["host"] * 3
    r1 = runs["jax"].rung("R1")
    assert timeline.lanes(r1)["host_ms"] == r1.regime["host_ms"]


# -- learning ---------------------------------------------------------------------------------
def test_learning_curve_has_its_validation_points_and_threshold(runs):
    check = runs["jax"].learning
    fig = learning.figure(check, "t")
    lines = {ln.get_gid(): ln for ln in fig.axes[0].get_lines()}
    assert list(lines["val"].get_xdata()) == [0, check.steps]
    assert list(lines["val"].get_ydata()) == [check.val_before, check.val_after]
    assert set(lines["threshold"].get_ydata()) == {check.threshold}
    assert len(lines["train"].get_xdata()) == len(check.losses)
    no_val = dataclasses.replace(check, val_before=None, val_after=None, threshold=None)
    assert set(ln.get_gid() for ln in learning.figure(no_val, "t").axes[0].get_lines()) == {"train"}
