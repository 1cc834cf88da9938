"""Each JAX rung's own equivalence checks, at probe weights and in the rung's precision: R1's
jit parity, R4's remat mirror and what its remat saves for the backward (``checkpoint_saves``), B4's attention-kernel parity (``max |a - b| / max |b|`` of the
logits, tolerances ``perfladder.measure.gates.PARITY_TOL`` / ``MIRROR_TOL``), and the fp32
masters after a mixed-precision step. The model and optimizer gates: ``perfladder.jax.gates``.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
from flax import nnx

from perfladder.jax.gate_programs import gate_jit
from perfladder.jax.gates import clone, set_probe_weights
from perfladder.jax.program import param_dtypes
from perfladder.measure.checkpointing import checkpoint_gate
from perfladder.measure.evidence import Gate
from perfladder.measure.gates import MIRROR_TOL, PARITY_TOL

__all__ = ["PARITY_TOL", "MIRROR_TOL", "assert_fp32_masters", "probed", "check_jit_parity",
           "with_checkpointing", "check_mirror", "saved_residual_bytes", "checkpoint_saves",
           "check_attention_parity"]


def assert_fp32_masters(model, optimizer) -> None:
    """Parameters and AdamW moments must still be fp32 after a mixed-precision step."""
    params = nnx.state(model, nnx.Param)
    opt_state = nnx.state(optimizer, nnx.OptState) if hasattr(nnx, "OptState") else nnx.state(optimizer)
    for name, tree in (("parameters", params), ("optimizer state", opt_state)):
        dts = param_dtypes(tree)
        if dts != {"float32"}:
            raise AssertionError(f"fp32 masters broken: {name} hold dtypes {sorted(dts)}")


# -- correctness gates --------------------------------------------------------------------------
def _tol(dtype, table) -> float:
    return table.get(str(jnp.dtype(dtype)), table["bfloat16"])


def _compare(got, want, tol, what) -> float:
    """Relative disagreement ``max|got - want| / max|want|``; raises above ``tol``."""
    g, w = jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)
    if g.shape != w.shape:
        raise AssertionError(f"{what}: logits shapes differ, {g.shape} vs {w.shape}")
    rel = float(jnp.max(jnp.abs(g - w)) / jnp.maximum(jnp.max(jnp.abs(w)), 1e-30))
    if not rel <= tol:
        raise AssertionError(f"{what}: logits differ, max|diff| / max|logits| = {rel:.3g} "
                             f"> allowed {tol:g}")
    return rel


def probed(*models):
    """Clones of ``models`` at their probe weights (``set_probe_weights``): a parity check at
    the initial weights, where attention is a near-uniform average, would pass a wrong
    attention scale. The originals (the models a rung times) are not touched."""
    out = tuple(clone(m) for m in models)
    for m in out:
        set_probe_weights(m)
    return out


def check_jit_parity(model, X, *, reference=None, tol: float | None = None) -> float:
    """R1's gate: compiled logits (a gate program) of ``model`` == op-by-op logits of ``reference``,
    at probe weights (``probed``).

    ``reference`` defaults to ``model`` itself (a test passes a different, planted one).
    Returns ``max|diff| / max|logits|``; raises ``AssertionError`` above ``tol``
    (default by compute dtype, ``perfladder.measure.gates.PARITY_TOL``).
    """
    reference = model if reference is None else reference
    model, reference = probed(model, reference)
    compiled = _forward_jit(model, X)
    eager = reference(X)
    return _compare(compiled, eager, _tol(model.dtype, PARITY_TOL) if tol is None else tol,
                    "jit parity gate")


def with_checkpointing(model):
    """A mirror of ``model`` sharing its parameter values, with every block under remat."""
    graphdef, state = nnx.split(model)
    mirror = nnx.merge(graphdef, state)
    mirror.use_checkpoint(True)
    return mirror


# the checks' compiled forwards are gate programs (no GEMM autotuning: they need the
# arithmetic, not the fastest kernels), so a rung can compile them beside its step
_forward_jit = gate_jit(lambda m, X: m(X))
_pair_jit = gate_jit(lambda pair, X: (pair[0](X), pair[1](X)))


def _two_forwards_jit(a, b, X):
    """``(a(X), b(X))`` in one compiled program."""
    return _pair_jit((a, b), X)


def jit_parity_program(model, X) -> Callable[[], None]:
    """A job that compiles, without running, what ``check_jit_parity(model, X)`` compiles."""
    return lambda: _forward_jit.lower(model, X).compile()


def two_forwards_program(a, b, X) -> Callable[[], None]:
    """A job that compiles, without running, the program of ``check_mirror(b, a, X)`` or
    ``check_attention_parity(a, b, X)`` (the candidate first)."""
    return lambda: _pair_jit.lower((a, b), X).compile()


def check_mirror(reference, mirror, X, *, tol: float | None = None) -> float:
    """R4's gate: the checkpointed model must compute the reference's logits, at probe weights.

    Both forwards run in one compiled gate program (one compilation) in the rung's compute
    dtype; remat must not change what the forward computes. Returns ``max|diff| /
    max|logits|``; raises above ``tol`` (``perfladder.measure.gates.MIRROR_TOL``).
    """
    got, want = _two_forwards_jit(*probed(mirror, reference), X)
    return _compare(got, want, _tol(reference.dtype, MIRROR_TOL) if tol is None else tol,
                    "checkpoint mirror")


def saved_residual_bytes(model, X) -> int:
    """Bytes one forward of ``model`` on ``X`` leaves saved for the backward: the residuals of
    ``jax.vjp`` with respect to the parameters, the parameters themselves left out (every
    form of the model keeps them). Traced on shapes only (``jax.eval_shape``): nothing runs,
    and the model's arrays may already be donated. Under ``nnx.remat`` a block's residuals
    are its inputs; a block called directly keeps every intermediate."""
    import jax
    import numpy as np
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    shape = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype) if hasattr(a, "shape") else a  # noqa: E731
    params, rest, X = jax.tree.map(shape, (params, rest, X))

    def residuals(p):
        _, vjp = jax.vjp(lambda p: nnx.merge(graphdef, p, rest)(X), p)     # (B, T, V) logits
        own = {id(q) for q in jax.tree.leaves(p)}
        return [r for r in jax.tree.leaves(vjp) if id(r) not in own]
    return sum(int(np.prod(r.shape)) * r.dtype.itemsize for r in jax.eval_shape(residuals, params))


def checkpoint_saves(reference, candidate, X) -> Gate:
    """R4's checkpoint gate (``perfladder.measure.checkpointing``): the residuals the rung's
    model (``candidate``) saves for the backward against ``reference``'s, the same recipe
    without remat. ``CheckpointGateError`` unless at most ``CHECKPOINT_SAVED_RATIO`` of them."""
    return checkpoint_gate(saved_residual_bytes(candidate, X), saved_residual_bytes(reference, X),
                           reference="the same recipe without remat, the residuals of one "
                                     f"forward of {tuple(X.shape)}")


def check_attention_parity(candidate, reference, X, *, tol: float | None = None) -> float:
    """B4's gate: the candidate's attention kernel (cuDNN) gives the reference's (XLA's)
    logits, both models from the same init, at probe weights, in one compiled gate program in
    the rung's compute dtype. Returns ``max|diff| / max|logits|``; raises above ``tol``."""
    got, want = _two_forwards_jit(*probed(candidate, reference), X)
    return _compare(got, want, _tol(candidate.dtype, PARITY_TOL) if tol is None else tol,
                    "attention kernel parity")


def distinct_devices(X) -> list[str]:
    """Every device was fed other rows: the shards of the global batch ``X`` by content --
    this process's, and with several processes every process's (gathered) -- must all differ
    (``perfladder.measure.counts.check_distinct``; devices fed copies of one batch would count
    k x the tokens of one). Returns the digests, device by device; ``CountError`` otherwise."""
    import hashlib

    import jax
    import numpy as np

    from perfladder.measure.counts import check_distinct
    shards = sorted(X.addressable_shards, key=lambda s: s.device.id)
    mine = np.stack([np.frombuffer(hashlib.sha1(np.asarray(s.data).tobytes()).digest(), np.uint8)
                     for s in shards])                                         # (local, 20)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        mine = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.shape[-1])
    return check_distinct([row.tobytes().hex() for row in mine], what="devices")
