"""The fused-kernel test cases (run by tests/test_torch_fused.py; see there for how).

Each Triton kernel against the reference op, forward and backward, the model options, and
torch.compile over them. On a CUDA GPU they run natively; without one, in Triton's CPU
interpreter, which needs ``TRITON_INTERPRET=1`` in the environment before triton is first
imported (``triton.jit`` decides at decoration, triton's own library functions included).

Tolerances: fp32 inputs agree to ~1e-6 (the same fp32 operations, possibly contracted into
FMAs). bf16 outputs agree to one bf16 rounding step (relative 2^-7 ~ 0.8e-2; the interpreter
rounds fp32 -> bf16 toward zero where torch rounds to nearest, so on CPU a bf16 result can sit
one step away); tests use rtol 1.6e-2 there.
"""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
import torch.nn.functional as F

_ON_GPU = torch.cuda.is_available()
if not _ON_GPU and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("without a CUDA GPU these cases need TRITON_INTERPRET=1 set before triton "
                       "is imported: run tests/test_torch_fused.py, which sets it for them")

from perfladder.config import GPTConfig, get_config  # noqa: E402
from perfladder.torch import GPT  # noqa: E402
from perfladder.torch.fused import attention as fattn  # noqa: E402
from perfladder.torch.fused import check_fused  # noqa: E402
from perfladder.torch.fused import mlp as fmlp  # noqa: E402
from perfladder.torch.fused._launch import (  # noqa: E402
    bf16_round_to_nearest,
    check_device,
    interpreted,
)
from perfladder.torch.fused.add_layer_norm import add_layer_norm, layer_norm  # noqa: E402
from perfladder.torch.fused.attention import rope_attention, rope_attention_fwd  # noqa: E402
from perfladder.torch.fused.gelu import gelu_tanh  # noqa: E402
from perfladder.torch.fused.rope import _rope_fwd_kernel, rope_qkv  # noqa: E402
from perfladder.torch.model import rope_angles, rotate  # noqa: E402

DEV = "cuda" if _ON_GPU else "cpu"
SMOKE = get_config("smoke").gpt()
ALL_ROPE = ("rope", "addnorm", "gelu")             # every option, RoPE by its own kernel
ALL_EPI = ("addnorm", "attention", "mlp")          # every option, GELU inside the FFN's GEMMs
# Triton's dots need K >= 16 on a GPU, and the attention kernel splits a head in halves: there the
# attention cases use heads of 32 (the smoke model: one head), in the interpreter the smoke's 16
SMALL_DH = 32 if _ON_GPU else 16
# fp32 attention against float64, ||diff|| / ||ref||: measured ~2e-7 in the interpreter; a GPU's
# exp2 and log2 are approximations (a few ulp), hence 1e-5 there
FP32_REL = 1e-5 if _ON_GPU else 1e-6
FP32 = dict(atol=2e-6, rtol=1e-5)
BF16 = dict(atol=1e-2, rtol=1.6e-2)


def close(a, b, tol):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    torch.testing.assert_close(a.float(), b.float(), **tol)


# -- RoPE -------------------------------------------------------------------------------------
def _reference_rope(qkv, cos, sin, H):
    B, T, D3 = qkv.shape
    q, k, v = (u.reshape(B, T, H, D3 // 3 // H) for u in qkv.split(D3 // 3, dim=-1))
    return rotate(q, cos, sin), rotate(k, cos, sin), v


@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32), (torch.bfloat16, BF16)])
def test_rope_matches_reference_forward_and_backward(dtype, tol):
    torch.manual_seed(0)
    B, T, H, Dh = 2, 16, 2, 16
    cos, sin = rope_angles(T, Dh, 10000.0, DEV)
    qkv = torch.randn(B, T, 3 * H * Dh, device=DEV, dtype=dtype, requires_grad=True)
    ref_in = qkv.detach().clone().requires_grad_()
    out, ref = rope_qkv(qkv, cos, sin, H), _reference_rope(ref_in, cos, sin, H)
    for o, r in zip(out, ref):
        assert o.shape == (B, T, H, Dh) and o.is_contiguous()
        close(o, r, tol)
    # gradients arrive as SDPA's backward hands them over: (B, H, T, Dh) tensors transposed
    grads = [torch.randn(B, H, T, Dh, device=DEV, dtype=dtype).transpose(1, 2) for _ in range(3)]
    torch.autograd.backward(out, grads)
    torch.autograd.backward(ref, grads)
    close(qkv.grad, ref_in.grad, tol)


def test_rope_rejects_bad_shapes():
    cos, sin = rope_angles(8, 16, 10000.0, DEV)
    with pytest.raises(ValueError, match="num_heads"):
        rope_qkv(torch.randn(1, 8, 3 * 32, device=DEV), cos, sin, 3)
    with pytest.raises(ValueError, match="tables"):
        rope_qkv(torch.randn(1, 8, 3 * 32, device=DEV), cos[:4], sin[:4], 2)


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


# -- residual add + LayerNorm --------------------------------------------------------------------
CASES = [  # (stream dtype, branch dtype, output dtype, tolerance): fp32; bf16 autocast; all bf16
    (torch.float32, torch.float32, torch.float32, FP32),
    (torch.float32, torch.bfloat16, torch.bfloat16, BF16),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16, BF16),
]


@pytest.mark.parametrize("sd,bd,od,tol", CASES)
def test_add_layer_norm_matches_reference(sd, bd, od, tol):
    torch.manual_seed(1)
    B, T, D = 3, 5, 48                                     # D not a power of two: masked columns
    x = torch.randn(B, T, D, device=DEV, dtype=sd, requires_grad=True)
    br = torch.randn(B, T, D, device=DEV, dtype=bd, requires_grad=True)
    w = (1 + 0.1 * torch.randn(D, device=DEV)).requires_grad_()
    b = (0.1 * torch.randn(D, device=DEV)).requires_grad_()
    ref = [t.detach().clone().requires_grad_() for t in (x, br, w, b)]
    h, y = add_layer_norm(x, br, w, b, 1e-5, od)
    rh = ref[0] + ref[1]                                   # the reference's add (promotes)
    ry = F.layer_norm(rh.float(), (D,), ref[2], ref[3], 1e-5).to(od)
    assert h.dtype == rh.dtype and y.dtype == od
    close(h, rh, tol)
    close(y, ry, tol)
    gh, gy = torch.randn_like(h), torch.randn_like(y)
    torch.autograd.backward((h, y), (gh, gy))
    torch.autograd.backward((rh, ry), (gh, gy))
    for got, want in zip((x, br, w, b), ref):
        assert got.grad.dtype == want.grad.dtype
        close(got.grad, want.grad, tol if got.grad.dtype != torch.float32 or sd == torch.float32
              else dict(atol=2e-2, rtol=1e-2))


def test_layer_norm_without_add_and_many_row_blocks(monkeypatch):
    """More row blocks than backward programs: each program loops over several of them, the
    last one partly masked. The interpreter runs the programs one by one, so the test lowers
    the program count instead of raising the row count past the default 1024 programs."""
    import perfladder.torch.fused.add_layer_norm as aln
    monkeypatch.setattr(aln, "BWD_PROGRAMS", 4)
    torch.manual_seed(2)
    rows = aln.BWD_ROWS * (aln.BWD_PROGRAMS + 1) + 2             # 6 row blocks over 4 programs
    x = torch.randn(rows, 32, device=DEV, requires_grad=True)
    w = torch.randn(32, device=DEV, requires_grad=True)
    b = torch.randn(32, device=DEV, requires_grad=True)
    ref = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y, ry = layer_norm(x, w, b, 1e-5), F.layer_norm(ref[0], (32,), ref[1], ref[2], 1e-5)
    close(y, ry, FP32)
    g = torch.randn_like(y)
    y.backward(g)
    ry.backward(g)
    for got, want in zip((x, w, b), ref):
        close(got.grad, want.grad, dict(atol=1e-4, rtol=1e-5))


# -- GELU ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32), (torch.bfloat16, BF16)])
def test_gelu_matches_reference(dtype, tol):
    torch.manual_seed(3)
    h = (3 * torch.randn(5000, device=DEV)).to(dtype).requires_grad_()
    h[:4].data = torch.tensor([0.0, -30.0, 30.0, 1e-3], device=DEV, dtype=dtype)   # tanh limits
    r = h.detach().clone().requires_grad_()
    g, rg = gelu_tanh(h), F.gelu(r, approximate="tanh")
    close(g, rg, tol)
    dg = torch.randn_like(g)
    g.backward(dg)
    rg.backward(dg)
    # 1 - tanh(u)^2 cancels where |tanh(u)| ~ 1: each implementation carries ~1e-7 absolute
    # error there, times h (1 + 3 * 0.044715 h^2) ~ 10, on derivatives that are ~0
    close(h.grad, r.grad, dict(tol, atol=max(tol["atol"], 1e-5)))


# -- options and errors --------------------------------------------------------------------------
def test_check_fused_names_the_choices():
    assert check_fused(()) == () and check_fused("rope") == ("rope",)
    assert check_fused(("gelu", "rope")) == ("rope", "gelu")        # canonical order
    assert check_fused(("attention", "addnorm")) == ("addnorm", "attention")
    with pytest.raises(ValueError, match="valid choices"):
        check_fused(("rope", "flash"))
    with pytest.raises(ValueError, match="subsumes 'rope'"):
        check_fused(("rope", "attention"))
    with pytest.raises(ValueError, match="subsumes 'gelu'"):
        check_fused(("gelu", "mlp"))
    for option in ("rope", "attention"):
        with pytest.raises(ValueError, match="pos='rope'"):
            GPT(GPTConfig(num_hiddens=32, num_blks=1, num_heads=2, pos="learned"), fused=(option,))
    with pytest.raises(ValueError, match="attn_backend must be None"):
        GPT(SMOKE, fused=("attention",), attn_backend="math")


def test_uninterpreted_kernel_refuses_cpu_tensors():
    import triton

    @triton.jit
    def _k(x_ptr):
        pass

    if not interpreted(_k):                      # defined outside TRITON_INTERPRET: a GPU kernel
        with pytest.raises(RuntimeError, match="CUDA tensors"):
            check_device(_k, torch.zeros(2))
    assert interpreted(_rope_fwd_kernel) == (not _ON_GPU)


# -- the model ---------------------------------------------------------------------------------
def _pair(fused, **kw):
    cfg = SMOKE
    if "attention" in fused and _ON_GPU:
        cfg = dataclasses.replace(SMOKE, num_heads=SMOKE.num_hiddens // SMALL_DH)
    torch.manual_seed(0)
    ref = GPT(cfg, **kw).to(DEV)
    model = GPT(cfg, fused=fused, **kw).to(DEV)
    model.load_state_dict(ref.state_dict())
    return ref, model


def _loss_and_grads(model, X, autocast=False):
    model.zero_grad(set_to_none=True)
    with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
        logits = model(X)
    loss = F.cross_entropy(logits.float().flatten(0, 1), X.flatten())
    loss.backward()
    return logits.detach(), {n.removeprefix("_orig_mod."): p.grad.detach().clone()   # compiled: prefixed
                             for n, p in model.named_parameters()}


@pytest.mark.parametrize("fused", [("rope",), ("addnorm",), ("gelu",), ("attention",), ("mlp",),
                                   ALL_ROPE, ALL_EPI])
def test_fused_model_matches_reference_fp32(fused):
    ref, model = _pair(fused)
    X = torch.randint(0, SMOKE.vocab_size, (2, 16), device=DEV)
    lr, gr = _loss_and_grads(ref, X)
    lf, gf = _loss_and_grads(model, X)
    torch.testing.assert_close(lf, lr, atol=1e-5, rtol=1e-5)
    assert gf.keys() == gr.keys()
    for n in gr:
        torch.testing.assert_close(gf[n], gr[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("fused", [ALL_ROPE, ALL_EPI])
def test_fused_model_under_bf16_autocast_and_checkpointing(fused):
    ref, model = _pair(fused, checkpoint=True)
    X = torch.randint(0, SMOKE.vocab_size, (2, 16), device=DEV)
    lr, gr = _loss_and_grads(ref, X, autocast=True)
    lf, gf = _loss_and_grads(model, X, autocast=True)
    assert lf.dtype == lr.dtype == torch.bfloat16
    torch.testing.assert_close(lf.float(), lr.float(), atol=3e-2, rtol=3e-2)
    for n in gr:     # bf16 activations: gradients agree to bf16 precision of their scale
        scale = gr[n].abs().max().item()
        assert (gf[n] - gr[n]).abs().max().item() <= 3e-2 * scale + 1e-6, n


def test_fused_model_with_a_bf16_stream():
    """residual='bf16' composes with the kernels: the fused add+LayerNorm then reads and writes a
    bf16 stream; against the unfused bf16-stream model to bf16 precision."""
    ref, model = _pair(ALL_EPI, residual="bf16")
    X = torch.randint(0, SMOKE.vocab_size, (2, 16), device=DEV)
    lr, gr = _loss_and_grads(ref, X, autocast=True)
    lf, gf = _loss_and_grads(model, X, autocast=True)
    torch.testing.assert_close(lf.float(), lr.float(), atol=3e-2, rtol=3e-2)
    for n in gr:
        scale = gr[n].abs().max().item()
        assert (gf[n] - gr[n]).abs().max().item() <= 3e-2 * scale + 1e-6, n


@pytest.mark.parametrize("autocast,fused", [(False, ALL_ROPE), (True, ALL_EPI)])
def test_fused_model_compiles_without_graph_breaks(autocast, fused):
    """dynamo + AOTAutograd trace the autograd.Functions and their custom ops, under bf16
    autocast too (fullgraph: a graph break would raise); the compiled model computes what the
    eager one does (inductor on a GPU may reorder bf16 arithmetic: bf16 tolerance there)."""
    torch._dynamo.reset()
    _, model = _pair(fused)
    X = torch.randint(0, SMOKE.vocab_size, (2, 16), device=DEV)
    le, ge = _loss_and_grads(model, X, autocast=autocast)
    backend = "inductor" if _ON_GPU else "aot_eager"
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    lc, gc = _loss_and_grads(compiled, X, autocast=autocast)
    tol = dict(atol=3e-2, rtol=3e-2) if autocast else dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(lc.float(), le.float(), **tol)
    for n in ge:
        torch.testing.assert_close(gc[n], ge[n], **tol, msg=n)


@pytest.mark.gpu
@pytest.mark.skipif(not _ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("fused", [ALL_ROPE, ALL_EPI])
def test_fused_full_width_model_on_gpu_bf16(fused):
    """The full-width model, bf16 autocast, compiled: fused vs reference logits and gradients."""
    torch.manual_seed(0)
    cfg = GPTConfig()
    ref = GPT(cfg).cuda()
    model = GPT(cfg, fused=fused).cuda()
    model.load_state_dict(ref.state_dict())
    X = torch.randint(0, cfg.vocab_size, (8, 128), device="cuda")
    lr, gr = _loss_and_grads(torch.compile(ref), X, autocast=True)
    lf, gf = _loss_and_grads(torch.compile(model), X, autocast=True)
    torch.testing.assert_close(lf.float(), lr.float(), atol=5e-2, rtol=3e-2)
    for n in gr:
        scale = gr[n].abs().max().item()
        assert (gf[n] - gr[n]).abs().max().item() <= 3e-2 * scale + 1e-6, n
