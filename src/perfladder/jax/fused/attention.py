"""Causal attention with RoPE applied on load, in Pallas: the QKV projection in, ``d(qkv)`` out.

The algorithm of ``perfladder.torch.fused.attention`` (read its doc for the derivation), for
the JAX model: ``rope_attention(qkv, cos, sin, num_heads) -> y``, with ``qkv`` the (B, T, 3D)
projection and ``y`` (B, T, D) ready for ``W_o``, under ``jax.custom_vjp``:

* forward, one program per (batch, head): q and k rotated in fp32 and rounded to the input
  dtype on load, ``S = q k^T / sqrt(Dh)`` causal, online softmax over key blocks, ``y = P v``
  in fp32; keeps the base-2 row logsumexp (B, H, T).
* backward, one program per (batch, head): P recomputed from the logsumexp, ``delta =
  rowsum(dy * y)`` in the program, per key block dV, dS, dK (rotated back, stored) and dQ
  accumulated in registers over all key blocks (the program owns its rows: no atomics),
  rotated back and stored. ``d(qkv)`` is written by the kernel directly: XLA's split
  backward (a concatenation of dq, dk, dv) and the RoPE passes are gone.

Every head-wide tile is held as its two rotate-half halves (columns i and i + Dh/2), so a
rotation is elementwise and no value is ever sliced in the kernel (the Triton lowering slices
refs, not values): the arrays are viewed, for free, as (B, T, 3, H, 2, Dh/2) and (B, T, H, 2,
Dh/2), and one program's block of them is (T, 3, 2, Dh/2) -- its q, k and v, each in halves.

Why Pallas and not jax-triton calling the PyTorch module's Triton kernels: jax-triton needs a
CUDA device even to trace, so those kernels could not be tested from JAX on a CPU at all;
Pallas runs the same program in its interpreter on CPU (``interpret=True``, what the tests use)
and compiles it through its Triton backend on a GPU (``interpret=None`` picks), as
``fused.add_layer_norm`` does. One algorithm, two sources, each testable where it is written.

Constraints of the Triton lowering: every array the kernel loads or computes must have a
power-of-two size, so T must be a power of two (<= 128: a sequence per program); on a GPU
the dots need dimensions >= 16, so Dh >= 32 there.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MAX_T = 128
# (keys per inner step, warps), read at each trace; the benchmark may try others
FWD = dict(block_n=64, num_warps=8)
BWD = dict(block_n=64, num_warps=8)
LOG2E = 1.4426950408889634


def _interpret(interpret):
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def _check(qkv, cos, num_heads: int, interpret: bool) -> tuple[int, int, int, int]:
    if qkv.ndim != 3 or qkv.shape[-1] % 3:
        raise ValueError(f"qkv must be (B, T, 3D), got shape {qkv.shape}")
    B, T, D3 = qkv.shape
    D = D3 // 3
    if D % num_heads:
        raise ValueError(f"width {D} does not split into num_heads={num_heads} heads")
    Dh = D // num_heads
    if Dh < 4 or Dh & (Dh - 1):
        raise ValueError(f"fused attention needs a power-of-two head width >= 4; got {Dh}")
    if Dh < 32 and not interpret:
        raise ValueError(f"fused attention on a GPU needs head width >= 32 (Triton dots need "
                         f"K >= 16 for the rotate-half halves); got {Dh}")
    if T > MAX_T or T & (T - 1):
        raise ValueError(f"fused attention keeps a whole sequence in one program and Pallas's "
                         f"Triton lowering needs power-of-two blocks: T a power of two <= {MAX_T}; got T={T}")
    if cos.shape != (T, Dh) or cos.dtype != jnp.float32:
        raise ValueError(f"cos/sin must be fp32 tables of shape (T, Dh) = {(T, Dh)}, got "
                         f"{cos.shape} {cos.dtype}")
    return B, T, D, Dh


# -- kernels ------------------------------------------------------------------------------------
def _dot(a, b, trans_a=False, trans_b=False):
    """``a @ b`` (either transposed) with an fp32 result; fp32 inputs in true fp32 (a GPU would
    otherwise round them to TF32)."""
    exact = a.dtype == jnp.float32
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32,
                               precision=jax.lax.Precision.HIGHEST if exact else None)


def _rotated(ref, part: int, rows, c, s):
    """q (part 0) or k (part 1) at ``rows`` of a (T, 3, 2, HALF) block, rotated in fp32 and
    rounded to the input dtype: its two halves (len(rows), HALF)."""
    x1, x2 = ref[rows, part, 0, :], ref[rows, part, 1, :]
    a, b = x1.astype(jnp.float32), x2.astype(jnp.float32)
    return (a * c - b * s).astype(x1.dtype), (b * c + a * s).astype(x1.dtype)


def _causal(T: int, start: int, n: int):
    """(T, n) mask: key ``start + j`` is visible from query row ``i`` when it is not later."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (T, n), 0)
    keys = jax.lax.broadcasted_iota(jnp.int32, (T, n), 1) + start
    return keys <= rows


def _fwd_kernel(qkv_ref, cos_ref, sin_ref, y_ref, lse_ref, *, block_n: int, qk_scale: float):
    T = qkv_ref.shape[0]
    q1, q2 = _rotated(qkv_ref, 0, slice(None), cos_ref[...], sin_ref[...])   # (T, HALF) each
    m = jnp.full((T,), -jnp.inf, jnp.float32)                          # running max, base 2
    l = jnp.zeros((T,), jnp.float32)
    acc1 = acc2 = jnp.zeros(q1.shape, jnp.float32)                     # y's halves, (T, HALF)
    for j in range(T // block_n):                                      # unrolled: T // block_n <= 8
        ks = pl.ds(j * block_n, block_n)
        k1, k2 = _rotated(qkv_ref, 1, ks, cos_ref[ks, :], sin_ref[ks, :])    # (block_n, HALF)
        s = (_dot(q1, k1, trans_b=True) + _dot(q2, k2, trans_b=True)) * qk_scale  # (T, block_n)
        s = jnp.where(_causal(T, j * block_n, block_n), s, -jnp.inf)   # key 0: every max finite
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        l = l * alpha + jnp.sum(p, axis=1)
        pc = p.astype(q1.dtype)
        acc1 = acc1 * alpha[:, None] + _dot(pc, qkv_ref[ks, 2, 0, :])
        acc2 = acc2 * alpha[:, None] + _dot(pc, qkv_ref[ks, 2, 1, :])
        m = m_new
    y_ref[:, 0, :] = (acc1 / l[:, None]).astype(y_ref.dtype)
    y_ref[:, 1, :] = (acc2 / l[:, None]).astype(y_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def _bwd_kernel(qkv_ref, y_ref, dy_ref, lse_ref, cos_ref, sin_ref, dqkv_ref, *, block_n: int,
                qk_scale: float, sm_scale: float):
    T = qkv_ref.shape[0]
    cq, sq = cos_ref[...], sin_ref[...]
    q1, q2 = _rotated(qkv_ref, 0, slice(None), cq, sq)                 # (T, HALF) each
    dy1, dy2 = dy_ref[:, 0, :], dy_ref[:, 1, :]
    f32 = jnp.float32
    delta = jnp.sum(dy1.astype(f32) * y_ref[:, 0, :].astype(f32)
                    + dy2.astype(f32) * y_ref[:, 1, :].astype(f32), axis=1)   # (T,) rowsum(P dP)
    lse = lse_ref[...]
    dq1 = dq2 = jnp.zeros(q1.shape, f32)
    out = dqkv_ref.dtype
    for j in range(T // block_n):
        ks = pl.ds(j * block_n, block_n)
        ck, sk = cos_ref[ks, :], sin_ref[ks, :]
        k1, k2 = _rotated(qkv_ref, 1, ks, ck, sk)                      # (block_n, HALF) each
        v1, v2 = qkv_ref[ks, 2, 0, :], qkv_ref[ks, 2, 1, :]
        s = (_dot(q1, k1, trans_b=True) + _dot(q2, k2, trans_b=True)) * qk_scale  # (T, block_n)
        p = jnp.where(_causal(T, j * block_n, block_n), jnp.exp2(s - lse[:, None]), 0.0)
        pc = p.astype(q1.dtype)
        dv1, dv2 = _dot(pc, dy1, trans_a=True), _dot(pc, dy2, trans_a=True)   # (block_n, HALF)
        dp = _dot(dy1, v1, trans_b=True) + _dot(dy2, v2, trans_b=True)       # (T, block_n)
        ds = (p * (dp - delta[:, None])).astype(q1.dtype)             # d(scores) before the scale
        dk1 = _dot(ds, q1, trans_a=True) * sm_scale                    # (block_n, HALF)
        dk2 = _dot(ds, q2, trans_a=True) * sm_scale
        dq1 = dq1 + _dot(ds, k1)
        dq2 = dq2 + _dot(ds, k2)
        # RoPE's transpose: y1 = x1 c - x2 s, y2 = x2 c + x1 s => dx1 = g1 c + g2 s, dx2 = g2 c - g1 s
        dqkv_ref[ks, 1, 0, :] = (dk1 * ck + dk2 * sk).astype(out)
        dqkv_ref[ks, 1, 1, :] = (dk2 * ck - dk1 * sk).astype(out)
        dqkv_ref[ks, 2, 0, :] = dv1.astype(out)
        dqkv_ref[ks, 2, 1, :] = dv2.astype(out)
    dq1, dq2 = dq1 * sm_scale, dq2 * sm_scale
    dqkv_ref[:, 0, 0, :] = (dq1 * cq + dq2 * sq).astype(out)
    dqkv_ref[:, 0, 1, :] = (dq2 * cq - dq1 * sq).astype(out)


# -- pallas calls -------------------------------------------------------------------------------
def _specs(B: int, T: int, H: int, half: int):
    """BlockSpecs over the grid (B, H): one head's (T, 3, 2, HALF) block of the (B, T, 3, H, 2,
    HALF) view of qkv / d(qkv); its (T, 2, HALF) block of the (B, T, H, 2, HALF) view of y / dy;
    its (T,) row of the (B, H, T) logsumexp; the (T, HALF) tables."""
    heads = pl.BlockSpec((None, T, 3, None, 2, half), lambda b, h: (b, 0, 0, h, 0, 0))
    head = pl.BlockSpec((None, T, None, 2, half), lambda b, h: (b, 0, h, 0, 0))
    row = pl.BlockSpec((None, None, T), lambda b, h: (b, h, 0))
    table = pl.BlockSpec((T, half), lambda b, h: (0, 0))
    return heads, head, row, table


def _forward(qkv, cos, sin, H: int, interpret: bool):
    B, T, D3 = qkv.shape
    Dh = D3 // 3 // H
    half = Dh // 2
    heads, head, row, table = _specs(B, T, H, half)
    block_n = min(FWD["block_n"], T)
    y, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, block_n=block_n, qk_scale=LOG2E / math.sqrt(Dh)),
        out_shape=[jax.ShapeDtypeStruct((B, T, H, 2, half), qkv.dtype),
                   jax.ShapeDtypeStruct((B, H, T), jnp.float32)],
        grid=(B, H), in_specs=[heads, table, table], out_specs=[head, row],
        compiler_params=plgpu.CompilerParams(num_warps=FWD["num_warps"]), interpret=interpret,
        name="rope_attention_fwd",
    )(qkv.reshape(B, T, 3, H, 2, half), cos[:, :half], sin[:, :half])   # the tables' halves are equal
    return y.reshape(B, T, H * Dh), lse


def _backward(qkv, y, dy, lse, cos, sin, H: int, interpret: bool):
    B, T, D3 = qkv.shape
    Dh = D3 // 3 // H
    half = Dh // 2
    heads, head, row, table = _specs(B, T, H, half)
    block_n = min(BWD["block_n"], T)
    view = (B, T, H, 2, half)
    dqkv = pl.pallas_call(
        functools.partial(_bwd_kernel, block_n=block_n, qk_scale=LOG2E / math.sqrt(Dh),
                          sm_scale=1.0 / math.sqrt(Dh)),
        out_shape=jax.ShapeDtypeStruct((B, T, 3, H, 2, half), qkv.dtype),
        grid=(B, H), in_specs=[heads, head, head, row, table, table], out_specs=heads,
        compiler_params=plgpu.CompilerParams(num_warps=BWD["num_warps"]), interpret=interpret,
        name="rope_attention_bwd",
    )(qkv.reshape(B, T, 3, H, 2, half), y.reshape(view), dy.astype(qkv.dtype).reshape(view), lse,
      cos[:, :half], sin[:, :half])
    return dqkv.reshape(B, T, D3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _rope_attention(qkv, cos, sin, num_heads, interpret):
    return _forward(qkv, cos, sin, num_heads, interpret)[0]


def _rope_attention_fwd(qkv, cos, sin, num_heads, interpret):
    y, lse = _forward(qkv, cos, sin, num_heads, interpret)
    return y, (qkv, y, lse, cos, sin)


def _rope_attention_bwd(num_heads, interpret, res, dy):
    qkv, y, lse, cos, sin = res
    dqkv = _backward(qkv, y, dy, lse, cos, sin, num_heads, interpret)
    return dqkv, jnp.zeros_like(cos), jnp.zeros_like(sin)     # the tables are constants


_rope_attention.defvjp(_rope_attention_fwd, _rope_attention_bwd)


def rope_attention(qkv: jax.Array, cos, sin, num_heads: int,
                   interpret: bool | None = None) -> jax.Array:
    """Causal softmax attention, scale 1/sqrt(Dh), of the heads of the QKV projection ``qkv``
    (B, T, 3D) with RoPE on q and k from the (T, Dh) fp32 tables: (B, T, D) in ``qkv``'s dtype.
    ``interpret=None``: Pallas's interpreter unless the default backend is a GPU."""
    interpret = _interpret(interpret)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)
    _check(qkv, cos, num_heads, interpret)
    return _rope_attention(qkv, cos, sin, int(num_heads), interpret)


def forward_with_lse(qkv: jax.Array, cos, sin, num_heads: int, interpret: bool | None = None):
    """``(y, lse)``: the forward kernel's outputs, the base-2 logsumexp (B, H, T) included (tests)."""
    interpret = _interpret(interpret)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)
    _check(qkv, cos, num_heads, interpret)
    return _forward(qkv, cos, sin, int(num_heads), interpret)
