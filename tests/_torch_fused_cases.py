"""The fused-kernel test cases (run by tests/torch/test_fused.py; see there for how); the
attention and FFN-epilogue kernels' own cases are in tests/_torch_fused_attention_cases.py.

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
from perfladder.torch.fused import check_fused  # noqa: E402
from perfladder.torch.fused._launch import (  # noqa: E402
    check_device,
    interpreted,
)
from perfladder.torch.fused.add_layer_norm import add_layer_norm, layer_norm  # noqa: E402
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
    """dynamo + AOTAutograd trace the custom ops and their registered backwards, under bf16
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


class _Wrapped(torch.autograd.Function):
    """The pattern the kernels left: an autograd.Function around an operator."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def _dynamo_graph(fn, *args):
    """The FX graph dynamo hands its backend for ``fn(*args)``: what AOTAutograd's cache keys."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    return graphs[0]


@pytest.mark.parametrize("fused", [ALL_ROPE, ALL_EPI])
def test_a_compiled_model_with_the_kernels_is_cacheable(fused):
    """AOTAutograd's cache accepts the graph of a model with every kernel (each is an operator
    with its backward registered on it), so a rung's compiled step can be loaded by another
    process (perfladder.ahead.torch); an autograd.Function in the graph is refused."""
    from torch._functorch._aot_autograd.autograd_cache import (
        BypassAOTAutogradCache,
        check_cacheable,
    )
    _, model = _pair(fused)
    X = torch.randint(0, SMOKE.vocab_size, (2, 16), device=DEV)
    check_cacheable(_dynamo_graph(lambda x: model(x).sum(), X))
    with pytest.raises(BypassAOTAutogradCache, match="autograd_function_apply"):
        check_cacheable(_dynamo_graph(lambda x: _Wrapped.apply(x).sum(), X.float().requires_grad_()))


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


# -- CUDA graphs over the fused step (B16) -----------------------------------------------------------
B14_FUSED = ("gelu", "attention")            # the kernels of the fastest configuration so far (B14)


def _aot_graphs(fn, *args):
    """The forward and backward graphs AOTAutograd hands inductor for ``fn(*args).sum()`` and its
    backward (what inductor's CUDA-graph check reads)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    compiled(*args).float().sum().backward()
    assert len(graphs) == 2, len(graphs)
    return graphs


def _refused_by_cuda_graphs(gm):
    """The first node of ``gm`` that would make inductor skip CUDA graphs (an op tagged
    cudagraph-unsafe or forbidden, such as a host sync; a data-dependent shape), or None."""
    from torch._inductor.utils import get_first_incompatible_cudagraph_node
    node = get_first_incompatible_cudagraph_node(gm)
    return None if node is None else str(node.target)


@pytest.mark.parametrize("fused", [(*B14_FUSED, "gemm_bgrad"), ALL_ROPE, ALL_EPI, ("attention", "epilogue")],
                         ids=["B14+gemm_bgrad", "all_rope", "all_epi", "B15"])
def test_the_fused_step_holds_nothing_cuda_graphs_refuse(fused):
    """B16 replays the fused step as CUDA graphs (mode='reduce-overhead'): under bf16 autocast
    with a bf16 stream, as B14 runs, the model compiles whole (fullgraph) and neither its forward
    nor its backward graph holds anything inductor's CUDA-graph check would refuse; our
    operators are in the graphs, as opaque nodes (each declared functional: mutates_args=()).
    What this cannot check on CPU: host work inside an operator during a capture (the GPU
    test captures it)."""
    from perfladder.torch.fused import epilogue as ep
    torch.manual_seed(0)
    model = GPT(SMOKE, fused=fused, residual="bf16").to(DEV)
    X = torch.randint(0, SMOKE.vocab_size, (2, 16), device=DEV)

    def fwd(x):
        with torch.autocast(DEV, dtype=torch.bfloat16):
            return model(x)
    with ep.use_backend(ep.STAND_IN):
        graphs = _aot_graphs(fwd, X)
    for gm in graphs:
        assert _refused_by_cuda_graphs(gm) is None, (_refused_by_cuda_graphs(gm), fused)
    ops = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert any(op.startswith("perfladder.") for op in ops), sorted(ops)


@torch.library.custom_op("perfladder_test::host_sync", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def _host_sync(x: torch.Tensor) -> torch.Tensor:
    return x * 2


_host_sync.register_fake(lambda x: torch.empty_like(x))
_host_sync.register_autograd(lambda ctx, g: g * 2)


def test_the_cuda_graph_check_finds_an_unsafe_op():
    """Planted: an operator tagged cudagraph-unsafe is what the check above reports."""
    fw, _ = _aot_graphs(lambda t: _host_sync(t), torch.randn(4, requires_grad=True))
    assert "host_sync" in _refused_by_cuda_graphs(fw)
