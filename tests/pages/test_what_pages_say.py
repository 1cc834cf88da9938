"""The kinds of wrong sentence a page once printed, each fixed at its cause and pinned here: a
claim about later rungs reads the registry; "fastest" is one function; "did not settle" is said
of the rung that did not; an unsettled base credits nothing, not even a bound (the one credit
rule); a compiled rung records its compile; the fp32 control is built like the rung it
controls; a rung's result line and its table agree."""
from __future__ import annotations

import copy
from pathlib import Path

from conftest import timing_of

from perfladder.ladder.rung import later
from perfladder.pages import cards, kernel_report
from perfladder.pages.claims import call
from perfladder.pages.ladder import read_run
from perfladder.pages.story import ladder_numbers
from perfladder.results.committed import reference_run
from perfladder.results.record import LadderResult, RungResult

ROOT = Path(__file__).resolve().parents[2]


def ref(framework: str) -> LadderResult:
    return read_run(reference_run(ROOT, framework=framework) / f"{framework}.json")


def test_later_rungs_come_from_the_registry():
    from perfladder.torch import RUNGS
    assert [r.name for r in later(RUNGS, "B6", targets="attention")] == ["B7", "B12"]
    assert [r.name for r in later(RUNGS, "B12", targets="attention")] == []
    assert [r.name for r in later(RUNGS, "R5f")] == []           # the last declared rung has none after it
    assert [r.stage for r in later(RUNGS, "B18")] == ["multi-gpu"] * 3


def test_fastest_is_one_function_for_every_page_part():
    res = copy.deepcopy(ref("jax"))
    kept = res.fastest_rung()
    quicker = max((r for r in res.waterfall() if r.kept is False), key=lambda r: r.tokens_per_s)
    quicker.tokens_per_s = 1.01 * kept.tokens_per_s           # a faster median that was not kept
    quicker.timing.windows = [1.01 * w for w in kept.timing.windows]
    assert res.fastest_rung() is kept
    assert ladder_numbers(res)["fastest"] == kept.name == kernel_report.kernel_rung(res).name
    assert res.learning.configuration == kept.name
    res.fastest = quicker.name                                 # what the ladder recorded wins
    assert ladder_numbers(res)["fastest"] == quicker.name


def test_a_recorded_fastest_that_failed_or_is_absent_names_a_measured_rung():
    """A run whose chain top failed its gate (every later rung refused), or a run of a few
    rungs whose recorded top is not among them: the pages still name, and glue, a measured rung."""
    from perfladder.pages.story import glue_values
    res = copy.deepcopy(ref("jax"))
    top = res.fastest_rung()
    for r in res.rungs:
        if r.stage == "beyond":
            r.tokens_per_s, r.timing, r.kept, r.error = None, None, False, "OptimizerGateError: planted"
    res.fastest = top.name
    named = res.fastest_rung()
    assert named.measured and named.stage != "beyond"
    assert glue_values(res)["fastest"] == named.name
    res.fastest = "R99"                                         # not in this file at all
    assert res.fastest_rung() is named


def _pair(base_stable: bool, base_windows, windows):
    res = LadderResult(framework="torch", device="dev", config={"name": "full"}, baseline="R0")
    res.add(RungResult(name="R0", key="eager", label="eager", tokens_per_s=sorted(base_windows)[1],
                       timing=timing_of(base_windows, stable=base_stable)))
    res.add(RungResult(name="R1", key="compile", label="compile", builds_on="R0",
                       tokens_per_s=sorted(windows)[1], timing=timing_of(windows)))
    return res


def test_did_not_settle_is_said_of_the_rung_that_did_not():
    res = _pair(False, [90.0, 120.0, 150.0], [100.0, 101.0, 102.0])
    rows = dict(cards.compact_rows(res, res.rung("R1")))
    assert "settled" in rows["windows"] and "did NOT settle" not in rows["windows"]
    assert "did NOT settle" in dict(cards.compact_rows(res, res.rung("R0")))["windows"]
    assert "R0's windows did not settle" in call(res, res.rung("R1")).shaky or \
        call(res, res.rung("R1")).word == "unsettled"


def test_a_gain_over_an_unsettled_base_is_credited_nothing():
    """The one credit rule (``verdict.credit``): no credited ratio and no bound when a base did
    not settle, however far above it every window is."""
    res = _pair(False, [5.0, 7.0, 9.0], [300.0, 310.0, 320.0])
    c = call(res, res.rung("R1"))
    assert c.word == "unsettled" and not c.credited and c.ratio is None and c.bound is None
    assert "at least" not in cards.result_line(res, res.rung("R1"))
    close = _pair(False, [90.0, 100.0, 110.0], [100.0, 104.0, 108.0])
    assert call(close, close.rung("R1")).word == "unsettled"    # overlapping windows: no credit


def test_the_result_line_and_the_table_quote_the_same_windows():
    res = ref("torch")
    r = res.rung("R2")
    rows = dict(cards.compact_rows(res, r))
    lo, hi = min(r.timing.settled_windows), max(r.timing.settled_windows)
    from perfladder.words import rate
    assert f"{rate(lo)}–{rate(hi)}" in rows["windows"]
    assert f"last {r.timing.settled} of {len(r.timing.windows)}" in rows["windows"]
    assert rate(r.tokens_per_s) in cards.result_line(res, r)


def test_kernel_names_are_shortened_with_the_full_name_kept():
    name = ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
            "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)")
    short = cards.short_name(name)
    assert short == "cutlass::Kernel2" and len(short) <= 56
    assert f'title="{name}"' in cards.code_html(name).replace("&lt;", "<").replace("&gt;", ">")
