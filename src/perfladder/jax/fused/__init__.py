"""Fused Pallas kernels for the JAX model, each behind a model option.

    GPT(config, rngs=..., fused=("addnorm",))     # default: fused=() -- the reference ops

| option     | module                   | replaces                                          |
|------------|--------------------------|---------------------------------------------------|
| 'addnorm'  | ``fused.add_layer_norm`` | residual add + LayerNorm, forward and backward    |
| 'attention'| ``fused.attention``      | QKV split + RoPE + causal attention + head merge, forward and backward |
| 'attention_bias' | ``fused.attention`` | the QKV bias's own pass: added on load, its gradient summed where ``d(qkv)`` is written (with 'attention') |
| 'gelu_bias_grad' | ``fused.gelu_bias_grad`` | GELU's backward and FC1's bias gradient (one pass) |

The names match ``perfladder.torch.fused.FUSED`` where the kernels do the same job.
"""
from __future__ import annotations

import jax

from perfladder.checks import check_options

FUSED = ("addnorm", "attention", "attention_bias", "gelu_bias_grad")


def check_fused(fused) -> tuple[str, ...]:
    """``fused`` as a tuple of known option names; a clear error for anything else."""
    fused = check_options("fused", fused, FUSED)
    if "attention_bias" in fused and "attention" not in fused:
        raise ValueError(f"fused={fused!r}: 'attention_bias' adds the QKV bias inside the fused "
                         "attention kernel, so it needs 'attention' too")
    return fused


def matmul_and_bias(linear, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(x @ kernel, bias)`` of a flax ``Linear``, each cast to its compute dtype as ``Linear``
    casts them: ``linear(x)`` is their sum, which a kernel then forms where it loads the product."""
    dtype = linear.dtype or x.dtype
    kernel, bias = linear.kernel[...].astype(dtype), linear.bias[...].astype(dtype)
    u = jax.lax.dot_general(x.astype(dtype), kernel, (((x.ndim - 1,), (0,)), ((), ())),
                            precision=linear.precision)                    # (..., d_out)
    return u, bias
