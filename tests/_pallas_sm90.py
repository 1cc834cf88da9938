"""Shared by the Pallas kernel tests: the Triton modules Pallas hands to XLA, caught as text, and
each compiled for Hopper by the triton package (its bundled ptxas; no GPU needed) with its
register use read back; and the logits and every gradient of a model, flattened by path."""
from __future__ import annotations

import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx


def catch_triton_modules(monkeypatch) -> list[str]:
    """A list that fills with the TTIR of every kernel Pallas lowers from here on (empty where
    this JAX has no such hook: the caller skips)."""
    modules: list[str] = []
    try:
        from jax._src.pallas.triton import pallas_call_registration as registration
        lower = registration.lowering.lower_jaxpr_to_triton_module
    except (ImportError, AttributeError):
        return modules

    def keep(*args, **kwargs):              # the Triton module Pallas hands to XLA, as text
        result = lower(*args, **kwargs)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result
    monkeypatch.setattr(registration.lowering, "lower_jaxpr_to_triton_module", keep)
    return modules


def cuobjdump():
    """The triton package's cuobjdump (skips the test without it)."""
    triton = pytest.importorskip("triton")
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip(f"no cuobjdump at {tool} to read the register use")
    return tool


def compile_for_sm90(text: str, path: Path, **options) -> tuple[dict, dict]:
    """``text`` (TTIR) compiled to an sm_90a cubin at ``path`` with ``options`` (num_warps, ...):
    (its ``asm`` by stage, cuobjdump's resource fields: REG, STACK, LOCAL, ...)."""
    import triton
    from triton.backends.compiler import GPUTarget
    tool = cuobjdump()
    src = path.with_suffix(".ttir")
    src.write_text(text)
    compiled = triton.compile(str(src), target=GPUTarget("cuda", 90, 32), options=options)
    cubin = path.with_suffix(".cubin")
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True,
                           text=True, timeout=60).stdout
    line = next(ln for ln in usage.splitlines() if "REG:" in ln)
    return compiled.asm, dict(f.split(":") for f in line.split() if ":" in f)


def logits_and_grads(model, X):
    """The model's logits on X and the gradients of its next-token loss, by parameter path."""
    def loss(m):
        logits = m(X)
        lp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(lp, X[..., None], axis=-1).mean(), logits
    (_, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return logits, {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(grads)}


def rel(a, b) -> float:
    """The relative difference of ``a`` from ``b`` (2-norms, in float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def assert_matches_reference(ref, model, X, dtype):
    """``model``'s logits and every gradient against ``ref``'s (the same parameters) at 'highest'
    matmul precision, in the same dtype: fp32 the same math in another order (1e-5), bf16
    rounding steps of bf16, the gate's metric (2e-2)."""
    with jax.default_matmul_precision("highest"):
        lr, gr = logits_and_grads(ref, X)
        lf, gf = logits_and_grads(model, X)
    assert lf.dtype == lr.dtype == dtype and gf.keys() == gr.keys()
    for n in ("logits", *gr):
        a, b = (lf, lr) if n == "logits" else (gf[n], gr[n])
        assert a.dtype == b.dtype, n
        assert rel(a, b) < (1e-5 if dtype == jnp.float32 else 2e-2), n
