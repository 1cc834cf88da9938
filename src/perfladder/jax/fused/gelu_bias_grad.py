"""FC1's bias and GELU, whose backward is one Pallas kernel: GELU's derivative and the bias
gradient's partial sums in one pass over the hidden activation.

``gelu_bias(u, bias) -> gelu_tanh(u + bias)`` under ``jax.custom_vjp``, where ``u = x @ W1`` is
FC1's matmul without its bias:

* forward: the plain ops (``u + bias``, ``jax.nn.gelu(approximate=True)``), so XLA fuses them as
  it would the reference's, into the matmul's cuBLASLt epilogue where that is on
  (``perfladder.jax.compile_options.CUBLASLT``); the pre-activation ``h = u + bias`` is kept
  for the backward, as the reference's autodiff keeps it;
* backward kernel, one pass: reads ``h`` and ``dg`` (the cotangent of the GELU's output),
  writes ``dh = dg * gelu'(h)`` (FC1's output gradient, which the matmul's own gradients then
  read) and per-program partial sums of ``dh`` over its rows, summed afterwards into the bias
  gradient. The reference writes ``dh`` and reads it back to sum it.

The derivative is computed in fp32 and ``dh`` rounded to ``h``'s dtype; the bias gradient is
returned in ``bias``'s dtype (the model casts the fp32 bias to the compute dtype first, as
flax's ``Linear`` does, so the cast's own backward rounds it as the reference's does).

``ffn(module, x)``: ``perfladder.jax.model.FFN``'s forward through ``gelu_bias``, the same
parameters read the way flax's ``Linear`` reads them. On a GPU the kernel is compiled by
Pallas's Triton backend; elsewhere (``interpret=None`` on a CPU) it runs in Pallas's
interpreter, which is what the tests use.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from perfladder.jax.fused import matmul_and_bias

# rows per iteration x columns per program: an 8 x 256 tile over 4 warps compiles for sm_90 to
# 72 registers a thread (8 x 1024: 250), so several programs share an SM to hide the loads
ROWS = 8                # rows per iteration of a backward program
COLS = 256              # at most this many hidden columns per program (a power of two)
PROGRAMS = 256          # at most this many row chunks
NUM_WARPS = 4
_C = math.sqrt(2.0 / math.pi)
_A = 0.044715


def _interpret(interpret):
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def _largest_power_of_two_dividing(n: int, at_most: int) -> int:
    r = 1
    while r * 2 <= at_most and n % (r * 2) == 0:
        r *= 2
    return r


def _check(u, bias):
    F = u.shape[-1]
    if bias.shape != (F,):
        raise ValueError(f"bias must be ({F},) for a pre-activation of width {F}, got {bias.shape}")
    if _largest_power_of_two_dividing(F, 16) < 16:
        raise ValueError(f"the fused GELU backward needs a width divisible by 16 (Triton blocks); got {F}")


def gelu_grad(h):
    """``d gelu_tanh(h) / dh`` in fp32."""
    h = h.astype(jnp.float32)
    t = jnp.tanh(_C * (h + _A * h * h * h))
    return 0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * h * h)


def _bwd_kernel(h_ref, dg_ref, dh_ref, db_ref, *, rows: int, chunk: int):
    cols = h_ref.shape[-1]

    def body(j, db):
        r = pl.ds(j * rows, rows)
        dh = dg_ref[r, :].astype(jnp.float32) * gelu_grad(h_ref[r, :])       # (rows, cols)
        dh_ref[r, :] = dh.astype(dh_ref.dtype)
        return db + jnp.sum(dh, axis=0)

    db = jax.lax.fori_loop(0, chunk // rows, body, jnp.zeros((cols,), jnp.float32))
    db_ref[...] = db[None, :]


def _backward(h2, dg2, interpret):
    """``(dh, bias gradient in fp32)`` of ``(n, F)`` pre-activations and output cotangents."""
    n, F = h2.shape
    R = _largest_power_of_two_dividing(n, ROWS)
    progs = _largest_power_of_two_dividing(n // R, PROGRAMS)    # equal contiguous row chunks
    chunk, cols = n // progs, _largest_power_of_two_dividing(F, COLS)
    block = pl.BlockSpec((chunk, cols), lambda i, j: (i, j))
    part = pl.BlockSpec((1, cols), lambda i, j: (i, j))
    dh, db_part = pl.pallas_call(
        functools.partial(_bwd_kernel, rows=R, chunk=chunk),
        out_shape=[jax.ShapeDtypeStruct((n, F), h2.dtype),
                   jax.ShapeDtypeStruct((progs, F), jnp.float32)],
        grid=(progs, F // cols), in_specs=[block, block], out_specs=[block, part],
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS), interpret=interpret,
        name="gelu_bias_grad_bwd")(h2, dg2)
    return dh, db_part.sum(0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gelu_bias(u, bias, interpret):
    return _gelu_bias_fwd(u, bias, interpret)[0]


def _gelu_bias_fwd(u, bias, interpret):
    h = u + bias.astype(u.dtype)
    return jax.nn.gelu(h, approximate=True), (h, jnp.zeros((), bias.dtype))


def _gelu_bias_bwd(interpret, res, dg):
    h, bias_like = res
    F = h.shape[-1]
    dh, db = _backward(h.reshape(-1, F), dg.reshape(-1, F).astype(h.dtype), interpret)
    return dh.reshape(h.shape), db.astype(bias_like.dtype)


_gelu_bias.defvjp(_gelu_bias_fwd, _gelu_bias_bwd)


def gelu_bias(u: jax.Array, bias: jax.Array, interpret: bool | None = None) -> jax.Array:
    """``gelu_tanh(u + bias)`` over the last axis, whose backward is one Pallas kernel (see the
    module docstring). ``interpret=None``: Pallas's interpreter unless the backend is a GPU."""
    _check(u, bias)
    return _gelu_bias(u, bias, _interpret(interpret))


def ffn(module, x: jax.Array) -> jax.Array:
    """``module.dense2(gelu_tanh(module.dense1(x)))`` with FC1's bias and GELU through
    ``gelu_bias``: FC1's kernel and bias cast to its compute dtype, as flax's ``Linear`` does."""
    u, bias = matmul_and_bias(module.dense1, x)                         # (..., F), (F,)
    return module.dense2(gelu_bias(u, bias))
