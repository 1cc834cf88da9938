"""Fused Triton kernels for the memory-bound half of a training step, each behind a model option.

    GPT(config, fused=("rope", "addnorm"))      # default: fused=() -- the reference ops

| option     | module                 | replaces                                              |
|------------|------------------------|-------------------------------------------------------|
| 'rope'     | ``fused.rope``         | RoPE on q and k (and the QKV split's backward concat) |
| 'addnorm'  | ``fused.add_layer_norm``| residual add + LayerNorm, forward and backward       |
| 'gelu'     | ``fused.gelu``         | tanh GELU and its derivative                          |

Each is a ``torch.autograd.Function`` whose forward and backward launch Triton kernels through
``torch.library.custom_op`` operators (``perfladder::...``) with fake (shape) implementations,
so ``torch.compile`` (dynamo + AOTAutograd + inductor) treats each kernel as one opaque node
and CUDA graphs capture it like any other kernel. The math is the reference's: fp32 inside the
kernel, the reference's output dtypes; tests compare both, forward and backward.

The kernels run on CUDA tensors; on CPU only through Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported), which the tests use. Anything else
is a clear error, never a silent fallback to the reference ops.
"""
from __future__ import annotations

FUSED = ("rope", "addnorm", "gelu")


def check_fused(fused) -> tuple[str, ...]:
    """``fused`` as a sorted tuple of known option names; a clear error for anything else."""
    if isinstance(fused, str):
        fused = (fused,)
    try:
        names = tuple(fused)
    except TypeError:
        raise ValueError(f"fused={fused!r} must be a tuple of option names; valid choices: {FUSED}") from None
    bad = [n for n in names if n not in FUSED]
    if bad:
        raise ValueError(f"fused={names!r}: unknown option(s) {bad}; valid choices: {FUSED}")
    return tuple(n for n in FUSED if n in names)
