"""What a run runs on: the device's name, the versions, and this run's own ceilings.

``device_name()``, ``has_gpu()``, ``versions()``; ``probe_roofs()``: the device ceilings, a large
matmul and a device-to-device copy (CUDA only).

The measured roofs a page reads rates against come from the same run, not from a table:
they differ by a few percent from day to day and machine to machine.

The matmul roof is a sustained rate, as a training step runs its GEMMs: each timed window is a
chain of ``inner`` dependent products, not one. A lone product between idle gaps runs at the
card's boost clock; back to back, a power-capped card lowers its clock (an H100 at 700 W fell
from 1980 to about 1400 MHz), and one product alone read 9% above ten in a row
(``benchmarks/results/h100-matmul-probe-2026-12-07/``). JAX's probe measures the same way
(``perfladder.jax.device``), so the two sides' ceilings are one quantity.
"""
from __future__ import annotations

import platform
import statistics

import numpy as np
import torch

from perfladder.kernels.ceiling import PROBE_CHAIN, PROBE_N
from perfladder.results.record import python_versions

METHOD = ("median of {reps} CUDA-event-timed repeats after 3 warm-ups, each a chain of {inner} "
          "dependent {n}x{n} matmuls (2n^3 FLOPs each, random data); copy counts bytes read + "
          "written of a {gib} GiB fp32 tensor")


def matmul_chain(x: torch.Tensor, y: torch.Tensor, inner: int) -> torch.Tensor:
    """``x @ y @ ... @ y`` (``inner`` products), each waiting for the one before, as a step's
    GEMMs run back to back. ``y`` should be scaled by ``1/sqrt(n)`` so the chain keeps ``x``'s
    magnitude (no overflow in bf16)."""
    for _ in range(inner):
        x = x @ y
    return x


def _ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def probe_roofs(n: int = PROBE_N, gib: int = 1, reps: int = 10, inner: int = PROBE_CHAIN) -> dict | None:
    """``{'matmul_bf16_tflops', 'matmul_tf32_tflops', 'copy_gbps', 'source', 'method'}`` on a
    CUDA device, ``None`` without one."""
    if not torch.cuda.is_available():
        return None
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = (torch.randn(n, n, device="cuda") / n ** 0.5).to(torch.bfloat16)
    flops = 2 * n ** 3 * inner
    bf16 = flops / (_ms(lambda: matmul_chain(x, y, inner), reps) / 1e3) / 1e12
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    xf, yf = x.float(), y.float()
    tf32 = flops / (_ms(lambda: matmul_chain(xf, yf, inner), reps) / 1e3) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = before
    src = torch.randn(gib << 28, device="cuda", dtype=torch.float32)      # gib GiB
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / (_ms(lambda: dst.copy_(src), reps) / 1e3) / 1e9
    return {"matmul_bf16_tflops": bf16, "matmul_tf32_tflops": tf32, "copy_gbps": copy,
            "source": "perfladder.torch.device at the start of this run",
            "method": METHOD.format(reps=reps, n=n, gib=gib, inner=inner)}


def has_gpu() -> bool:
    """Is a CUDA device usable from this process?"""
    return torch.cuda.is_available()


def device_name() -> str:
    """The GPU's name (e.g. 'NVIDIA H200'), or 'cpu'."""
    return torch.cuda.get_device_name(0) if has_gpu() else "cpu"


def versions() -> dict[str, str]:
    """Python, platform, torch, CUDA/cuDNN (when present) and numpy versions."""
    out = python_versions(torch=torch, numpy=np)
    out["cuda"] = torch.version.cuda or "none"
    if has_gpu():
        out["cudnn"] = str(torch.backends.cudnn.version())
        out["gpu"] = device_name()
    out["machine"] = platform.machine()
    return out


def capability() -> tuple[int, int] | None:
    """The CUDA device's compute capability, e.g. ``(9, 0)``; ``None`` without one."""
    return tuple(torch.cuda.get_device_capability(0)) if has_gpu() else None


def triton_present() -> bool:
    """Is Triton installed (what torch.compile's GPU kernels and our fused kernels compile with)?"""
    import importlib.util
    return importlib.util.find_spec("triton") is not None


def apply_memory_cap(cap_gib: float) -> str:
    """Hold this process's CUDA allocator to ``cap_gib`` GiB
    (``torch.cuda.set_per_process_memory_fraction``: an allocation past it raises as a full
    card would); the line a result keeps."""
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, cap_gib * 2 ** 30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    return (f"device memory capped to {cap_gib:g} GiB of {total / 2 ** 30:.1f} GiB "
            f"(torch.cuda.set_per_process_memory_fraction({fraction:.4f}))")


def memory_room(cap_bytes: int | None) -> int:
    """Bytes a rung may still allocate on the CUDA device: its free memory plus what this
    process's allocator holds unused, and no more than the cap leaves."""
    free, _ = torch.cuda.mem_get_info()
    allocated = torch.cuda.memory_allocated()
    room = free + torch.cuda.memory_reserved() - allocated
    return room if cap_bytes is None else min(room, cap_bytes - allocated)
