"""What each rung changes in the recipe it builds on: one small function per technique,
``change(recipe, config) -> recipe``. The declarations in ``seed`` and ``beyond`` use them, and
the ladder page shows each in its rung's cell (``page.run(name, change=...)`` measures an edited
one). The recipe's fields are ``perfladder.jax.recipe.Recipe``; the model and the step read them."""
from __future__ import annotations

from perfladder.ladder.changes import batch_x2, batch_x4, big_batch  # the same on both sides


def fp32_embedding_lookup(recipe, config):
    """B1: GPT(embed_fp32=True): look up in the fp32 table, cast the rows
    to bf16 after, so the gradient's scatter-add runs in fp32."""
    return recipe.replace(embed_fp32=True)


def onehot_embedding(recipe, config):
    """B2: GPT(embed="onehot"): one_hot(X, V) @ table, no scatter at all."""
    return recipe.replace(embed="onehot")


def split_jit(recipe, config):
    """B3: one jax.jit over the split state, donated (not nnx.jit)."""
    return recipe.replace(jit="split")


def cudnn_attention(recipe, config):
    """B4: GPT(attn_impl="cudnn"): cuDNN's fused attention kernel."""
    return recipe.replace(attn_impl="cudnn")


def fused_addnorm(recipe, config):
    """B7: GPT(fused=("addnorm",)): each residual add inside its LayerNorm."""
    return recipe.replace(fused=(*recipe.fused, "addnorm"))


def fused_attention(recipe, config):
    """B8: split, RoPE, attention and merge in one Pallas kernel each way
    (it replaces the attention implementation)."""
    return recipe.replace(fused=(*recipe.fused, "attention"), attn_impl=None)


def xla_cublaslt(recipe, config):
    """B9: XLA's GEMMs through cuBLASLt, compiled into this step alone,
    so XLA can put FC1's bias and GELU in the GEMM's epilogue."""
    return recipe.replace(xla_options={**dict(recipe.xla_options),
                                       "xla_gpu_enable_cublaslt": True})


def fused_gelu_bias_grad(recipe, config):
    """B10: GPT(fused=(..., "gelu_bias_grad")): GELU's backward and FC1's
    bias gradient in one Pallas kernel."""
    return recipe.replace(fused=(*recipe.fused, "gelu_bias_grad"))


def command_buffers(recipe, config):
    """B11: every command type XLA can record into CUDA graphs, from a
    sequence of one kernel up, compiled into this step alone."""
    return recipe.replace(xla_options={
        **dict(recipe.xla_options),
        "xla_gpu_enable_command_buffer":
            "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL",
        "xla_gpu_graph_min_graph_size": 1})


def attention_bias(recipe, config):
    """B12: GPT(fused=(..., "attention_bias")): the QKV bias added where
    B8's attention kernels load q, k and v (the option needs them)."""
    return recipe.replace(fused=(*recipe.fused, "attention", "attention_bias"), attn_impl=None)


CHANGES = {f.__name__: f for f in (
    big_batch, fp32_embedding_lookup, onehot_embedding, split_jit, cudnn_attention, batch_x2,
    batch_x4, fused_addnorm, fused_attention, xla_cublaslt, fused_gelu_bias_grad, command_buffers,
    attention_bias)}
