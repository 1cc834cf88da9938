"""The accounting of a profiled step, fixed at its cause: the device's busy time is the union of
its kernels' intervals (never their sum), one taxonomy files a kernel the same on a rung's card
and in the kernel report, a roofline charges the recipe's own stream dtype and only the passes
the step runs, and a group measured far above its roof is flagged as an accounting error."""
from __future__ import annotations

from pathlib import Path

import pytest

from perfladder.config import get_config
from perfladder.kernels import breakdown, categorize
from perfladder.kernels.accounting import (
    ROOF_ERROR,
    accounting_error,
    judged,
    recorded_report,
    rederive,
    reread_report,
    workload_of,
)
from perfladder.kernels.roofline import Roofs, must_do, roofline
from perfladder.kernels.trace import select_kernel_events, trace_rows, union_us
from perfladder.measure.evidence import ProfileSummary
from perfladder.results.committed import read_run, reference_run
from perfladder.results.record import LadderResult

GPT = get_config("full").gpt()


# -- busy: the union of the kernels' intervals --------------------------------------------------
def test_union_counts_each_instant_once():
    assert union_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert union_us([(0, 10), (2, 3)]) == 10
    assert union_us([(0, 10), None]) is None and union_us([]) is None


def test_overlapping_kernels_never_make_the_device_busier_than_the_wall_time():
    """Two streams each running kernels for 80 of 100 µs, overlapping: summed they are 160 µs,
    160% of the wall time; the device was busy 90 µs of it."""
    events = [("gemm_a", 80.0), ("gemm_b", 80.0)]
    kb = breakdown(events, steps=1, wall_us=100.0, spans=[(0.0, 80.0), (10.0, 90.0)])
    assert kb.total_us == 160.0 and kb.busy_us == 90.0 and kb.busy == pytest.approx(0.9)
    assert any("overlapped" in n for n in kb.notes)
    assert kb.to_dict()["busy"] == pytest.approx(0.9)
    unknown = breakdown(events, steps=1, wall_us=100.0)          # no intervals: a sum over the wall
    assert unknown.busy is None                                   # is no busy fraction


def test_a_trace_keeps_each_kernels_interval():
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "Stream #8(Compute)"}},
              {"ph": "X", "pid": 1, "tid": 7, "name": "gemm", "ts": 100.0, "dur": 50.0},
              {"ph": "X", "pid": 1, "tid": 8, "name": "loop_fusion", "ts": 120.0, "dur": 50.0}]
    ev = select_kernel_events(trace_rows(events), expect="gpu")
    assert ev.spans == [(100.0, 150.0), (120.0, 170.0)] and union_us(ev.spans) == 70.0


# -- one taxonomy for cards and the kernel report -------------------------------------------------
def test_cards_and_the_kernel_report_file_a_kernel_the_same():
    """The committed PyTorch reference run profiled its own attention kernels (``_fwd_kernel``,
    ``_bwd_kernel``) as 'other'. Read back, the rung's profile (its card) and its kernel report
    both file them as attention, by the one ``categorize``."""
    res = read_run(Path(__file__).parents[2] / "benchmarks" / "results" / "h200-serial-book" / "torch.json")
    r = res.fastest_rung()
    assert r.kernels and r.profile
    named = {row["name"]: row["category"] for row in r.profile.rows}
    report = {k["name"]: k["category"] for k in r.kernels["top"]}
    common = set(named) & set(report)
    assert {"_fwd_kernel", "_bwd_kernel"} <= common
    assert all(named[n] == report[n] for n in common)
    assert named["_bwd_kernel"] == categorize("_bwd_kernel") == "attention"
    assert r.profile.shares["attention"] > 0.1 and r.kernels["category_share"]["attention"] > 0.1
    assert r.profile.shares["attention"] == pytest.approx(r.kernels["category_share"]["attention"], abs=0.02)


def test_a_profile_is_reread_by_todays_taxonomy():
    p = ProfileSummary(tool="t", steps=1, device_ms=10.0,
                       shares={"matmul": 0.5, "other": 0.5},
                       rows=[{"name": "_rope_attention_fwd_kernel", "category": "other", "device_ms": 3.0},
                             {"name": "mystery", "category": "other", "device_ms": 2.0}])
    q = p.recategorized()
    assert q.shares["attention"] == pytest.approx(0.3) and q.shares["other"] == pytest.approx(0.2)
    assert [row["category"] for row in q.rows] == ["attention", "other"]
    assert q.recategorized() == q


# -- a roofline of the step the recipe runs ------------------------------------------------------
def test_the_workload_is_the_recipes_own():
    kw = dict(batch=8, seq=128, precision="bf16")
    chapter = workload_of("torch", {}, GPT, **kw)
    fastest = workload_of("torch", {"residual": "bf16", "fused": ["gelu", "attention"]}, GPT, **kw)
    assert chapter.stream_bytes == 4 and not chapter.rope_in_attention     # autocast: fp32 stream
    assert fastest.stream_bytes == 2 and fastest.rope_in_attention
    jax = workload_of("jax", {"dtype": "bfloat16", "fused": ["attention"]}, GPT, **kw)
    assert jax.stream_bytes == 2 and jax.rope_in_attention
    assert workload_of("torch", {"residual": "bf16"}, GPT, batch=8, seq=128, precision="fp32").stream_bytes == 4
    assert must_do(fastest)["elementwise: RoPE"] == (0.0, 0.0)              # done inside attention
    assert must_do(chapter)["elementwise: RoPE"][0] > 0
    assert must_do(fastest)["attention"] == must_do(chapter)["attention"]
    mlp = workload_of("torch", {"fused": ["attention", "mlp"]}, GPT, **kw)
    assert mlp.gelu_in_matmul and must_do(mlp)["elementwise: GELU"] == (0.0, 0.0)
    assert workload_of("torch", {"fused": ["attention", "epilogue"]}, GPT, **kw).gelu_in_matmul   # cuBLASLt's
    assert must_do(fastest)["elementwise: GELU"][0] > 0
    # JAX's B10: GELU's forward in FC1's cuBLASLt epilogue, its backward our kernel's pass
    b10 = workload_of("jax", {"dtype": "bfloat16", "fused": ["attention", "gelu_bias_grad"]}, GPT, **kw)
    assert b10.gelu_fwd_in_matmul and not b10.gelu_in_matmul
    assert 0 < must_do(b10)["elementwise: GELU"][0] == 3 / 5 * must_do(jax)["elementwise: GELU"][0]
    with pytest.raises(ValueError, match="framework='tf'"):
        workload_of("tf", {}, GPT, **kw)


def test_no_committed_kernel_report_is_read_far_above_its_roof():
    """Read back with the accounting of its own recipe, the fastest PyTorch step's elementwise
    rest (charged the RoPE passes its fused attention does and an fp32 stream it does not have)
    is no longer at 18x its roof; no group of the reference runs' reports is past
    ``ROOF_ERROR`` unflagged."""
    for fw in ("torch", "jax"):
        res = read_run(reference_run(framework=fw) / f"{fw}.json")
        rl = res.fastest_rung().kernels["roofline"]
        for row in rl["rows"]:
            f = row["roof_fraction"]
            assert (f is None or f <= ROOF_ERROR) or row["accounting_error"], (fw, row["group"], f)
        if fw == "torch":
            w = rl["workload"]
            assert w["stream_fp32"] is False and w["rope_in_attention"] is True
            rest = next((r for r in rl["rows"] if r["group"] == "elementwise: rest"), None)
            assert rest is None or rest["roof_fraction"] <= ROOF_ERROR


def test_a_group_far_above_its_roof_is_an_accounting_error():
    row = {"group": "elementwise: rest", "bw_frac": 18.26, "mm_frac": None}
    assert "accounting error" in accounting_error(row) and "1826%" in accounting_error(row)
    assert accounting_error({"group": "matmul", "bw_frac": 0.2, "mm_frac": 1.12}) == ""
    rl = judged({"rows": [row, {"group": "matmul", "mm_frac": 1.1}]})
    assert rl["accounting_errors"] == [accounting_error(row)] and rl["rows"][1]["accounting_error"] == ""


def test_the_kernel_report_flags_an_accounting_error_and_never_calls_it_at_its_roof():
    from perfladder.pages.kernel_report import roofline_html, under_floor_note
    rows = [{"group": "elementwise: rest", "time_ms": 0.18, "floor_ms": 3.3, "above_ms": -3.1,
             "bw_frac": 18.26, "mm_frac": None, "bound": "memory"},
            {"group": "matmul", "time_ms": 38.0, "floor_ms": 41.0, "above_ms": -3.0,
             "bw_frac": 0.1, "mm_frac": 1.08, "bound": "compute"}]
    note = under_floor_note({"rows": rows})
    assert "Accounting error" in note and "1826%" in note
    at_roof = note.split("Accounting error")[0]
    assert "matmul" in at_roof and "elementwise: rest" not in at_roof
    html = roofline_html({"rows": rows, "time_ms": 38.2, "floor_ms": 44.3})
    assert "accounting error" in html


def test_rederive_leaves_raw_measurements_alone():
    path = reference_run(framework="torch") / "torch.json"
    plain, again = LadderResult.read(path), LadderResult.read(path)
    rederive(again)
    for a, b in zip(plain.rungs, again.rungs):
        assert a.tokens_per_s == b.tokens_per_s and a.windows == b.windows
        if a.profile:
            assert a.profile.device_ms == b.profile.device_ms and a.profile.rows[0]["device_ms"] == \
                b.profile.rows[0]["device_ms"]
        if a.kernels:
            assert a.kernels["total_us"] == b.kernels["total_us"] and a.kernels["steps"] == b.kernels["steps"]


def test_reread_report_recomputes_from_its_own_recipe():
    kb = breakdown([("gemm", 10.0), ("triton_poi_fused_add_0", 2.0), ("_rope_attention_fwd_kernel", 3.0)],
                   steps=1)
    w = workload_of("torch", {}, GPT, batch=8, seq=128, precision="bf16")
    rf = Roofs(copy_bytes_per_s=4e12, matmul_flops_per_s=7e14)
    stored = {**kb.to_dict(), "recipe": {"residual": "bf16", "fused": ["attention"]},
              "roofline": roofline(kb, w, rf).to_dict()}
    new = reread_report(stored, "torch")
    assert new["roofline"]["workload"]["stream_fp32"] is False
    assert new["roofline"]["workload"]["rope_in_attention"] is True
    assert new["roofline"]["rows"][0]["roof_fraction"] is not None


def test_a_recorded_report_is_profiled_at_its_recipes_batch_and_reads_back_the_same():
    class Recipe:          # what a lab's recipe gives the report (either framework's)
        batch_size, precision = 8, "bf16"

        def to_dict(self):
            return {"batch_size": 8, "residual": "bf16", "fused": ["attention"]}

    kb = breakdown([("gemm", 10.0), ("triton_poi_fused_add_0", 2.0)], steps=1)
    roofs = {"copy_gbps": 4000.0, "matmul_bf16_tflops": 700.0, "matmul_tf32_tflops": 350.0}
    d = recorded_report(kb, roofs, GPT, Recipe(), seq=128, framework="torch")
    assert d["recipe"] == Recipe().to_dict() and d["total_us"] == kb.to_dict()["total_us"]
    assert d["roofline"]["workload"]["batch"] == 8 and d["roofline"]["workload"]["rope_in_attention"]
    assert reread_report(d, "torch")["roofline"] == d["roofline"]
    assert recorded_report(kb, None, GPT, Recipe(), seq=128, framework="torch")["roofline"] is None
