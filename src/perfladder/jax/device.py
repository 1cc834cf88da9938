"""What a run runs on: the device's name, the versions, and this run's own ceilings.

``device_name()``, ``has_gpu()``, ``versions()``; ``probe_roofs()``: the ceilings, measured on
the device in a few seconds.

A large bf16 matmul gives the compute roof (TFLOP/s), the same in fp32 at JAX's default
precision (TF32 on a GPU that has it), and an elementwise pass over a large fp32 array the
memory roof (GB/s, bytes read + written). Each is a jitted loop of ``inner`` dependent ops,
timed from a synced start to a synced end (``block_until_ready``), so the sync costs one
round trip per ``inner`` ops; the median of ``reps`` repeats after a warm-up is reported.
Random data, not zeros: zeros run faster on tensor cores.
"""
from __future__ import annotations

import statistics
import time
from functools import partial

import jax
import jax.numpy as jnp

from perfladder.checks import check_int
from perfladder.jax.compiler import xla_flags
from perfladder.results.record import python_versions

MATMUL_N = 8192
COPY_MIB = 1024
INNER = 10
REPS = 5


@partial(jax.jit, static_argnames=("inner",))
def _matmuls(x, y, *, inner):
    # y is scaled by 1/sqrt(n), so x @ y keeps x's magnitude: no overflow over the loop
    return jax.lax.fori_loop(0, inner, lambda _, a: a @ y, x)


@partial(jax.jit, static_argnames=("inner",))
def _passes(x, *, inner):
    return jax.lax.fori_loop(0, inner, lambda _, a: a * jnp.float32(1.0000001), x)


def _median_s(fn, reps: int) -> float:
    jax.block_until_ready(fn())                       # compile and warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_tflops(dtype, n: int, inner: int, reps: int) -> float:
    kx, ky = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (n, n), jnp.float32).astype(dtype)
    y = (jax.random.normal(ky, (n, n), jnp.float32) / jnp.sqrt(jnp.float32(n))).astype(dtype)
    return 2 * n ** 3 * inner / _median_s(lambda: _matmuls(x, y, inner=inner), reps) / 1e12


def copy_gbps(mib: int, inner: int, reps: int) -> float:
    elems = mib * 2 ** 20 // 4
    a = jax.random.normal(jax.random.key(1), (elems,), jnp.float32)
    return 2 * 4 * elems * inner / _median_s(lambda: _passes(a, inner=inner), reps) / 1e9


def probe_roofs(n: int = MATMUL_N, copy_mib: int = COPY_MIB, inner: int = INNER,
                reps: int = REPS) -> dict:
    """``{"matmul_bf16_tflops", "matmul_tf32_tflops", "copy_gbps", "source", "method"}``."""
    for name, v in (("n", n), ("copy_mib", copy_mib), ("inner", inner), ("reps", reps)):
        check_int(name, v)
    device = jax.devices()[0]
    return {"matmul_bf16_tflops": matmul_tflops(jnp.bfloat16, n, inner, reps),
            "matmul_tf32_tflops": matmul_tflops(jnp.float32, n, inner, reps),
            "copy_gbps": copy_gbps(copy_mib, inner, reps),
            "source": f"perfladder.jax.device on {device.device_kind} (this run)",
            "method": f"median of {reps} synced repeats after a warm-up, each a jitted loop of "
                      f"{inner}: {n}x{n} matmuls (2n^3 FLOPs, random data; fp32 at JAX's default "
                      f"precision) and elementwise passes over {copy_mib} MiB fp32 "
                      "(bytes read + written)"}


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def device_name() -> str:
    """``jax.devices()[0].device_kind`` on a GPU (e.g. 'NVIDIA H200'), ``'cpu'`` otherwise."""
    d = jax.devices()[0]
    return d.device_kind if d.platform == "gpu" else "cpu"


def versions() -> dict[str, str]:
    import flax
    import jaxlib
    import numpy
    import optax
    out = python_versions(jax=jax, jaxlib=jaxlib, flax=flax, optax=optax, numpy=numpy)
    out["backend"] = jax.default_backend()
    out["device_count"] = str(jax.device_count())
    out["XLA_FLAGS"] = xla_flags()       # compiler settings change both speed and compile time
    return out
