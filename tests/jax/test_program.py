"""perfladder.jax.program: categories of a compiled XLA module's ops from its HLO text, and the
refinement of a kernel's name-based category by its op's."""
from __future__ import annotations

import pytest

from perfladder.jax.program import hlo_module_name, hlo_op_categories, refine

# -- HLO text ---------------------------------------------------------------------------------------
HLO = """HloModule jit_train_step, is_scheduled=true, entry_computation_layout={(f32[8,8]{1,0})->f32[]}

FileNames
1 "/work/src/model.py"
2 "/venv/lib/python3.11/site-packages/optax/_src/transform.py"
3 "/venv/lib/python3.11/site-packages/optax/losses/_classification.py"
4 "/venv/lib/python3.11/site-packages/flax/nnx/training/optimizer.py"

FunctionNames
1 "train_step"
2 "scale_by_adam.<locals>.update_fn"
3 "softmax_cross_entropy_with_integer_labels"
4 "Optimizer.update"
5 "helper"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=20 end_line=20 column=1 end_column=2}
3 {file_name_id=3 function_name_id=3 line=30 end_line=30 column=1 end_column=2}
4 {file_name_id=4 function_name_id=4 line=40 end_line=40 column=1 end_column=2}
5 {file_name_id=1 function_name_id=5 line=50 end_line=50 column=1 end_column=2}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=4 parent_frame_id=2}
3 {file_location_id=2 parent_frame_id=3}
4 {file_location_id=3 parent_frame_id=2}
5 {file_location_id=5 parent_frame_id=3}


%region_0.1 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%a, %b)
}

%fused_dot (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_reduce (p0.1: f32[8,8]) -> f32[] {
  %p0.1 = f32[8,8]{1,0} parameter(0)
  %c = f32[] constant(0)
  %e = f32[8,8]{1,0} exponential(%p0.1)
  ROOT %r = f32[] reduce(%e, %c), dimensions={0,1}, to_apply=%region_0.1
}

%fused_copy (p0.2: f32[8,8]) -> f32[8,8] {
  %p0.2 = f32[8,8]{1,0} parameter(0)
  %t = f32[8,8]{0,1} transpose(%p0.2), dimensions={1,0}
  ROOT %cv = bf16[8,8]{1,0} convert(%t)
}

%fused_pointwise (p0.3: f32[8,8]) -> f32[8,8] {
  %p0.3 = f32[8,8]{1,0} parameter(0)
  ROOT %m = f32[8,8]{1,0} multiply(%p0.3, %p0.3)
}

%outer (p0.4: f32[8,8]) -> f32[8,8] {
  %p0.4 = f32[8,8]{1,0} parameter(0)
  ROOT %inner = f32[8,8]{1,0} fusion(%p0.4, %p0.4), kind=kOutput, calls=%fused_dot
}

ENTRY %main.9 (x: f32[8,8]) -> f32[] {
  %x = f32[8,8]{1,0} parameter(0), metadata={op_name="x"}
  %gemm_fusion_dot.1 = f32[8,8]{1,0} fusion(%x, %x), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(train_step)/dot_general" stack_frame_id=1}
  %nested_fusion = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%outer
  %input_reduce_fusion = f32[] fusion(%x), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(train_step)/reduce_sum" stack_frame_id=4}
  %wrapped_transpose = bf16[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_copy
  %loop_multiply_fusion = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(train_step)/mul" stack_frame_id=5}
  %loop_multiply_fusion.2 = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(train_step)/mul" stack_frame_id=1}
  %adam_src = f32[8,8]{1,0} fusion(%x), kind=kLoop, calls=%fused_pointwise, metadata={op_name="jit(train_step)/mul" source_file="/venv/site-packages/optax/_src/transform.py" source_line=3}
  %custom-call.3 = (bf16[8,8]{1,0}, s8[1024]{0}) custom-call(%x, %x), custom_call_target="__cublas$lt$matmul", backend_config={"alpha_real":1}
  %custom-call.4 = (f32[8,8]{1,0}, u8[0]{0}) custom-call(%x, %x, %x), custom_call_target="__cudnn$fmhaSoftmax"
  %custom-call.5 = f32[8,8]{1,0} custom-call(%x), custom_call_target="SomethingElse"
  %all-reduce-start = f32[8,8]{1,0} all-reduce-start(%x), replica_groups={}, to_apply=%region_0.1
  %copy.3 = f32[8,8]{0,1} copy(%x)
  ROOT %dot.9 = f32[] reduce(%x, %x), dimensions={0,1}, to_apply=%region_0.1
}
"""


def test_hlo_op_categories_from_contents():
    cats = hlo_op_categories(HLO)
    assert hlo_module_name(HLO) == "jit_train_step"
    assert cats["gemm_fusion_dot.1"] == "matmul"
    assert cats["nested_fusion"] == "matmul"              # a fusion calling a fusion holding a dot
    assert cats["input_reduce_fusion"] == "reduction/norm"   # optax *losses* are not the optimizer
    assert cats["wrapped_transpose"] == "memcpy/memset"
    assert cats["loop_multiply_fusion.2"] == "elementwise"
    assert cats["custom-call.3"] == "matmul"
    assert cats["custom-call.4"] == "attention"
    assert cats["custom-call.5"] == "other"
    assert cats["all-reduce-start"] == "collective"
    assert cats["copy.3"] == "memcpy/memset"
    assert cats["dot.9"] == "reduction/norm"              # the opcode decides, not the name


def test_hlo_optimizer_ops_from_python_frames():
    cats = hlo_op_categories(HLO)
    # frame 5 (helper) was called from frame 3 (optax scale_by_adam), called from 2 (Optimizer.update)
    assert cats["loop_multiply_fusion"] == "optimizer"
    assert cats["adam_src"] == "optimizer"                 # older dumps: source_file only
    # The same tables printed with 0-based "no parent" (no self-parent quirk) read the same.
    plain = HLO.replace("1 {file_location_id=1 parent_frame_id=1}", "1 {file_location_id=1 parent_frame_id=0}")
    plain = plain.replace("2 {file_location_id=4 parent_frame_id=2}", "2 {file_location_id=4 parent_frame_id=1}")
    plain = plain.replace("3 {file_location_id=2 parent_frame_id=3}", "3 {file_location_id=2 parent_frame_id=2}")
    plain = plain.replace("4 {file_location_id=3 parent_frame_id=2}", "4 {file_location_id=3 parent_frame_id=1}")
    cats2 = hlo_op_categories(plain)
    assert cats2["loop_multiply_fusion"] == "optimizer"
    assert cats2["input_reduce_fusion"] == "reduction/norm"
    assert cats2["loop_multiply_fusion.2"] == "elementwise"


def test_hlo_op_categories_rejects_non_hlo():
    with pytest.raises(ValueError, match="HloModule"):
        hlo_op_categories("def f(): pass")


@pytest.mark.parametrize("name, op_cat, expected", [
    ("ynn_fusion.4", "matmul", "matmul"),                   # the op knows what the fusion holds
    ("loop_multiply_fusion_3", "optimizer", "optimizer"),
    ("sm90_xmma_gemm_bf16_cublas", "optimizer", "optimizer"),
    ("sm90_xmma_gemm_bf16_cublas", "elementwise", "matmul"),   # a library kernel stays itself
    ("Memset", "matmul", "memcpy/memset"),                  # cuBLAS workspace fill: still a fill
    ("transpose_copy_fusion", "elementwise", "elementwise"),
    ("loop_add_fusion", None, "elementwise"),
])
def test_refine(name, op_cat, expected):
    assert refine(name, op_cat) == expected


def test_refine_rejects_unknown_category():
    with pytest.raises(ValueError, match="valid choices"):
        refine("x", "gemm")
