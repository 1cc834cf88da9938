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

The engine (``perfladder.ladder.engine``) hands each rung the fastest configuration so far with the
rung's change applied; the rung gates it (logits and every gradient against the
configuration it builds on, then a few optimizer steps against the eager seed recipe, and the
bf16 receipt of the timed step), times it, and records it. The engine keeps it when its
verdict is 'faster'.
"""
from __future__ import annotations

from perfladder.ladder.engine import Rung
from perfladder.measure.evidence import Compile
from perfladder.results.record import RungResult
from perfladder.torch.attention import BACKENDS, attention_backends, pick_backend
from perfladder.torch.lab import TorchLab
from perfladder.torch.loss_gate import (
    embed_gate,
    gate_batches,
    loss_gate,
    reference_losses,
)
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs.seed import gated_step, measured


def measure_recipe(lab: TorchLab, name: str, label: str, recipe: Recipe, base: str | None,
                   *, gates=(), details=None, optimizer_gate: bool = False) -> RungResult:
    """Build ``recipe``'s step, gate it, time it; the engine records it against ``base``."""
    B = recipe.batch_size
    reference_losses(lab, B)           # the eager reference first: its memory is gone before
    step, first, comp = gated_step(lab, recipe, optimizer_gate)   # the configuration under test is built
    gate, first_s = loss_gate(lab, step, B)    # its first optimizer step (compiled AdamW compiles here)
    return measured(lab, name, label, recipe, step, gates=[*first, *gates, gate],
                    compile=Compile(first_call_s=comp.first_call_s + first_s), details=details)


def b1_fused_adamw(lab, recipe, base):
    """AdamW(fused=True): the whole update in one kernel per parameter group and dtype."""
    return measure_recipe(lab, "B1", "+fused AdamW", recipe, base, optimizer_gate=True)


def b2_compiled_adamw(lab, recipe, base):
    """The default AdamW with its step torch.compile-d, in place of the optimizer so far."""
    return measure_recipe(lab, "B2", "compiled AdamW", recipe, base, optimizer_gate=True)


def b3_cudagraphs(lab, recipe, base):
    """torch.compile(mode='reduce-overhead'): forward and backward replayed as CUDA graphs."""
    return measure_recipe(lab, "B3", "+CUDA graphs", recipe, base, optimizer_gate=True)


def b4_onehot_embedding(lab, recipe, base):
    """GPT(embed='onehot'): the embedding's gradient becomes a matmul instead of a scatter-add."""
    X = gate_batches(lab, recipe.batch_size)[0][0][: lab.config.batch_size]
    return measure_recipe(lab, "B4", "+one-hot embedding", recipe, base, gates=[embed_gate(lab, X)])


def b5_batch_x2(lab, recipe, base):
    return measure_recipe(lab, "B5", "batch x2", recipe, base)


def b6_batch_x4(lab, recipe, base):
    return measure_recipe(lab, "B6", "batch x4", recipe, base)


def b7_attention_kernel(lab, recipe, base):
    """Time every SDPA backend on the configuration's shapes; pin the fastest; measure. When
    PyTorch's own choice already is the fastest, nothing changes: recorded as not measured,
    with the timings (timing the same kernels again would prove nothing)."""
    timings = attention_backends(lab, recipe.batch_size)
    best = pick_backend(timings)
    picks = timings["default"].get("picks")
    details = {"attention_ms": timings, "attention_backend": best, "default_picks": picks,
               "refused": [n for n in BACKENDS if not timings[n]["available"]]}
    pinned = recipe.replace(attn_backend=best)
    if picks == best and recipe.attn_backend in (None, best):
        return RungResult(name="B7", key="", label=f"attention: {best}", kind="skipped",
                          recipe=pinned.to_dict(), details=details,
                          error=f"PyTorch's default already runs the fastest kernel ({best}); "
                                "pinning it would time the same kernels again")
    return measure_recipe(lab, "B7", f"attention: {best}", pinned, base, details=details)


def b8_fused_rope(lab, recipe, base):
    """RoPE in one Triton kernel straight from the QKV projection (fp32 math in registers)."""
    return measure_recipe(lab, "B8", "+fused RoPE", recipe, base)


def b9_fused_gelu(lab, recipe, base):
    """The tanh GELU and its derivative as Triton kernels."""
    return measure_recipe(lab, "B9", "+fused GELU", recipe, base)


def b10_fused_addnorm(lab, recipe, base):
    """Each residual add fused into the LayerNorm after it; a one-pass LayerNorm backward."""
    return measure_recipe(lab, "B10", "+fused add+LayerNorm", recipe, base)


def b11_max_autotune(lab, recipe, base):
    """torch.compile(mode='max-autotune-no-cudagraphs') (or 'max-autotune' over CUDA graphs)."""
    return measure_recipe(lab, "B11", "+max-autotune", recipe, base)


def _fuse(name: str):
    return lambda r, c: r.replace(fused=(*r.fused, name))


TRITON_ON_CPU = ("Triton kernels compile for a GPU; on CPU they run only through Triton's "
                 "interpreter, in tests/test_torch_fused.py")


def _times(factor: int):
    return lambda r, c: r.replace(batch_size=c.big_batch * factor)


BEYOND = [
    Rung("B1", "fused_adamw", "+fused AdamW", b1_fused_adamw, stage="beyond",
         change=lambda r, c: r.replace(optimizer="fused"), section="13.3 fusion",
         gate="logits and gradients vs its base; losses over 3 steps vs the seed recipe",
         attacks="optimizer",
         targets=('optimizer',)),
    Rung("B2", "compiled_adamw", "compiled AdamW", b2_compiled_adamw, stage="beyond",
         change=lambda r, c: r.replace(optimizer="compiled"), alternative=True,
         section="13.3 compilation", gate="losses over 3 steps vs the seed recipe",
         attacks="optimizer",
         targets=('optimizer',)),
    Rung("B3", "cuda_graphs", "+CUDA graphs", b3_cudagraphs, stage="beyond",
         change=lambda r, c: r.replace(cudagraphs=True), section="13.3 overhead",
         gate="losses over 3 steps vs the seed recipe", attacks="launch overhead",
         needs_gpu="CUDA graphs exist only on a CUDA device (mode='reduce-overhead' on CPU would "
                   "compile the default mode)"),
    Rung("B4", "onehot_embedding", "+one-hot embedding", b4_onehot_embedding, stage="beyond",
         change=lambda r, c: r.replace(embed="onehot"), section="13.2 atomics and the roofline",
         gate="one-hot == gather logits (true fp32) and table gradients; losses over 3 steps",
         attacks="the embedding gradient's scatter-add",
         targets=('elementwise: rest',)),
    Rung("B5", "batch_x2", "batch x2", b5_batch_x2, stage="beyond", change=_times(2),
         section="13.1 roofline: arithmetic intensity", gate="losses over 3 steps vs the seed recipe",
         attacks="fixed per-step cost"),
    Rung("B6", "batch_x4", "batch x4", b6_batch_x4, stage="beyond", change=_times(4),
         section="13.1 roofline: arithmetic intensity", gate="losses over 3 steps vs the seed recipe",
         attacks="fixed per-step cost"),
    Rung("B7", "attention_kernel", "attention kernel", b7_attention_kernel, stage="beyond",
         alternative=True, section="10.5 fused attention",
         gate="losses over 3 steps vs the seed recipe", attacks="attention",
         targets=('attention',)),
    Rung("B8", "fused_rope", "+fused RoPE", b8_fused_rope, stage="beyond", change=_fuse("rope"),
         section="13.3 fusion (a hand-written kernel)", needs_gpu=TRITON_ON_CPU,
         gate="logits and gradients vs its base; losses over 3 steps vs the seed recipe",
         attacks="elementwise: the RoPE apply",
         targets=('elementwise: RoPE',)),
    Rung("B9", "fused_gelu", "+fused GELU", b9_fused_gelu, stage="beyond", change=_fuse("gelu"),
         section="13.3 fusion (a hand-written kernel)", needs_gpu=TRITON_ON_CPU,
         gate="losses over 3 steps vs the seed recipe", attacks="elementwise: GELU",
         targets=('elementwise: GELU',)),
    Rung("B10", "fused_addnorm", "+fused add+LayerNorm", b10_fused_addnorm, stage="beyond",
         change=_fuse("addnorm"), section="13.3 fusion (a hand-written kernel)",
         needs_gpu=TRITON_ON_CPU, gate="losses over 3 steps vs the seed recipe",
         attacks="reduction/norm: residual add and LayerNorm",
         targets=('layernorm/reductions',)),
    Rung("B11", "max_autotune", "+max-autotune", b11_max_autotune, stage="beyond",
         change=lambda r, c: r.replace(autotune=True), optional=True, section="13.3 compilation",
         gate="losses over 3 steps vs the seed recipe", attacks="elementwise",
         needs_gpu="the Triton GEMM templates it tunes are GPU kernels",
         targets=('matmul', 'elementwise')),
]
