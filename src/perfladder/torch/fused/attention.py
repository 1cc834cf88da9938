"""Causal attention with RoPE applied on load: the QKV projection in, ``d(qkv)`` out.

Reference (``perfladder.torch.model.CausalAttention``): ``W_qkv(x).split(D)``, each (B, T, H, Dh);
``rotate`` q and k (fp32, cast back); SDPA on the (B, H, T, Dh) transposes; the output transposed
back to (B, T, D) for ``W_o``. Compiled, that is a RoPE kernel each way, the attention kernels,
and in the backward pass a concatenation of dq, dk, dv into ``d(qkv)``. Here it is one kernel
each way.

``rope_attention(qkv, cos, sin, num_heads) -> y`` (B, T, D), in ``qkv``'s dtype (bf16 or fp32):

* forward: one program per (batch, head, block of ``block_m`` query rows). It reads the rows'
  q from the (B, T, 3D) projection (any batch and time strides, unit last stride), rotates it
  in fp32 registers and rounds it to the input dtype (what the reference hands SDPA), then
  walks the key blocks of ``block_n`` up to its last row only, k rotated the same way on load:
  ``S = q k^T / sqrt(Dh)``, causal mask, an online softmax, ``y = P v`` with fp32
  accumulation, written straight into the head's columns of (B, T, D); keeps the row
  logsumexp (base 2, fp32, (B, H, T)).
* backward: FlashAttention-2's split, without atomics: per (batch, head, block of ``block_m``
  rows) one program for dK and dV of those rows as keys (over the query blocks of ``block_n``
  from the diagonal down: ``P^T`` recomputed from the saved logsumexp, ``dV += P^T dy``,
  ``dS^T = P^T (v dy^T - delta)``, ``dK += dS^T q``) and one for dQ of those rows as queries
  (over the key blocks up to the diagonal: ``dQ += dS k``). Every accumulator belongs to one
  program, so there is no fp32 scratch and no second pass: dq and dk are rotated back (the
  transpose of RoPE's rotation) on store, into the q and k columns of ``d(qkv)``, dv into v's.
  ``delta = rowsum(dy * y)`` (softmax's backward) is formed wherever a query block is
  loaded, from y and dy.

Rotate-half pairs column i with i + Dh/2, so the kernels hold q, k, dq and dk as two (., Dh/2)
halves: a rotation is then elementwise, and ``q k^T = q_lo k_lo^T + q_hi k_hi^T`` is two dots.
The cos/sin tables are the model's fp32 (T, Dh) buffers, whose two halves are equal by
construction; the kernels read the first half. Each product takes the tile computed in
registers (q, P, dS and their transposes' sources) on the left and a loaded tile on the
right, so no register tile is transposed (on Hopper the right operand is read from shared
memory, where a transpose is free).

Costs by design. Only the causal lower triangle of (query, key) tiles is computed (to the
granularity of ``block_n``): at the model's T=128 the forward's 64-row blocks with 32-key steps
do 6 of the 8 64 x 32 tiles. The backward computes each live tile twice, once for dK/dV and
once for dQ (7 products of a tile where a single pass would do 5), in exchange for programs
with no accumulator held across the whole sequence: a single pass holding dQ for all 128 rows
takes 214 registers a thread at 8 warps (one program an SM, latency-bound), these programs
half that (two an SM). The bytes, which dominate at Dh=64, are the minimum from DRAM: the
forward reads qkv once and writes y; the backward reads qkv, y and dy and writes ``d(qkv)``;
a head's programs are launched next to each other, so what several of them read (k and v of
the first block, q, y and dy of the last) comes again from L2. The inner loops run to a bound
known only at run time (the triangle), so they are ``while`` loops (Triton's CPU interpreter
cannot take a run-time ``range`` bound), which Triton does not software-pipeline: a launch
has one stage, and the other programs on an SM hide a program's load latency instead. Triton
dots need dimensions >= 16 on a GPU, so there Dh >= 32.
"""
import math

import torch

from perfladder.torch.fused._launch import (
    check_device,
    interpreted,
    next_pow2,
    tl,
    triton,
)

# The lengths the kernels are tested and compiled at (tests/_torch_fused_attention_cases.py,
# tests/torch/test_fused.py); they loop over blocks and hold no whole sequence.
MAX_T = 128
# Launch configurations, read at each call (benchmarks/fused_kernels.py --attention-configs
# times others): ``block_m`` rows per program (queries in the forward; keys for dK/dV or
# queries for dQ in the backward), ``block_n`` rows per step of its inner loop, warps.
# Compiled for sm_90a at T=128, Dh=64, bf16 as the JIT specialises them (ptxas, no GPU needed;
# tests/torch/test_fused.py prints it), without spills: the forward 122 registers a thread (4
# programs of 4 warps an SM; 148 with 64-key steps: 3), the backward 124 (2 programs of 8
# warps an SM; at 4 warps 167: 3 programs; with 32-key steps, 140 at 8 warps and 206 at 4:
# 1 and 2 programs).
FWD = dict(block_m=64, block_n=32, num_warps=4)
BWD = dict(block_m=64, block_n=16, num_warps=8)
LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, acc=None, PREC: tl.constexpr = "ieee", UPCAST: tl.constexpr = False):
    """``a @ b (+ acc)`` in fp32. ``UPCAST``: Triton's CPU interpreter multiplies bf16 tiles as
    their raw 16-bit integers, so there the operands are widened first (exact: a bf16 value is an
    fp32 value, and the GPU's bf16 MMA forms exact products with fp32 accumulation too)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def _tables(cos_ptr, sin_ptr, pos, pmask, HALF: tl.constexpr):
    """cos and sin at positions ``pos``, (len(pos), HALF): the first half of the (T, Dh) tables."""
    tab = pos[:, None] * (2 * HALF) + tl.arange(0, HALF)[None, :]
    return (tl.load(cos_ptr + tab, mask=pmask[:, None], other=0.0),
            tl.load(sin_ptr + tab, mask=pmask[:, None], other=0.0))


@triton.jit
def _load_rotated(ptr, pos, pmask, stride_t, c, s, HALF: tl.constexpr):
    """Rows ``pos`` of one head's q or k (columns 0..Dh-1 from ``ptr``), rotated in fp32 and
    rounded to the input dtype, as two halves (len(pos), HALF)."""
    off = pos[:, None] * stride_t + tl.arange(0, HALF)[None, :]    # (P, HALF)
    x1 = tl.load(ptr + off, mask=pmask[:, None], other=0.0)
    x2 = tl.load(ptr + off + HALF, mask=pmask[:, None], other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    return (a * c - b * s).to(x1.dtype), (b * c + a * s).to(x1.dtype)


@triton.jit
def _store_unrotated(ptr, pos, pmask, stride_t, g1, g2, c, s, HALF: tl.constexpr):
    """The gradient of the rotated halves (g1, g2), rotated back: y1 = x1 c - x2 s and
    y2 = x2 c + x1 s give dx1 = g1 c + g2 s and dx2 = g2 c - g1 s."""
    i = tl.arange(0, HALF)
    off = pos[:, None] * stride_t + i[None, :]
    m = pmask[:, None]
    tl.store(ptr + off, (g1 * c + g2 * s).to(ptr.dtype.element_ty), mask=m)
    tl.store(ptr + off + HALF, (g2 * c - g1 * s).to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _program(T, BLOCK_M: tl.constexpr, HEADS: tl.constexpr, JOBS: tl.constexpr):
    """(b, h, b * HEADS + h, job, row blocks) of this program: each (batch, head) has ``JOBS``
    jobs per block of BLOCK_M rows, launched next to each other (what they all read stays in
    L2)."""
    n_blocks = tl.cdiv(T, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // (JOBS * n_blocks)
    return (bh // HEADS).to(tl.int64), bh % HEADS, bh.to(tl.int64), pid % (JOBS * n_blocks), n_blocks


@triton.jit
def _rope_attention_fwd_kernel(qkv_ptr, cos_ptr, sin_ptr, y_ptr, lse_ptr, T, s_b, s_t, y_b, y_t,
                               qk_scale, HEADS: tl.constexpr, HALF: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                               UPCAST: tl.constexpr):
    DH: tl.constexpr = 2 * HALF
    D: tl.constexpr = HEADS * DH
    b, h, bh, job, n_blocks = _program(T, BLOCK_M, HEADS, 1)
    blk = n_blocks - 1 - job                                        # the longest rows first
    head = qkv_ptr + b * s_b + h * DH                               # q's columns of this head
    rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < T
    cq, sq = _tables(cos_ptr, sin_ptr, rows, rmask, HALF)
    q1, q2 = _load_rotated(head, rows, rmask, s_t, cq, sq, HALF)     # (BLOCK_M, HALF) each
    cols = tl.arange(0, DH)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)            # running max (base-2 units)
    l_i = tl.zeros((BLOCK_M,), tl.float32)                          # running sum of exp2
    acc = tl.zeros((BLOCK_M, DH), tl.float32)
    # key 0 is allowed for every row (padding rows too), so each row's max is finite after the
    # first block and a fully masked part of a later block gives exp2(-inf) = 0
    start = 0
    end = tl.minimum((blk + 1) * BLOCK_M, T)
    while start < end:
        keys = start + tl.arange(0, BLOCK_N)
        kmask = keys < T
        ck, sk = _tables(cos_ptr, sin_ptr, keys, kmask, HALF)
        k1, k2 = _load_rotated(head + D, keys, kmask, s_t, ck, sk, HALF)   # (BLOCK_N, HALF) each
        v = tl.load(head + 2 * D + keys[:, None] * s_t + cols[None, :], mask=kmask[:, None], other=0.0)
        s = _dot(q1, tl.trans(k1), PREC=PREC, UPCAST=UPCAST)
        s = _dot(q2, tl.trans(k2), s, PREC=PREC, UPCAST=UPCAST) * qk_scale      # (BLOCK_M, BLOCK_N)
        s = tl.where(keys[None, :] <= rows[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], PREC=PREC, UPCAST=UPCAST)  # (BLOCK_M, DH)
        m_i = m_new
        start += BLOCK_N
    y = acc / l_i[:, None]
    tl.store(y_ptr + b * y_b + rows[:, None] * y_t + h * DH + cols[None, :],
             y.to(y_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(lse_ptr + bh * T + rows, m_i + tl.log2(l_i), mask=rmask)


@triton.jit
def _query_block(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr, rows, rmask, s_t, y_t, dy_t,
                 HALF: tl.constexpr):
    """What the backward needs of the query rows ``rows``: q rotated (two halves), dy, the saved
    logsumexp and ``delta = rowsum(dy * y)``."""
    cols = tl.arange(0, 2 * HALF)
    cq, sq = _tables(cos_ptr, sin_ptr, rows, rmask, HALF)
    q1, q2 = _load_rotated(head, rows, rmask, s_t, cq, sq, HALF)
    dy = tl.load(dy_row + rows[:, None] * dy_t + cols[None, :], mask=rmask[:, None], other=0.0)
    y = tl.load(y_row + rows[:, None] * y_t + cols[None, :], mask=rmask[:, None], other=0.0)
    delta = tl.sum(dy.to(tl.float32) * y.to(tl.float32), axis=1)
    lse = tl.load(lse_row + rows, mask=rmask, other=0.0)
    return q1, q2, dy, delta, lse


@triton.jit
def _key_block(head, cos_ptr, sin_ptr, keys, kmask, s_t, HALF: tl.constexpr, D: tl.constexpr):
    """k rotated (two halves) and v of the key rows ``keys``."""
    cols = tl.arange(0, 2 * HALF)
    ck, sk = _tables(cos_ptr, sin_ptr, keys, kmask, HALF)
    k1, k2 = _load_rotated(head + D, keys, kmask, s_t, ck, sk, HALF)
    v = tl.load(head + 2 * D + keys[:, None] * s_t + cols[None, :], mask=kmask[:, None], other=0.0)
    return k1, k2, v


@triton.jit
def _dk_dv(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr, ghead, keys, T, s_t, y_t, dy_t,
           qk_scale, sm_scale, HALF: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
           BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """dK and dV of the key rows ``keys`` (a block of BLOCK_M), over the query blocks of
    BLOCK_N that see them, stored into ``d(qkv)`` (dk rotated back)."""
    kmask = keys < T
    k1, k2, v = _key_block(head, cos_ptr, sin_ptr, keys, kmask, s_t, HALF, D)   # (BLOCK_M, .)
    dk1 = tl.zeros((BLOCK_M, HALF), tl.float32)
    dk2 = tl.zeros((BLOCK_M, HALF), tl.float32)
    dv = tl.zeros((BLOCK_M, 2 * HALF), tl.float32)
    start = tl.min(keys, axis=0) // BLOCK_N * BLOCK_N           # the block holding the diagonal
    while start < T:
        rows = start + tl.arange(0, BLOCK_N)
        rmask = rows < T
        q1, q2, dy, delta, lse = _query_block(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr,
                                              rows, rmask, s_t, y_t, dy_t, HALF)
        st = _dot(k1, tl.trans(q1), PREC=PREC, UPCAST=UPCAST)
        st = _dot(k2, tl.trans(q2), st, PREC=PREC, UPCAST=UPCAST) * qk_scale   # (BLOCK_M, BLOCK_N)
        # padding query rows (>= T) are zeroed: their lse is not a real one
        live = (keys[:, None] <= rows[None, :]) & rmask[None, :]
        pt = tl.where(live, tl.exp2(st - lse[None, :]), 0.0)
        dv = _dot(pt.to(dy.dtype), dy, dv, PREC=PREC, UPCAST=UPCAST)          # (BLOCK_M, DH)
        dpt = _dot(v, tl.trans(dy), PREC=PREC, UPCAST=UPCAST)                 # (BLOCK_M, BLOCK_N)
        dst = (pt * (dpt - delta[None, :])).to(q1.dtype)            # d(scores)^T, before the scale
        dk1 = _dot(dst, q1, dk1, PREC=PREC, UPCAST=UPCAST)                    # (BLOCK_M, HALF)
        dk2 = _dot(dst, q2, dk2, PREC=PREC, UPCAST=UPCAST)
        start += BLOCK_N
    # the tables are read again rather than held in registers through the loop
    ck, sk = _tables(cos_ptr, sin_ptr, keys, kmask, HALF)
    _store_unrotated(ghead + D, keys, kmask, 3 * D, dk1 * sm_scale, dk2 * sm_scale, ck, sk, HALF)
    cols = tl.arange(0, 2 * HALF)
    tl.store(ghead + 2 * D + keys[:, None] * (3 * D) + cols[None, :],
             dv.to(ghead.dtype.element_ty), mask=kmask[:, None])


@triton.jit
def _dq(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr, ghead, rows, T, s_t, y_t, dy_t,
        qk_scale, sm_scale, HALF: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of the query rows ``rows`` (a block of BLOCK_M), over the key blocks of BLOCK_N they
    see, stored into ``d(qkv)`` rotated back."""
    rmask = rows < T
    q1, q2, dy, delta, lse = _query_block(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr,
                                          rows, rmask, s_t, y_t, dy_t, HALF)
    dq1 = tl.zeros((BLOCK_M, HALF), tl.float32)
    dq2 = tl.zeros((BLOCK_M, HALF), tl.float32)
    start = 0
    end = tl.minimum(tl.max(rows, axis=0) + 1, T)
    while start < end:
        keys = start + tl.arange(0, BLOCK_N)
        kmask = keys < T
        k1, k2, v = _key_block(head, cos_ptr, sin_ptr, keys, kmask, s_t, HALF, D)   # (BLOCK_N, .)
        s = _dot(q1, tl.trans(k1), PREC=PREC, UPCAST=UPCAST)
        s = _dot(q2, tl.trans(k2), s, PREC=PREC, UPCAST=UPCAST) * qk_scale     # (BLOCK_M, BLOCK_N)
        live = (keys[None, :] <= rows[:, None]) & rmask[:, None]
        p = tl.where(live, tl.exp2(s - lse[:, None]), 0.0)
        dp = _dot(dy, tl.trans(v), PREC=PREC, UPCAST=UPCAST)                  # (BLOCK_M, BLOCK_N)
        ds = (p * (dp - delta[:, None])).to(q1.dtype)
        dq1 = _dot(ds, k1, dq1, PREC=PREC, UPCAST=UPCAST)                     # (BLOCK_M, HALF)
        dq2 = _dot(ds, k2, dq2, PREC=PREC, UPCAST=UPCAST)
        start += BLOCK_N
    cq, sq = _tables(cos_ptr, sin_ptr, rows, rmask, HALF)
    _store_unrotated(ghead, rows, rmask, 3 * D, dq1 * sm_scale, dq2 * sm_scale, cq, sq, HALF)


@triton.jit
def _rope_attention_bwd_kernel(qkv_ptr, y_ptr, dy_ptr, lse_ptr, cos_ptr, sin_ptr, dqkv_ptr,
                               T, s_b, s_t, y_b, y_t, dy_b, dy_t, qk_scale, sm_scale,
                               HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    DH: tl.constexpr = 2 * HALF
    D: tl.constexpr = HEADS * DH
    b, h, bh, job, n_blocks = _program(T, BLOCK_M, HEADS, 2)
    head = qkv_ptr + b * s_b + h * DH
    ghead = dqkv_ptr + b * T * 3 * D + h * DH                      # d(qkv) is written contiguous
    y_row, dy_row, lse_row = y_ptr + b * y_b + h * DH, dy_ptr + b * dy_b + h * DH, lse_ptr + bh * T
    if job < n_blocks:                      # dK, dV of key block ``job``: the first has most work
        mine = job * BLOCK_M + tl.arange(0, BLOCK_M)
        _dk_dv(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr, ghead, mine, T, s_t, y_t, dy_t,
               qk_scale, sm_scale, HALF, D, BLOCK_M, BLOCK_N, PREC, UPCAST)
    else:                                   # dQ of query block 2 n_blocks - 1 - job: the last first
        mine = (2 * n_blocks - 1 - job) * BLOCK_M + tl.arange(0, BLOCK_M)
        _dq(head, y_row, dy_row, lse_row, cos_ptr, sin_ptr, ghead, mine, T, s_t, y_t, dy_t,
            qk_scale, sm_scale, HALF, D, BLOCK_M, BLOCK_N, PREC, UPCAST)


def _check(qkv: torch.Tensor, cos: torch.Tensor, num_heads: int) -> tuple[int, int, int, int]:
    if qkv.dim() != 3 or qkv.shape[-1] % 3:
        raise ValueError(f"qkv must be (B, T, 3D), got shape {tuple(qkv.shape)}")
    B, T, D3 = qkv.shape
    D = D3 // 3
    if D % num_heads:
        raise ValueError(f"width {D} does not split into num_heads={num_heads} heads")
    Dh = D // num_heads
    if Dh < 4 or Dh & (Dh - 1):
        raise ValueError(f"fused attention needs a power-of-two head width >= 4; got {Dh}")
    if not 1 <= T <= MAX_T:
        raise ValueError(f"fused attention is tested for sequences of T <= {MAX_T}; got T={T}")
    if tuple(cos.shape) != (T, Dh) or cos.dtype != torch.float32:
        raise ValueError(f"cos/sin must be fp32 tables of shape (T, Dh) = {(T, Dh)}, got "
                         f"{tuple(cos.shape)} {cos.dtype}")
    if qkv.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"fused attention takes bf16, fp16 or fp32 inputs; got {qkv.dtype}")
    return B, T, D, Dh


def _launch_args(T: int, Dh: int, dtype: torch.dtype, kernel, config: dict) -> tuple[int, dict]:
    """(row blocks per head, the kernel's constexprs and launch options) for ``config``."""
    if Dh < 32 and not interpreted(kernel):
        raise ValueError(f"fused attention on a GPU needs head width >= 32 (Triton dots need "
                         f"K >= 16 for the rotate-half halves); got {Dh}")
    for key in ("block_m", "block_n"):
        n = config[key]
        if n < 16 or n & (n - 1):
            raise ValueError(f"fused attention's {key}={n} is not valid; valid: a power of two >= 16")
    rows = max(16, next_pow2(T))            # a block longer than the sequence is cut to it
    block_m, block_n = min(config["block_m"], rows), min(config["block_n"], rows)
    return -(-T // block_m), dict(
        HALF=Dh // 2, BLOCK_M=block_m, BLOCK_N=block_n,
        PREC="ieee" if dtype == torch.float32 else "tf32",
        UPCAST=interpreted(kernel) and dtype != torch.float32,
        num_warps=config["num_warps"], num_stages=1)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


@torch.library.custom_op("perfladder::rope_attention_fwd", mutates_args=())
def rope_attention_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y (B, T, D), lse (B, H, T) fp32 base-2 logsumexp of the scaled scores)."""
    B, T, D, Dh = _check(qkv, cos, num_heads)
    check_device(_rope_attention_fwd_kernel, qkv, cos, sin)
    qkv = _unit_last(qkv)
    y = qkv.new_empty(B, T, D)
    lse = torch.empty(B, num_heads, T, dtype=torch.float32, device=qkv.device)
    blocks, launch = _launch_args(T, Dh, qkv.dtype, _rope_attention_fwd_kernel, FWD)
    _rope_attention_fwd_kernel[(B * num_heads * blocks,)](
        qkv, cos.contiguous(), sin.contiguous(), y, lse, T, qkv.stride(0), qkv.stride(1),
        y.stride(0), y.stride(1), LOG2E / math.sqrt(Dh), HEADS=num_heads, **launch)
    return y, lse


@rope_attention_fwd.register_fake
def _(qkv, cos, sin, num_heads):
    B, T, D, _ = _check(qkv, cos, num_heads)
    return qkv.new_empty(B, T, D), qkv.new_empty(B, num_heads, T, dtype=torch.float32)


@torch.library.custom_op("perfladder::rope_attention_bwd", mutates_args=())
def rope_attention_bwd(qkv: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, lse: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """d(qkv) (B, T, 3D), contiguous, in ``qkv``'s dtype."""
    B, T, D, Dh = _check(qkv, cos, num_heads)
    check_device(_rope_attention_bwd_kernel, qkv, y, dy, lse, cos, sin)
    qkv, y, dy = _unit_last(qkv), _unit_last(y), _unit_last(dy).to(qkv.dtype)
    dqkv = qkv.new_empty(B, T, 3 * D)
    blocks, launch = _launch_args(T, Dh, qkv.dtype, _rope_attention_bwd_kernel, BWD)
    _rope_attention_bwd_kernel[(2 * B * num_heads * blocks,)](
        qkv, y, dy, lse.contiguous(), cos.contiguous(), sin.contiguous(), dqkv, T,
        qkv.stride(0), qkv.stride(1), y.stride(0), y.stride(1), dy.stride(0), dy.stride(1),
        LOG2E / math.sqrt(Dh), 1.0 / math.sqrt(Dh), HEADS=num_heads, **launch)
    return dqkv


@rope_attention_bwd.register_fake
def _(qkv, y, dy, lse, cos, sin, num_heads):
    return torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)


def _attention_setup(ctx, inputs, output):
    qkv, cos, sin, num_heads = inputs
    y, lse = output
    ctx.save_for_backward(qkv, y, lse, cos, sin)
    ctx.num_heads = num_heads


def _attention_backward(ctx, dy, dlse):
    # lse is an output only so that the backward can read it; nothing downstream uses it
    qkv, y, lse, cos, sin = ctx.saved_tensors
    return rope_attention_bwd(qkv, y, dy, lse, cos, sin, ctx.num_heads), None, None, None


# registered on the operator (see fused/gelu.py): the compiled graph stays cacheable
rope_attention_fwd.register_autograd(_attention_backward, setup_context=_attention_setup)


def rope_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   num_heads: int) -> torch.Tensor:
    """Causal softmax attention, scale 1/sqrt(Dh), of the heads of the QKV projection ``qkv``
    (B, T, 3D) with RoPE on q and k from the (T, Dh) fp32 tables: (B, T, D) in ``qkv``'s dtype."""
    return rope_attention_fwd(qkv, cos, sin, num_heads)[0]
