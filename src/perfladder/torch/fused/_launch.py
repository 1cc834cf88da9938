"""What every fused kernel module shares: the Triton import and the where-can-it-run check."""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError as e:               # the model option names the missing package
    raise ImportError("perfladder's fused kernels need the 'triton' package "
                      "(pip install triton; a CUDA build of torch ships it)") from e

__all__ = ["triton", "tl", "interpreted", "check_device", "next_pow2"]


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
