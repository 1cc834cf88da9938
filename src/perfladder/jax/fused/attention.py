"""Causal attention with RoPE applied on load, in Pallas: the QKV projection in, ``d(qkv)`` out.

The algorithm of ``perfladder.torch.fused.attention`` (read its doc for the derivation), for
the JAX model: ``rope_attention(qkv, cos, sin, num_heads) -> y``, with ``qkv`` the (B, T, 3D)
projection and ``y`` (B, T, D) ready for ``W_o``, under ``jax.custom_vjp`` (residuals: qkv,
y, the base-2 row logsumexp (B, H, T), the tables). q and k are rotated in fp32 and rounded to
the input dtype each time a tile of them is loaded; every dot accumulates in fp32.

``bias=`` (the model's ``'attention_bias'``): ``qkv`` is the projection's matmul alone; the
kernels add the (3D,) bias to each q and k tile they load (in the input dtype, as flax's
``Linear`` does) and to y (a row of P sums to one: ``P (v + b) = P v + b``), the backward to
every tile it loads and sums the rows of ``d(qkv)`` it writes into the bias gradient's partial
sums. Otherwise the bias is a pass of its own: XLA fuses no add into a custom call.

* forward, one program per (query block, batch, head), grid ``(T / block_m, B, H)``: the
  block's rotated q against the key blocks up to the diagonal only (a loop with a bound per
  program), online softmax over them, ``y = P v``; keys past the diagonal are never loaded.
* backward, one kernel, one program per (block, batch, head), grid ``(T / block, B, H)``, in
  two phases over the causal triangle of tiles (FlashAttention-2's split, fused):
  1. dK and dV of the program's key block, accumulated over the query tiles at or below the
     diagonal (P, dP and dS recomputed from the logsumexp);
  2. dQ of the program's query block, accumulated over the key tiles up to the diagonal.
  Each program owns its rows of ``d(qkv)``: no atomics, no fp32 scratch, and it writes dq,
  dk (each rotated back) and dv straight into ``d(qkv)``'s layout (no split backward, no RoPE
  pass). ``delta = rowsum(dy * y)`` is computed where a query tile is loaded (one more tile
  read, from L2) instead of by a pass of its own over y and dy.

Costs, at the model's shape (T=128, Dh=64, 8 heads, batch 2048, bf16; per layer):

* forward, blocks of 64: three live (query block, key block) tiles of the four, 2 dots each,
  about 52 GFLOP; it reads qkv and writes y and the logsumexp, about 1.1 GB (k and v are
  read by both of a head's programs, the second time from L2: the grid's first axis is the
  query block, so they run side by side). Bound by memory: about 0.23 ms at 4.8 TB/s.
* backward, blocks and inner tiles of 64: each live tile is computed twice (phase 1:
  S, dP, dV, dK; phase 2: S, dP, dQ -- 7 dots, against the 5 of a single pass per head,
  which must hold dQ for the whole sequence in registers: 8 warps, spilled registers and one
  program per SM), about 180 GFLOP, in exchange for B*H*T/block programs with the same work
  each (a program's phase 1 visits the tiles from its block to the end, its phase 2 those
  from the start to its block) and no state across programs. It reads qkv, y and dy and
  writes d(qkv), about 2.2 GB: about 0.45 ms at 4.8 TB/s.

Fully masked tiles are never computed; the mask is applied on every visited tile (cheap beside
the exponentials). Compiled for sm_90a (tests/jax/test_fused_attention.py), the forward keeps
127 registers a thread; the backward 255 and a few values on its stack (8 bytes, 56 with the
bias), measured faster than every setting that spills nothing.
Every head-wide tile is held as its two rotate-half halves (columns i and i + Dh/2), so a
rotation is elementwise and no value is ever sliced in the kernel (the Triton lowering slices
refs, not values): the arrays are viewed, for free, as (B, T, 3, H, 2, Dh/2) and (B, T, H, 2,
Dh/2); a program sees its head's whole sequence, (T, 3, 2, Dh/2), and loads tiles of it.
Pallas, not jax-triton (which needs a GPU even to trace): it runs in its interpreter on CPU.

Constraints of the Triton lowering: every array a kernel loads or computes has a power-of-two
size, so a sequence whose length is not a multiple of the blocks is padded with zeros to one
(padded keys come after every real query, so the causal mask hides them; padded queries get a
zero gradient) -- at the model's T=128 nothing is padded. On a GPU the dots need dimensions
>= 16: blocks of at least ``MIN_BLOCK`` rows and Dh >= 32 (the halves are the dots' K).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Launch parameters, read at each trace: for each kernel the fastest setting of an H100 sweep
# (benchmarks/fused_kernels.py --attention-configs). forward: query rows per program, keys per
# inner step (FWD_BIAS: the forward with the bias on load, B12's); backward: rows per program
# (its key block in phase 1, its query block in phase 2), rows of the other side per step.
FWD = dict(block_m=64, block_n=64, num_warps=4, num_stages=2)
FWD_BIAS = dict(block_m=64, block_n=32, num_warps=4, num_stages=2)
BWD = dict(block=64, inner=64, num_warps=4, num_stages=1)
MIN_BLOCK = 16                        # Triton's dots on a GPU need M, N, K >= 16
LOG2E = 1.4426950408889634


def _interpret(interpret):
    return jax.default_backend() != "gpu" if interpret is None else bool(interpret)


def _check(qkv, bias, cos, num_heads: int, interpret: bool) -> tuple[int, int, int, int]:
    if qkv.ndim != 3 or qkv.shape[-1] % 3:
        raise ValueError(f"qkv must be (B, T, 3D), got shape {qkv.shape}")
    B, T, D3 = qkv.shape
    if bias is not None and (bias.shape != (D3,) or bias.dtype != qkv.dtype):
        raise ValueError(f"bias must be ({D3},) in qkv's dtype {qkv.dtype}, got {bias.shape} {bias.dtype}")
    D = D3 // 3
    if D % num_heads:
        raise ValueError(f"width {D} does not split into num_heads={num_heads} heads")
    Dh = D // num_heads
    if Dh < 4 or Dh & (Dh - 1):
        raise ValueError(f"fused attention needs a power-of-two head width >= 4; got {Dh}")
    if Dh < 32 and not interpret:
        raise ValueError(f"fused attention on a GPU needs head width >= 32 (Triton dots need "
                         f"K >= 16 for the rotate-half halves); got {Dh}")
    if T < 1:
        raise ValueError(f"fused attention needs a sequence of at least one token; got T={T}")
    if cos.shape != (T, Dh) or cos.dtype != jnp.float32:
        raise ValueError(f"cos/sin must be fp32 tables of shape (T, Dh) = {(T, Dh)}, got "
                         f"{cos.shape} {cos.dtype}")
    for name, cfg in (("FWD", FWD), ("FWD_BIAS", FWD_BIAS), ("BWD", BWD)):
        for key in ("block_m", "block_n", "block", "inner"):
            b = cfg.get(key)
            if b is not None and (b < MIN_BLOCK or b & (b - 1)):
                raise ValueError(f"fused attention {name}[{key!r}] must be a power of two >= "
                                 f"{MIN_BLOCK}; got {b}")
    return B, T, D, Dh


def forward_launch(biased: bool) -> dict:
    return FWD_BIAS if biased else FWD            # the forward's launch parameters


def _blocks(T: int, biased: bool) -> tuple[int, dict, dict]:
    """The padded length and each kernel's launch parameters, its blocks capped: a block is no
    longer than the sequence rounded up to a power of two (>= MIN_BLOCK), and the padded length
    a multiple of every block, so that the forward's logsumexp serves the backward as it is."""
    cap = max(MIN_BLOCK, 1 << (T - 1).bit_length())
    launch = forward_launch(biased)
    fwd = {**launch, "block_m": min(launch["block_m"], cap), "block_n": min(launch["block_n"], cap)}
    bwd = {**BWD, "block": min(BWD["block"], cap), "inner": min(BWD["inner"], cap)}
    step = max(fwd["block_m"], fwd["block_n"], bwd["block"], bwd["inner"])
    return -(-T // step) * step, fwd, bwd


def _pad_rows(x, Tp: int, axis: int = 1):
    """``x`` with zero rows appended along ``axis`` up to ``Tp`` (itself when already there)."""
    if x.shape[axis] == Tp:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, Tp - x.shape[axis])
    return jnp.pad(x, widths)


# -- kernels ------------------------------------------------------------------------------------
def _dot(a, b, trans_a=False, trans_b=False):
    """``a @ b`` (either transposed) in fp32; fp32 inputs in true fp32 (not a GPU's TF32)."""
    exact = a.dtype == jnp.float32
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32,
                               precision=jax.lax.Precision.HIGHEST if exact else None)


def _refs(refs, biased: bool):      # a kernel's (qkv_ref, bias_ref or None, the others)
    return refs[0], (refs[1] if biased else None), refs[1 + biased:]


def _load(ref, bias_ref, rows, part: int, half: int):
    """Half ``half`` of q, k or v (``part`` 0-2) at ``rows`` of a (T, 3, 2, HALF) block, plus
    the (3, 2, HALF) bias block's when there is one."""
    x = ref[rows, part, half, :]
    return x if bias_ref is None else x + bias_ref[part, half, :][None, :]


def _rotated(ref, part: int, rows, cos_ref, sin_ref, bias_ref=None):
    """q (part 0) or k (part 1) at ``rows`` of a (T, 3, 2, HALF) block, rotated in fp32 and
    rounded to the input dtype: its two halves (n, HALF)."""
    x1, x2 = _load(ref, bias_ref, rows, part, 0), _load(ref, bias_ref, rows, part, 1)
    a, b = x1.astype(jnp.float32), x2.astype(jnp.float32)
    c, s = cos_ref[rows, :], sin_ref[rows, :]
    return (a * c - b * s).astype(x1.dtype), (b * c + a * s).astype(x1.dtype)


def _visible(q0, m: int, k0, n: int, keys_first: bool = False):
    """Causal mask of queries ``q0..q0+m`` and keys ``k0..k0+n``: a key is visible from every
    query not before it. (m, n), or (n, m) with ``keys_first``."""
    shape, (qa, ka) = ((n, m), (1, 0)) if keys_first else ((m, n), (0, 1))
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, qa) + q0
    keys = jax.lax.broadcasted_iota(jnp.int32, shape, ka) + k0
    return keys <= rows


def _fwd_kernel(*refs, block_m: int, block_n: int, qk_scale: float, biased: bool):
    qkv_ref, bias_ref, (cos_ref, sin_ref, y_ref, lse_ref) = _refs(refs, biased)
    q0 = pl.program_id(0) * block_m
    q1, q2 = _rotated(qkv_ref, 0, pl.ds(q0, block_m), cos_ref, sin_ref, bias_ref)  # (block_m, HALF)

    def step(j, carry):
        acc1, acc2, m, l = carry
        k0 = j * block_n
        ks = pl.ds(k0, block_n)
        k1, k2 = _rotated(qkv_ref, 1, ks, cos_ref, sin_ref, bias_ref)      # (block_n, HALF)
        s = (_dot(q1, k1, trans_b=True) + _dot(q2, k2, trans_b=True)) * qk_scale
        s = jnp.where(_visible(q0, block_m, k0, block_n), s, -jnp.inf)    # (block_m, block_n)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))     # finite from key 0, seen by every row
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        pc = p.astype(q1.dtype)
        acc1 = acc1 * alpha[:, None] + _dot(pc, qkv_ref[ks, 2, 0, :])
        acc2 = acc2 * alpha[:, None] + _dot(pc, qkv_ref[ks, 2, 1, :])
        return acc1, acc2, m_new, l * alpha + jnp.sum(p, axis=1)

    f32 = jnp.float32
    acc = jnp.zeros(q1.shape, f32)
    init = (acc, acc, jnp.full((block_m,), -jnp.inf, f32), jnp.zeros((block_m,), f32))
    last = jax.lax.div(q0 + block_m + block_n - 1, block_n)      # key blocks to the diagonal
    acc1, acc2, m, l = jax.lax.fori_loop(0, last, step, init)
    for half, acc in ((0, acc1), (1, acc2)):      # v's bias after P (see the module doc)
        y = acc / l[:, None]
        y = y if bias_ref is None else y + bias_ref[2, half, :][None, :].astype(jnp.float32)
        y_ref[:, half, :] = y.astype(y_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def _query_tile(qkv_ref, bias_ref, y_ref, dy_ref, lse_ref, cos_ref, sin_ref, rows):
    """What a query tile brings to the backward: rotated q, dy (halves each), its logsumexp
    and ``delta = rowsum(dy * y)`` (fp32; rowsum(P dP), the softmax's backward term)."""
    q1, q2 = _rotated(qkv_ref, 0, rows, cos_ref, sin_ref, bias_ref)
    dy1, dy2 = dy_ref[rows, 0, :], dy_ref[rows, 1, :]
    f32 = jnp.float32
    delta = jnp.sum(dy1.astype(f32) * y_ref[rows, 0, :].astype(f32)
                    + dy2.astype(f32) * y_ref[rows, 1, :].astype(f32), axis=1)
    return q1, q2, dy1, dy2, lse_ref[rows], delta


def _bwd_kernel(*refs, block: int, inner: int, qk_scale: float, sm_scale: float, biased: bool):
    qkv_ref, bias_ref, (y_ref, dy_ref, lse_ref, cos_ref, sin_ref, dqkv_ref, *db) = _refs(refs, biased)
    j = pl.program_id(0)
    b0 = j * block
    own = pl.ds(b0, block)
    T = qkv_ref.shape[0]
    f32, out = jnp.float32, dqkv_ref.dtype
    zeros = jnp.zeros((block, qkv_ref.shape[-1]), f32)

    # phase 1: dK, dV of keys b0.. over the query tiles that see them
    k1, k2 = _rotated(qkv_ref, 1, own, cos_ref, sin_ref, bias_ref)
    v1, v2 = _load(qkv_ref, bias_ref, own, 2, 0), _load(qkv_ref, bias_ref, own, 2, 1)

    def keys_step(i, carry):
        dk1, dk2, dv1, dv2 = carry
        r0 = i * inner
        q1, q2, dy1, dy2, lse, delta = _query_tile(qkv_ref, bias_ref, y_ref, dy_ref, lse_ref,
                                                   cos_ref, sin_ref, pl.ds(r0, inner))
        # keys on rows (S^T, dP^T: (block, inner)), so that P^T and dS^T enter their dots as
        # they are, the left operand straight from registers, with no transpose through memory
        s = (_dot(k1, q1, trans_b=True) + _dot(k2, q2, trans_b=True)) * qk_scale
        p = jnp.where(_visible(r0, inner, b0, block, keys_first=True),
                      jnp.exp2(s - lse[None, :]), 0.0)
        dp = _dot(v1, dy1, trans_b=True) + _dot(v2, dy2, trans_b=True)
        ds = (p * (dp - delta[None, :])).astype(q1.dtype)
        pc = p.astype(q1.dtype)
        return (dk1 + _dot(ds, q1), dk2 + _dot(ds, q2), dv1 + _dot(pc, dy1), dv2 + _dot(pc, dy2))

    dk1, dk2, dv1, dv2 = jax.lax.fori_loop(jax.lax.div(b0, inner), T // inner, keys_step,
                                           (zeros, zeros, zeros, zeros))
    dk1, dk2 = dk1 * sm_scale, dk2 * sm_scale
    cb, sb = cos_ref[own, :], sin_ref[own, :]

    def write(part: int, g1, g2):       # and, with a bias, its share of the bias gradient
        for half, g in ((0, g1.astype(out)), (1, g2.astype(out))):
            dqkv_ref[:, part, half, :] = g
            if biased:
                db[0][part, half, :] = jnp.sum(g.astype(f32), axis=0)

    # RoPE's transpose: y1 = x1 c - x2 s, y2 = x2 c + x1 s => dx1 = g1 c + g2 s, dx2 = g2 c - g1 s
    write(1, dk1 * cb + dk2 * sb, dk2 * cb - dk1 * sb)
    write(2, dv1, dv2)

    # phase 2: dQ of queries b0.. over the key tiles they see
    q1, q2, dy1, dy2, lse, delta = _query_tile(qkv_ref, bias_ref, y_ref, dy_ref, lse_ref,
                                               cos_ref, sin_ref, own)

    def queries_step(i, carry):
        dq1, dq2 = carry
        k0 = i * inner
        ks = pl.ds(k0, inner)
        k1, k2 = _rotated(qkv_ref, 1, ks, cos_ref, sin_ref, bias_ref)       # (inner, HALF)
        s = (_dot(q1, k1, trans_b=True) + _dot(q2, k2, trans_b=True)) * qk_scale
        p = jnp.where(_visible(b0, block, k0, inner), jnp.exp2(s - lse[:, None]), 0.0)
        dp = (_dot(dy1, _load(qkv_ref, bias_ref, ks, 2, 0), trans_b=True)
              + _dot(dy2, _load(qkv_ref, bias_ref, ks, 2, 1), trans_b=True))
        ds = (p * (dp - delta[:, None])).astype(q1.dtype)                # (block, inner)
        return dq1 + _dot(ds, k1), dq2 + _dot(ds, k2)

    last = jax.lax.div(b0 + block + inner - 1, inner)            # key tiles to the diagonal
    dq1, dq2 = jax.lax.fori_loop(0, last, queries_step, (zeros, zeros))
    dq1, dq2 = dq1 * sm_scale, dq2 * sm_scale
    write(0, dq1 * cb + dq2 * sb, dq2 * cb - dq1 * sb)


# -- pallas calls -------------------------------------------------------------------------------
def _sequence_specs(Tp: int, half: int):
    """BlockSpecs over a grid (row block, b, h) that give every program its head's whole
    sequence: of the (B, Tp, 3, H, 2, HALF) view of qkv, of the (B, Tp, H, 2, HALF) view of y /
    dy, of the (B, H, Tp) logsumexp, and the (Tp, HALF) tables."""
    heads = pl.BlockSpec((None, Tp, 3, None, 2, half), lambda i, b, h: (b, 0, 0, h, 0, 0))
    head = pl.BlockSpec((None, Tp, None, 2, half), lambda i, b, h: (b, 0, h, 0, 0))
    row = pl.BlockSpec((None, None, Tp), lambda i, b, h: (b, h, 0))
    table = pl.BlockSpec((Tp, half), lambda i, b, h: (0, 0))
    return heads, head, row, table


def _tables(cos, sin, Tp: int):
    half = cos.shape[1] // 2                   # the tables' two halves are equal
    return _pad_rows(cos[:, :half], Tp, 0), _pad_rows(sin[:, :half], Tp, 0)


def _bias_inputs(bias, H: int, half: int) -> tuple[list, list]:
    """``([BlockSpec], [array])`` of the bias to splice into a call's inputs (both empty without
    one): its (3, H, 2, HALF) view, of which a program gets its head's three parts."""
    if bias is None:
        return [], []
    return [pl.BlockSpec((3, None, 2, half), lambda i, b, h: (0, h, 0, 0))], [bias.reshape(3, H, 2, half)]


def _forward(qkv, bias, cos, sin, H: int, interpret: bool):
    """``(y, lse)``: y (B, T, D); lse (B, H, Tp), Tp the padded length."""
    B, T, D3 = qkv.shape
    half = D3 // 3 // H // 2
    Tp, fwd, _ = _blocks(T, bias is not None)
    heads, _, _, table = _sequence_specs(Tp, half)
    (bias_spec, bias_arg), bm = _bias_inputs(bias, H, half), fwd["block_m"]
    y, lse = pl.pallas_call(
        functools.partial(_fwd_kernel, block_m=bm, block_n=fwd["block_n"],
                          qk_scale=LOG2E / math.sqrt(2 * half), biased=bool(bias_arg)),
        out_shape=[jax.ShapeDtypeStruct((B, Tp, H, 2, half), qkv.dtype),
                   jax.ShapeDtypeStruct((B, H, Tp), jnp.float32)],
        grid=(Tp // bm, B, H), in_specs=[heads, *bias_spec, table, table],
        out_specs=[pl.BlockSpec((None, bm, None, 2, half), lambda i, b, h: (b, i, h, 0, 0)),
                   pl.BlockSpec((None, None, bm), lambda i, b, h: (b, h, i))],
        compiler_params=plgpu.CompilerParams(num_warps=fwd["num_warps"], num_stages=fwd["num_stages"]),
        interpret=interpret, name="rope_attention_fwd",
    )(_pad_rows(qkv, Tp).reshape(B, Tp, 3, H, 2, half), *bias_arg, *_tables(cos, sin, Tp))
    return y[:, :T].reshape(B, T, D3 // 3), lse


def _backward(qkv, bias, y, dy, lse, cos, sin, H: int, interpret: bool):
    """``(d(qkv), the bias gradient in fp32 or None)``."""
    B, T, D3 = qkv.shape
    half = D3 // 3 // H // 2
    Tp, _, bwd = _blocks(T, bias is not None)
    heads, head, row, table = _sequence_specs(Tp, half)
    bias_spec, bias_arg = _bias_inputs(bias, H, half)
    biased, block = bool(bias_arg), bwd["block"]
    view = (B, Tp, H, 2, half)
    # the forward's own, unless the launch parameters changed since (a sweep) and with them Tp
    lse = _pad_rows(lse[..., :T], Tp, axis=2)
    # with a bias: per-program sums of d(qkv)'s rows, (row block, B, 3, H, 2, HALF) in fp32
    sums = ([jax.ShapeDtypeStruct((Tp // block, B, 3, H, 2, half), jnp.float32)],
            [pl.BlockSpec((None, None, 3, None, 2, half), lambda i, b, h: (i, b, 0, h, 0, 0))])
    out = pl.pallas_call(
        functools.partial(_bwd_kernel, block=block, inner=bwd["inner"], biased=biased,
                          qk_scale=LOG2E / math.sqrt(2 * half), sm_scale=1.0 / math.sqrt(2 * half)),
        out_shape=[jax.ShapeDtypeStruct((B, Tp, 3, H, 2, half), qkv.dtype), *sums[0] * biased],
        grid=(Tp // block, B, H),
        in_specs=[heads, *bias_spec, head, head, row, table, table],
        out_specs=[pl.BlockSpec((None, block, 3, None, 2, half),
                                lambda i, b, h: (b, i, 0, h, 0, 0)), *sums[1] * biased],
        compiler_params=plgpu.CompilerParams(num_warps=bwd["num_warps"], num_stages=bwd["num_stages"]),
        interpret=interpret, name="rope_attention_bwd",
    )(_pad_rows(qkv, Tp).reshape(B, Tp, 3, H, 2, half), *bias_arg,
      _pad_rows(y, Tp).reshape(view), _pad_rows(dy.astype(qkv.dtype), Tp).reshape(view), lse,
      *_tables(cos, sin, Tp))
    dqkv = out[0][:, :T].reshape(B, T, D3)
    return dqkv, (out[1].sum((0, 1)).reshape(D3) if biased else None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _rope_attention(qkv, bias, cos, sin, num_heads, interpret):
    return _forward(qkv, bias, cos, sin, num_heads, interpret)[0]


def _rope_attention_fwd(qkv, bias, cos, sin, num_heads, interpret):
    y, lse = _forward(qkv, bias, cos, sin, num_heads, interpret)
    return y, (qkv, bias, y, lse, cos, sin)


def _rope_attention_bwd(num_heads, interpret, res, dy):
    qkv, bias, y, lse, cos, sin = res
    dqkv, dbias = _backward(qkv, bias, y, dy, lse, cos, sin, num_heads, interpret)
    dbias = None if bias is None else dbias.astype(bias.dtype)
    return dqkv, dbias, jnp.zeros_like(cos), jnp.zeros_like(sin)     # the tables are constants


_rope_attention.defvjp(_rope_attention_fwd, _rope_attention_bwd)


def rope_attention(qkv: jax.Array, cos, sin, num_heads: int, interpret: bool | None = None,
                   bias: jax.Array | None = None) -> jax.Array:
    """Causal softmax attention, scale 1/sqrt(Dh), of the heads of the QKV projection ``qkv``
    (B, T, 3D) with RoPE on q and k from the (T, Dh) fp32 tables: (B, T, D) in ``qkv``'s dtype.
    ``bias``: ``qkv`` is the projection without its (3D,) bias, which the kernels add on load.
    ``interpret=None``: Pallas's interpreter unless the default backend is a GPU."""
    interpret = _interpret(interpret)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)
    _check(qkv, bias, cos, num_heads, interpret)
    return _rope_attention(qkv, bias, cos, sin, int(num_heads), interpret)


def forward_with_lse(qkv: jax.Array, cos, sin, num_heads: int, interpret: bool | None = None,
                     bias: jax.Array | None = None):
    """``(y, lse)``: the forward kernel's outputs, the base-2 logsumexp (B, H, T) included (tests)."""
    interpret = _interpret(interpret)
    cos, sin = jnp.asarray(cos), jnp.asarray(sin)
    B, T, _, _ = _check(qkv, bias, cos, num_heads, interpret)
    y, lse = _forward(qkv, bias, cos, sin, int(num_heads), interpret)
    return y, lse[..., :T]
