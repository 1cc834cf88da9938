"""What every fused kernel module shares: the Triton import and the where-can-it-run check."""
from __future__ import annotations

import contextlib

import torch

try:
    import triton
    import triton.language as tl
except ImportError as e:               # the model option names the missing package
    raise ImportError("perfladder's fused kernels need the 'triton' package "
                      "(pip install triton; a CUDA build of torch ships it)") from e

__all__ = ["triton", "tl", "interpreted", "check_device", "next_pow2", "bf16_round_to_nearest"]


def interpreted(kernel) -> bool:
    """Was ``kernel`` made by ``triton.jit`` under ``TRITON_INTERPRET=1`` (it then runs on CPU)?"""
    return not isinstance(kernel, triton.runtime.jit.JITFunction)


def check_device(kernel, *tensors: torch.Tensor) -> None:
    """Raise unless ``kernel`` can run on these tensors: CUDA, or CPU under the interpreter."""
    for t in tensors:
        if t.device.type == "cuda" or (t.device.type == "cpu" and interpreted(kernel)):
            continue
        raise RuntimeError(f"fused Triton kernels run on CUDA tensors (or on CPU with TRITON_INTERPRET=1 "
                           f"set before triton is imported); got a tensor on {t.device}")


def next_pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


@contextlib.contextmanager
def bf16_round_to_nearest():
    """Inside: Triton's CPU interpreter rounds fp32 -> bf16 to nearest even, as a GPU's
    ``cvt.rn`` does, instead of toward zero (its own conversion truncates, which doubles the
    rounding error and biases it), so that an accuracy comparison on CPU means what it means on
    a GPU. No effect on compiled kernels."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    truncating = builder.cast_impl

    def cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            x = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
            bits = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)   # bf16 as uint16
            return interpreter.TensorHandle(bits, dst_type.scalar)
        return truncating(self, src, dst_type)

    builder.cast_impl = cast
    try:
        yield
    finally:
        builder.cast_impl = truncating
