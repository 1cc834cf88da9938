"""perfladder.torch.fused.gemm: the model's GEMMs through cuBLASLt plans autotuned once per shape
(fused 'gemm', rung B17) and with the bias gradients in the weight-gradient GEMMs' epilogue
(fused 'gemm_bgrad', rung B18).

On CPU the operators run on ``fused.epilogue.StandInMatmul`` (PyTorch ops keeping each
epilogue's contract and nvmath's result-layout rule): what is tested there is the wiring -- the
operand arrangements, the custom operators and their registered backward, torch.compile over
them, the plans made and autotuned once per shape -- against ``F.linear`` and the plain model,
forward and every gradient. cuBLASLt's own numerics are the GPU test's, at the end.
"""
from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from _torch_gate_helpers import BF16_REL, FP32_REL, StubGpuLab, assert_trains_like, one_cacheable_graph, rel

from perfladder.config import get_config
from perfladder.ladder import engine
from perfladder.ladder.rung import Given, NotSupported
from perfladder.torch import GPT, RUNGS
from perfladder.torch.fused import check_fused, gemm
from perfladder.torch.fused import epilogue as ep
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import changes as ch

SMOKE = get_config("smoke")
CFG = SMOKE.gpt()
ON_GPU = torch.cuda.is_available()


def linear_and_grads(fn, x, w, b, dy, bf16: bool):
    """``[y, dx, dW(, db)]`` of ``fn(x, w, b)`` under bf16 autocast or not."""
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, *([b] if b is not None else []))]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        y = fn(leaves[0], leaves[1], leaves[2] if b is not None else None)
    y.backward(dy.to(y.dtype))
    return [y.detach()] + [t.grad for t in leaves]


def operands(bias=True, lead=(3, 5), K=8, O=12):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(*lead, K, generator=g), torch.randn(O, K, generator=g)
    b = torch.randn(O, generator=g) if bias else None
    return x, w, b, torch.randn(*lead, O, generator=g)


# -- the operators against F.linear --------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("bgrad", [False, True], ids=["sum", "bgradb"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_forward_and_gradients_match_f_linear(bias, bgrad, bf16):
    x, w, b, dy = operands(bias)
    want = linear_and_grads(F.linear, x, w, b, dy, bf16)
    with ep.use_backend(ep.STAND_IN) as plans:
        got = linear_and_grads(lambda *a: gemm.linear(*a, bgrad=bgrad), x, w, b, dy, bf16)
    for n, a, c in zip(["y", "dx", "dW", "db"], got, want):
        assert a.dtype == c.dtype and a.shape == c.shape, (n, a.dtype, c.dtype)
        assert rel(a, c) <= (BF16_REL if bf16 else FP32_REL), (n, rel(a, c))
    assert got[0].is_contiguous()                                   # the row-major result, no copy
    epilogs = {key[0] for key in plans.plans}
    assert epilogs == {"BIAS" if bias else None, None, "BGRADB" if bias and bgrad else None}
    assert plans.tuned == plans.planned == len(plans.plans)         # every plan autotuned, once


def test_each_result_comes_out_row_major_without_a_copy():
    """nvmath's result is column-major when its epilogue asks (BIAS, BGRADB), else in operand
    a's order: each GEMM's operands are arranged so that the result is the row-major tensor the
    model wants (the stand-in keeps the rule)."""
    x, w, b, dy = (t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t for t in operands())
    with ep.use_backend(ep.STAND_IN):
        outs = [gemm.linear_fwd(x, w, b, False), gemm.linear_fwd(x, w, None, False),
                gemm.dgrad(dy, w), gemm.wgrad(dy, x), *gemm.wgrad_bgrad(dy, x)]
    assert all(t.is_contiguous() for t in outs)
    assert [tuple(t.shape) for t in outs] == [(15, 12), (15, 12), (15, 8), (12, 8), (12, 8), (12,)]


def test_bad_operands_are_refused_in_one_line():
    with ep.use_backend(ep.STAND_IN):
        with pytest.raises(ValueError, match="gemm_linear: shapes \\(4, 3\\) and \\(8, 4\\) do not multiply"):
            gemm.linear_fwd(torch.ones(4, 3), torch.ones(8, 4), None, False)
        with pytest.raises(ValueError, match="input dtype torch.bfloat16 != weight dtype torch.float32"):
            gemm.dgrad(torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(8, 3))


# -- the model option ------------------------------------------------------------------------------
@pytest.mark.parametrize("option", gemm.GEMM_OPTIONS)
def test_the_model_option_matches_the_plain_model(option):
    """GPT(fused=(option,)): every nn.Linear and the tied LM head through the operators, the
    parameters and their names unchanged; logits and every gradient as the plain model's."""
    torch.manual_seed(0)
    ref = GPT(CFG)
    with torch.no_grad():                                           # biases zero at init would hide a lost db
        for m in ref.modules():
            if isinstance(m, torch.nn.Linear):
                m.bias.normal_(0, 0.5)
    model = GPT(CFG, fused=(option,))
    model.load_state_dict(ref.state_dict())
    assert list(model.state_dict()) == list(ref.state_dict())
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(isinstance(m, gemm.TunedLinear) and m.bgrad == (option == "gemm_bgrad")
                           for m in linears)
    X = torch.randint(0, CFG.vocab_size, (2, SMOKE.num_steps))
    with ep.use_backend(ep.STAND_IN) as plans:
        assert_trains_like(ref, model, X)
    # per block QKV, W_o, FC1, FC2 and the head: 5 forward, 5 input- and 5 weight-gradient shapes,
    # the layers of both blocks sharing theirs
    assert plans.planned == 15 and plans.tuned == 15
    assert sum(key[0] == "BGRADB" for key in plans.plans) == (4 if option == "gemm_bgrad" else 0)


def test_planned_and_autotuned_once_per_shape():
    calls = []

    class Recording(ep.StandInMatmul):
        def autotune(self, iterations=10):
            calls.append(iterations)
            super().autotune(iterations)

    backend = type(ep.STAND_IN)(**{**vars(ep.STAND_IN), "Matmul": Recording})
    torch.manual_seed(0)
    model = GPT(CFG, fused=("gemm",))
    with ep.use_backend(backend) as plans:
        for batch in (2, 2, 3):
            model(torch.randint(0, CFG.vocab_size, (batch, SMOKE.num_steps))).sum().backward()
            if batch == 2:
                assert plans.planned == 15
        assert plans.planned == 30                                  # the new batch: new shapes
        assert all(mm.a is None and mm.b is None for mm in plans.plans.values())   # nothing kept alive
    assert calls == [gemm.AUTOTUNE_ITERATIONS] * 30


def test_a_compiled_model_with_the_tuned_gemms_is_one_cacheable_graph():
    torch.manual_seed(0)
    model = GPT(CFG, fused=("gemm_bgrad",))
    graph = one_cacheable_graph(model, torch.randint(0, CFG.vocab_size, (2, SMOKE.num_steps)))
    assert sum("perfladder.gemm_linear" in str(n.target) for n in graph.graph.nodes) == 9   # 4 x 2 + head


def test_compiled_under_autocast_matches_eager():
    torch.manual_seed(0)
    model = GPT(CFG, fused=("gemm_bgrad",))
    X = torch.randint(0, CFG.vocab_size, (2, SMOKE.num_steps))

    def run(fn):
        model.zero_grad()   # gradients set to None (the default)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(X)
        F.cross_entropy(y.float().flatten(0, 1), X.flatten()).backward()
        return [y.detach()] + [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    with ep.use_backend(ep.STAND_IN):
        eager = run(model)
        compiled = run(torch.compile(model, fullgraph=True))             # inductor, as the rungs compile
    assert eager[0].dtype == torch.bfloat16
    for a, b in zip(compiled, eager):
        assert rel(a, b) <= BF16_REL


@pytest.mark.parametrize("pair", [("gemm", "gemm_bgrad")])
def test_the_two_gemm_options_exclude_each_other(pair):
    with pytest.raises(ValueError, match="'gemm_bgrad' is 'gemm' with.*use one of them"):
        check_fused(pair)


# -- the rungs ---------------------------------------------------------------------------------------
def test_b16_to_b18_follow_b15_as_gpu_rungs():
    names = list(RUNGS)
    assert names[names.index("B15") + 1:names.index("R5")] == ["B16", "B17", "B18"]
    for name, key, change in (("B16", "fused_cuda_graphs", ch.fused_cuda_graphs),
                              ("B17", "tuned_gemms", ch.tuned_gemms),
                              ("B18", "gemm_bias_grads", ch.gemm_bias_grads)):
        r = RUNGS[name]
        assert r.stage == "beyond" and not r.optional and r.needs_gpu, name
        # B17 and B18 are other implementations of GEMMs the step already runs: a multi-GPU rank
        # that no ladder handed a configuration does not assume them (or nvmath-python)
        assert r.alternative == (name != "B16"), name
        assert r.key == key and r.change is change and ch.CHANGES[key] is change
    assert RUNGS["B17"].targets == ("matmul",)
    assert set(RUNGS["B18"].targets) == {"matmul", "layernorm/reductions"}


@pytest.mark.parametrize("before, b17, b18", [
    (("gelu", "attention"), ("gelu", "attention", "gemm"), ("gelu", "attention", "gemm_bgrad")),
    (("attention", "gemm"), ("attention", "gemm"), ("attention", "gemm_bgrad")),          # B17 kept
    (("gemm_bgrad",), ("gemm",), ("gemm_bgrad",))])
def test_b17_and_b18_changes(before, b17, b18):
    recipe = Recipe(batch_size=8, compiled=True, bf16=True, fused=before)
    assert ch.tuned_gemms(recipe, SMOKE).fused == b17
    assert ch.gemm_bias_grads(recipe, SMOKE).fused == b18
    graphs = ch.fused_cuda_graphs(recipe, SMOKE)
    assert graphs.cudagraphs and graphs.mode == "reduce-overhead" and graphs.fused == before


def test_the_tuned_gemms_are_not_taken_for_triton_kernels():
    from perfladder.torch.lab import TorchLab
    lab = TorchLab(SMOKE)
    assert lab.kernels(Recipe(batch_size=8, bf16=True, fused=("gemm_bgrad",))) == []


GpuLab = StubGpuLab


class CpuLab(GpuLab):
    on_gpu, device_name = False, "cpu"


@pytest.fixture
def no_nvmath(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvmath", None)               # import nvmath -> ImportError
    monkeypatch.setattr(ep, "_NVMATH", [])


def test_without_nvmath_the_model_says_what_to_install(no_nvmath):
    model = GPT(CFG, fused=("gemm",))
    with pytest.raises(ImportError) as e:
        model(torch.randint(0, CFG.vocab_size, (2, SMOKE.num_steps)))
    assert "\n" not in str(e.value) and "pip install nvmath-python" in str(e.value)


@pytest.mark.parametrize("name", ["B17", "B18"])
def test_b17_b18_without_nvmath_are_refused_in_one_line_as_not_supported(no_nvmath, name):
    lab = GpuLab()
    rung = RUNGS[name]
    with pytest.raises(NotSupported):                               # before any build
        rung.fn(lab, Given(rung=rung, recipe=Recipe.seed(SMOKE)))
    res = engine.run_rung(rung, lab, engine.Chain(RUNGS, lab))
    assert res.outcome == "not_supported" and not res.measured and not res.kept
    assert "\n" not in res.error and "pip install nvmath-python" in res.error
    assert "autotuned cuBLASLt GEMMs" in res.error and "FFN" not in res.error


@pytest.mark.parametrize("name", ["B17", "B18"])
def test_b17_b18_on_cuda_graphs_are_refused_in_one_line_before_any_build(name):
    # B16 kept: an nvmath plan's workspace first allocated in a CUDA-graph tree's pool is refused
    # by the tree at record time, so the rung stops before it builds or plans anything
    lab = GpuLab()
    rung = RUNGS[name]
    base = Recipe.seed(SMOKE).replace(compiled=True, cudagraphs=True)
    with pytest.raises(NotSupported) as e:
        rung.fn(lab, Given(rung=rung, recipe=rung.change(base, SMOKE)))
    assert "\n" not in str(e.value) and "CUDA graph" in str(e.value)


@pytest.mark.parametrize("name", ["B16", "B17", "B18"])
def test_on_cpu_they_are_not_applicable(name):
    lab = CpuLab()
    res = engine.run_rung(RUNGS[name], lab, engine.Chain(RUNGS, lab))
    assert res.outcome == "not_applicable" and res.error.startswith("not applicable on CPU: ")


# -- on a GPU: nvmath's plans, and the fused step captured -----------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="cuBLASLt's GEMMs run on a CUDA GPU")
@pytest.mark.parametrize("option", gemm.GEMM_OPTIONS)
def test_tuned_gemms_match_the_plain_model_on_cuda(option):
    """The full-width model (B14's bf16 stream) with every GEMM through nvmath's autotuned plans,
    compiled, bf16 under autocast, against the plain compiled model."""
    pytest.importorskip("nvmath", reason="needs nvmath-python: pip install nvmath-python")
    from perfladder.config import GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig()
    ref = GPT(cfg, residual="bf16").cuda()
    model = GPT(cfg, fused=(option,), residual="bf16").cuda()
    model.load_state_dict(ref.state_dict())
    X = torch.randint(0, cfg.vocab_size, (8, 128), device="cuda")

    def run(m, fn):
        m.zero_grad()   # gradients set to None (the default)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn(X)
        F.cross_entropy(y.float().flatten(0, 1), X.flatten()).backward()
        return [y.detach()] + [p.grad for p in m.parameters()]

    for a, b in zip(run(model, torch.compile(model)), run(ref, torch.compile(ref))):
        assert rel(a, b) <= 3e-2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("fused", [("gelu", "attention"), ("gelu", "attention", "gemm_bgrad")],
                         ids=["B14", "B14+gemm_bgrad"])
def test_the_fused_step_is_captured_as_cuda_graphs(fused):
    """B16 on the GPU: the full-width fused step compiled with mode='reduce-overhead' is captured
    (inductor skips no graph), and a replay on new tokens computes what the uncaptured step does
    on them (an operator whose kernel ran outside the graph would replay stale results)."""
    if "gemm_bgrad" in fused:
        pytest.importorskip("nvmath", reason="needs nvmath-python: pip install nvmath-python")
    from torch._dynamo.utils import counters

    from perfladder.config import GPTConfig
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg, fused=fused, residual="bf16").cuda()
    first, other = (torch.randint(0, cfg.vocab_size, (8, 128), device="cuda") for _ in range(2))

    def step(fn, X):
        model.zero_grad()   # gradients set to None (the default)
        torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = fn(X)
        F.cross_entropy(y.float().flatten(0, 1), X.flatten()).backward()
        return [y.detach().clone()] + [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    counters.clear()
    want = step(torch.compile(model), other)
    graphed = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):                                              # warm-up, capture, replay
        step(graphed, first)
    got = step(graphed, other)                                      # a replay on other tokens
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    for a, b in zip(got, want):
        assert rel(a, b) <= 1e-2


# -- the rungs' gates, on the stand-in --------------------------------------------------------------
def _trial(option, backend=ep.STAND_IN):
    from perfladder.torch.lab import TorchLab
    from perfladder.torch.rungs import beyond as bz
    lab = TorchLab(SMOKE)
    recipe = Recipe(batch_size=SMOKE.batch_size, bf16=True, fused=(option,))
    with ep.use_backend(backend):
        return bz.gated()(lab, Given(rung=RUNGS["B17"], recipe=recipe))


@pytest.mark.parametrize("option", gemm.GEMM_OPTIONS)
def test_the_rung_measurement_passes_every_gate_with_its_gemms_counted(option):
    """What B17 / B18 run (``gated()``: the model gate, the loss gate, the receipt) on the smoke
    config, eager bf16, the GEMMs on the stand-in: every gate passes, and the receipt counts our
    GEMM operators as bf16 matmuls (they are all the step's matmuls: without them it would see
    none and refuse the step)."""
    ev = _trial(option)
    assert [g.passed for g in ev.gates] == [True, True]
    assert ev.receipt.observed["matmul_operands"] == "bfloat16"


class WrongBiasGradient(ep.StandInMatmul):
    def execute(self):
        out = super().execute()
        if self.epilog is ep.StandInEpilog.BGRADB:
            out[1]["bgradb"] = 2 * out[1]["bgradb"]
        return out


@pytest.mark.planted
def test_a_wrong_bias_gradient_in_the_epilogue_is_caught_by_the_model_gate():
    from perfladder.measure.gates import GateError
    backend = type(ep.STAND_IN)(**{**vars(ep.STAND_IN), "Matmul": WrongBiasGradient})
    with pytest.raises(GateError, match="model gate|gradient"):
        _trial("gemm_bgrad", backend)
