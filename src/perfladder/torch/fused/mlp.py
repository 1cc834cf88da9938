"""The FFN with GELU in its GEMMs' epilogues: one Triton GEMM each way replaces a GEMM + GELU pair.

Reference (``perfladder.torch.model.FFN``): ``y = dense2(gelu_tanh(dense1(x)))``. Compiled under
bf16 autocast that is, per layer, a cuBLAS GEMM writing ``h = x W1^T + b1`` (N x 4D), a GELU
kernel reading h and writing ``g``, and cuBLAS for FC2; backward: a cuBLAS GEMM writing
``dg = dy W2``, a GELU-backward kernel reading h and dg and writing ``dh``, a reduction of dh
for ``db1``, and the weight and input gradients. Here:

* FC1 forward, ``fc1_gelu(x, W1, b1) -> (h, g)``: the GEMM's epilogue adds the bias, rounds h
  to the output dtype and writes it (the backward needs it), and writes ``g = gelu(h)``: h is
  not read back. FC2 stays ``torch.addmm`` (cuBLAS).
* FC2's input gradient, ``fc2_dgelu(dy, W2, h) -> (dh, db1)``: the GEMM ``dy W2`` keeps dg in
  fp32 registers, reads the h tile, writes ``dh = dg * gelu'(h)`` and per-row-block partial
  column sums of dh (fp32, summed afterwards into db1): dg never reaches memory, and db1 needs
  no second pass over dh. dW2, dx and dW1 stay cuBLAS.

Bytes saved per layer at N tokens, F = 4D, bf16: forward a read of h (2NF), backward a write and
a read of dg and the bias-gradient read of dh (6NF): 8NF, about 2.1 GB at N = 131072 and D = 512.
Whether that wins depends on the Triton GEMM keeping up with cuBLAS on these shapes (K = 512 for
both: 8 steps of 64); the benchmark measures it.

Tiles: 128 x 128 x 64 (bf16), 8 warps, 3 stages (3 x 32 KiB of shared memory), row-major
program order so the programs that share an A row block run together (B, a weight, is 2 MiB and
stays in L2). K is a compile-time constant (the interpreter cannot loop over a runtime count).
The math is the reference's (fp32 accumulation, the tanh GELU of ``fused.gelu``).
"""
import torch

from perfladder.torch.fused._ffn import check_operands, ffn_backward, ffn_setup, run_ffn
from perfladder.torch.fused._launch import check_device, interpreted, tl, triton
from perfladder.torch.fused.gelu import _tanh

GEMM = dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)   # read at each call
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)


@triton.jit
def _gemm_kernel(a_ptr, b_ptr, bias_ptr, aux_ptr, out_ptr, out2_ptr, part_ptr, M, N,
                 s_am, s_ak, s_bk, s_bn, K: tl.constexpr, DGELU: tl.constexpr, EVEN: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``C = A (M, K) @ B (K, N)`` in fp32, then the epilogue: ``not DGELU``: ``h = C + bias``
    into ``out`` (rounded), ``gelu(h)`` into ``out2``; ``DGELU``: ``dh = C * gelu'(aux)`` into
    ``out`` and its column sums over this row block into ``part[pid_m]``. ``out``, ``out2`` and
    ``aux`` are contiguous (M, N); A and B any strides."""
    pid = tl.program_id(0)
    n_tiles = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // n_tiles, pid % n_tiles                    # N fastest: A's rows reused
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a = a_ptr + rm.to(tl.int64)[:, None] * s_am + rk[None, :] * s_ak   # (BLOCK_M, BLOCK_K)
    b = b_ptr + rk[:, None] * s_bk + rn[None, :] * s_bn                # (BLOCK_K, BLOCK_N)
    mmask, nmask = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kt in range(tl.cdiv(K, BLOCK_K)):                          # a compile-time trip count
        if EVEN:
            at, bt = tl.load(a), tl.load(b)
        else:
            kmask = rk < K - kt * BLOCK_K
            at = tl.load(a, mask=mmask[:, None] & kmask[None, :], other=0.0)
            bt = tl.load(b, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST:   # the CPU interpreter multiplies bf16 tiles as raw integers (see fused.attention)
            acc = tl.dot(at.to(tl.float32), bt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(at, bt, acc, input_precision=PREC)
        a += BLOCK_K * s_ak
        b += BLOCK_K * s_bk
    off = rm.to(tl.int64)[:, None] * N + rn[None, :]
    mask = mmask[:, None] & nmask[None, :]
    if DGELU:
        h = tl.load(aux_ptr + off, mask=mask, other=0.0).to(tl.float32)
        t = _tanh(SQRT_2_OVER_PI * (h + 0.044715 * h * h * h))
        du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * h * h)
        dh = (acc * (0.5 * (1.0 + t) + 0.5 * h * (1.0 - t * t) * du)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + off, dh, mask=mask)
        # the bias gradient sums the dh that is stored (masked rows hold h = 0, acc = 0: dh = 0)
        tl.store(part_ptr + pid_m.to(tl.int64) * N + rn, tl.sum(dh.to(tl.float32), axis=0), mask=nmask)
    else:
        bias = tl.load(bias_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        hq = (acc + bias[None, :]).to(out_ptr.dtype.element_ty)      # h as the reference stores it
        tl.store(out_ptr + off, hq, mask=mask)
        h = hq.to(tl.float32)
        t = _tanh(SQRT_2_OVER_PI * (h + 0.044715 * h * h * h))
        tl.store(out2_ptr + off, (0.5 * h * (1.0 + t)).to(out2_ptr.dtype.element_ty), mask=mask)


def _launch(a, b, M: int, N: int, K: int, dgelu: bool, bias=None, aux=None):
    """``a`` (M, K) and ``b`` (K, N) as strided views; returns (out, out2 or partial sums)."""
    cfg = GEMM
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    out = a.new_empty(M, N)
    m_tiles = triton.cdiv(M, bm)
    out2 = (torch.empty(m_tiles, N, dtype=torch.float32, device=a.device) if dgelu
            else a.new_empty(M, N))
    even = M % bm == 0 and N % bn == 0 and K % bk == 0
    _gemm_kernel[(m_tiles * triton.cdiv(N, bn),)](
        a, b, bias if bias is not None else out, aux if aux is not None else out, out,
        out if dgelu else out2, out2 if dgelu else out, M, N, a.stride(0), a.stride(1),
        b.stride(0), b.stride(1), K=K, DGELU=dgelu, EVEN=even, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        PREC="ieee" if a.dtype == torch.float32 else "tf32",
        UPCAST=interpreted(_gemm_kernel) and a.dtype != torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out, out2


@torch.library.custom_op("perfladder::mlp_fc1_gelu", mutates_args=())
def fc1_gelu(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, D), W1 (F, D), b1 (F,) -> (h, gelu(h)), each (N, F) in x's dtype."""
    check_operands(x, w1, "fc1_gelu", 1)
    check_device(_gemm_kernel, x, w1, b1)
    (M, K), N = x.shape, w1.shape[0]
    return _launch(x, w1.t(), M, N, K, dgelu=False, bias=b1)             # B = W1^T, a view


@fc1_gelu.register_fake
def _(x, w1, b1):
    return x.new_empty(x.shape[0], w1.shape[0]), x.new_empty(x.shape[0], w1.shape[0])


@torch.library.custom_op("perfladder::mlp_fc2_dgelu", mutates_args=())
def fc2_dgelu(dy: torch.Tensor, w2: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dy (N, D), W2 (D, F), h (N, F) -> (dh = (dy W2) * gelu'(h) (N, F), db1 (F,) fp32)."""
    check_operands(dy, w2, "fc2_dgelu", 0)
    check_device(_gemm_kernel, dy, w2, h)
    (M, K), N = dy.shape, w2.shape[1]
    if tuple(h.shape) != (M, N):
        raise ValueError(f"fc2_dgelu: h has shape {tuple(h.shape)}, expected {(M, N)}")
    dh, parts = _launch(dy, w2, M, N, K, dgelu=True, aux=h.contiguous())
    return dh, parts.sum(0)


@fc2_dgelu.register_fake
def _(dy, w2, h):
    return dy.new_empty(dy.shape[0], w2.shape[1]), dy.new_empty(w2.shape[1], dtype=torch.float32)


@torch.library.custom_op("perfladder::mlp_fwd", mutates_args=())
def mlp_fwd(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
            b2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (N, D) -> (y (N, D), h (N, F), g (N, F)): the FFN's output, and the pre-activation and
    activation its backward reads."""
    h, g = fc1_gelu(x, w1, b1)                                        # (N, F) each
    return torch.addmm(b2, g, w2.t()), h, g                           # (N, D)


@mlp_fwd.register_fake
def _(x, w1, b1, w2, b2):
    return (x.new_empty(x.shape[0], w2.shape[0]), x.new_empty(x.shape[0], w1.shape[0]),
            x.new_empty(x.shape[0], w1.shape[0]))


# the backward registered on the operator itself (not an autograd.Function around it), so a
# compiled graph holds only perfladder:: operators and AOTAutograd's cache can keep it
mlp_fwd.register_autograd(ffn_backward(fc2_dgelu), setup_context=ffn_setup)


def fused_ffn(x: torch.Tensor, dense1: torch.nn.Linear, dense2: torch.nn.Linear) -> torch.Tensor:
    """``dense2(gelu_tanh(dense1(x)))`` for x (..., D), through ``mlp_fwd`` (``fused._ffn.run_ffn``)."""
    return run_ffn(mlp_fwd, x, dense1, dense2)
