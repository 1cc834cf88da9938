"""Residual add fused with the LayerNorm after it, in Pallas, forward and one-pass backward.

``add_layer_norm(x, branch, scale, bias, eps) -> (h, y)``: ``h = x + branch`` (rounded to the
stream's dtype, as the reference's add is) and ``y = LayerNorm(h)`` in ``scale``'s dtype,
under ``jax.custom_vjp``:

* forward kernel: reads the stream and the branch once, writes ``h`` and ``y`` and the fp32
  row mean and 1/std (kept for the backward pass);
* backward kernel, one pass: reads ``h``, ``dy`` and ``dh``, writes ``dx = dh + LN'(dy)``
  (which is also the branch's gradient: same value, same dtype in this model, so one array
  serves both) and per-program partial sums of ``dy * xhat`` and ``dy``, summed afterwards
  into the scale and bias gradients.
* ``layer_norm(x, scale, bias, eps)``: the same kernels without the add.

The math mirrors ``flax.nnx.LayerNorm`` with ``dtype`` = the compute dtype (what the model
uses): statistics in fp32 with flax's default fast variance ``max(0, E[x^2] - E[x]^2)``,
``y = (x - mean) * (rsqrt(var + eps) * scale) + bias`` in fp32, cast to the compute dtype.
flax casts ``scale`` and ``bias`` to the compute dtype first; the caller does the same
(``GPT`` passes ``norm.scale[...].astype(dtype)``), and the kernels return their gradients
in that dtype, so the cast's own backward rounds them exactly as the reference's does.

On a GPU the kernels are compiled by Pallas's Triton backend; elsewhere (``interpret=None``
on a CPU) they run in Pallas's interpreter, which is what the tests use.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

FWD_ROWS = 8            # rows per forward program
BWD_ROWS = 8            # rows per backward iteration
BWD_PROGRAMS = 1024     # at most this many backward programs, each over a contiguous row chunk


def _interpret(interpret):
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def _rows_per_block(n: int, want: int) -> int:
    r = want
    while n % r:
        r //= 2
    return r


def _check(x, branch, scale, bias):
    D = x.shape[-1]
    if D & (D - 1):
        raise ValueError(f"the fused LayerNorm needs a power-of-two width (Triton blocks); got {D}")
    if branch is not None and branch.shape != x.shape:
        raise ValueError(f"branch shape {branch.shape} != stream shape {x.shape}")
    if scale.shape != (D,) or bias.shape != (D,):
        raise ValueError(f"scale and bias must be ({D},), got {scale.shape}, {bias.shape}")


# -- kernels ------------------------------------------------------------------------------------
def _fwd_kernel(*refs, eps: float, has_branch: bool):
    if has_branch:
        x_ref, br_ref, w_ref, b_ref, h_ref, y_ref, mean_ref, rstd_ref = refs
        h = (x_ref[...].astype(jnp.float32) + br_ref[...].astype(jnp.float32)).astype(h_ref.dtype)
        h_ref[...] = h
        x = h.astype(jnp.float32)                    # normalise the stream as stored
    else:
        x_ref, w_ref, b_ref, y_ref, mean_ref, rstd_ref = refs
        x = x_ref[...].astype(jnp.float32)           # (R, D)
    D = x.shape[-1]
    mean = jnp.sum(x, axis=1) / D                    # (R,)
    var = jnp.maximum(0.0, jnp.sum(x * x, axis=1) / D - mean * mean)
    rstd = jax.lax.rsqrt(var + eps)
    mul = rstd[:, None] * w_ref[...].astype(jnp.float32)[None, :]
    y = (x - mean[:, None]) * mul + b_ref[...].astype(jnp.float32)[None, :]
    y_ref[...] = y.astype(y_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _bwd_kernel(*refs, rows: int, chunk: int, has_res: bool):
    if has_res:
        h_ref, dy_ref, dres_ref, w_ref, mean_ref, rstd_ref, dx_ref, dw_ref, db_ref = refs
    else:
        h_ref, dy_ref, w_ref, mean_ref, rstd_ref, dx_ref, dw_ref, db_ref = refs
    D = h_ref.shape[-1]
    w = w_ref[...].astype(jnp.float32)

    def body(j, acc):
        dw, db = acc
        r = pl.ds(j * rows, rows)
        x = h_ref[r, :].astype(jnp.float32)                                # (rows, D)
        dy = dy_ref[r, :].astype(jnp.float32)
        rstd = rstd_ref[r]
        xhat = (x - mean_ref[r][:, None]) * rstd[:, None]
        wdy = dy * w[None, :]
        c1 = jnp.sum(xhat * wdy, axis=1) / D
        c2 = jnp.sum(wdy, axis=1) / D
        dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if has_res:
            dx = dx + dres_ref[r, :].astype(jnp.float32)
        dx_ref[r, :] = dx.astype(dx_ref.dtype)
        return dw + jnp.sum(dy * xhat, axis=0), db + jnp.sum(dy, axis=0)

    zeros = jnp.zeros((D,), jnp.float32)
    dw, db = jax.lax.fori_loop(0, chunk // rows, body, (zeros, zeros))
    dw_ref[...] = dw[None, :]
    db_ref[...] = db[None, :]


# -- pallas calls -------------------------------------------------------------------------------
def _forward(x2, br2, w, b, eps, out_dtype, interpret):
    n, D = x2.shape
    R = _rows_per_block(n, FWD_ROWS)
    row_block = pl.BlockSpec((R, D), lambda i: (i, 0))
    vec = pl.BlockSpec((D,), lambda i: (0,))
    stat = pl.BlockSpec((R,), lambda i: (i,))
    has_branch = br2 is not None
    out_shape = ([jax.ShapeDtypeStruct((n, D), x2.dtype)] if has_branch else []) + [
        jax.ShapeDtypeStruct((n, D), out_dtype),
        jax.ShapeDtypeStruct((n,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32)]
    out_specs = ([row_block] if has_branch else []) + [row_block, stat, stat]
    ins = (x2, br2, w, b) if has_branch else (x2, w, b)
    in_specs = ([row_block, row_block] if has_branch else [row_block]) + [vec, vec]
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, eps=eps, has_branch=has_branch),
        out_shape=out_shape, grid=(n // R,), in_specs=in_specs, out_specs=out_specs,
        compiler_params=plgpu.CompilerParams(num_warps=4), interpret=interpret,
        name="add_layer_norm_fwd" if has_branch else "layer_norm_fwd")(*ins)
    return outs if has_branch else (x2, *outs)


def _backward(h2, dy2, dres2, w, mean, rstd, interpret):
    n, D = h2.shape
    R = _rows_per_block(n, BWD_ROWS)
    progs = 1                                   # a power of two dividing the row blocks:
    while progs * 2 <= BWD_PROGRAMS and (n // R) % (progs * 2) == 0:   # equal contiguous chunks
        progs *= 2
    chunk = n // progs
    row_chunk = pl.BlockSpec((chunk, D), lambda i: (i, 0))
    stat = pl.BlockSpec((chunk,), lambda i: (i,))
    vec = pl.BlockSpec((D,), lambda i: (0,))
    part = pl.BlockSpec((1, D), lambda i: (i, 0))
    has_res = dres2 is not None
    ins = (h2, dy2, dres2, w, mean, rstd) if has_res else (h2, dy2, w, mean, rstd)
    in_specs = [row_chunk, row_chunk] + ([row_chunk] if has_res else []) + [vec, stat, stat]
    dx, dw_part, db_part = pl.pallas_call(
        functools.partial(_bwd_kernel, rows=R, chunk=chunk, has_res=has_res),
        out_shape=[jax.ShapeDtypeStruct((n, D), h2.dtype),
                   jax.ShapeDtypeStruct((progs, D), jnp.float32),
                   jax.ShapeDtypeStruct((progs, D), jnp.float32)],
        grid=(progs,), in_specs=in_specs, out_specs=[row_chunk, part, part],
        compiler_params=plgpu.CompilerParams(num_warps=4), interpret=interpret,
        name="add_layer_norm_bwd" if has_res else "layer_norm_bwd")(*ins)
    return dx, dw_part.sum(0), db_part.sum(0)


# -- differentiable functions ------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _add_ln(x, branch, scale, bias, eps, interpret):
    return _add_ln_fwd(x, branch, scale, bias, eps, interpret)[0]


def _add_ln_fwd(x, branch, scale, bias, eps, interpret):
    D = x.shape[-1]
    h, y, mean, rstd = _forward(x.reshape(-1, D), branch.reshape(-1, D), scale, bias, eps,
                                scale.dtype, interpret)
    return (h.reshape(x.shape), y.reshape(x.shape)), (h, scale, mean, rstd, jnp.zeros((), branch.dtype))


def _add_ln_bwd(eps, interpret, res, cot):
    h, scale, mean, rstd, branch_like = res
    dh, dy = cot
    shape = dh.shape
    dx, dw, db = _backward(h, dy.reshape(h.shape), dh.reshape(h.shape), scale, mean, rstd, interpret)
    dx = dx.reshape(shape)
    dbranch = dx if branch_like.dtype == dx.dtype else dx.astype(branch_like.dtype)
    return dx, dbranch, dw.astype(scale.dtype), db.astype(scale.dtype)


_add_ln.defvjp(_add_ln_fwd, _add_ln_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ln(x, scale, bias, eps, interpret):
    return _ln_fwd(x, scale, bias, eps, interpret)[0]


def _ln_fwd(x, scale, bias, eps, interpret):
    D = x.shape[-1]
    x2, y, mean, rstd = _forward(x.reshape(-1, D), None, scale, bias, eps, scale.dtype, interpret)
    return y.reshape(x.shape), (x2, scale, mean, rstd)


def _ln_bwd(eps, interpret, res, dy):
    x2, scale, mean, rstd = res
    dx, dw, db = _backward(x2, dy.reshape(x2.shape), None, scale, mean, rstd, interpret)
    return dx.reshape(dy.shape), dw.astype(scale.dtype), db.astype(scale.dtype)


_ln.defvjp(_ln_fwd, _ln_bwd)


def add_layer_norm(x: jax.Array, branch: jax.Array, scale: jax.Array, bias: jax.Array,
                   eps: float = 1e-5, interpret: bool | None = None) -> tuple[jax.Array, jax.Array]:
    """``(x + branch, LayerNorm(x + branch))`` over the last axis; ``y`` in ``scale``'s dtype.
    ``interpret=None``: Pallas's interpreter unless the default backend is a GPU."""
    _check(x, branch, scale, bias)
    return _add_ln(x, branch, scale, bias, float(eps), _interpret(interpret))


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-5,
               interpret: bool | None = None) -> jax.Array:
    """``LayerNorm(x)`` over the last axis, in ``scale``'s dtype (see ``add_layer_norm``)."""
    _check(x, None, scale, bias)
    return _ln(x, scale, bias, float(eps), _interpret(interpret))
