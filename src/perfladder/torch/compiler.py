"""Inductor's settings for the ladder's compiles (the counterpart of ``perfladder.jax.compiler``).

* ``fast_cpu_compiles()``, the smoke configuration's on a CPU: inductor writes scalar C++
  kernels instead of vectorised ones. On a CPU inductor compiles each of a step's C++
  kernels with the system compiler, and the vectorised ones instantiate ATen's SIMD
  templates: at the smoke config one compiled training step took 37-39 s to compile
  vectorised and 21-22 s scalar on this project's 2-core CI machine (torch 2.13, an empty
  inductor cache each time), with 20 kernels instead of 26. The kernels compute the same
  model (the gates check every rung either way); they run slower, which does not matter for
  smoke numbers, which are not performance results. Never for real measurements.
"""
from __future__ import annotations

import os

VEC_ISA_ENV = "TORCHINDUCTOR_VEC_ISA_OK"


def fast_cpu_compiles() -> bool:
    """Scalar C++ kernels for inductor on a CPU, in this process and the processes it starts
    (the compile-ahead helpers, a data-parallel launch's ranks), unless
    ``$TORCHINDUCTOR_VEC_ISA_OK`` says otherwise: a user's own setting wins. Returns whether
    the kernels are scalar now."""
    value = os.environ.get(VEC_ISA_ENV, "")
    if value == "":
        os.environ[VEC_ISA_ENV] = "0"
    elif value != "0":
        return False
    import torch._inductor.config as inductor_config
    inductor_config.cpp.vec_isa_ok = False
    return True
