"""Fused Pallas kernels for the JAX model, each behind a model option.

    GPT(config, rngs=..., fused=("addnorm",))     # default: fused=() -- the reference ops

| option     | module                   | replaces                                          |
|------------|--------------------------|---------------------------------------------------|
| 'addnorm'  | ``fused.add_layer_norm`` | residual add + LayerNorm, forward and backward    |
| 'attention'| ``fused.attention``      | QKV split + RoPE + causal attention + head merge, forward and backward |
| 'gelu_bias_grad' | ``fused.gelu_bias_grad`` | GELU's backward and FC1's bias gradient (one pass) |

The names match ``perfladder.torch.fused.FUSED`` where the kernels do the same job.
"""
from __future__ import annotations

from perfladder.checks import check_options

FUSED = ("addnorm", "attention", "gelu_bias_grad")


def check_fused(fused) -> tuple[str, ...]:
    """``fused`` as a tuple of known option names; a clear error for anything else."""
    return check_options("fused", fused, FUSED)
