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

import os
import statistics
import time
from functools import partial

import jax
import jax.numpy as jnp

from perfladder.checks import check_int
from perfladder.hardware import nvidia_smi
from perfladder.jax.compiler import backend_started, xla_flags
from perfladder.kernels.ceiling import PROBE_CHAIN, PROBE_N
from perfladder.ladder.fit import memory_cap_gib
from perfladder.results.record import python_versions

COPY_MIB = 1024
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


def probe_roofs(n: int = PROBE_N, copy_mib: int = COPY_MIB, inner: int = PROBE_CHAIN,
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


def capability() -> tuple[int, int] | None:
    """The GPU's compute capability, e.g. ``(9, 0)``; ``None`` on a CPU."""
    d = jax.devices()[0]
    cc = getattr(d, "compute_capability", None) if d.platform == "gpu" else None
    if not cc:
        return None
    major, _, minor = str(cc).partition(".")
    return int(major), int(minor or 0)


def memory_room(cap_bytes: int | None) -> int | None:
    """Bytes a rung may still allocate: what JAX's allocator may still hand out (its limit, less
    what is in use), and no more than the cap leaves; without a GPU, the cap (an emulated card)
    or ``None`` (no limit known)."""
    d = jax.devices()[0]
    stats = d.memory_stats() if d.platform == "gpu" else None
    if not stats:
        return cap_bytes
    in_use = int(stats.get("bytes_in_use", 0))
    limit = stats.get("bytes_limit")
    room = None if limit is None else int(limit) - in_use
    if cap_bytes is not None:
        room = cap_bytes - in_use if room is None else min(room, cap_bytes - in_use)
    return room


PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
# the name every jaxlib reads (newer ones also read XLA_CLIENT_MEM_FRACTION, and refuse both)
FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
FRACTIONS = ("XLA_CLIENT_MEM_FRACTION", FRACTION)
_SET_HERE: set[str] = set()      # the variables this process set (the others: the user's)


def memory_settings(environ=None) -> list[str]:
    """JAX's use of the device memory, set before its backend starts (XLA reads these once),
    each only where the user has not set it:

    * no preallocation (``XLA_PYTHON_CLIENT_PREALLOCATE=false``): JAX takes memory as the
      steps need it, instead of 75% of the card at its first operation, so whatever runs beside
      it (the PyTorch ladder of a book build, another notebook) keeps the rest;
    * with a memory cap (``PERFLADDER_MEMORY_CAP_GIB``), the allocator's limit:
      ``XLA_PYTHON_CLIENT_MEM_FRACTION`` = the cap over the card's memory, read from
      ``nvidia-smi`` (JAX cannot be asked before it starts), and that much taken at once
      (``PREALLOCATE=true``): one pool, as a card of that size is. Grown region by region up
      to a cap, the pool fragments: on an H100 capped at 24 GiB, B7's 15.7 GiB of temporaries
      at batch 1024 found no piece that large with most of the cap free.

    Returns the lines a result keeps: what is in effect, and a cap that could not be set."""
    env = os.environ if environ is None else environ
    started = backend_started()
    lines = []
    cap = memory_cap_gib(env)
    if PREALLOCATE not in env and not started:
        env[PREALLOCATE] = "false"
        _SET_HERE.add(PREALLOCATE)
    theirs = PREALLOCATE in env and PREALLOCATE not in _SET_HERE
    lines.append(f"{PREALLOCATE}={env.get(PREALLOCATE, '(unset: JAX preallocates 75% of the card)')}"
                 + (" (set before perfladder.jax)" if theirs else ""))
    user = [v for v in FRACTIONS if v in env]
    if user and set(user) <= _SET_HERE:
        lines.append(f"device memory capped by {', '.join(f'{v}={env[v]}' for v in user)} "
                     f"(from the {cap:g} GiB cap)" if cap is not None else
                     f"{', '.join(f'{v}={env[v]}' for v in user)}")
    elif cap is not None and not user:
        total = gpu_total_bytes(env)
        if started:
            lines.append(f"memory cap {cap:g} GiB not set in JAX's allocator: its backend had "
                         "started; the fit check before each rung still holds rungs to it")
        elif total is None:
            lines.append(f"memory cap {cap:g} GiB not set in JAX's allocator: nvidia-smi did not "
                         f"say the card's memory (set {FRACTION} yourself); the fit check before "
                         "each rung still holds rungs to it")
        else:
            env[FRACTION] = f"{min(1.0, cap * 2 ** 30 / total):.4f}"
            _SET_HERE.add(FRACTION)
            if PREALLOCATE in _SET_HERE:       # the capped amount as one pool (above)
                env[PREALLOCATE] = "true"
                lines[0] = f"{PREALLOCATE}=true (the cap, taken as one pool)"
            lines.append(f"device memory capped to {cap:g} GiB of {total / 2 ** 30:.1f} GiB "
                         f"({FRACTION}={env[FRACTION]})")
    elif user:
        lines.append(", ".join(f"{v}={env[v]}" for v in user) + " (set before perfladder.jax)")
    return lines


def gpu_total_bytes(environ=None) -> int | None:
    """The memory of the first visible GPU, from ``nvidia-smi`` (no CUDA call in this process);
    ``None`` when it cannot say."""
    env = os.environ if environ is None else environ
    first = str(env.get("CUDA_VISIBLE_DEVICES", "0")).split(",")[0].strip() or "0"
    out = nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", first, timeout=20)
    try:
        return None if out is None else int(float(out.split()[0]) * 2 ** 20)
    except (ValueError, IndexError):
        return None


# Made when perfladder.jax is imported (its package imports this module before any of its
# modules can start JAX's backend); JaxLab reads them again and keeps the lines. A bad
# $PERFLADDER_MEMORY_CAP_GIB is JaxLab's error to raise, in one line, not an import's.
try:
    memory_settings()
except ValueError:
    pass
