"""perfladder.pages.comparison and .scaling: the H200 story as checked claims, the chapter's
RTX 4090 numbers beside ours, the reading of the two waterfalls, and R5's predictions for
k = 2, 4 and 8 beside what was measured."""
from __future__ import annotations

import copy
import dataclasses
import json
import re

import matplotlib
import matplotlib.pyplot as plt
import pytest
from _ladders import ROOT, result, rung

from perfladder.measure.evidence import ProfileSummary
from perfladder.multigpu import costmodel
from perfladder.pages import comparison, plot, report, scaling
from perfladder.pages.ladder import read_run
from perfladder.results.committed import reference_run
from perfladder.words import rate

matplotlib.use("Agg")

RESULTS = ROOT / "benchmarks" / "results"
# the runs the pages show (benchmarks/results/reference.txt)
REF = {fw: reference_run(framework=fw) / f"{fw}.json" for fw in ("torch", "jax")}
BUILDS = [p for p in sorted(RESULTS.iterdir()) if (p / "torch.json").is_file() and (p / "jax.json").is_file()]


@pytest.fixture(scope="module")
def reference():
    return read_run(REF["torch"]), read_run(REF["jax"]), scaling.read_r5(ROOT)


# statements about PyTorch's batch-64 rungs, which the host's pace decides: each has a version for
# a run whose bf16 step lost (the host set the pace) and one for a run whose step did not, and the
# run's R2 picks; where R2's windows did not settle neither is decided, and the page says so
HOST_DECIDES = {"torch_batch_biggest", "torch_bf16_small_batch"}
# the build that ran both ladders and measured R1 settled in both (a fixed run for the tests of
# how a settled or an unsettled base is read)
SETTLED = RESULTS / "h200-serial-book"


def test_every_statement_of_the_h200_story_holds_or_is_marked_beside_the_reference(reference):
    t, j, r5 = reference
    claims = comparison.story(t, j, r5)
    assert [c.key for c in claims] == ["torch_batch_biggest", "torch_bf16_small_batch", "jax_jit_cliff",
                                       "jax_bf16_scatter", "fastest_pair", "data_parallel"]
    for c in claims:
        html = comparison.claim_html(c, "the reference")
        if c.key in HOST_DECIDES:
            unsettled = comparison.call(t, t.rung("R2")).word == "unsettled"
            assert c.holds is (None if unsettled else True), c.key
            assert ("Not checked in this run" in html) == unsettled and "Not so" not in html, c.key
        else:
            assert c.holds is True and "Not so" not in html, c.key


def test_the_host_decided_statements_tell_each_run_its_own_story():
    """Across the committed pairs each host-decided statement holds in the version its run's R2
    picks, or is left undecided where R2's windows did not settle, never contradicted; and both
    versions are printed for some run."""
    told = {k: set() for k in HOST_DECIDES}
    for run in BUILDS:
        t, j = read_run(run / "torch.json"), read_run(run / "jax.json")
        r2 = t.rung("R2") if any(r.name == "R2" for r in t.rungs) else None
        for c in comparison.story(t, j, None):
            if c.key not in told or r2 is None or r2.profile is None:
                continue
            unsettled = comparison.call(t, r2).word == "unsettled"
            assert c.holds is (None if unsettled else True), (run.name, c.key, c.evidence)
            if not unsettled:
                told[c.key].add("host" if "loses" in c.statement or "slower, not" in c.statement else "device")
    assert all(versions == {"host", "device"} for versions in told.values()), told


def test_the_numbers_beside_each_statement_are_the_files(reference):
    t, j, r5 = reference
    bf16 = comparison.torch_bf16_small_batch(t)
    r1, r2 = t.rung("R1"), t.rung("R2")
    assert rate(r2.tokens_per_s) in bf16.evidence and rate(r1.tokens_per_s) in bf16.evidence
    assert f"{r1.profile.device_ms:.2f} -> {r2.profile.device_ms:.2f} ms" in bf16.evidence
    scatter = comparison.jax_bf16_scatter(j)
    assert f"{j.rung('R3').batch_size * 128:,} token rows" in scatter.evidence and "28-row" in scatter.statement
    assert "input_scatter_fusion" in scatter.evidence
    dp = comparison.data_parallel_nearly_free(r5)
    for m in scaling.fast_rows(r5):
        assert rate(m["measured_tokens_per_s"]) in dp.evidence
    ch = comparison.CHAPTER["torch"]
    assert f"{ch['R2'] / ch['R1']:.2f}x" in bf16.chapter          # the 4090's bf16 rung paid


def test_a_run_that_tells_another_story_is_said_so_beside_the_claim():
    prof = lambda dev, step: ProfileSummary(tool="t", steps=1, device_ms=dev, shares={"matmul": 1.0})  # noqa: E731
    other = result([rung("R0", "eager", [1e5, 1e5, 1e5]),
                    rung("R1", "compile", [2e5, 2e5, 2e5], "R0", profile=prof(30.0, 41.0)),
                    rung("R2", "bf16", [3e5, 3e5, 3e5], "R1", profile=prof(18.0, 27.0))], device="RTX 4090")
    c = comparison.torch_bf16_small_batch(other)             # shaped like the chapter's 4090 run
    assert c.holds is True and "the host kept up" in c.statement and "slower, not" not in c.statement
    page = comparison.claim_html(c, "this build on RTX 4090")
    assert "Not so in this run" not in page and 'data-holds="True"' in page and "1.50x" in page
    idle = result([rung("R0", "eager", [1e5, 1e5, 1e5]),                 # slower, yet busy: no story holds
                   rung("R1", "compile", [2e5, 2e5, 2e5], "R0", profile=prof(30.0, 41.0)),
                   rung("R2", "bf16", [1e5, 1e5, 1e5], "R1", profile=prof(29.0, 41.0))], device="RTX 4090")
    c = comparison.torch_bf16_small_batch(idle)
    assert c.holds is False and "Not so in this run" in comparison.claim_html(c, "this build")
    missing = comparison.jax_bf16_scatter(result([rung("R0", "eager", [1e3, 1e3, 1e3])], framework="jax"))
    assert missing.holds is None and "Not checked in this run" in comparison.claim_html(missing)


def test_the_batch_claim_reads_only_credited_gains():
    """An unsettled R1, every window above R0's, is credited nothing (the one credit rule,
    ``verdict.credit``): the batch claim compares credited ratios only."""
    def seed(r1_windows):
        return result([rung("R0", "eager", [100e3, 101e3, 102e3]),
                       rung("R1", "compile", r1_windows, "R0", stable=False),
                       rung("R2", "bf16", [120e3, 121e3, 122e3], "R1"),
                       rung("R3", "batch_up", [480e3, 484e3, 488e3], "R2", batch_size=512)])
    modest = seed([130e3, 150e3, 170e3])               # R1 unsettled; R3 4x R2
    r1 = comparison.call(modest, modest.rung("R1"))
    assert r1.word == "unsettled" and not r1.credited and r1.ratio is None and r1.bound is None
    claim = comparison.torch_batch_biggest(modest)
    assert claim.holds is True and "≥" not in claim.evidence and "- R0 (unsettled)" in claim.evidence


@pytest.mark.parametrize("run", BUILDS, ids=lambda p: p.name)
def test_the_comparison_page_reads_every_committed_pair_of_ladders(run, tmp_path):
    """What the comparison page computes from a GPU build's own two ladders (a smoke build
    never reaches it), over every committed pair: each claim is decided or marked unchecked,
    none fails on numbers that wandered (the build of 2026-12-03 did, on an R1 credited as a
    bound)."""
    t, j = read_run(run / "torch.json"), read_run(run / "jax.json")
    claims = comparison.story(t, j, None)
    assert {c.holds for c in claims} <= {True, False, None}
    assert all(comparison.claim_html(c, "this build") for c in claims)
    assert comparison.chapter_table_html(t, j) and comparison.waterfall_reading(t, j)
    assert report.comparison_html([t, j])
    fig = plot.compare([t, j], tmp_path / "comparison.png", title=run.name)
    assert (tmp_path / "comparison.png").stat().st_size > 0
    plt.close(fig)


def test_the_scatter_claim_needs_the_bf16_scatter(reference):
    _, j, _ = reference
    fp32 = dataclasses.replace(j.rung("R3"), details={**j.rung("R3").details,
                                                      "hlo_embedding_scatter": {"types": ["f32"]}})
    swapped = result([fp32 if r.name == "R3" else r for r in j.rungs], framework="jax", baseline="R1")
    assert comparison.jax_bf16_scatter(swapped).holds is False


def test_no_ratio_where_a_base_did_not_settle():
    t, j = read_run(SETTLED / "torch.json"), read_run(SETTLED / "jax.json")
    r1, best = j.rung("R1"), j.best()
    assert comparison.span(best, r1) == f"{best.tokens_per_s / r1.tokens_per_s:.2f}x"   # both settled
    r1.timing.stable = False                                         # as in runs where R1 wandered
    assert comparison.span(best, r1) == "no ratio credited, R1's windows did not settle"
    assert comparison.span(t.best(), t.rung("R0")) == f"{t.best().tokens_per_s / t.rung('R0').tokens_per_s:.2f}x"
    reading = comparison.waterfall_reading(t, j)
    assert any(line.startswith("PyTorch climbs from R0 eager") for line in reading)
    assert not any("at least" in line for line in reading)


def r0_unsettled(run):
    """A copy of ``run`` whose R0 windows wander (30% either way) and did not settle."""
    out = copy.deepcopy(run)
    r0 = out.rung("R0")
    r0.timing.windows = [w * f for w, f in zip(r0.timing.windows, (0.7, 1.0, 1.3) * 10)]
    r0.timing.stable = False
    out.finalize()
    return out


def test_the_chapter_table_puts_the_4090_beside_the_h200():
    t, j = read_run(SETTLED / "torch.json"), read_run(SETTLED / "jax.json")
    html = comparison.chapter_table_html(t, j)
    ch = comparison.CHAPTER
    assert rate(ch["torch"]["R3"]) in html and rate(t.rung("R3").tokens_per_s) in html
    assert f"{ch['jax']['R1'] / ch['jax']['R0']:.2f}x R0" in html
    r0, r1 = j.rung("R0"), j.rung("R1")
    assert r1.stable and min(r1.windows) > max(r0.windows)
    if r0.stable:                                             # both settled: the ratio of the medians
        assert f"{rate(r1.tokens_per_s)} · {r1.tokens_per_s / r0.tokens_per_s:.2f}x R0 · faster" in html
    else:                                                     # its base unsettled: no credited ratio
        assert f"{rate(r1.tokens_per_s)} · unsettled" in html
    unsettled = r0_unsettled(j)                               # the other case, planted
    u1 = unsettled.rung("R1")
    assert f"{rate(u1.tokens_per_s)} · unsettled" in comparison.chapter_table_html(t, unsettled)


def test_k4_and_k8_are_predicted_from_the_committed_baselines(reference):
    _, _, r5 = reference
    rows = scaling.r5_predictions(r5)
    assert {(r["framework"], r["form"]) for r in rows} == {(fw, f) for fw in ("torch", "jax")
                                                           for f in ("seed", "fast")}
    for row in rows:
        base = r5["baselines"][f"{row['framework']}:{row['form']}"]
        assert [p.k for p in row["predictions"]] == list(costmodel.PREDICT_KS) == [2, 4, 8]
        for p in row["predictions"]:
            want = costmodel.predict(p.k, row["batch"], 128, base["tokens_per_s"], 18_929_664)
            assert p.predicted_tokens_per_s == pytest.approx(want.predicted_tokens_per_s)
    measured_ks = {m["k"] for m in r5["measurements"] if m["status"] == "measured"}
    html = scaling.r5_predictions_html(rows)
    assert html.count("not measured") == sum(1 for r in rows for k in (2, 4, 8) if k not in measured_ks)


def test_lab_notes_say_the_chapter_outside_code():
    text = "The seed chapter's box; `--form seed` stays; the seed's link, so the seed predicted."
    assert scaling.chapter_words(text) == ("The chapter's box; `--form seed` stays; the chapter's link, "
                                           "so the chapter predicted.")
    for readme in RESULTS.glob("*/README.md"):
        prose = scaling.chapter_words(readme.read_text())
        outside = re.split(r"(```.*?```|`[^`\n]*`)", prose, flags=re.S)[::2]
        assert not any("seed" in part.lower() for part in outside), readme


def test_no_committed_run_means_no_predictions(tmp_path):
    assert scaling.read_r5(tmp_path) is None and scaling.r5_predictions(None) == []
    assert "No committed" in scaling.r5_predictions_html([])
    assert comparison.data_parallel_nearly_free(None).holds is None
    (tmp_path / "benchmarks/results/h200x2-r5").mkdir(parents=True)
    (tmp_path / "benchmarks/results/h200x2-r5/r5.json").write_text(json.dumps({"measurements": []}))
    assert scaling.r5_predictions(scaling.read_r5(tmp_path)) == []


def test_each_clause_of_a_statement_can_fail_it(reference):
    t, j, r5 = reference
    over = json.loads(json.dumps(r5))
    m = next(m for m in over["measurements"] if m["form"] == "seed" and m["status"] == "measured")
    m["measured_tokens_per_s"] = 1.01 * m["predicted_tokens_per_s"]      # one beats its prediction
    assert comparison.data_parallel_nearly_free(over).holds is False
    one = json.loads(json.dumps(r5))
    one["measurements"] = [m for m in one["measurements"] if m["framework"] == "torch"]
    assert comparison.data_parallel_nearly_free(one).holds is False      # "in both frameworks"
    assert comparison.data_parallel_nearly_free(r5).holds is True
    for clause, change in [("joined by NVLink", lambda m: m["prediction"].update(link="pcie-host-staged")),
                           ("two H200s", lambda m: m.update(device="NVIDIA H100 80GB HBM3"))]:
        other = json.loads(json.dumps(r5))
        for m in scaling.fast_rows(other):
            change(m)
        assert comparison.data_parallel_nearly_free(other).holds is False, clause
    slow = result([rung("R0", "eager", [1e5, 1e5, 1e5]), rung("R1", "compile", [2e5, 2e5, 2e5], "R0")],
                  framework="jax", baseline="R1")
    assert comparison.fastest_pair(t, slow).holds is False               # 2M apart, not within a tenth

    def chapter_rungs(r1, r2, r3):
        return result([rung("R0", "eager", [1e5] * 3), rung("R1", "compile", [r1] * 3, "R0"),
                       rung("R2", "bf16", [r2] * 3, "R1"), rung("R3", "batch_up", [r3] * 3, "R2")])
    assert comparison.torch_batch_biggest(chapter_rungs(2e5, 1.5e5, 6e5)).holds is True
    paid = comparison.torch_batch_biggest(chapter_rungs(2e5, 2.5e5, 7e5))                  # bf16 paid:
    assert paid.holds is True and "does not lose here" in paid.statement                  # the other story
    assert comparison.torch_batch_biggest(chapter_rungs(5e5, 4e5, 8e5)).holds is False     # compile biggest


def test_the_waterfall_reading_credits_no_unsettled_step():
    """JAX R1 over an R0 whose windows did not settle is credited nothing: the reading of the
    waterfalls neither names it as a credited step nor gives it a bound."""
    from perfladder.pages.claims import call
    from perfladder.results.committed import read_run, reference_run
    j = r0_unsettled(read_run(reference_run(framework="jax") / "jax.json"))
    assert call(j, j.rung("R1")).word == "unsettled"
    text = " ".join(comparison.waterfall_reading(None, j))
    assert "at least" not in text and "the largest is R1 " not in text
