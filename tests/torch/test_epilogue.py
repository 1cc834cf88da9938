"""perfladder.torch.fused.epilogue: the FFN with its elementwise work in cuBLASLt's epilogues,
and rung B15 that measures it.

cuBLASLt needs a GPU and nvmath-python. On CPU the operators run on ``StandInMatmul`` (PyTorch
ops keeping each epilogue's contract, injected with ``use_backend``): what is tested there is
the wiring -- the transposed layouts, the custom operators and their registered backward,
torch.compile over them, the plan cache -- against the reference FFN, forward and every
gradient. The epilogues' own numerics are the GPU test's, at the end.
"""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from _torch_gate_helpers import BF16_REL, FP32_REL, StubGpuLab, assert_trains_like, one_cacheable_graph, rel

from perfladder.config import get_config
from perfladder.ladder import engine
from perfladder.ladder.rung import Given, NotSupported
from perfladder.torch import GPT, RUNGS
from perfladder.torch.fused import check_fused
from perfladder.torch.fused import epilogue as ep
from perfladder.torch.model import FFN
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import changes as ch

SMOKE = get_config("smoke")
CFG = SMOKE.gpt()
ON_GPU = torch.cuda.is_available()


def ffn_pair(seed: int = 0, width: int | None = None):
    """The reference FFN and the epilogue one with the same weights (biases non-zero: the
    model initialises them to zero, which would hide a bias added twice or not at all)."""
    cfg = CFG if width is None else dataclasses.replace(CFG, num_hiddens=width, num_heads=1, pos="learned")
    torch.manual_seed(seed)
    ref = FFN(cfg)
    with torch.no_grad():
        ref.dense1.bias.normal_(0, 0.5)
        ref.dense2.bias.normal_(0, 0.5)
    epi = FFN(cfg, epilogue=True)
    epi.load_state_dict(ref.state_dict())
    return ref, epi


def forward_backward(module, fn, x, dy, bf16: bool) -> list[torch.Tensor]:
    """``[y, dx, dW1, db1, dW2, db2]`` of ``fn(x)`` (``fn``: the module or its compiled self)."""
    x = x.clone().requires_grad_()
    for p in module.parameters():
        p.grad = None
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        y = fn(x)
    y.backward(dy.to(y.dtype))
    return [y.detach(), x.grad] + [p.grad for p in module.parameters()]


def inputs(width: int = CFG.num_hiddens, lead=(3, 5)):
    g = torch.Generator().manual_seed(1)
    return torch.randn(*lead, width, generator=g), torch.randn(*lead, width, generator=g)


def assert_matches(got, want, tol):
    names = ["y", "dx", "dW1", "db1", "dW2", "db2"]
    for n, a, b in zip(names, got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (n, a.dtype, b.dtype, a.shape, b.shape)
        assert rel(a, b) <= tol, (n, rel(a, b))


# -- the operators against the reference FFN ---------------------------------------------------
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_eager_forward_and_gradients_match_the_reference(bf16):
    ref, epi = ffn_pair()
    x, dy = inputs()
    want = forward_backward(ref, ref, x, dy, bf16)
    with ep.use_backend(ep.STAND_IN):
        got = forward_backward(epi, epi, x, dy, bf16)
    assert_matches(got, want, BF16_REL if bf16 else FP32_REL)


def test_compiled_forward_and_gradients_match_the_reference():
    """torch.compile over the operators (one opaque node each, the backward registered on the
    forward operator), fp32 and then bf16 under autocast, against the eager reference."""
    ref, epi = ffn_pair()
    x, dy = inputs()
    compiled = torch.compile(epi, dynamic=False, fullgraph=True)     # no graph break
    with ep.use_backend(ep.STAND_IN) as plans:
        for bf16 in (False, True):
            want = forward_backward(ref, ref, x, dy, bf16)
            got = forward_backward(epi, compiled, x, dy, bf16)
            assert_matches(got, want, BF16_REL if bf16 else FP32_REL)
    assert plans.planned == 4          # FC1 and FC2's dgrad, in fp32 and in bf16


def test_a_compiled_model_with_the_epilogues_is_cacheable():
    """One dynamo graph with no break, which AOTAutograd's cache accepts (each piece an operator
    with its backward registered on it), so another process can load a B15 step's compile."""
    torch.manual_seed(0)
    model = GPT(CFG, fused=("epilogue",))
    graph = one_cacheable_graph(model, torch.randint(0, CFG.vocab_size, (2, SMOKE.num_steps)))
    assert any("perfladder.epilogue_ffn_fwd" in str(n.target) for n in graph.graph.nodes)


def test_a_width_that_is_not_a_multiple_of_8_pads_the_pre_activation():
    """D = 5 gives F = 20, not a multiple of 8: cuBLASLt's auxiliary h then has 24 rows, which
    travel to the backward unread (the stand-in fills the 4 extra with NaN)."""
    ref, epi = ffn_pair(width=5)
    x, dy = inputs(width=5)
    with ep.use_backend(ep.STAND_IN):
        _, h = ep.fc1_gelu(x.reshape(-1, 5), epi.dense1.weight, epi.dense1.bias)
        got = forward_backward(epi, epi, x, dy, False)
    assert h.shape == (15, 24) and h.is_contiguous()
    assert_matches(got, forward_backward(ref, ref, x, dy, False), FP32_REL)


def test_the_model_option_matches_the_reference_model():
    """GPT(fused=("epilogue",)) computes the plain model's logits and gradients (fp32)."""
    torch.manual_seed(0)
    ref = GPT(CFG)
    epi = GPT(CFG, fused=("epilogue",))
    epi.load_state_dict(ref.state_dict())
    X = torch.randint(0, CFG.vocab_size, (2, SMOKE.num_steps))
    with ep.use_backend(ep.STAND_IN):
        assert_trains_like(ref, epi, X)


# -- plans -----------------------------------------------------------------------------------------
def test_planned_once_per_shape_and_shared_by_the_layers():
    torch.manual_seed(0)
    model = GPT(CFG, fused=("epilogue",))                      # two blocks: one plan for both
    with ep.use_backend(ep.STAND_IN) as plans:
        for batch in (2, 2, 2, 3):
            model(torch.randint(0, CFG.vocab_size, (batch, SMOKE.num_steps))).sum().backward()
            if batch == 2:
                assert plans.planned == 2                          # FC1 forward, FC2's dgrad
        assert plans.planned == 4                                  # the new batch: a new shape
        # no plan keeps a layer's tensors alive between calls
        assert all(mm.a is None and mm.b is None and not mm.inputs for mm in plans.plans.values())
    assert not ep._INJECTED                                        # the backend is put back


def test_later_calls_reset_the_operands_and_do_not_plan_again():
    calls = []

    class Recording(ep.StandInMatmul):
        def plan(self, **kw):
            calls.append("plan")
            super().plan(**kw)

        def reset_operands_unchecked(self, **kw):
            calls.append("reset")
            super().reset_operands_unchecked(**kw)

    backend = type(ep.STAND_IN)(**{**vars(ep.STAND_IN), "Matmul": Recording})
    x, w, b = torch.randn(6, 4), torch.randn(8, 4), torch.randn(8)
    with ep.use_backend(backend):
        first = ep.fc1_gelu(x, w, b)
        again = ep.fc1_gelu(2 * x, w, b)
    assert calls == ["plan", "reset"]
    assert not torch.equal(first[0], again[0])                     # the new operand was used


# -- what it refuses -----------------------------------------------------------------------------
@pytest.fixture
def no_nvmath(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvmath", None)               # import nvmath -> ImportError
    monkeypatch.setattr(ep, "_NVMATH", [])


def test_without_nvmath_the_operators_say_what_to_install(no_nvmath):
    _ref, epi = ffn_pair()
    with pytest.raises(ImportError) as e:
        epi(inputs()[0])
    msg = str(e.value)
    assert "\n" not in msg and "nvmath-python" in msg and "pip install nvmath-python" in msg
    assert "perfladder[kernels]" in msg


def test_the_nvmath_backend_refuses_cpu_tensors():
    plans = ep.Plans(object())                                     # any backend but the stand-in
    with pytest.raises(RuntimeError, match="run on CUDA tensors; got tensors on \\['cpu'\\]"):
        plans.run("GELU_AUX_BIAS", torch.ones(2, 2), torch.ones(2, 2), {"bias": torch.ones(2)})


@pytest.mark.parametrize("pair", [("mlp", "epilogue"), ("gelu", "epilogue")])
def test_epilogue_excludes_the_other_ffn_gelu_options(pair):
    with pytest.raises(ValueError, match="'epilogue'.*use one of them"):
        check_fused(pair)


def test_bad_operands_are_refused():
    with ep.use_backend(ep.STAND_IN):
        with pytest.raises(ValueError, match="do not multiply"):
            ep.fc1_gelu(torch.ones(4, 3), torch.ones(8, 4), torch.ones(8))
        with pytest.raises(ValueError, match="h has shape"):
            ep.fc2_dgelu(torch.ones(4, 3), torch.ones(3, 8), torch.ones(4, 9))


# -- the rung ------------------------------------------------------------------------------------
def test_b15_is_declared_after_b14_as_an_alternative_gpu_rung():
    names = list(RUNGS)
    assert names.index("B15") == names.index("B14") + 1 and names.index("B15") < names.index("R5")
    r = RUNGS["B15"]
    assert r.stage == "beyond" and r.alternative and not r.optional and r.needs_gpu
    assert r.key == "cublaslt_epilogues" and r.change is ch.cublaslt_epilogues
    assert ch.CHANGES["cublaslt_epilogues"] is ch.cublaslt_epilogues
    assert "elementwise: GELU" in r.targets and r.label == "+cuBLASLt FFN epilogues"


@pytest.mark.parametrize("before, after", [
    (("gelu", "attention"), ("attention", "epilogue")),           # B9 and B12 kept
    (("attention", "mlp"), ("attention", "epilogue")),            # B13 kept
    ((), ("epilogue",))])
def test_b15_change_swaps_the_ffn_gelu_for_the_epilogues(before, after):
    recipe = Recipe(batch_size=8, compiled=True, bf16=True, fused=before)
    assert ch.cublaslt_epilogues(recipe, SMOKE).fused == after


def test_the_epilogues_are_not_taken_for_triton_kernels():
    """What a recipe's kernels need of the card (``TorchLab.kernels``): cuBLASLt's epilogues
    need no Triton; the Triton kernels beside them still do."""
    from perfladder.torch.lab import TorchLab
    lab = TorchLab(SMOKE)
    recipe = Recipe(batch_size=8, bf16=True, fused=("epilogue",))
    assert lab.kernels(recipe) == []
    (triton,) = lab.kernels(recipe.replace(fused=("attention", "epilogue")))
    assert triton.compiler == "triton" and triton.what == "our Triton kernels (attention)"


GpuLab = StubGpuLab


def test_b15_without_nvmath_is_refused_in_one_line_as_not_supported(no_nvmath):
    lab = GpuLab()
    rung = RUNGS["B15"]
    with pytest.raises(NotSupported) as e:                           # before any build
        rung.fn(lab, Given(rung=rung, recipe=Recipe.seed(SMOKE)))
    assert e.value.outcome == "not_supported"
    res = engine.run_rung(rung, lab, engine.Chain(RUNGS, lab))      # through the engine
    assert res.outcome == "not_supported" and not res.measured and not res.kept
    assert "\n" not in res.error and "pip install nvmath-python" in res.error
    assert "epilogue" in res.recipe["fused"]                         # what it would have run


class CpuLab(GpuLab):
    on_gpu, device_name = False, "cpu"


def test_b15_on_cpu_is_not_applicable():
    lab = CpuLab()
    res = engine.run_rung(RUNGS["B15"], lab, engine.Chain(RUNGS, lab))
    assert res.outcome == "not_applicable" and res.error.startswith("not applicable on CPU: cuBLASLt")


# -- on a GPU: nvmath's epilogues themselves ---------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="cuBLASLt's epilogues run on a CUDA GPU")
def test_nvmath_epilogues_match_the_reference_ffn_on_cuda():
    """nvmath's GELU_AUX_BIAS and DGELU_BGRAD (cuBLASLt) against the reference FFN, eager and
    compiled, bf16 under autocast and fp32, at the full model's width."""
    pytest.importorskip("nvmath", reason="needs nvmath-python: pip install nvmath-python")
    ref, epi = ffn_pair(width=512)
    ref, epi = ref.cuda(), epi.cuda()
    g = torch.Generator(device="cuda").manual_seed(1)
    x, dy = (torch.randn(4, 128, 512, device="cuda", generator=g) for _ in range(2))

    def run(module, fn, bf16):
        return forward_backward(module, fn, x, dy, bf16)

    before = ep.plans().planned
    for bf16, tol in ((True, BF16_REL), (False, 1e-3)):   # fp32: the reference's may be TF32
        want = run(ref, ref, bf16)
        assert_matches(run(epi, epi, bf16), want, tol)
        assert_matches(run(epi, torch.compile(epi, dynamic=False), bf16), want, tol)
    assert ep.plans().planned - before <= 4                # FC1 and FC2's dgrad, per dtype
