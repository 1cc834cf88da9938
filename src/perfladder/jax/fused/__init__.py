"""Fused Pallas kernels for the JAX model, each behind a model option.

    GPT(config, rngs=..., fused=("addnorm",))     # default: fused=() -- the reference ops

| option     | module                   | replaces                                          |
|------------|--------------------------|---------------------------------------------------|
| 'addnorm'  | ``fused.add_layer_norm`` | residual add + LayerNorm, forward and backward    |

The names match ``perfladder.torch.fused.FUSED`` where the kernels do the same job.
"""
from __future__ import annotations

FUSED = ("addnorm",)


def check_fused(fused) -> tuple[str, ...]:
    """``fused`` as a tuple of known option names; a clear error for anything else."""
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
