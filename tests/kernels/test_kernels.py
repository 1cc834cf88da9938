"""perfladder.kernels: name categories, breakdown arithmetic, trace parsing, HLO op categories.

Framework-free: neither torch nor jax is imported here.
"""
from __future__ import annotations

import gzip
import json
import math

import pytest

from perfladder import kernels as K
from perfladder.kernels import (
    CATEGORIES,
    KernelEvents,
    breakdown,
    categorize,
    parse_chrome_trace,
)

# Kernel / operator names as the profilers print them (torch + CUDA, XLA:GPU, XLA:CPU, torch CPU).
NAMED = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cublas", "matmul"),
    ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NTN", "matmul"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false>(...)", "matmul"),
    ("gemm_fusion_dot_1", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("dot.46", "matmul"),
    ("flash_fwd_kernel", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, "
     "false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
     "cutlass::bfloat16_t> >, false, true>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0",
     "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("triton_poi_fused__to_copy_mul_0", "elementwise"),      # a fused cast is still pointwise work
    ("loop_add_fusion", "elementwise"),
    ("loop_multiply_fusion_3", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
     "elementwise"),
    ("triton_red_fused_native_layer_norm_1", "reduction/norm"),
    ("triton_per_fused__log_softmax_2", "reduction/norm"),
    ("input_reduce_fusion", "reduction/norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float)",
     "reduction/norm"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...adam...>", "optimizer"),
    ("Memcpy HtoD (Pageable -> Device)", "memcpy/memset"),
    ("Memset (Device)", "memcpy/memset"),
    ("MemcpyD2D", "memcpy/memset"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
     "at::TensorIteratorBase&)::{lambda()#3}, std::array<char*, 2ul>, 4>(int)", "memcpy/memset"),
    ("wrapped_transpose", "memcpy/memset"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
    ("all-reduce-start.1", "collective"),
    ("c10d::allreduce_", "collective"),
    ("void small_reduce_kernel<float>(int)", "reduction/norm"),   # 'small_reduce' is no all-reduce
    # torch CPU operators (self CPU time)
    ("aten::addmm", "matmul"),
    ("aten::mm", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::native_layer_norm_backward", "reduction/norm"),
    ("aten::gelu", "elementwise"),
    ("aten::copy_", "memcpy/memset"),
    ("aten::_foreach_mul_", "optimizer"),
    ("Optimizer.step#AdamW.step", "optimizer"),
    ("aten::view", "other"),
    ("AddmmBackward0", "other"),
    ("autograd::engine::evaluate_function: AddmmBackward0", "other"),
    # perfladder's fused attention: the Triton kernels (and their first names, in a committed
    # run) and the Pallas ones
    ("_rope_attention_fwd_kernel", "attention"),
    ("_rope_attention_bwd_kernel", "attention"),
    ("_bwd_kernel", "attention"),
    ("rope_attention_fwd", "attention"),
    ("_rope_fwd_kernel", "elementwise"),
    ("gelu_bias_grad_bwd", "elementwise"),      # the Pallas GELU backward (JAX B10)
    # XLA:CPU YNNPACK fusions: a dot or a reduction alike, the name cannot tell
    ("ynn_fusion.4", "other"),
    ("some_kernel_nobody_knows", "other"),
]


@pytest.mark.parametrize("name, expected", NAMED)
def test_categorize_real_names(name, expected):
    assert categorize(name) == expected


def test_categories_and_patterns_are_consistent():
    assert CATEGORIES == ("matmul", "attention", "elementwise", "reduction/norm", "optimizer",
                          "memcpy/memset", "collective", "other")
    assert {cat for cat, _, _ in K.PATTERNS} <= set(CATEGORIES)
    assert set(K.CATEGORY_HELP) == set(CATEGORIES)


def test_categorize_rejects_non_strings():
    with pytest.raises(TypeError, match="str"):
        categorize(42)


# -- breakdown arithmetic -------------------------------------------------------------------------
EVENTS = [("gemm_a", 50.0), ("gemm_a", 30.0), ("flash_fwd_kernel", 40.0),
          ("triton_poi_fused_add_0", 10.0), ("triton_red_fused_native_layer_norm_0", 20.0),
          ("mystery", 25.0), ("Memcpy HtoD (Pageable -> Device)", 5.0)]


def test_breakdown_sums_and_shares():
    b = breakdown(EVENTS, steps=2, top=3)
    total = sum(d for _, d in EVENTS)
    assert b.total_us == pytest.approx(total)
    assert b.per_step_ms == pytest.approx(total / 2 / 1000)
    assert math.isclose(sum(b.category_share.values()), 1.0)
    assert b.category_us["matmul"] == pytest.approx(80.0)
    assert b.category_us["attention"] == pytest.approx(40.0)
    assert b.category_us["other"] == pytest.approx(25.0)
    assert b.share("memcpy/memset") == pytest.approx(5.0 / total)
    assert b.num_events == len(EVENTS) and b.num_kernels == 6
    assert set(b.category_us) == set(CATEGORIES)


def test_breakdown_top_is_ordered_and_limited():
    b = breakdown(EVENTS, steps=1, top=3)
    assert [k.name for k in b.top] == ["gemm_a", "flash_fwd_kernel", "mystery"]
    assert [k.total_us for k in b.top] == sorted((k.total_us for k in b.top), reverse=True)
    assert b.top[0].calls == 2 and b.top[0].share == pytest.approx(80.0 / b.total_us)
    assert b.other_names == ["mystery"]
    assert len(breakdown(EVENTS, steps=1, top=100).top) == 6


def test_breakdown_explicit_category_wins_and_splits_rows():
    evs = [("vectorized_elementwise_kernel", 10.0, "optimizer"),
           ("vectorized_elementwise_kernel", 30.0), ("vectorized_elementwise_kernel", 5.0, None)]
    b = breakdown(evs, steps=1)
    assert b.category_us["optimizer"] == 10.0 and b.category_us["elementwise"] == 35.0
    assert {(k.name, k.category) for k in b.top} == {("vectorized_elementwise_kernel", "optimizer"),
                                                     ("vectorized_elementwise_kernel", "elementwise")}


def test_breakdown_busy_and_other_warning():
    b = breakdown([("mystery", 60.0), ("gemm", 40.0)], steps=1, wall_us=200.0)
    assert b.busy == pytest.approx(0.5)
    assert any("no pattern" in n and "mystery" in n for n in b.notes)
    assert not any("no pattern" in n for n in breakdown([("gemm", 1.0)], steps=1).notes)


@pytest.mark.parametrize("kwargs, events, match", [
    ({"steps": 0}, EVENTS, "steps=0"),
    ({"steps": 1, "top": 0}, EVENTS, "top=0"),
    ({"steps": 1, "device": "tpu"}, EVENTS, "device='tpu'.*valid choices"),
    ({"steps": 1}, [], "no kernel events"),
    ({"steps": 1}, [("gemm", -1.0)], "gemm.*>= 0"),
    ({"steps": 1}, [("gemm", float("nan"))], "finite"),
    ({"steps": 1}, [("gemm", 1.0, "gemms")], "'gemms'.*valid choices"),
    ({"steps": 1}, [("gemm",)], "must be"),
    ({"steps": 1, "wall_us": 0}, EVENTS, "wall_us"),
])
def test_breakdown_rejects_bad_input(kwargs, events, match):
    with pytest.raises(ValueError, match=match):
        breakdown(events, **kwargs)


def test_breakdown_outputs():
    b = breakdown(EVENTS, steps=2, top=4, framework="torch", wall_us=500.0, notes=["a note"])
    d = b.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["per_step_ms"] == pytest.approx(b.per_step_ms)
    assert math.isclose(sum(d["category_share"].values()), 1.0)
    assert [k["name"] for k in d["top"]] == [k.name for k in b.top]
    md = b.markdown()
    for c in CATEGORIES:
        assert f"| {c} |" in md
    assert "| **total** |" in md and "`gemm_a`" in md and "- a note" in md
    assert md.count("\n| ") >= len(CATEGORIES) + 1 + 4
    s = str(b)
    assert "torch kernels on gpu" in s and "gemm_a" in s
    back = K.KernelBreakdown.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.markdown() == md
    with pytest.raises(ValueError, match="missing"):
        K.KernelBreakdown.from_dict({"device": "gpu"})
    with pytest.raises(ValueError, match="unknown categories"):
        K.KernelBreakdown.from_dict({**d, "category_us": {"gemm": 1.0}})
    with pytest.raises(ValueError, match="valid choices"):
        b.share("matmuls")


def test_markdown_keeps_tables_intact_for_awkward_names():
    b = breakdown([("void k<a|b>(int)" + "x" * 200, 1.0)], steps=1)
    row = [line for line in b.markdown().splitlines() if line.startswith("| 1 |")][0]
    assert row.count("|") == 7 and "…" in row


# -- Chrome / Perfetto traces ---------------------------------------------------------------------
def _meta(pid, name, tid=None):
    e = {"ph": "M", "pid": pid, "name": "process_name" if tid is None else "thread_name",
         "args": {"name": name}}
    if tid is not None:
        e["tid"] = tid
    return e


def _x(pid, tid, name, dur, **args):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": 1.0, "dur": dur, "name": name, "args": args}


def gpu_trace() -> dict:
    """The xprof layout on a GPU: host threads, and a device plane whose raw CUDA stream
    lines carry the kernels; the derived 'XLA Ops' line repeats them (must not count)."""
    return {"displayTimeUnit": "ns", "traceEvents": [
        _meta(701, "/host:CPU"), _meta(701, "python", tid=1),
        _meta(1, "/device:GPU:0"), _meta(1, "Stream #14(Kernel,MemcpyH2D)", tid=14),
        _meta(1, "XLA Ops", tid=2), _meta(1, "CUPTI overhead", tid=3),
        _x(701, 1, "PjitFunction(train_step)", 900.0),
        _x(701, 1, "fusion.1", 7.0, hlo_op="fusion.1"),               # host-side: not a kernel
        _x(1, 14, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublas", 100.0,
           hlo_op="custom-call.3", hlo_module="jit_train_step", correlation_id="7"),
        _x(1, 14, "loop_add_fusion_2", 20.0, hlo_op="loop_add_fusion.2", hlo_module="jit_train_step"),
        _x(1, 14, "MemcpyH2D", 5.0),
        _x(1, 2, "custom-call.3", 100.0), _x(1, 2, "loop_add_fusion.2", 20.0),
        _x(1, 3, "Buffer flush", 50.0),
        {"ph": "i", "pid": 1, "tid": 14, "ts": 3.0, "name": "instant"},
    ]}


def cpu_trace() -> list:
    """The layout of jax 0.10.2's CPU trace (recorded here): XLA:CPU ops on the PjRt client
    and Eigen threads carry hlo_op args; 'end: ...' markers and thread-pool bookkeeping don't."""
    return [
        _meta(701, "/host:CPU"), _meta(701, "python", tid=1),
        _meta(701, "tf_XLAPjRtCpuClient/-84224", tid=5), _meta(701, "tf_XLAEigen/-47329", tid=6),
        _x(701, 1, "PjitFunction(f)", 500.0),
        _x(701, 5, "ThreadpoolListener::StartRegion", 1e-06),
        _x(701, 5, "ynn_fusion.4", 3744.161, hlo_op="ynn_fusion.4", hlo_module="jit_f", run_id="1"),
        _x(701, 5, "end: ynn_fusion.4", 1.583),
        _x(701, 6, "broadcast_divide_fusion", 3.907, hlo_op="broadcast_divide_fusion", hlo_module="jit_f"),
        _x(701, 5, "ThunkExecutor::Execute (wait for completion)", 0.06, run_id="1"),
    ]


def test_parse_gpu_trace_counts_stream_kernels_once(tmp_path):
    path = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(gpu_trace(), f)
    ev = parse_chrome_trace(path, expect="gpu")
    assert isinstance(ev, KernelEvents) and ev.device == "gpu"
    assert [n for n, _ in ev] == ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublas",
                                  "loop_add_fusion_2", "MemcpyH2D"]
    assert sum(d for _, d in ev) == pytest.approx(125.0)
    assert ev.ops[0] == ("custom-call.3", "jit_train_step") and ev.ops[2] == (None, None)
    assert ev.lines == ["/device:GPU:0 / Stream #14(Kernel,MemcpyH2D)"]


def test_parse_gpu_trace_falls_back_to_derived_ops_line(tmp_path):
    trace = gpu_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("tid") != 14]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    ev = parse_chrome_trace(path)
    assert ev.device == "gpu" and [n for n, _ in ev] == ["custom-call.3", "loop_add_fusion.2"]


def test_parse_cpu_trace_keeps_xla_ops_only(tmp_path):
    path = tmp_path / "trace.json"                       # a bare event array, not gzipped
    path.write_text(json.dumps(cpu_trace()))
    ev = parse_chrome_trace(path)
    assert ev.device == "cpu"
    assert ev == [("ynn_fusion.4", 3744.161), ("broadcast_divide_fusion", 3.907)]
    assert ev.ops == [("ynn_fusion.4", "jit_f"), ("broadcast_divide_fusion", "jit_f")]
    b = breakdown(ev, steps=1, device=ev.device)
    assert b.total_us == pytest.approx(3748.068) and b.device == "cpu"


def test_parse_trace_expectation_mismatch_is_an_error(tmp_path):
    cpu, gpu = tmp_path / "cpu.json", tmp_path / "gpu.json"
    cpu.write_text(json.dumps(cpu_trace()))
    gpu.write_text(json.dumps(gpu_trace()))
    with pytest.raises(ValueError, match="expected GPU kernel events.*CPU.*CUPTI"):
        parse_chrome_trace(cpu, expect="gpu")
    with pytest.raises(ValueError, match="expected CPU"):
        parse_chrome_trace(gpu, expect="cpu")
    with pytest.raises(ValueError, match="expect='tpu'"):
        parse_chrome_trace(gpu, expect="tpu")


def test_parse_trace_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trace file"):
        parse_chrome_trace(tmp_path / "missing.json.gz")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a Chrome trace JSON"):
        parse_chrome_trace(bad)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": [_meta(701, "/host:CPU"), _x(701, 1, "python op", 3.0)]}))
    with pytest.raises(ValueError, match="no kernel or XLA op events"):
        parse_chrome_trace(empty)
    no_kernels = tmp_path / "nok.json"
    no_kernels.write_text(json.dumps({"traceEvents": [
        _meta(1, "/device:GPU:0"), _meta(1, "Steps", tid=9), _x(1, 9, "step 1", 3.0)]}))
    with pytest.raises(ValueError, match="no kernel events on a 'Stream #"):
        parse_chrome_trace(no_kernels)
