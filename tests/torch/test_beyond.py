"""perfladder.torch.rungs.beyond: the B rungs of the shared smoke ladder (conftest.py), their gates
and chaining, the one-hot embedding, the kernel report, and the bad inputs they refuse."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.kernels import KernelBreakdown
from perfladder.ladder.engine import check_rungs
from perfladder.measure.gates import EMBED_ATOL, EMBED_GRAD_RTOL, GATE_STEPS, LOSS_RTOL
from perfladder.measure.verdict import REGIMES, VERDICTS
from perfladder.torch import GPT, RUNGS, Ladder, MirrorError, TorchLab, run_ladder
from perfladder.torch.checks import embed_gate
from perfladder.torch.kernels import BACKENDS, pick_backend
from perfladder.torch.lab import LIBRARY_CODE
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs import beyond as bz
from perfladder.torch.step import make_optimizer, make_step
from perfladder.torch.trial import LossGateError, gate_batches, loss_gate

CFG = get_config("smoke")
# the smoke sizes with head width 32: a GPU's Triton dots need K >= 16 for the fused attention
# kernel's rotate-half halves (the smoke config's 16 runs only in the interpreter)
GPU_KERNEL_CFG = CFG.replace(num_hiddens=64)
ON_GPU = torch.cuda.is_available()
BEYOND = ["B1", "B2", "B3", "B4", "B5", "B6", "B7"]
FUSED = ["B8", "B9", "B10"]
KERNELS = ["B12", "B13"]          # after the optional B11 (not in the smoke run)
LATEST = ["B16", "B17", "B18"]    # CUDA graphs on the fused step, the autotuned cuBLASLt GEMMs
MEASURED = ["B1", "B2", "B4", "B5", "B6", "B14"] + (["B3", *FUSED, *KERNELS] if ON_GPU else [])


@pytest.fixture(scope="module")
def res(torch_smoke_ladder):
    return torch_smoke_ladder.result


@pytest.fixture(scope="module")
def lab():
    """A TorchLab on which nothing has run (cheap: data and state, no model)."""
    return TorchLab(CFG)


# -- the rungs of the smoke run ------------------------------------------------------------------
def test_beyond_rungs_follow_the_seed(res):
    names = [r.name for r in res.rungs]
    assert names[names.index("R4") + 1:names.index("R5")] == BEYOND + FUSED + KERNELS + ["B14", "B15", *LATEST]
    assert "B11" in RUNGS and "B11" not in check_rungs(RUNGS) and RUNGS["B11"].optional
    assert "B11" in check_rungs(RUNGS, optional=True)
    assert check_rungs(RUNGS, ["B11", "R0"]) == ["R0", "B11"]      # named: runs, in ladder order


@pytest.mark.parametrize("name", MEASURED)
def test_measured_beyond_rung_is_well_formed(res, name):
    r = res.rung(name)
    assert r.kind == "rung" and r.stage == "beyond" and r.tokens_per_s > 0
    assert r.timing.settled == CFG.windows and len(r.windows) >= CFG.windows
    assert sorted(r.timing.settled_windows)[1] == pytest.approx(r.tokens_per_s)
    assert r.precision == "bf16" and r.receipt.ok and r.receipt.where.startswith("TrainStep.forward_backward")
    assert r.batch_size == r.recipe["batch_size"] and r.seq_len == CFG.num_steps
    assert r.timing.steps_per_window == CFG.timed_steps(r.batch_size)
    assert r.timing.warmup == CFG.warmup_steps(r.batch_size)
    prev = res.rung(r.builds_on)
    assert r.ratio_prev == pytest.approx(r.tokens_per_s / prev.tokens_per_s)
    assert r.ratio_base == pytest.approx(r.tokens_per_s / res.rung("R0").tokens_per_s)
    assert r.verdict["against"] == r.builds_on and r.verdict["verdict"] in VERDICTS
    assert r.regime["regime"] in REGIMES and r.profile is not None
    assert isinstance(r.kept, bool) and r.compile.first_call_s > 0
    assert (r.memory.bytes is not None) == ON_GPU


def test_cuda_only_rungs_say_so_on_cpu(res):
    if ON_GPU:
        pytest.skip("on a GPU B3 is measured (test_measured_beyond_rung_is_well_formed)")
    r = res.rung("B3")
    assert r.kind == "skipped" and r.tokens_per_s is None and r.windows == [] and r.kept is False
    assert r.error.startswith("not applicable on CPU") and "CUDA graphs" in r.error
    assert r.recipe["cudagraphs"] and r.recipe["mode"] == "reduce-overhead"


def test_b11_is_skipped_on_cpu_without_building_anything(monkeypatch):
    if ON_GPU:
        pytest.skip("on a GPU B11 compiles with max-autotune: test_b3_b11_on_cuda")
    run = Ladder(CFG)
    monkeypatch.setattr(run.lab, "build_step", lambda *a: pytest.fail("built a step"))
    r = run.run("B11")
    assert r.kind == "skipped" and "Triton GEMM templates" in r.error and r.kept is False
    assert r.recipe["mode"] == "max-autotune-no-cudagraphs" and r.builds_on == "R3"
    assert run.fastest() == ("R3", run.chain.recipe_of("R3"))      # nothing kept
    assert [x.name for x in run.result.rungs] == ["B11"]


def test_fused_kernel_rungs_say_so_on_cpu(res):
    if ON_GPU:
        pytest.skip("on a GPU the Triton rungs are measured")
    for name, fused in zip(FUSED, ("rope", "gelu", "addnorm")):
        r = res.rung(name)
        assert r.kind == "skipped" and "interpreter" in r.error and fused in r.recipe["fused"]


def test_each_rung_changes_one_thing_of_the_fastest_so_far(res):
    """Every rung's recipe is the fastest-so-far recipe with one switch changed; the smoke policy
    keeps every added technique and neither B2 nor B7 (choices between implementations), so B4
    builds on B1 (or B3 on a GPU), and on CPU B14 builds on B6 and ends the chain."""
    expected = res.rung("R3").recipe
    assert expected["compiled"] and expected["bf16"] and expected["batch_size"] == CFG.big_batch
    changes = {"B1": {"optimizer": "fused"}, "B2": {"optimizer": "compiled"},
               "B3": {"cudagraphs": True, "mode": "reduce-overhead"}, "B4": {"embed": "onehot"},
               "B5": {"batch_size": 2 * CFG.big_batch}, "B6": {"batch_size": 4 * CFG.big_batch},
               "B7": {"attn_backend": res.rung("B7").details["attention_backend"]}}
    prev = "R3"
    for name in BEYOND:
        r = res.rung(name)
        assert r.builds_on == prev, name
        assert r.recipe == {**expected, **changes[name]}, name
        assert r.kept is (r.measured and not RUNGS[name].alternative), name
        if r.kept:
            expected, prev = r.recipe, name
    assert res.rung("B2").ratio_prev == pytest.approx(res.rung("B2").tokens_per_s
                                                      / res.rung("B1").tokens_per_s)
    assert res.rung("B4").recipe["optimizer"] == "fused"                # B2 was not kept
    assert prev == "B6"
    b14 = res.rung("B14")                 # B8-B13 need a GPU: on CPU B14 builds on B6
    if not ON_GPU:
        assert b14.builds_on == "B6" and b14.recipe == {**expected, "residual": "bf16"}
    last = b14.name if b14.kept else b14.builds_on
    assert res.fastest == last and res.rung(last).kernels is not None    # the fastest


def test_loss_gates_match_the_seed_recipe(res):
    """A few steps from the same init on the same batches: every beyond configuration's losses
    equal the eager seed recipe's within LOSS_RTOL, while the loss itself moves by more."""
    for name in MEASURED + (["B7"] if res.rung("B7").measured else []):
        g = res.rung(name).gate("loss over steps")
        assert g.passed and g.tolerances["max_rel_diff"] == LOSS_RTOL, name
        assert g.detail["steps"] == GATE_STEPS == len(g.detail["losses"]) == len(g.detail["reference_losses"])
        assert 0 <= g.values["max_rel_diff"] <= LOSS_RTOL, (name, g)
        assert g.values["max_rel_diff"] == pytest.approx(
            max(abs(a - b) / b for a, b in zip(g.detail["losses"], g.detail["reference_losses"])))
        first, last = g.detail["losses"][0], g.detail["losses"][-1]
        assert (first - last) / first > LOSS_RTOL, (name, g.detail)
        assert g.reference == "the reference recipe, eager bf16"


def test_the_loss_gate_can_fail(lab):
    """A step that does not update (lr=0) or computes another model is refused before timing."""
    B = CFG.big_batch
    ok = lab.build_step(Recipe(batch_size=B, bf16=True))
    gate = loss_gate(lab, ok, B)
    assert gate.values["max_rel_diff"] == 0.0 and ok.first_call_s["optimizer"] > 0
    frozen = lab.make_model()
    step = make_step(frozen, torch.optim.AdamW(frozen.parameters(), lr=0.0), bf16=True)
    with pytest.raises(LossGateError, match="differ from the reference recipe, eager bf16"):
        loss_gate(lab, step, B)
    other = lab.make_model()
    with torch.no_grad():
        other.norm.weight.mul_(1.5)
    with pytest.raises(LossGateError, match=r"> rtol=0.01"):
        loss_gate(lab, make_step(other, make_optimizer(other, CFG.lr), bf16=True), B)


# -- B4: the one-hot embedding ---------------------------------------------------------------------
def test_onehot_embedding_equals_gather():
    torch.manual_seed(0)
    g = GPT(CFG.gpt())
    o = GPT(CFG.gpt(), embed="onehot")
    o.load_state_dict(g.state_dict())               # same parameter names: checkpoints carry over
    assert [n for n, _ in g.named_parameters()] == [n for n, _ in o.named_parameters()]
    X = torch.randint(0, 28, (4, CFG.num_steps), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(o.embed_tokens(X), g.embed_tokens(X), rtol=0, atol=0)  # exact on CPU
    torch.testing.assert_close(o(X), g(X), rtol=0, atol=1e-6)
    for m in (g, o):
        m(X).logsumexp(-1).mean().backward()
    torch.testing.assert_close(o.token_emb.weight.grad, g.token_emb.weight.grad, rtol=1e-5, atol=1e-8)
    with torch.autocast("cpu", dtype=torch.bfloat16):            # fp32 rows under autocast, as the gather
        assert o.embed_tokens(X).dtype == g.embed_tokens(X).dtype == torch.float32


def test_embed_gate_passes_and_refuses(lab, monkeypatch):
    X = gate_batches(lab, CFG.batch_size)[0][0]
    g = embed_gate(lab, X)
    assert g.passed and g.values["logits_max_abs_diff"] <= EMBED_ATOL
    assert g.values["grad_max_rel_diff"] <= EMBED_GRAD_RTOL
    right = GPT.embed_tokens

    def off_by_a_percent(self, X):       # a planted bug in the one-hot path only
        H = right(self, X)
        return H * 1.01 if self.embed == "onehot" else H
    monkeypatch.setattr(GPT, "embed_tokens", off_by_a_percent)
    with pytest.raises(MirrorError, match="one-hot embedding logits differ"):
        embed_gate(lab, X)


def test_b4_recorded_its_embed_gate(res):
    r = res.rung("B4")
    assert r.recipe["embed"] == "onehot"
    g = r.gate("one-hot vs gather embedding")
    assert g.passed and g.values["logits_max_abs_diff"] <= EMBED_ATOL
    assert [x.name for x in r.gates] == ["model gate", "one-hot vs gather embedding", "loss over steps"]


# -- B5 / B6 / B7 -------------------------------------------------------------------------------------
def test_batch_rungs_scale_the_big_batch(res):
    assert res.rung("B5").batch_size == 2 * CFG.big_batch
    assert res.rung("B6").batch_size == 4 * CFG.big_batch
    for name in ("B5", "B6"):
        r = res.rung(name)
        assert r.timing.steps_per_window == CFG.timed_steps(r.batch_size) >= 2


def test_b7_measured_every_backend_and_pinned_the_fastest(res):
    r = res.rung("B7")
    d = r.details
    t = d["attention_ms"]
    assert set(t) == {"default", *BACKENDS}
    best = d["attention_backend"]
    eligible = {n: v for n, v in t.items() if n not in d["computes_in_fp32"]}
    assert best == pick_backend(eligible) == r.recipe["attn_backend"] and r.label == "pinned attention kernel"
    assert all(t[n]["ms"] >= t[best]["ms"] for n in eligible if n in BACKENDS and t[n]["available"])
    assert d["computes_in_fp32"] == ([] if torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
                                     else ["math"])           # bf16 inputs, fp32 arithmetic
    assert d["default_picks"] == t["default"]["picks"] in (*BACKENDS, None)
    assert d["refused"] == [n for n in BACKENDS if not t[n]["available"]]
    assert r.kept is False                                          # an alternative: never kept
    if r.kind == "skipped":        # PyTorch's own pick was the fastest: nothing to pin
        assert d["default_picks"] == best and "already runs the fastest" in r.error
    else:
        assert r.kind == "rung" and r.gate("loss over steps").values["max_rel_diff"] <= LOSS_RTOL
    if not ON_GPU:
        assert t["math"]["available"] and t["flash"]["available"] and t["default"]["picks"] == "flash"
        assert d["refused"] == ["efficient", "cudnn"] and "No viable backend" in t["cudnn"]["error"]


def test_b7_does_not_remeasure_the_default_kernel(monkeypatch):
    fake = {"default": {"available": True, "ms": 1.0, "picks": "flash"},
            "flash": {"available": True, "ms": 1.0}, "math": {"available": True, "ms": 2.0},
            "efficient": {"available": False, "error": "x"}, "cudnn": {"available": False, "error": "y"}}
    monkeypatch.setattr(bz, "attention_backends", lambda *a, **kw: fake)
    monkeypatch.setattr(bz, "trial", lambda *a, **kw: pytest.fail("measured the default again"))
    run = Ladder(CFG)
    r = run.run("B7")
    assert r.kind == "skipped" and "already runs the fastest kernel (flash)" in r.error
    assert r.details["attention_ms"] is fake and r.recipe["attn_backend"] == "flash"
    assert r.key == "attention_kernel" and r.builds_on == "R3" and r.kept is False


def test_b7_times_each_kernel_with_the_labs_time_attention(lab):
    """A reader's ``time_attention`` (lab.use) is what times every kernel B7 compares: here one
    that makes up each kernel's milliseconds and refuses the kernels it does not know."""
    from perfladder.torch.kernels import attention_backends
    from perfladder.torch.model import ATTN_BACKENDS
    made_up = {ATTN_BACKENDS["math"]: 1.0, ATTN_BACKENDS["flash"]: 3.0, None: 3.0}
    seen = []

    def time_attention(attend, backend=None, reps=20):
        seen.append(backend)
        if backend not in made_up:
            raise RuntimeError(f"{backend} refused (planted)")
        attend()                                       # the real kernel still runs
        return made_up[backend]
    lab.use(time_attention=time_attention)
    try:
        t = attention_backends(lab, 2, reps=1)
    finally:
        lab.use(time_attention=LIBRARY_CODE["time_attention"])
    assert seen == [None, *(ATTN_BACKENDS[n] for n in BACKENDS)]
    assert t["math"]["ms"] == 1.0 and t["flash"]["ms"] == 3.0 and t["default"]["ms"] == 3.0
    assert not t["cudnn"]["available"] and "refused (planted)" in t["cudnn"]["error"]
    assert pick_backend(t) == "math"


# -- the kernel report and the learning check -------------------------------------------------------
def test_kernel_report_on_the_fastest_rung(res):
    fastest = [r for r in res.rungs if r.stage == "beyond" and r.kept][-1]
    kb = KernelBreakdown.from_dict(fastest.kernels)
    assert kb.framework == "torch" and kb.total_us > 0 and kb.steps >= 1
    assert kb.device == ("gpu" if ON_GPU else "cpu")
    assert fastest.kernels["recipe"] == fastest.recipe
    assert "| category | ms/step | share |" in kb.markdown()
    assert [r.name for r in res.rungs if r.kernels] == [fastest.name]
    assert not any("kernel breakdown" in n for n in res.notes)


def test_learning_check_trains_the_fastest_configuration(res):
    fastest = [r for r in res.rungs if r.stage == "beyond" and r.kept][-1]
    assert res.learning.passed and res.learning.steps == CFG.learn_steps
    assert res.learning.configuration == fastest.name


# -- bad inputs --------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_valid_choices(lab):
    with pytest.raises(ValueError, match=r"embed='lookup' is not valid; valid choices: \('gather', 'onehot'\)"):
        GPT(CFG.gpt(), embed="lookup")
    with pytest.raises(ValueError, match="attn_backend='xformers'.*'flash'.*'cudnn'"):
        Recipe(batch_size=8, attn_backend="xformers")
    with pytest.raises(ValueError, match="optimizer='adam8bit'.*'fused'"):
        Recipe(batch_size=8, optimizer="adam8bit")
    with pytest.raises(ValueError, match="batch_size=0"):
        Recipe(batch_size=0)
    with pytest.raises(ValueError, match="cudagraphs / autotune are torch.compile modes"):
        Recipe(batch_size=8, cudagraphs=True)
    with pytest.raises(ValueError, match=r"unknown recipe field\(s\) \['colour'\]; valid choices"):
        Recipe.from_dict({"batch_size": 8, "colour": "red"})
    r = Recipe(batch_size=8, compiled=True, autotune=True)
    assert Recipe.from_dict(r.to_dict()) == r and r.mode == "max-autotune-no-cudagraphs"
    m = GPT(CFG.gpt())
    with pytest.raises(ValueError, match="optimizer='sgd'.*'default', 'fused', 'compiled'"):
        make_optimizer(m, 1e-3, "sgd")
    with pytest.raises(ValueError, match="mode='fast'.*'reduce-overhead'"):
        make_step(m, make_optimizer(m, 1e-3), compiled=True, mode="fast")
    with pytest.raises(ValueError, match="needs compiled=True"):
        make_step(m, make_optimizer(m, 1e-3), mode="max-autotune-no-cudagraphs")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_step(m, make_optimizer(m, 1e-3), compiled=True, mode="reduce-overhead", device_type="cpu")
    with pytest.raises(TypeError, match="Recipe"):
        lab.build_step({"batch_size": 8})
    with pytest.raises(ValueError, match="'B99'; valid choices: .*B7, B8, .*R5"):
        run_ladder(CFG, rungs=["B99"])
    with pytest.raises(RuntimeError, match="no attention backend"):
        pick_backend({"flash": {"available": False, "error": "x"}, "default": {"available": True, "ms": 1}})


# -- on a GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and Triton templates need a CUDA GPU")
def test_b3_b11_on_cuda():
    run = Ladder(CFG)
    r3 = run.run("B3")
    assert r3.kind == "rung", r3.error
    assert r3.recipe["mode"] == "reduce-overhead" and r3.memory.bytes > 0
    assert r3.gate("loss over steps").values["max_rel_diff"] <= LOSS_RTOL and r3.receipt.ok
    r11 = run.run("B11")
    assert r11.kind == "rung", r11.error
    assert r11.recipe["mode"] in ("max-autotune", "max-autotune-no-cudagraphs")
    X = gate_batches(run.lab, CFG.batch_size)[0][0]
    assert embed_gate(run.lab, X).values["logits_max_abs_diff"] <= EMBED_ATOL   # TF32 off inside the gate


# -- failures are loud, not fatal ------------------------------------------------------------------------------
def test_a_failing_rung_is_a_loud_skip(monkeypatch, capsys):
    def boom(*a, **kw):
        raise RuntimeError("CUDA out of memory (planted)")
    monkeypatch.setattr(bz, "trial", boom)
    run = Ladder(CFG)
    r = run.run("B1")
    assert r.kind == "skipped" and r.tokens_per_s is None and r.kept is False
    assert r.error == "RuntimeError: CUDA out of memory (planted)" and r.builds_on == "R3"
    assert "boom" in r.details["traceback"] and r.recipe["optimizer"] == "fused"
    assert "perfladder: torch B1 (+fused AdamW) not measured: RuntimeError" in capsys.readouterr().err
    assert run.fastest() == ("R3", run.chain.recipe_of("R3"))          # nothing kept


def test_a_failing_kernel_report_does_not_end_the_ladder(monkeypatch, capsys):
    import perfladder.torch.kernels as tk

    def broken(*a, **kw):
        raise RuntimeError("the profile of 2 steps recorded no CUDA kernels (planted)")
    monkeypatch.setattr(tk, "kernel_breakdown", broken)
    run = Ladder(CFG)
    assert run.kernel_report() is None
    assert any(n.startswith("kernel breakdown of R3 failed: RuntimeError") and "planted" in n
               for n in run.result.notes)
    assert "perfladder: kernel breakdown of R3 failed" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="the Triton kernels compile for a CUDA GPU")
def test_kernel_rungs_on_cuda():
    """Every Triton-kernel rung builds, passes every gate and is timed on a GPU, one after
    another on the same chain (B12 drops the fused RoPE that B8 added, B13 the fused GELU)."""
    run = Ladder(GPU_KERNEL_CFG)
    for name in ("B8", "B9", "B10", "B12", "B13", "B14"):
        r = run.run(name)
        assert r.kind == "rung", (name, r.error)
        assert r.gates and all(g.passed for g in r.gates) and r.receipt.ok, name
        assert r.tokens_per_s > 0 and r.precision == "bf16", name
    assert "rope" not in run.result.rung("B12").recipe["fused"]
    assert "gelu" not in run.result.rung("B13").recipe["fused"]


@pytest.mark.parametrize("name, base", [("B16", ("epilogue",)), ("B17", ()), ("B18", ())])
def test_cuda_graphs_over_cublaslt_plans_are_refused_in_one_line_before_any_work(name, base):
    """B16 over a kept B15, or B17 / B18 over a kept B16, would replay CUDA graphs over nvmath's
    plans, whose workspace the graph tree refuses: not supported, before the lab is touched (it
    is None here), and never compiled ahead (perfladder.ahead.torch.compiles)."""
    from perfladder.ahead.torch import compiles
    from perfladder.ladder.rung import Given, NotSupported
    rung = RUNGS[name]
    before = Recipe(batch_size=8, bf16=True, fused=base).with_mode(None if name == "B16" else "reduce-overhead")
    recipe = rung.change(before, CFG)
    assert recipe.graphs_over_cublaslt_plans and not compiles(recipe)
    with pytest.raises(NotSupported, match="CUDA graph trees refuse"):
        rung.fn(None, Given(rung=rung, recipe=recipe))
    plain = recipe.replace(cudagraphs=False)
    assert not plain.graphs_over_cublaslt_plans and compiles(plain)
    assert not Recipe(batch_size=8, fused=("rope",)).with_mode("reduce-overhead").graphs_over_cublaslt_plans
