"""Causal attention with RoPE applied on load: the QKV projection in, ``d(qkv)`` out.

Reference (``perfladder.torch.model.CausalAttention``): ``W_qkv(x).split(D)``, each (B, T, H, Dh);
``rotate`` q and k (fp32, cast back); SDPA on the (B, H, T, Dh) transposes; the output transposed
back to (B, T, D) for ``W_o``. Compiled, that is a RoPE kernel each way, the attention kernels,
and in the backward pass a concatenation of dq, dk, dv into ``d(qkv)``. Here it is one kernel
each way, one program per (batch, head): at T <= 128 a whole sequence fits one program.

``rope_attention(qkv, cos, sin, num_heads) -> y`` (B, T, D), in ``qkv``'s dtype (bf16 or fp32):

* forward: reads the head's q, k, v columns of the (B, T, 3D) projection (any batch and time
  strides, unit last stride), rotates q and k in fp32 registers and rounds them to the input
  dtype (what the reference hands SDPA), ``S = q k^T / sqrt(Dh)``, causal, an online softmax
  over key blocks of ``BLOCK_N``, ``y = P v`` with fp32 accumulation, written straight into the
  head's columns of (B, T, D); keeps the row logsumexp (base 2, fp32, (B, H, T)).
* backward: recomputes ``P`` from the saved logsumexp; ``delta = rowsum(dy * y)`` (softmax's
  backward) is formed in the program from y and dy, not by a separate pass; then per key block
  ``dV = P^T dy``, ``dS = P (dy v^T - delta)``, ``dK = dS^T q``, and ``dQ += dS k`` into an
  accumulator that lives in registers for the whole loop: the program owns every query row
  of its (batch, head), so no other program touches its dQ and no atomics are needed. dK and
  dV of a key block are final when the block is done. dq and dk are rotated back (the
  transpose of RoPE's rotation) on store, into the q and k columns of ``d(qkv)``, dv into v's.

Rotate-half pairs column i with i + Dh/2, so the kernels hold q, k, dq and dk as two (., Dh/2)
halves: a rotation is then elementwise, and ``q k^T = q_lo k_lo^T + q_hi k_hi^T`` is two dots.
The cos/sin tables are the model's fp32 (T, Dh) buffers, whose two halves are equal by
construction; the kernels read the first half.

Costs by design: every key block is multiplied against the whole query tile (static shapes),
so about half of the products the causal mask discards are computed anyway (at T=128: 2 x 2
tiles of 64 where 3 are needed); the bytes, which dominate at Dh=64, are the minimum: the
forward reads qkv once and writes y; the backward reads qkv, y and dy once and writes
``d(qkv)``. Triton dots need dimensions >= 16 on a GPU, so there Dh >= 32.
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

MAX_T = 128             # one program holds the whole sequence: (T, Dh) tiles and (T, BLOCK_N) scores
# Launch configurations (keys per inner step, warps, software-pipeline stages), read at each
# call (the benchmark tries others). Compiled for sm_90a at T=128, Dh=64 as the JIT specialises
# them (ptxas, no GPU needed; tests/torch/test_fused.py): forward 117 registers a thread, no
# spills (two programs an SM); backward 214, no spills (one program of 8 warps an SM; with 4
# warps it spills, as with BLOCK_N=32; BLOCK_N=128, one key block, fits at 252).
FWD = dict(block_n=64, num_warps=8, num_stages=1)
BWD = dict(block_n=64, num_warps=8, num_stages=2)
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
def _rope_attention_fwd_kernel(qkv_ptr, cos_ptr, sin_ptr, y_ptr, lse_ptr, T, s_b, s_t, y_b, y_t,
                               qk_scale, HEADS: tl.constexpr, HALF: tl.constexpr,
                               BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                               UPCAST: tl.constexpr):
    DH: tl.constexpr = 2 * HALF
    D: tl.constexpr = HEADS * DH
    pid = tl.program_id(0)                                          # b * HEADS + h
    b, h = (pid // HEADS).to(tl.int64), pid % HEADS
    head = qkv_ptr + b * s_b + h * DH                               # q's columns of this head
    rows = tl.arange(0, BLOCK_T)
    rmask = rows < T
    cq, sq = _tables(cos_ptr, sin_ptr, rows, rmask, HALF)
    q1, q2 = _load_rotated(head, rows, rmask, s_t, cq, sq, HALF)     # (BLOCK_T, HALF) each
    cols = tl.arange(0, DH)
    m_i = tl.full((BLOCK_T,), float("-inf"), tl.float32)            # running max (base-2 units)
    l_i = tl.zeros((BLOCK_T,), tl.float32)                          # running sum of exp2
    acc = tl.zeros((BLOCK_T, DH), tl.float32)
    for j in range(BLOCK_T // BLOCK_N):                             # a compile-time trip count
        keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
        kmask = keys < T
        ck, sk = _tables(cos_ptr, sin_ptr, keys, kmask, HALF)
        k1, k2 = _load_rotated(head + D, keys, kmask, s_t, ck, sk, HALF)   # (BLOCK_N, HALF) each
        v = tl.load(head + 2 * D + keys[:, None] * s_t + cols[None, :], mask=kmask[:, None], other=0.0)
        s = _dot(q1, tl.trans(k1), PREC=PREC, UPCAST=UPCAST)
        s = _dot(q2, tl.trans(k2), s, PREC=PREC, UPCAST=UPCAST) * qk_scale      # (BLOCK_T, BLOCK_N)
        # key 0 is allowed for every row (padding rows too), so each row's max is finite
        # after the first block and a fully masked later block gives exp2(-inf) = 0
        s = tl.where(keys[None, :] <= rows[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], PREC=PREC, UPCAST=UPCAST)  # (BLOCK_T, DH)
        m_i = m_new
    y = acc / l_i[:, None]
    tl.store(y_ptr + b * y_b + rows[:, None] * y_t + h * DH + cols[None, :],
             y.to(y_ptr.dtype.element_ty), mask=rmask[:, None])
    tl.store(lse_ptr + pid.to(tl.int64) * T + rows, m_i + tl.log2(l_i), mask=rmask)


@triton.jit
def _rope_attention_bwd_kernel(qkv_ptr, y_ptr, dy_ptr, lse_ptr, cos_ptr, sin_ptr, dqkv_ptr,
                               T, s_b, s_t, y_b, y_t, dy_b, dy_t, qk_scale, sm_scale,
                               HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                               BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    DH: tl.constexpr = 2 * HALF
    D: tl.constexpr = HEADS * DH
    pid = tl.program_id(0)
    b, h = (pid // HEADS).to(tl.int64), pid % HEADS
    head = qkv_ptr + b * s_b + h * DH
    ghead = dqkv_ptr + b * T * 3 * D + h * DH                      # d(qkv) is written contiguous
    rows = tl.arange(0, BLOCK_T)
    rmask = rows < T
    cols = tl.arange(0, DH)
    cq, sq = _tables(cos_ptr, sin_ptr, rows, rmask, HALF)
    q1, q2 = _load_rotated(head, rows, rmask, s_t, cq, sq, HALF)     # (BLOCK_T, HALF) each
    dy = tl.load(dy_ptr + b * dy_b + rows[:, None] * dy_t + h * DH + cols[None, :],
                 mask=rmask[:, None], other=0.0)                    # (BLOCK_T, DH)
    y = tl.load(y_ptr + b * y_b + rows[:, None] * y_t + h * DH + cols[None, :],
                mask=rmask[:, None], other=0.0)
    delta = tl.sum(dy.to(tl.float32) * y.to(tl.float32), axis=1)    # (BLOCK_T,) = rowsum(P * dP)
    lse = tl.load(lse_ptr + pid.to(tl.int64) * T + rows, mask=rmask, other=0.0)
    dq1 = tl.zeros((BLOCK_T, HALF), tl.float32)
    dq2 = tl.zeros((BLOCK_T, HALF), tl.float32)
    for j in range(BLOCK_T // BLOCK_N):
        keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
        kmask = keys < T
        ck, sk = _tables(cos_ptr, sin_ptr, keys, kmask, HALF)
        k1, k2 = _load_rotated(head + D, keys, kmask, s_t, ck, sk, HALF)   # (BLOCK_N, HALF) each
        v = tl.load(head + 2 * D + keys[:, None] * s_t + cols[None, :], mask=kmask[:, None], other=0.0)
        s = _dot(q1, tl.trans(k1), PREC=PREC, UPCAST=UPCAST)
        s = _dot(q2, tl.trans(k2), s, PREC=PREC, UPCAST=UPCAST) * qk_scale      # (BLOCK_T, BLOCK_N)
        # padding rows (>= T) are zeroed too: their dy is 0, but their lse is not a real one
        live = (keys[None, :] <= rows[:, None]) & rmask[:, None]
        p = tl.where(live, tl.exp2(s - lse[:, None]), 0.0)
        dv = _dot(tl.trans(p.to(dy.dtype)), dy, PREC=PREC, UPCAST=UPCAST)      # (BLOCK_N, DH)
        dp = _dot(dy, tl.trans(v), PREC=PREC, UPCAST=UPCAST)                   # (BLOCK_T, BLOCK_N)
        ds = (p * (dp - delta[:, None])).to(q1.dtype)               # d(scores), before the scale
        dk1 = _dot(tl.trans(ds), q1, PREC=PREC, UPCAST=UPCAST) * sm_scale     # (BLOCK_N, HALF)
        dk2 = _dot(tl.trans(ds), q2, PREC=PREC, UPCAST=UPCAST) * sm_scale
        dq1 = _dot(ds, k1, dq1, PREC=PREC, UPCAST=UPCAST)                      # (BLOCK_T, HALF)
        dq2 = _dot(ds, k2, dq2, PREC=PREC, UPCAST=UPCAST)
        _store_unrotated(ghead + D, keys, kmask, 3 * D, dk1, dk2, ck, sk, HALF)
        tl.store(ghead + 2 * D + keys[:, None] * (3 * D) + cols[None, :],
                 dv.to(dqkv_ptr.dtype.element_ty), mask=kmask[:, None])
    _store_unrotated(ghead, rows, rmask, 3 * D, dq1 * sm_scale, dq2 * sm_scale, cq, sq, HALF)


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
        raise ValueError(f"fused attention keeps a whole sequence in one program: T <= {MAX_T}; got T={T}")
    if tuple(cos.shape) != (T, Dh) or cos.dtype != torch.float32:
        raise ValueError(f"cos/sin must be fp32 tables of shape (T, Dh) = {(T, Dh)}, got "
                         f"{tuple(cos.shape)} {cos.dtype}")
    if qkv.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"fused attention takes bf16, fp16 or fp32 inputs; got {qkv.dtype}")
    return B, T, D, Dh


def _launch_args(T: int, Dh: int, dtype: torch.dtype, kernel, config: dict) -> dict:
    if Dh < 32 and not interpreted(kernel):
        raise ValueError(f"fused attention on a GPU needs head width >= 32 (Triton dots need "
                         f"K >= 16 for the rotate-half halves); got {Dh}")
    block_t = max(16, next_pow2(T))
    return dict(HALF=Dh // 2, BLOCK_T=block_t, BLOCK_N=min(config["block_n"], block_t),
                PREC="ieee" if dtype == torch.float32 else "tf32",
                UPCAST=interpreted(kernel) and dtype != torch.float32,
                num_warps=config["num_warps"], num_stages=config["num_stages"])


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
    _rope_attention_fwd_kernel[(B * num_heads,)](
        qkv, cos.contiguous(), sin.contiguous(), y, lse, T, qkv.stride(0), qkv.stride(1),
        y.stride(0), y.stride(1), LOG2E / math.sqrt(Dh), HEADS=num_heads,
        **_launch_args(T, Dh, qkv.dtype, _rope_attention_fwd_kernel, FWD))
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
    _rope_attention_bwd_kernel[(B * num_heads,)](
        qkv, y, dy, lse.contiguous(), cos.contiguous(), sin.contiguous(), dqkv, T,
        qkv.stride(0), qkv.stride(1), y.stride(0), y.stride(1), dy.stride(0), dy.stride(1),
        LOG2E / math.sqrt(Dh), 1.0 / math.sqrt(Dh), HEADS=num_heads,
        **_launch_args(T, Dh, qkv.dtype, _rope_attention_bwd_kernel, BWD))
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
