"""What a rung's evidence says, computed once: the one credit rule, and the regime's busy
fraction and host time, which are parts of the step and never reported above it."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from perfladder.measure import verdict as V
from perfladder.measure.evidence import PEAK_ALLOCATED, PLANNED, Memory, ProfileSummary
from perfladder.results.committed import read_run
from perfladder.results.record import RungResult

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _rung(tokens_per_s=1e6, batch=64, seq=128, **profile) -> RungResult:
    return RungResult("R1", "compile", "compile", tokens_per_s=tokens_per_s, batch_size=batch,
                      seq_len=seq, profile=ProfileSummary(tool="t", steps=3, **profile))


# -- the credit rule ------------------------------------------------------------------------------
def test_only_a_faster_verdict_is_credited():
    assert V.credit({"verdict": "faster", "ratio": 1.3}) == 1.3
    for word in ("slower", "within noise", "unsettled"):
        assert V.credit({"verdict": word, "ratio": 1.3}) is None
    assert V.credit(None) is None


@functools.lru_cache(maxsize=1)
def _committed() -> tuple:
    out = []
    for path in sorted(RESULTS.glob("*/*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "rungs" in data:     # a ladder (not a probe, r5, attention run)
            out.append((path, read_run(path)))
    return tuple(out)


def test_every_page_credits_what_the_rule_credits_in_every_committed_run():
    """Cards, tables, bars and inserted numbers read a comparison through ``claims.call``: over
    every committed run, it credits a rung exactly when ``verdict.credit`` does, and an unsettled
    comparison is never given a ratio or a bound (JAX R3 was once credited "at least 1.20x")."""
    from perfladder.pages.claims import call
    from perfladder.pages.plot import bar_label
    from perfladder.pages.story import credited_ratio
    seen_unsettled = 0
    for path, res in _committed():
        for r in res.waterfall():
            c = call(res, r)
            assert c.credited == V.credited(r) or c.word == "smoke", (path, r.name)
            if (r.verdict or {}).get("verdict") == "unsettled":
                seen_unsettled += 1
                assert not c.credited and c.bound is None, (path, r.name)
                # a certain loss keeps its sign and ratio (no credit); anything else has none
                assert c.ratio is None or c.word == "slower", (path, r.name)
                assert "≥" not in bar_label(res, r) and "at least" not in credited_ratio(
                    res, r, res.rung(r.builds_on))
    assert seen_unsettled                        # the committed runs hold unsettled comparisons


# -- busy and host time are parts of the step ------------------------------------------------------
def test_a_kernel_sum_over_the_step_is_flagged_not_reported_as_busy():
    """JAX R3 of a committed run: 130.4 ms of kernels summed against a 101.6 ms step was once
    'busy 100%'. Without the kernels' intervals the sum is no busy fraction."""
    step_ms = 64 * 128 / 1e6 * 1e3                                    # 8.192 ms
    r = _rung(device_ms=1.28 * step_ms, shares={"matmul": 1.0})
    reg = V.regime(r)
    assert reg["busy"] is None and reg["step_ms"] == pytest.approx(step_ms)
    assert any("summed against" in f for f in reg["accounting"])
    fits = V.regime(_rung(device_ms=0.5 * step_ms, shares={"matmul": 1.0}))
    assert fits["busy"] == pytest.approx(0.5) and fits["accounting"] == []
    union = V.regime(_rung(device_ms=1.28 * step_ms, busy_ms=0.93 * step_ms, shares={"matmul": 1.0}))
    assert union["busy"] == pytest.approx(0.93) and union["accounting"] == []   # overlap counted once
    slow = V.regime(_rung(device_ms=1.4 * step_ms, busy_ms=1.2 * step_ms, shares={"matmul": 1.0}))
    assert slow["busy"] is None and any("ran slower" in f for f in slow["accounting"])


def test_a_host_time_over_the_step_is_flagged_not_kept():
    """'Python spends 19.9 ms issuing a step of 17.4 ms': a call that waited on the device."""
    step_ms = 64 * 128 / 1e6 * 1e3
    reg = V.regime(_rung(device_ms=0.4 * step_ms, host_ms=1.15 * step_ms, shares={"matmul": 1.0}))
    assert reg["host_ms"] is None and any("to issue" in f for f in reg["accounting"])
    ok = V.regime(_rung(device_ms=0.4 * step_ms, host_ms=0.8 * step_ms, shares={"matmul": 1.0}))
    assert ok["host_ms"] == pytest.approx(0.8 * step_ms) and ok["accounting"] == []


def test_no_committed_regime_reports_busy_or_host_time_over_its_step():
    for path, res in _committed():
        for r in res.rungs:
            reg = r.regime or {}
            if reg.get("step_ms"):
                assert reg.get("busy") is None or reg["busy"] <= 1.0, (path, r.name)
                assert reg.get("host_ms") is None or reg["host_ms"] <= (1 + V.OVER_STEP) * reg["step_ms"], \
                    (path, r.name)


def test_the_cards_say_the_judged_numbers_and_why():
    from perfladder.pages import cards
    from perfladder.results.committed import reference_run
    res = read_run(RESULTS / "h200-book-cublas-2026-12-03" / "jax.json")
    rows = dict(cards.compact_rows(res, res.rung("R1")))
    assert "to issue" not in rows["profile"]
    assert "to issue" in rows["accounting"]
    r3 = dict(cards.compact_rows(res, res.rung("R3")))
    assert "busy" not in r3["profile"] and "summed against" in r3["accounting"]
    assert reference_run(framework="jax")


# -- what a memory number is ---------------------------------------------------------------------
def test_a_memory_record_names_what_it_measured():
    old = Memory.from_dict({"bytes": 376576512, "kind": "measured peak"})
    assert old.kind == PEAK_ALLOCATED and "CUDA graph" in old.note
    assert Memory.from_dict({"bytes": 1, "kind": PLANNED}).kind == PLANNED
    b3 = read_run(RESULTS / "h200-serial-book" / "torch.json").rung("B3")
    assert b3.memory.kind == PEAK_ALLOCATED                     # that run recorded no reserved peak


def test_a_step_mostly_waiting_is_host_bound_too():
    """The comparison page's stronger claim ("mostly waiting on the host") and the regime's
    host-bound cutoff are thresholds on the same busy share: a step the claim holds for must be
    host-bound, so the page never says one and the regime the other."""
    assert 0 < V.MOSTLY_WAITING < V.HOST_BOUND < 1
