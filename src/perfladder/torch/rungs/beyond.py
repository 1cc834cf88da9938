"""PyTorch rungs past the seed (``B1`` ...), each declared once; they continue from R3.

    B1  fused AdamW (``fused=True``)                       the optimizer's many small kernels
    B2  the default AdamW, its step torch.compile-d        an alternative to B1
    B3  CUDA graphs (``mode='reduce-overhead'``)           launch overhead; CUDA only
    B4  scatter-free embedding (``GPT(embed='onehot')``)   the embedding gradient's atomics
    B5  batch x2, B6 batch x4                              bigger GEMMs, fixed costs amortised
    B7  the fastest attention kernel, pinned               every SDPA backend timed first
    B8  RoPE as one Triton kernel from the QKV projection  the RoPE apply (elementwise); GPU
    B9  GELU and its derivative as Triton kernels          elementwise; GPU
    B10 residual add fused into LayerNorm (Triton)         norm traffic; GPU
    B11 ``max-autotune`` GEMM templates                    optional (minutes of compiling); GPU
    B12 attention as one Triton kernel (split, RoPE, SDPA)  attention and its copies; GPU
    B13 FC1+GELU and FC2's dgrad+dGELU as Triton GEMMs      the FFN's elementwise passes; GPU
    B14 the residual stream between blocks in bf16         the stream's bytes (numerics change)
    B15 FC1+GELU and FC2's dgrad+dGELU+db1 in cuBLASLt's    the FFN's elementwise passes, as B13; GPU,
        epilogues (nvmath-python)                           nvmath-python (an alternative to B13)
    B16 CUDA graphs on the fastest fused step              the idle between kernels; CUDA only
    B17 every GEMM through a cuBLASLt plan autotuned once   cuBLAS's first-choice algorithms; GPU,
        per shape (nvmath-python)                           nvmath-python (an alternative to cuBLAS's)
    B18 B17 with each bias gradient in its weight-gradient  the bias gradients' reductions; GPU,
        GEMM's epilogue (cuBLASLt BGRADB)                   nvmath-python (an alternative to the sum)

The engine (``perfladder.ladder.engine``) hands each rung the fastest configuration so far with
the rung's change applied; ``perfladder.torch.trial.trial`` gates it (logits and every
gradient against the plain fp32 model, a few optimizer steps against the eager bf16 reference,
and the receipt of the timed step) and times it. The engine keeps it when its verdict is
'faster'.
"""
from __future__ import annotations

import torch

from perfladder.ladder.rung import Evidence, Given, NotMeasured, NotSupported, Rung
from perfladder.torch.checks import onehot_check
from perfladder.torch.fused.epilogue import nvmath_missing
from perfladder.torch.kernels import BACKENDS, attention_backends, pick_backend
from perfladder.torch.rungs import changes as ch
from perfladder.torch.trial import trial


def gated(optimizer: bool = False, checks=()):
    """A beyond rung's measurement: every gate, the loss gate included (``trial``)."""
    def fn(lab, given: Given) -> Evidence:
        return trial(lab, given, optimizer_gate_=optimizer, loss_gate_=True, checks=checks)
    return fn


def with_nvmath(measure, *what: str):
    """``measure``, refused in one line when nvmath-python cannot be imported (outcome
    'not_supported'), naming ``what`` needs it: the cuBLASLt GEMMs have no fallback to
    PyTorch's."""
    def fn(lab, given: Given) -> Evidence:
        missing = nvmath_missing(*what)
        if missing:
            raise NotSupported(missing, recipe=given.recipe)
        return measure(lab, given)
    return fn


def without_cuda_graphs(measure):
    """``measure``, refused in one line on a configuration that would replay CUDA graphs over
    nvmath-python's cuBLASLt plans (``Recipe.graphs_over_cublaslt_plans``): B16 over a kept B15,
    B17 or B18 over a kept B16."""
    def fn(lab, given: Given) -> Evidence:
        if given.recipe.graphs_over_cublaslt_plans:
            raise NotSupported("nvmath-python's cuBLASLt plans keep their workspace between calls, "
                               "which CUDA graph trees refuse; this configuration would replay CUDA "
                               "graphs over them", recipe=given.recipe)
        return measure(lab, given)
    return fn


def b7_attention_kernel(lab, given: Given) -> Evidence:
    """Time every SDPA backend on the configuration's shapes; pin the fastest; measure. When
    PyTorch's own choice already is the fastest, nothing changes: not measured, with the
    timings (timing the same kernels again would prove nothing)."""
    recipe = given.recipe
    timings = attention_backends(lab, recipe.batch_size)
    # the math kernel computes bf16 attention in fp32 unless PyTorch is told it may not
    # (allow_fp16_bf16_reduction_math_sdp): a bf16 rung does not pin it (its receipt would refuse)
    fp32 = ["math"] if recipe.bf16 and not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() else []
    best = pick_backend({n: t for n, t in timings.items() if n not in fp32})
    picks = timings["default"].get("picks")
    details = {"attention_ms": timings, "attention_backend": best, "default_picks": picks,
               "refused": [n for n in BACKENDS if not timings[n]["available"]],
               "computes_in_fp32": fp32}
    pinned = recipe.replace(attn_backend=best)
    if picks == best and recipe.attn_backend in (None, best):
        raise NotMeasured(f"PyTorch's default already runs the fastest kernel ({best}); pinning it "
                          "would time the same kernels again", recipe=pinned, details=details)
    return trial(lab, given, recipe=pinned, loss_gate_=True, details=details)


TRITON_ON_CPU = ("Triton compiles for a GPU; on CPU its kernels run only through the Triton "
                 "interpreter, in tests/torch/test_fused.py")


CUDA_GRAPHS_ON_CPU = ("CUDA graphs exist only on a CUDA device (mode='reduce-overhead' on CPU would "
                      "compile the default mode)")
CUBLASLT_ON_CPU = ("cuBLASLt's GEMMs are GPU kernels (on CPU PyTorch ops stand in for them, in "
                   "tests/torch/test_gemm.py)")
TUNED_GEMMS = "the autotuned cuBLASLt GEMMs (fused 'gemm', 'gemm_bgrad')"


GATE = "logits and every gradient vs the plain fp32 model; losses over 3 steps vs the eager bf16 reference"
OPT_GATE = GATE + "; each parameter's update vs the default AdamW"
BEYOND_ = dict(stage="beyond")

BEYOND = [
    Rung("B1", "fused_adamw", "+fused AdamW", gated(optimizer=True), **BEYOND_,
         change=ch.fused_adamw, gate=OPT_GATE),
    Rung("B2", "compiled_adamw", "compiled AdamW", gated(optimizer=True), **BEYOND_,
         change=ch.compiled_adamw, alternative=True, gate=OPT_GATE),
    Rung("B3", "cuda_graphs", "+CUDA graphs", gated(optimizer=True), **BEYOND_,
         change=ch.cuda_graphs, gate=OPT_GATE,
         needs_gpu="CUDA graphs exist only on a CUDA device (mode='reduce-overhead' on CPU would "
                   "compile the default mode)"),
    Rung("B4", "onehot_embedding", "+one-hot embedding", gated(checks=(onehot_check,)), **BEYOND_,
         change=ch.onehot_embedding,
         gate="one-hot == gather logits (true fp32) and table gradients; " + GATE),
    Rung("B5", "batch_x2", "batch x2", gated(), **BEYOND_, change=ch.batch_x2, gate=GATE),
    Rung("B6", "batch_x4", "batch x4", gated(), **BEYOND_, change=ch.batch_x4, gate=GATE),
    Rung("B7", "attention_kernel", "pinned attention kernel", b7_attention_kernel, **BEYOND_,
         alternative=True, gate=GATE),
    Rung("B8", "fused_rope", "+fused RoPE", gated(), **BEYOND_, change=ch.fused_rope,
         needs_gpu=TRITON_ON_CPU, gate=GATE),
    Rung("B9", "fused_gelu", "+fused GELU", gated(), **BEYOND_, change=ch.fused_gelu,
         needs_gpu=TRITON_ON_CPU, gate=GATE),
    Rung("B10", "fused_addnorm", "+fused add+LayerNorm", gated(), **BEYOND_, change=ch.fused_addnorm,
         needs_gpu=TRITON_ON_CPU, gate=GATE),
    Rung("B11", "max_autotune", "+max-autotune", gated(), **BEYOND_,
         change=lambda r, c: r.replace(autotune=True), optional=True, gate=GATE,
         needs_gpu="the Triton GEMM templates it tunes are GPU kernels"),
    # The fused attention kernel replaces SDPA (so no backend is pinned) and rotates q and k
    # itself; the fused FFN computes GELU inside its GEMMs.
    Rung("B12", "fused_attention", "+fused attention", gated(), **BEYOND_,
         change=ch.fused_attention,
         needs_gpu=TRITON_ON_CPU, gate=GATE),
    Rung("B13", "fused_mlp", "+fused FFN GEMMs", gated(), **BEYOND_,
         change=ch.fused_mlp, needs_gpu=TRITON_ON_CPU, gate=GATE),
    Rung("B14", "bf16_residual", "+bf16 residual stream", gated(), **BEYOND_,
         change=ch.bf16_residual, gate=GATE),
    # the FFN's elementwise cost again, as B13 went after it, with cuBLASLt's GEMMs
    Rung("B15", "cublaslt_epilogues", "+cuBLASLt FFN epilogues", with_nvmath(gated()), **BEYOND_,
         change=ch.cublaslt_epilogues, alternative=True, gate=GATE,
         needs_gpu="cuBLASLt's epilogues are GPU kernels (on CPU PyTorch ops stand in for them, "
                   "in tests/torch/test_epilogue.py)"),
    # the idle between kernels: B3 tried CUDA graphs only on the unfused step at the seed's batch
    Rung("B16", "fused_cuda_graphs", "+CUDA graphs, fused", without_cuda_graphs(gated(optimizer=True)),
         **BEYOND_, change=ch.fused_cuda_graphs, gate=OPT_GATE, needs_gpu=CUDA_GRAPHS_ON_CPU),
    Rung("B17", "tuned_gemms", "+tuned cuBLASLt GEMMs",
         without_cuda_graphs(with_nvmath(gated(), TUNED_GEMMS)), **BEYOND_,
         change=ch.tuned_gemms, alternative=True, gate=GATE, needs_gpu=CUBLASLT_ON_CPU),
    Rung("B18", "gemm_bias_grads", "+bias grads in GEMMs",
         without_cuda_graphs(with_nvmath(gated(), TUNED_GEMMS)),
         **BEYOND_, change=ch.gemm_bias_grads, alternative=True, gate=GATE, needs_gpu=CUBLASLT_ON_CPU),
]
