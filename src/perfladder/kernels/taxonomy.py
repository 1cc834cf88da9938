"""Kernel categories: a kernel (or CPU operator) name to one of ``CATEGORIES``, by ordered name
patterns (cuBLAS / cuDNN / FlashAttention / NCCL / torch / Triton-from-inductor / XLA names).
"""
from __future__ import annotations

import re

CATEGORIES = ("matmul", "attention", "elementwise", "reduction/norm", "optimizer",
              "memcpy/memset", "collective", "other")

# The roofline's groups (``perfladder.kernels.roofline.GROUPS`` prices each): the words a rung
# declaration names the costs it attacks in (``Rung.targets``), readable without the analysis.
ROOFLINE_GROUPS = ("matmul", "attention", "elementwise", "elementwise: RoPE", "elementwise: GELU",
                   "elementwise: rest", "layernorm/reductions", "optimizer", "copies", "other")

CATEGORY_HELP = {
    "matmul": "GEMMs: cuBLAS/cuBLASLt (sm90_xmma, nvjet, cutlass), Triton/XLA gemm fusions, aten mm/addmm/bmm",
    "attention": "fused attention kernels: FlashAttention, cuDNN SDPA/fMHA, memory-efficient attention",
    "elementwise": "pointwise and fused pointwise kernels (Triton poi, XLA loop fusions), gathers/scatters",
    "reduction/norm": "reductions, LayerNorm, softmax, cross entropy (Triton red/per, XLA reduce fusions)",
    "optimizer": "the AdamW update (multi_tensor_apply / fused adam; anything run inside the optimizer step)",
    "memcpy/memset": "data movement without arithmetic: host<->device and device copies, fills, casts, transposes",
    "collective": "NCCL / XLA collectives (all-reduce, all-gather, ...)",
    "other": "everything else (kept by name: see KernelBreakdown.other_names)",
}

# Ordered: the first pattern that matches (case-insensitively, anywhere in the name unless
# anchored) decides. Specific library kernels come before the generic words that their
# demangled template arguments may contain (a cutlass GEMM can mention 'Copy', a NCCL
# all-reduce says 'Reduce'), and the inductor/Triton prefixes come before any word because
# inductor names a kernel after every op it fused ('triton_poi_fused__to_copy_mul_0').
PATTERNS: tuple[tuple[str, str, str], ...] = (
    # (category, regex, where the names come from)
    ("collective", r"nccl|gloo|c10d::|(^|[^a-z])all[-_ ]?(reduce|gather|to[-_ ]?all)|reduce[-_ ]?scatter"
                   r"|collective[-_ ]?permute|collective[-_ ]?broadcast",
     "NCCL kernels (ncclDevKernel_AllReduce_...), torch c10d ops, XLA collective ops"),
    ("other", r"^autograd::|(?-i:^[A-Z][A-Za-z0-9]*Backward\d*$)",
     "CPU profiles: autograd engine wrappers and nodes (their self time is bookkeeping)"),
    ("other", r"^aten::(view|reshape|_reshape_alias|t|transpose|permute|expand|as_strided|slice"
              r"|select|unsqueeze|squeeze|_unsafe_view|split|split_with_sizes|chunk|unbind|narrow"
              r"|detach|alias|contiguous|empty|empty_like|empty_strided|resize_|lift_fresh)$",
     "CPU profiles: aten views and allocations (no arithmetic, no copy)"),
    ("attention", r"^triton_tem_.*(attention|flex)", "inductor flex-attention templates"),
    ("matmul", r"^triton_tem_", "inductor matmul templates (triton_tem_fused_mm_0)"),
    ("elementwise", r"^triton_poi_", "inductor pointwise kernels"),
    ("reduction/norm", r"^triton_(red|per)_", "inductor reductions (red) and persistent reductions (per)"),
    ("memcpy/memset", r"^(cuda)?mem(cpy|set)",
     "CUDA copy/fill activities: 'Memcpy HtoD (Pageable -> Device)', 'Memset (Device)', XLA 'MemcpyH2D'"),
    ("optimizer", r"multi_tensor_apply|adam|_foreach_|^optimizer\.|fused_sgd",
     "torch foreach/fused AdamW kernels, aten::_foreach_* ops, the Optimizer.step annotation"),
    ("attention", r"^_(fwd|bwd)_kernel$",
     "perfladder's fused attention Triton kernels under their first names (the committed "
     "h200-serial-book run); now _rope_attention_fwd_kernel / _rope_attention_bwd_kernel"),
    ("attention", r"flash|fmha|sdpa|scaled_dot_product|efficient_attention|mem_eff|attention"
                  r"|cudnn.*(attn|mha)",
     "FlashAttention (flash_fwd_kernel), cuDNN SDPA (cudnn_generated_fort_native_sdpa_...), "
     "mem-efficient fmha_cutlassF, aten::_scaled_dot_product_*"),
    ("matmul", r"gemm|gemv|xmma|nvjet|cublas|cutlass|splitk|matmul|wgmma|hmma|s16816|s1688"
               r"|(^|[^a-z])dot([^a-z]|$)|^aten::(mm|addmm|bmm|baddbmm|linear|matmul|_addmm_activation)$",
     "cuBLAS(Lt) sm90_xmma_gemm_*, nvjet_*, cutlass, XLA dot / gemm_fusion / triton_gemm, aten mm ops"),
    ("matmul", r"cudnn.*(gemm|matmul|conv)", "cuDNN GEMM engines (XLA's cuDNN GEMM fusions)"),
    ("elementwise", r"^_(rope|gelu)_(fwd|bwd)_kernel$",
     "perfladder's own Triton kernels: the fused RoPE apply and GELU (perfladder.torch.fused)"),
    ("elementwise", r"^gelu_bias_grad",
     "perfladder's Pallas GELU backward with FC1's bias partial sums (perfladder.jax.fused)"),
    ("reduction/norm", r"^_ln_(fwd|bwd)_kernel$",
     "perfladder's own fused residual add + LayerNorm (Triton; the Pallas ones say layer_norm)"),
    ("other", r"cudnn", "any other cuDNN kernel: its kind is not in its name (kept in other_names)"),
    ("memcpy/memset", r"copy|transpose|(^|_)convert",
     "device copies, dtype casts and layout changes: torch direct_copy_kernel, aten::copy_/_to_copy, "
     "XLA wrapped_copy / transpose_fusion / wrapped_convert"),
    ("other", r"^(ynn|xnn)_fusion",
     "XLA:CPU YNNPACK/XNNPACK fusions hold dots, reductions or pointwise work alike: the name "
     "cannot tell (pass the HLO text to resolve them)"),
    ("reduction/norm", r"reduc|layer_?norm|rms_?norm|group_?norm|batch_?norm|softmax|welford"
                       r"|gammabeta|gamma_beta|logsumexp|nll_loss|cross_entropy"
                       r"|^aten::(sum|mean|amax|amin|max|min|argmax|argmin|norm|linalg_vector_norm"
                       r"|var|std|var_mean|cumsum|prod)$",
     "torch reduce_kernel, layer-norm / softmax kernels, XLA input_reduce_fusion, aten reductions"),
    ("elementwise", r"elementwise|pointwise|fusion|^loop_|^input_|^wrapped_|^cpp_fused_"
                    r"|index|embedding|gather|scatter"
                    r"|^aten::(add|add_|sub|sub_|mul|mul_|div|div_|neg|exp|log|pow|sqrt|rsqrt|tanh"
                    r"|tanh_backward|gelu|gelu_backward|sigmoid|relu|threshold_backward|where|clamp"
                    r"|fill_|zero_|zeros|zeros_like|ones|ones_like|full|addcmul_?|addcdiv_?|lerp_?"
                    r"|cos|sin|cat|stack|rsub|masked_fill_?|maximum|minimum|abs|sign|reciprocal"
                    r"|square|arange|triu|tril|ge|gt|le|lt|eq|ne|clone|dropout|native_dropout"
                    r"|sqrt_|mul_|div_|exp_|neg_)$",
     "torch vectorized_elementwise_kernel, XLA loop_/input_/wrapped_ fusions, inductor cpp_fused_ "
     "(CPU), embedding gathers and their scatter-add gradients, aten pointwise ops"),
)

_COMPILED = tuple((cat, re.compile(rx, re.IGNORECASE)) for cat, rx, _ in PATTERNS)
for _cat, _rx, _why in PATTERNS:
    assert _cat in CATEGORIES, _cat


def categorize(name: str) -> str:
    """The category of one kernel / operator name (``'other'`` when no pattern matches)."""
    if not isinstance(name, str):
        raise TypeError(f"kernel name must be a str, got {type(name).__name__}: {name!r}")
    for cat, rx in _COMPILED:
        if rx.search(name):
            return cat
    return "other"
