"""XLA's settings for the ladder's compiles. Each must be made before JAX starts its backend
(the first ``jax.devices()``, array or jit call), because XLA reads ``XLA_FLAGS`` once.

* ``cublas_gemms()``, the full configuration's on a GPU. XLA's GPU compiler autotunes every
  matmul among cuBLAS's algorithms *and* Triton GEMM tilings, each Triton candidate compiled
  before it is timed. ``--xla_gpu_enable_triton_gemm=false`` keeps the autotuning among
  cuBLAS's algorithms and drops the Triton candidates. On the reference H200 that halved every
  compile (the un-jitted R0's first call too) and no rung ran slower
  (``benchmarks/xla_triton_gemm.py``; ``benchmarks/results/h200-xla-gemm-2026-12-03``).
* ``fast_cpu_compiles()``, the smoke configuration's on a CPU: LLVM's optimisations off and an
  on-disk cache of compiled programs. Never for real measurements.
* ``xla_flags()``: the flags in effect, which every results file records (``versions``).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax

CUBLAS_GEMMS_FLAG = "--xla_gpu_enable_triton_gemm=false"
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
SMOKE_CACHE_DIR = Path(tempfile.gettempdir()) / "perfladder-jax-smoke-cache"


def backend_started() -> bool:
    """Has JAX started its backend (so that ``XLA_FLAGS`` can no longer change)? True when
    it cannot tell: a flag is then never claimed to have taken effect."""
    try:   # no public way to ask
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


def xla_flags() -> str:
    """``XLA_FLAGS`` as this process has it."""
    return os.environ.get("XLA_FLAGS", "").strip()


def add_xla_flag(flag: str) -> bool:
    """Append ``flag`` (``--name=value``) to ``XLA_FLAGS`` unless the variable names it already
    (a user's own setting wins) or JAX's backend has started: then this process's XLA would not
    read it, and the processes it starts (R5's) must compile as it does. Whether it was added."""
    if backend_started():
        return False
    if flag.split("=")[0] not in xla_flags():
        os.environ["XLA_FLAGS"] = f"{xla_flags()} {flag}".strip()
    return True


def cublas_gemms() -> bool:
    """XLA's matmuls from cuBLAS's autotuned algorithms, without Triton GEMM candidates (see the
    module docstring). Returns whether it took effect (not once JAX's backend is up)."""
    return add_xla_flag(CUBLAS_GEMMS_FLAG)


def fast_cpu_compiles(cache_dir=SMOKE_CACHE_DIR) -> bool:
    """Make a *smoke* run cheap to compile; call it before JAX touches a device.

    On two CPU cores a smoke ladder spends most of its time in XLA's LLVM back end. This
    turns LLVM optimisation off (``FAST_COMPILE_FLAG``: about 3x faster compiles, slower
    generated code -- irrelevant for smoke numbers, which are not performance results). It
    must not be used for real measurements. ``cache_dir`` (None: off) also keeps compiled
    programs on disk -- JAX's persistent compilation cache -- so the tests, the notebook, a
    book build and the processes they start share one set of compilations; a program loaded
    from it still counts as a compilation for the recompile guard, and first-call times then
    measure a cache load, not a compile.

    Returns whether the flag took effect (it cannot once JAX's backend is initialised).
    """
    took = add_xla_flag(FAST_COMPILE_FLAG)
    if cache_dir is not None:
        cache = {"jax_compilation_cache_dir": str(cache_dir),
                 "jax_persistent_cache_min_compile_time_secs": 0.0,
                 "jax_persistent_cache_min_entry_size_bytes": 0}
        for name, value in cache.items():
            jax.config.update(name, value)
            os.environ[name.upper()] = str(value)   # processes started from here share it, as XLA_FLAGS
    return took
