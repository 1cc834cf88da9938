"""Correctness gates: each rung proves it still computes the same model before it is timed.

Every gate raises a ``GateError`` (an ``AssertionError``) naming what differed and by how
much; a faster wrong answer never reaches the timer.
"""
from __future__ import annotations

import torch
from torch import nn

# Compiled vs eager logits. On a GPU the fp32 matmuls run as TF32 and inductor re-associates
# fused reductions, so agreement is to about 1e-3..1e-2 absolute (logits are O(1)); on CPU
# the difference is ~1e-6. A wrong model (other weights, a broken op) is off by >= 1e-1.
COMPILE_ATOL, COMPILE_RTOL = 1e-2, 1e-3
# Checkpointing recomputes the same ops on the same inputs: the forward must be exact.
MIRROR_ATOL = 1e-6


class GateError(AssertionError):
    """A rung failed its correctness gate."""


class CorrectnessError(GateError):
    """The compiled model does not compute what the eager model computes."""


class MirrorError(GateError):
    """A re-wired model (e.g. checkpointed) is not an exact mirror of the plain one."""


class PrecisionError(GateError):
    """A rung that claims bf16 did not compute in bf16 (no silent fp32)."""


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def check_compiled(eager: nn.Module, compiled: nn.Module, X: torch.Tensor,
                   atol: float = COMPILE_ATOL, rtol: float = COMPILE_RTOL) -> float:
    """Assert ``compiled(X)`` is allclose to ``eager(X)``; return the max abs difference.

    Runs with autograd on, as in training, so the compiled module reuses its training
    graph instead of compiling a second (inference) graph just for the gate.
    """
    ref = eager(X).detach()                                   # (B, T, V)
    got = compiled(X).detach()                                # (B, T, V)
    if got.shape != ref.shape:
        raise CorrectnessError(f"compiled logits have shape {tuple(got.shape)}, eager {tuple(ref.shape)}")
    diff = _max_diff(got, ref)
    if not torch.allclose(got.float(), ref.float(), atol=atol, rtol=rtol):
        raise CorrectnessError(f"compiled logits differ from eager: max |diff| = {diff:.3g} "
                               f"(allowed atol={atol}, rtol={rtol}); not timing a wrong model")
    return diff


def check_mirror(plain: nn.Module, mirror: nn.Module, X: torch.Tensor,
                 atol: float = MIRROR_ATOL) -> float:
    """Assert ``mirror(X)`` equals ``plain(X)`` to ``atol`` in fp32 (no autocast); return max |diff|."""
    with torch.autocast(X.device.type, enabled=False):
        ref = plain(X).detach()                               # (B, T, V)
        got = mirror(X).detach()                              # (B, T, V)
    if ref.dtype != torch.float32 or got.dtype != torch.float32:
        raise MirrorError(f"mirror check must run in fp32; got {ref.dtype} and {got.dtype}")
    diff = _max_diff(got, ref)
    if got.shape != ref.shape or not torch.allclose(got, ref, atol=atol, rtol=0.0):
        raise MirrorError(f"the checkpointed model is not an exact mirror of the plain one: "
                          f"max |diff| = {diff:.3g} > atol={atol}")
    return diff


def check_bf16(logits: torch.Tensor, what: str = "logits") -> str:
    """Assert ``logits`` came out bf16 (the receipt of a bf16 rung); return the dtype name."""
    if logits.dtype != torch.bfloat16:
        raise PrecisionError(f"{what} are {logits.dtype} inside the bf16 autocast region, "
                             "expected torch.bfloat16: this rung would measure fp32 and call it bf16")
    return str(logits.dtype)
