"""RoPE on q and k straight out of the fused QKV projection, one Triton kernel each way.

Reference (``perfladder.torch.model``): ``q, k, v = W_qkv(x).split(D)``, each viewed
(B, T, H, Dh); ``q, k = rotate(q), rotate(k)`` in fp32 and cast back; SDPA gets the
(B, H, T, Dh) transposes. Compiled, that is an elementwise kernel that reads q and k and
writes them back rotated, and in the backward pass one that rotates dq and dk back and
concatenates them with dv into d(qkv) for the projection's backward GEMMs.

``rope_qkv(qkv, cos, sin, num_heads) -> (q, k, v)``, each (B, T, H, Dh) contiguous:

* forward: one kernel reads the (B, T, 3D) projection once, rotates q and k in fp32 registers
  (rotate-half pairing: x_i with x_{i+Dh/2}), writes q, k and v in the input's dtype;
* backward: one kernel reads dq, dk, dv (any strides with a unit last stride, as SDPA's
  backward hands them over), rotates dq and dk back, and writes d(qkv) (B, T, 3D) directly:
  no separate concatenation.

v is written by the forward kernel too (a copy of one D-wide tensor) so that all three outputs
are fresh tensors: an operator that returned a view of its input could not be an opaque
custom op. The cos/sin tables are the model's fp32 (T, Dh) buffers; their two halves are
equal by construction (``rope_angles`` repeats the Dh/2 angles), so the kernels read the first.
"""
import torch

from perfladder.torch.fused._launch import check_device, next_pow2, tl, triton

BLOCK_ROWS = 8          # tokens per program; each program covers all heads of q, k and v


@triton.jit
def _rope_fwd_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
                     n_rows, T, stride_b, stride_t,
                     HEADS: tl.constexpr, HALF: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    DH: tl.constexpr = 2 * HALF
    D: tl.constexpr = HEADS * DH
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)   # token b*T + t
    cols = tl.arange(0, BLOCK_C)                                               # pair j = h*HALF + i
    h, i = cols // HALF, cols % HALF
    mask = (rows < n_rows)[:, None] & (cols < HEADS * HALF)[None, :]
    t = rows % T
    src = ((rows // T) * stride_b + t * stride_t)[:, None]                     # (BLOCK_R, 1)
    dst = (rows * D)[:, None]
    lo = (h * DH + i)[None, :]                                                 # x_i
    hi = lo + HALF                                                             # x_{i+Dh/2}
    c = tl.load(cos_ptr + t[:, None] * DH + i[None, :], mask=mask, other=0.0)
    s = tl.load(sin_ptr + t[:, None] * DH + i[None, :], mask=mask, other=0.0)
    # q (columns 0..D-1 of the projection) and k (D..2D-1): rotate in fp32
    x1 = tl.load(qkv_ptr + src + lo, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(qkv_ptr + src + hi, mask=mask, other=0.0).to(tl.float32)
    tl.store(q_ptr + dst + lo, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(q_ptr + dst + hi, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=mask)
    x1 = tl.load(qkv_ptr + src + D + lo, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(qkv_ptr + src + D + hi, mask=mask, other=0.0).to(tl.float32)
    tl.store(k_ptr + dst + lo, (x1 * c - x2 * s).to(k_ptr.dtype.element_ty), mask=mask)
    tl.store(k_ptr + dst + hi, (x2 * c + x1 * s).to(k_ptr.dtype.element_ty), mask=mask)
    # v (2D..3D-1): copied unchanged
    tl.store(v_ptr + dst + lo, tl.load(qkv_ptr + src + 2 * D + lo, mask=mask), mask=mask)
    tl.store(v_ptr + dst + hi, tl.load(qkv_ptr + src + 2 * D + hi, mask=mask), mask=mask)


@triton.jit
def _rope_bwd_kernel(dq_ptr, dk_ptr, dv_ptr, cos_ptr, sin_ptr, dqkv_ptr,
                     n_rows, T,
                     sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h,
                     HEADS: tl.constexpr, HALF: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    DH: tl.constexpr = 2 * HALF
    D: tl.constexpr = HEADS * DH
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    h, i = cols // HALF, cols % HALF
    mask = (rows < n_rows)[:, None] & (cols < HEADS * HALF)[None, :]
    b, t = rows // T, rows % T
    dst = (rows * 3 * D)[:, None]
    lo = (h * DH + i)[None, :]
    hi = lo + HALF
    c = tl.load(cos_ptr + t[:, None] * DH + i[None, :], mask=mask, other=0.0)
    s = tl.load(sin_ptr + t[:, None] * DH + i[None, :], mask=mask, other=0.0)
    # y1 = x1 c - x2 s, y2 = x2 c + x1 s  =>  dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s
    src = (b * sq_b + t * sq_t)[:, None] + (h * sq_h + i)[None, :]
    g1 = tl.load(dq_ptr + src, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(dq_ptr + src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dqkv_ptr + dst + lo, (g1 * c + g2 * s).to(dqkv_ptr.dtype.element_ty), mask=mask)
    tl.store(dqkv_ptr + dst + hi, (g2 * c - g1 * s).to(dqkv_ptr.dtype.element_ty), mask=mask)
    src = (b * sk_b + t * sk_t)[:, None] + (h * sk_h + i)[None, :]
    g1 = tl.load(dk_ptr + src, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(dk_ptr + src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dqkv_ptr + dst + D + lo, (g1 * c + g2 * s).to(dqkv_ptr.dtype.element_ty), mask=mask)
    tl.store(dqkv_ptr + dst + D + hi, (g2 * c - g1 * s).to(dqkv_ptr.dtype.element_ty), mask=mask)
    src = (b * sv_b + t * sv_t)[:, None] + (h * sv_h + i)[None, :]
    tl.store(dqkv_ptr + dst + 2 * D + lo,
             tl.load(dv_ptr + src, mask=mask).to(dqkv_ptr.dtype.element_ty), mask=mask)
    tl.store(dqkv_ptr + dst + 2 * D + hi,
             tl.load(dv_ptr + src + HALF, mask=mask).to(dqkv_ptr.dtype.element_ty), mask=mask)


def _check(qkv: torch.Tensor, cos: torch.Tensor, num_heads: int) -> tuple[int, int, int, int]:
    if qkv.dim() != 3 or qkv.shape[-1] % 3:
        raise ValueError(f"qkv must be (B, T, 3D), got shape {tuple(qkv.shape)}")
    B, T, D3 = qkv.shape
    D = D3 // 3
    if D % num_heads or (D // num_heads) % 2:
        raise ValueError(f"width {D} must split into num_heads={num_heads} heads of even width")
    Dh = D // num_heads
    if tuple(cos.shape) != (T, Dh) or cos.dtype != torch.float32:
        raise ValueError(f"cos/sin must be fp32 tables of shape (T, Dh) = {(T, Dh)}, got "
                         f"{tuple(cos.shape)} {cos.dtype}")
    return B, T, D, Dh


@torch.library.custom_op("perfladder::rope_qkv_fwd", mutates_args=())
def rope_qkv_fwd(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, D, Dh = _check(qkv, cos, num_heads)
    check_device(_rope_fwd_kernel, qkv, cos, sin)
    if qkv.stride(-1) != 1:
        raise ValueError(f"qkv must have a unit last stride, got strides {qkv.stride()}")
    q, k, v = (qkv.new_empty(B, T, num_heads, Dh) for _ in range(3))          # (B, T, H, Dh)
    n = B * T
    _rope_fwd_kernel[(triton.cdiv(n, BLOCK_ROWS),)](
        qkv, cos.contiguous(), sin.contiguous(), q, k, v, n, T, qkv.stride(0), qkv.stride(1),
        HEADS=num_heads, HALF=Dh // 2, BLOCK_R=BLOCK_ROWS, BLOCK_C=next_pow2(D // 2))
    return q, k, v


@rope_qkv_fwd.register_fake
def _(qkv, cos, sin, num_heads):
    B, T, D, Dh = _check(qkv, cos, num_heads)
    return tuple(qkv.new_empty(B, T, num_heads, Dh) for _ in range(3))


@torch.library.custom_op("perfladder::rope_qkv_bwd", mutates_args=())
def rope_qkv_bwd(dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    check_device(_rope_bwd_kernel, dq, dk, dv, cos, sin)
    dq, dk, dv = (g if g.stride(-1) == 1 else g.contiguous() for g in (dq, dk, dv))
    B, T, H, Dh = dq.shape
    dqkv = dq.new_empty(B, T, 3 * H * Dh)                                     # (B, T, 3D)
    n = B * T
    _rope_bwd_kernel[(triton.cdiv(n, BLOCK_ROWS),)](
        dq, dk, dv, cos.contiguous(), sin.contiguous(), dqkv, n, T,
        *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
        HEADS=H, HALF=Dh // 2, BLOCK_R=BLOCK_ROWS, BLOCK_C=next_pow2(H * Dh // 2))
    return dqkv


@rope_qkv_bwd.register_fake
def _(dq, dk, dv, cos, sin):
    B, T, H, Dh = dq.shape
    return dq.new_empty(B, T, 3 * H * Dh)


def _rope_setup(ctx, inputs, output):
    _, cos, sin, _ = inputs
    ctx.save_for_backward(cos, sin)


def _rope_backward(ctx, dq, dk, dv):
    cos, sin = ctx.saved_tensors
    return rope_qkv_bwd(dq, dk, dv, cos, sin), None, None, None


# registered on the operator (see fused/gelu.py): the compiled graph stays cacheable
rope_qkv_fwd.register_autograd(_rope_backward, setup_context=_rope_setup)


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the QKV projection (B, T, 3D) into heads and rotate q and k: ``(q, k, v)``, each
    (B, T, H, Dh) in ``qkv``'s dtype, with (T, Dh) fp32 tables ``cos``/``sin``."""
    return rope_qkv_fwd(qkv, cos, sin, num_heads)
