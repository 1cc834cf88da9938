"""The fused attention and FFN-epilogue kernel cases (run by tests/torch/test_fused.py, with
tests/_torch_fused_cases.py; see there for how): each kernel against the model's own ops and
float64, forward and backward, on shapes that exercise the masks and several blocks.

bf16 accuracy is compared against float64 with the interpreter rounding fp32 -> bf16 to nearest
as a GPU does (``bf16_round_to_nearest``): its own conversion truncates, which doubles the error.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _torch_fused_cases import (  # the sibling cases
    _ON_GPU,
    DEV,
    SMALL_DH,
    _reference_rope,
)

from perfladder.torch.fused import attention as fattn
from perfladder.torch.fused import mlp as fmlp
from perfladder.torch.fused._launch import bf16_round_to_nearest
from perfladder.torch.fused.attention import rope_attention, rope_attention_fwd
from perfladder.torch.model import rope_angles

# fp32 against float64, ||diff|| / ||ref||: measured ~2e-7 in the interpreter; a GPU's exp2 and
# log2 are approximations (a few ulp), hence 1e-5 there
FP32_REL = 1e-5 if _ON_GPU else 1e-6


# -- attention with RoPE on load -------------------------------------------------------------
def _reference_attention(qkv, cos, sin, H):
    """The model's own ops: split, rotate q and k, causal SDPA (scale 1/sqrt(Dh)), merge."""
    B, T, D3 = qkv.shape
    D = D3 // 3
    q, k, v = _reference_rope(qkv, cos, sin, H)                           # (B, T, H, Dh) each
    q, k, v = (u.transpose(1, 2) for u in (q, k, v))                      # (B, H, T, Dh)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=(D // H) ** -0.5)
    return y.transpose(1, 2).reshape(B, T, D)                             # (B, T, D)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _attention_case(dtype, T, H, Dh, padded, B=2):
    """qkv (B, T, 3D) -- a column slice of a wider tensor when ``padded`` (strides of a view) --
    its float64 copy, tables, and an output gradient."""
    torch.manual_seed(4)
    cos, sin = rope_angles(T, Dh, 10000.0, DEV)
    D = H * Dh
    wide = 2 * torch.randn(B, T, 3 * D + (8 if padded else 0), device=DEV)  # scores of std ~ 4
    qkv = wide[..., :3 * D].to(dtype).requires_grad_()
    return qkv, qkv.detach().double().requires_grad_(), cos, sin, torch.randn(B, T, D, device=DEV)


@pytest.mark.parametrize("block_n", [16, 64])
def test_rope_attention_fp32_matches_float64(monkeypatch, block_n):
    """fp32 against the model's ops in float64, forward and backward; T=40 pads the sequence to
    64 rows: with 16-key blocks, 3 full blocks and a partly masked one (online softmax across
    blocks); with 64, one block holding the causal diagonal and the padding."""
    monkeypatch.setitem(fattn.FWD, "block_n", block_n)
    monkeypatch.setitem(fattn.BWD, "block_n", block_n)
    Dh = SMALL_DH
    qkv, ref_in, cos, sin, g = _attention_case(torch.float32, T=40, H=3, Dh=Dh, padded=True)
    y = rope_attention(qkv, cos, sin, 3)
    ref = _reference_attention(ref_in, cos.double(), sin.double(), 3)
    assert y.shape == ref.shape and y.dtype == torch.float32
    assert _rel(y, ref) < FP32_REL
    y.backward(g)
    ref.backward(g.double())
    assert qkv.grad.shape == qkv.shape and qkv.grad.is_contiguous()
    assert _rel(qkv.grad, ref_in.grad) < FP32_REL
    for part in range(3):                        # q, k and v columns each (a wrong rotation shows)
        cols = slice(part * 3 * Dh, (part + 1) * 3 * Dh)
        assert _rel(qkv.grad[..., cols], ref_in.grad[..., cols]) < FP32_REL, part
    _, lse = rope_attention_fwd(qkv.detach(), cos, sin, 3)           # (B, H, T), base 2
    q, k, _ = (u.transpose(1, 2) for u in _reference_rope(ref_in.detach(), cos.double(), sin.double(), 3))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
    s = s.masked_fill(torch.ones(40, 40, dtype=torch.bool, device=DEV).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1) / math.log(2), atol=1e-5, rtol=1e-6)


def test_rope_attention_bf16_as_accurate_as_the_reference(monkeypatch):
    """bf16 in and out, fp32 accumulation: against float64 the kernel is as accurate as the
    model's own bf16 ops are (which round q, k, P, dS... where it does). The interpreter is made
    to round fp32 -> bf16 to nearest, as a GPU does (its own conversion truncates: then the kernel
    measured 0.0069 vs the reference's 0.0039 forward, 0.0131 vs 0.0071 backward); rounding to
    nearest, 0.0039 vs 0.0039 and 0.0069 vs 0.0071. On a GPU the reference is flash attention."""
    monkeypatch.setitem(fattn.FWD, "block_n", 16)
    monkeypatch.setitem(fattn.BWD, "block_n", 16)
    qkv, exact_in, cos, sin, g = _attention_case(torch.bfloat16, T=40, H=2, Dh=32, padded=False)
    ref_in = qkv.detach().clone().requires_grad_()
    gb = g.to(torch.bfloat16)
    with bf16_round_to_nearest():
        y = rope_attention(qkv, cos, sin, 2)
        y.backward(gb)
    ref = _reference_attention(ref_in, cos, sin, 2)
    exact = _reference_attention(exact_in, cos.double(), sin.double(), 2)
    assert y.dtype == torch.bfloat16
    ref.backward(gb)
    exact.backward(gb.double())
    assert qkv.grad.dtype == torch.bfloat16
    e_fwd, r_fwd = _rel(y, exact), _rel(ref, exact)
    e_bwd, r_bwd = _rel(qkv.grad, exact_in.grad), _rel(ref_in.grad, exact_in.grad)
    print(f"forward {e_fwd:.4f} vs {r_fwd:.4f}, backward {e_bwd:.4f} vs {r_bwd:.4f}")
    assert e_fwd < 1.25 * r_fwd + 1e-3 and e_fwd < 1e-2, (e_fwd, r_fwd)
    assert e_bwd < 1.25 * r_bwd + 1e-3 and e_bwd < 2e-2, (e_bwd, r_bwd)


def test_receipt_reads_the_fused_attention_as_bf16(monkeypatch):
    """The bf16 receipt's dispatch mode sees the fused kernel's forward and backward as two
    attention ops on bf16 data (qkv, y, dy), not its fp32 logsumexp or RoPE tables."""
    from perfladder.torch.program import MatmulDtypes
    monkeypatch.setitem(fattn.FWD, "block_n", 16)
    monkeypatch.setitem(fattn.BWD, "block_n", 16)
    qkv, _, cos, sin, g = _attention_case(torch.bfloat16, T=24, H=2, Dh=32, padded=False)
    with MatmulDtypes() as mode:
        rope_attention(qkv, cos, sin, 2).backward(g.to(torch.bfloat16))
    assert dict(mode.attention) == {"bfloat16": 2}
    assert dict(mode.ops) == {"rope_attention_fwd": 1, "rope_attention_bwd": 1}


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a CUDA GPU")
def test_rope_attention_full_shape_on_gpu_bf16():
    """The compiled kernels at the model's shape (T=128, 8 heads of 64, bf16, default launch
    configurations) against float64, about as accurate as the model's ops (flash SDPA) are."""
    qkv, exact_in, cos, sin, g = _attention_case(torch.bfloat16, T=128, H=8, Dh=64, padded=False, B=16)
    ref_in = qkv.detach().clone().requires_grad_()
    y, ref = rope_attention(qkv, cos, sin, 8), _reference_attention(ref_in, cos, sin, 8)
    exact = _reference_attention(exact_in, cos.double(), sin.double(), 8)
    gb = g.to(torch.bfloat16)
    for out, grad in ((y, gb), (ref, gb), (exact, gb.double())):
        out.backward(grad)
    assert _rel(y, exact) < 1.5 * _rel(ref, exact) + 1e-3
    assert _rel(qkv.grad, exact_in.grad) < 1.5 * _rel(ref_in.grad, exact_in.grad) + 1e-3


def test_rope_attention_rejects_bad_shapes():
    cos, sin = rope_angles(8, 16, 10000.0, DEV)
    with pytest.raises(ValueError, match="num_heads"):
        rope_attention(torch.randn(1, 8, 3 * 32, device=DEV), cos, sin, 3)
    with pytest.raises(ValueError, match="tables"):
        rope_attention(torch.randn(1, 8, 3 * 32, device=DEV), cos[:4], sin[:4], 2)
    with pytest.raises(ValueError, match="power-of-two head width"):
        rope_attention(torch.randn(1, 8, 3 * 48, device=DEV), cos, sin, 2)
    long_cos, long_sin = rope_angles(129, 16, 10000.0, DEV)
    with pytest.raises(ValueError, match="T <= 128"):
        rope_attention(torch.randn(1, 129, 3 * 32, device=DEV), long_cos, long_sin, 2)


# -- the FFN with GELU in its GEMMs' epilogues -------------------------------------------------
def _ffn_case(N, D, F_, seed=5):
    torch.manual_seed(seed)
    d1, d2 = torch.nn.Linear(D, F_).to(DEV), torch.nn.Linear(F_, D).to(DEV)
    with torch.no_grad():
        for lin in (d1, d2):
            lin.bias.normal_(0.0, 0.5)                 # GELU's curved part, and a bias gradient
    ref1, ref2 = (torch.nn.Linear(lin.in_features, lin.out_features).to(DEV) for lin in (d1, d2))
    ref1.load_state_dict(d1.state_dict())
    ref2.load_state_dict(d2.state_dict())
    x = (2 * torch.randn(N, D, device=DEV)).requires_grad_()
    return (x, d1, d2), (x.detach().clone().requires_grad_(), ref1, ref2)


def _ffn_grads(x, d1, d2, g, fused, autocast=False):
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
        y = fmlp.fused_ffn(x, d1, d2) if fused else d2(F.gelu(d1(x), approximate="tanh"))
    y.backward(g)
    return [y, x.grad, d1.weight.grad, d1.bias.grad, d2.weight.grad, d2.bias.grad]


@pytest.mark.parametrize("N,D,F_", [(40, 48, 80), (64, 32, 128)])   # ragged tiles; whole tiles
def test_mlp_fp32_matches_the_ffn(monkeypatch, N, D, F_):
    """fp32: output and every gradient (x, W1, b1, W2, b2) against the model's FFN ops; 32 x 32 x
    16 tiles: several row, column and K tiles, the first shape with partial ones (masked loads,
    masked epilogue, bias-gradient partials of a partial row block)."""
    monkeypatch.setitem(fmlp.GEMM, "block_m", 32)
    monkeypatch.setitem(fmlp.GEMM, "block_n", 32)
    monkeypatch.setitem(fmlp.GEMM, "block_k", 16)
    (x, d1, d2), (xr, r1, r2) = _ffn_case(N, D, F_)
    g = torch.randn(N, D, device=DEV)
    got, want = _ffn_grads(x, d1, d2, g, True), _ffn_grads(xr, r1, r2, g, False)
    for name, a, b in zip(("y", "dx", "dW1", "db1", "dW2", "db2"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert _rel(a, b) < FP32_REL, (name, _rel(a, b))


def test_mlp_bf16_as_accurate_as_the_ffn(monkeypatch):
    """Under bf16 autocast, against float64: as accurate as the reference's bf16 ops (the kernel
    rounds h, g and dh where they do, and keeps dg in fp32, where the reference rounds it)."""
    monkeypatch.setitem(fmlp.GEMM, "block_m", 32)
    monkeypatch.setitem(fmlp.GEMM, "block_n", 32)
    monkeypatch.setitem(fmlp.GEMM, "block_k", 16)
    (x, d1, d2), (xr, r1, r2) = _ffn_case(48, 64, 96)
    exact = [t.detach().double().requires_grad_() for t in (xr, r1.weight, r1.bias, r2.weight, r2.bias)]
    ye = F.linear(F.gelu(F.linear(exact[0], exact[1], exact[2]), approximate="tanh"), exact[3], exact[4])
    g = torch.randn(48, 64, device=DEV)
    ye.backward(g.double())
    with bf16_round_to_nearest():
        got = _ffn_grads(x, d1, d2, g, True, autocast=True)
    want = _ffn_grads(xr, r1, r2, g, False, autocast=True)
    assert got[0].dtype == want[0].dtype == torch.bfloat16
    assert all(a.dtype == torch.float32 for a in got[1:])           # fp32 masters' gradients
    for name, a, b, e in zip(("y", "dx", "dW1", "db1", "dW2", "db2"), got, want, [ye] + [t.grad for t in exact]):
        assert _rel(a, e) < 1.25 * _rel(b, e) + 2e-3, (name, _rel(a, e), _rel(b, e))


def test_mlp_rejects_mismatched_operands():
    with pytest.raises(ValueError, match="do not multiply"):
        fmlp.fc1_gelu(torch.zeros(4, 8, device=DEV), torch.zeros(16, 6, device=DEV), torch.zeros(16, device=DEV))
    with pytest.raises(ValueError, match="cast both first"):
        fmlp.fc1_gelu(torch.zeros(4, 8, device=DEV), torch.zeros(16, 8, device=DEV, dtype=torch.bfloat16),
                      torch.zeros(16, device=DEV))


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a CUDA GPU")
def test_mlp_full_shape_on_gpu_bf16():
    """The compiled GEMMs at the model's FFN shape (8192 tokens, D=512, F=2048, default tiles)
    under bf16 autocast, against float64, about as accurate as cuBLAS + the GELU ops are."""
    (x, d1, d2), (xr, r1, r2) = _ffn_case(8192, 512, 2048)
    exact = [t.detach().double().requires_grad_() for t in (xr, r1.weight, r1.bias, r2.weight, r2.bias)]
    ye = F.linear(F.gelu(F.linear(exact[0], exact[1], exact[2]), approximate="tanh"), exact[3], exact[4])
    g = torch.randn(8192, 512, device=DEV)
    ye.backward(g.double())
    got = _ffn_grads(x, d1, d2, g, True, autocast=True)
    want = _ffn_grads(xr, r1, r2, g, False, autocast=True)
    for name, a, b, e in zip(("y", "dx", "dW1", "db1", "dW2", "db2"), got, want, [ye] + [t.grad for t in exact]):
        assert _rel(a, e) < 1.5 * _rel(b, e) + 2e-3, (name, _rel(a, e), _rel(b, e))
