"""perfladder.kernels.roofline: per-group bytes/FLOPs from shapes, floors, and the elementwise split."""
from __future__ import annotations

import pytest

from perfladder.config import GPTConfig, expected_num_params
from perfladder.kernels import breakdown
from perfladder.kernels.roofline import GROUPS, Roofs, Workload, must_do, roofline

W = Workload(batch=2048, seq=128, width=512, heads=8, blocks=6, vocab=28)
ROOFS = Roofs(copy_bytes_per_s=4e12, matmul_flops_per_s=800e12)
STEPS = 4


def planted(extra_events=()):
    """A breakdown whose per-step times are known: ms per step -> us over STEPS steps."""
    per_step_ms = {"nvjet_sm90_tst_256x128_bias_TNT": 40.0,                       # matmul
                   "cudnn_generated_fort_native_sdpa_sm90_flash_bprop": 8.0,      # attention
                   "triton_poi_fused__to_copy_add_cat_mul_neg_slice_transpose_12": 12.0,  # RoPE
                   "triton_poi_fused_gelu_gelu_backward_view_8": 5.0,             # GELU
                   "triton_poi_fused_gelu_view_9": 4.0,                           # GELU
                   "triton_poi_fused__to_copy_view_2": 2.0,                       # other elementwise
                   "triton_per_fused__to_copy_add_native_layer_norm_backward_10": 16.0,
                   "multi_tensor_apply_kernel_adam": 0.2,
                   "Memcpy DtoD (Device -> Device)": 0.5, **dict(extra_events)}
    return breakdown([(n, ms * 1e3 * STEPS) for n, ms in per_step_ms.items()], steps=STEPS, top=50)


def test_bytes_follow_the_shapes():
    need = must_do(W)
    N, D, L, a = 2048 * 128, 512, 6, 2
    nd = N * D * a                                           # one bf16 activation: 268 MB
    assert nd == 268_435_456
    assert need["elementwise: RoPE"][0] == 8 * L * nd
    assert need["elementwise: GELU"][0] == 5 * L * 4 * nd
    assert need["attention"][0] == pytest.approx(12 * L * nd, rel=0.01)
    assert need["copies"] == (0.0, 0.0)
    # matmul FLOPs are the model's 6N per token minus the embedding/LayerNorm/bias parameters
    six_n = 6 * expected_num_params(GPTConfig()) * N
    assert 0.99 * six_n < need["matmul"][1] < six_n
    assert W.params == expected_num_params(GPTConfig())


def test_stream_dtype_and_precision_scale_the_norm_group():
    fp32_stream = must_do(W)["layernorm/reductions"][0]
    bf16_stream = must_do(Workload(2048, 128, 512, 8, 6, 28, stream_fp32=False))["layernorm/reductions"][0]
    assert fp32_stream > bf16_stream
    full_fp32 = must_do(Workload(2048, 128, 512, 8, 6, 28, precision="fp32"))
    assert full_fp32["elementwise: GELU"][0] == 2 * must_do(W)["elementwise: GELU"][0]


def test_planted_breakdown_rows():
    rl = roofline(planted(), W, ROOFS)
    assert [r.group for r in rl.top_rows] == list(g for g, (c, _) in GROUPS.items() if c)
    rope = rl.row("elementwise: RoPE")
    assert rope.time_ms == pytest.approx(12.0)
    assert rope.floor_ms == pytest.approx(rope.bytes / 4e12 * 1e3)
    assert rope.above_ms == pytest.approx(12.0 - rope.floor_ms)
    assert rope.bw_frac == pytest.approx(rope.bytes / 12e-3 / 4e12)
    assert rl.row("elementwise: GELU").time_ms == pytest.approx(9.0)
    assert rl.row("elementwise: rest").time_ms == pytest.approx(2.0)
    assert rl.row("elementwise").time_ms == pytest.approx(23.0)
    mm = rl.row("matmul")
    assert mm.bound == "compute" and mm.tflops == pytest.approx(mm.flops / 40e-3 / 1e12)
    assert mm.floor_ms == pytest.approx(mm.flops / 800e12 * 1e3)
    assert rl.row("copies").floor_ms == 0 and rl.row("copies").time_ms == pytest.approx(0.5)
    # the total sums top-level groups only (sub-rows are parts of 'elementwise')
    assert rl.time_ms == pytest.approx(40 + 8 + 23 + 16 + 0.2 + 0.5)
    assert rl.floor_ms == pytest.approx(sum(r.floor_ms for r in rl.top_rows))
    text = rl.markdown()
    assert "elementwise: RoPE" in text and "8NDa per block" in text


def test_unnamed_elementwise_stays_one_row_with_all_its_bytes():
    kb = breakdown([("loop_convert_multiply_fusion_5", 4000.0), ("nvjet_gemm", 9000.0)], steps=1)
    rl = roofline(kb.to_dict(), W, ROOFS)
    assert not any(r.group.startswith("elementwise: ") for r in rl.rows)
    need = must_do(W)
    assert rl.row("elementwise").bytes == pytest.approx(
        need["elementwise: RoPE"][0] + need["elementwise: GELU"][0] + need["elementwise: rest"][0])


def test_gelu_only_split_gives_rope_bytes_to_the_rest():
    kb = breakdown([("triton_poi_fused_gelu_view_9", 4000.0), ("triton_poi_fused_add_3", 1000.0)], steps=1)
    rl = roofline(kb, W, ROOFS)
    need = must_do(W)
    assert rl.row("elementwise: rest").bytes == pytest.approx(
        need["elementwise: rest"][0] + need["elementwise: RoPE"][0])


def test_roofs_from_probe_and_bad_input():
    r = Roofs.from_probe({"copy_tb_per_s": 4.2, "bf16_matmul_tflops": 780.0, "tf32_matmul_tflops": 400.0})
    assert r.copy_bytes_per_s == pytest.approx(4.2e12) and r.matmul_flops_per_s == pytest.approx(780e12)
    assert Roofs.from_probe({"copy_tb_per_s": 4.2, "tf32_matmul_tflops": 400.0},
                            precision="fp32").matmul_flops_per_s == pytest.approx(400e12)
    with pytest.raises(ValueError, match="missing"):
        Roofs.from_probe({"copy_tb_per_s": 4.2})
    with pytest.raises(ValueError, match="precision"):
        Workload(2, 8, 32, 2, 1, 28, precision="fp8")
    with pytest.raises(ValueError, match="divisible"):
        Workload(2, 8, 30, 4, 1, 28)
    with pytest.raises(ValueError, match="copy_bytes_per_s"):
        Roofs(0.0, 1.0)
    with pytest.raises(TypeError, match="Workload"):
        roofline(planted(), {"batch": 2}, ROOFS)


def test_a_stored_report_is_reread_by_todays_taxonomy():
    """A report whose own Triton kernels were profiled as 'other' (as an older taxonomy sorted
    them) reads back with their time in their categories and the roofline rows derived again
    from the report's own workload and roofs; categories other than 'other' stay as stored."""
    from perfladder.kernels import categorize
    from perfladder.results.committed import reread_kernels
    assert categorize("_rope_fwd_kernel") == categorize("_gelu_bwd_kernel") == "elementwise"
    assert categorize("_ln_bwd_kernel") == "reduction/norm"
    kb = planted({"_rope_fwd_kernel": 3.0, "_gelu_bwd_kernel": 2.0, "_ln_fwd_kernel": 1.0,
                  "mystery_kernel": 0.25}).to_dict()
    for k in kb["top"]:                                  # as an older taxonomy stored them
        if k["name"].startswith("_"):
            kb["category_us"][k["category"]] -= k["total_us"]
            kb["category_us"]["other"] += k["total_us"]
            k["category"] = "other"
    kb["top"][0]["category"] = "reduction/norm"          # e.g. refined from the HLO: kept
    kb["roofline"] = roofline(kb, W, ROOFS, title="t").to_dict()
    assert kb["roofline"]["rows"][-1]["time_ms"] == pytest.approx(6.25)        # 'other'
    new = reread_kernels(kb)
    ms = {c: us / STEPS / 1e3 for c, us in new["category_us"].items()}
    assert ms["other"] == pytest.approx(0.25) and ms["reduction/norm"] == pytest.approx(16 + 1)
    assert new["top"][0]["category"] == "reduction/norm"
    rows = {r["group"]: r for r in new["roofline"]["rows"]}
    assert rows["elementwise: RoPE"]["time_ms"] == pytest.approx(12 + 3)
    assert rows["elementwise: GELU"]["time_ms"] == pytest.approx(9 + 2)
    assert rows["other"]["time_ms"] == pytest.approx(0.25) and new["roofline"]["title"] == "t"
    assert new["other_names"] == ["mystery_kernel"]
    assert "_rope_fwd_kernel" in new["notes"][-1]
    assert reread_kernels(new) == new                    # nothing left to move
    summary = {"device": "gpu", "category_us": {}}       # an older file's summary: as it is
    assert reread_kernels(summary) is summary
