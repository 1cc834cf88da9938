"""What each rung changes in the recipe it builds on: one small function per technique,
``change(recipe, config) -> recipe``. The declarations in ``seed`` and ``beyond`` use them, and
the ladder page shows each in its rung's cell (``page.run(name, change=...)`` measures an edited
one). The recipe's fields are ``perfladder.torch.recipe.Recipe``; the model and the step read them."""
from __future__ import annotations

from perfladder.ladder.changes import batch_x2, batch_x4, big_batch  # the same on both sides


def fused_adamw(recipe, config):
    """B1: AdamW's update in one fused kernel per parameter group."""
    return recipe.replace(optimizer="fused")


def compiled_adamw(recipe, config):
    """B2: the default AdamW, its step compiled (an alternative to B1)."""
    return recipe.replace(optimizer="compiled")


def cuda_graphs(recipe, config):
    """B3: compile_model(model, mode="reduce-overhead"): CUDA graphs."""
    return recipe.replace(cudagraphs=True)


def onehot_embedding(recipe, config):
    """B4: GPT(embed="onehot"): one_hot(X) @ W; its gradient is a matmul."""
    return recipe.replace(embed="onehot")


def fused_rope(recipe, config):
    """B8: GPT(fused=("rope",)): q and k rotated by our Triton kernel."""
    return recipe.replace(fused=(*recipe.fused, "rope"))


def fused_gelu(recipe, config):
    """B9: GPT(fused=("gelu",)): GELU and its derivative, one pass each."""
    return recipe.replace(fused=(*recipe.fused, "gelu"))


def fused_addnorm(recipe, config):
    """B10: GPT(fused=("addnorm",)): the residual add inside LayerNorm."""
    return recipe.replace(fused=(*recipe.fused, "addnorm"))


def fused_attention(recipe, config):
    """B12: split, RoPE, attention and merge in one Triton kernel each way.
    It rotates q and k itself (so the RoPE kernel goes) and replaces SDPA."""
    fused = tuple(f for f in recipe.fused if f != "rope")
    return recipe.replace(fused=(*fused, "attention"), attn_backend=None)


def fused_mlp(recipe, config):
    """B13: GELU inside the FFN's GEMMs (so the GELU kernel goes)."""
    fused = tuple(f for f in recipe.fused if f != "gelu")
    return recipe.replace(fused=(*fused, "mlp"))


def bf16_residual(recipe, config):
    """B14: GPT(residual="bf16"): the stream between blocks kept in bf16."""
    return recipe.replace(residual="bf16")


def cublaslt_epilogues(recipe, config):
    """B15: GELU, its derivative and FC1's bias gradient in the epilogues
    of cuBLASLt's GEMMs (so the GELU kernel or the Triton FFN GEMMs go)."""
    fused = tuple(f for f in recipe.fused if f not in ("gelu", "mlp"))
    return recipe.replace(fused=(*fused, "epilogue"))


def fused_cuda_graphs(recipe, config):
    """B16: the fastest fused step so far replayed as CUDA graphs
    (compile_model(model, mode="reduce-overhead"), as B3 did unfused)."""
    return recipe.replace(cudagraphs=True)


def tuned_gemms(recipe, config):
    """B17: every GEMM through a cuBLASLt plan whose algorithm was
    chosen by timing, once per shape (nvmath-python)."""
    fused = tuple(f for f in recipe.fused if f != "gemm_bgrad")
    return recipe.replace(fused=(*fused, "gemm"))


def gemm_bias_grads(recipe, config):
    """B18: B17's tuned GEMMs with each bias gradient computed in the
    epilogue of its weight-gradient GEMM (no separate sum)."""
    fused = tuple(f for f in recipe.fused if f != "gemm")
    return recipe.replace(fused=(*fused, "gemm_bgrad"))


CHANGES = {f.__name__: f for f in (
    big_batch, fused_adamw, compiled_adamw, cuda_graphs, onehot_embedding, batch_x2, batch_x4,
    fused_rope, fused_gelu, fused_addnorm, fused_attention, fused_mlp, bf16_residual,
    cublaslt_epilogues, fused_cuda_graphs, tuned_gemms, gemm_bias_grads)}
