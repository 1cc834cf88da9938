"""perfladder.torch.beyond: the B rungs of the shared smoke ladder (conftest.py), their gates
and chaining, the one-hot embedding, the kernel report, and the bad inputs they refuse."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.kernels import KernelBreakdown
from perfladder.results import RungResult
from perfladder.torch import (DEFAULT_RUNGS, GPT, RUNGS, Ladder, MirrorError, b3_cudagraphs,
                              b8_max_autotune, run_ladder)
from perfladder.torch import beyond as bz
from perfladder.torch.rungs import check_rungs
from perfladder.torch.steps import make_optimizer, make_step

CFG = get_config("smoke")
ON_GPU = torch.cuda.is_available()
MEASURED = ["B1", "B2", "B4", "B5", "B6"] + (["B3"] if ON_GPU else [])
REGIMES = ("overhead", "bandwidth", "compute", "memory")


@pytest.fixture(scope="module")
def res(torch_smoke_ladder):
    return torch_smoke_ladder[0]


@pytest.fixture(scope="module")
def fresh():
    """A Ladder on which nothing has run (cheap: data and state, no model)."""
    return Ladder(CFG)


# -- the rungs of the smoke run ------------------------------------------------------------------
def test_beyond_rungs_follow_the_seed(res):
    names = [r.name for r in res.rungs]
    assert names[names.index("R5") + 1:] == ["B1", "B2", "B3", "B4", "B5", "B6", "B7"]
    assert "B8" in RUNGS and "B8" not in DEFAULT_RUNGS
    assert check_rungs(None, autotune=True)[-1] == "B8" and "B8" not in check_rungs(None)
    assert check_rungs(["B8", "R0"]) == ["R0", "B8"]        # named: runs, in ladder order


@pytest.mark.parametrize("name", MEASURED)
def test_measured_beyond_rung_is_well_formed(res, name):
    r = res.rung(name)
    assert r.kind == "rung" and r.tokens_per_s > 0 and len(r.windows) == CFG.windows
    assert sorted(r.windows)[1] == pytest.approx(r.tokens_per_s)
    assert r.precision == "bf16" and r.extra["logits_dtype"] == "torch.bfloat16"
    assert r.batch_size == r.extra["recipe"]["batch_size"] and r.seq_len == CFG.num_steps
    prev = res.rung(r.extra["builds_on"])
    assert r.ratio_prev == pytest.approx(r.tokens_per_s / prev.tokens_per_s)
    assert r.ratio_base == pytest.approx(r.tokens_per_s / res.rung("R0").tokens_per_s)
    first = r.notes[0]
    assert first.startswith("diagnosis (") and any(w in first.split(")")[0] for w in REGIMES)
    assert "profile" in first
    assert isinstance(r.extra["kept"], bool)
    assert (r.peak_mem_bytes is not None) == ON_GPU


def test_cuda_only_rungs_say_so_on_cpu(res):
    if ON_GPU:
        pytest.skip("on a GPU B3 is measured (test_measured_beyond_rung_is_well_formed)")
    r = res.rung("B3")
    assert r.kind == "skipped" and r.tokens_per_s is None and r.windows == []
    assert r.notes[0].startswith("not applicable on CPU") and "CUDA graphs" in r.notes[0]
    assert r.extra["recipe"]["cudagraphs"] and r.extra["recipe"]["mode"] == "reduce-overhead"


def test_b8_is_skipped_on_cpu_without_building_anything(fresh):
    if ON_GPU:
        pytest.skip("on a GPU B8 compiles with max-autotune: test_b3_b8_on_cuda")
    before = len(fresh.result.rungs)
    r = b8_max_autotune(fresh)
    assert r.kind == "skipped" and "Triton GEMM templates" in r.notes[0]
    assert r.extra["recipe"]["mode"] == "max-autotune-no-cudagraphs"
    assert "base" not in fresh.beyond and len(fresh.result.rungs) == before + 1   # nothing profiled


def test_each_rung_changes_one_thing_of_the_fastest_so_far(res):
    """Every rung's recipe is the fastest-so-far recipe with one switch changed; the smoke policy
    keeps every added technique and neither B2 nor B7 (choices between implementations), so B4
    builds on B1 (or B3 on a GPU) and the fastest configuration is B6's."""
    expected = dict(batch_size=CFG.big_batch, optimizer="default", cudagraphs=False,
                    embed="gather", attn_backend=None, autotune=False, mode=None)
    changes = {"B1": {"optimizer": "fused"}, "B2": {"optimizer": "compiled"},
               "B3": {"cudagraphs": True, "mode": "reduce-overhead"}, "B4": {"embed": "onehot"},
               "B5": {"batch_size": 2 * CFG.big_batch}, "B6": {"batch_size": 4 * CFG.big_batch},
               "B7": {"attn_backend": res.rung("B7").extra.get("attention_backend")}}
    prev = "R3"
    for name in ["B1", "B2", "B3", "B4", "B5", "B6", "B7"]:
        r = res.rung(name)
        assert r.extra["builds_on"] == prev, name
        assert r.extra["recipe"] == {**expected, **changes[name]}, name
        if r.kind == "rung":
            assert r.extra["kept"] is (name not in bz.ALTERNATIVES), name
            assert bz.SMOKE_POLICY in r.notes[-1], name
            if r.extra["kept"]:
                expected, prev = r.extra["recipe"], name
    assert res.rung("B2").ratio_prev == pytest.approx(res.rung("B2").tokens_per_s
                                                      / res.rung("B1").tokens_per_s)
    assert res.rung("B4").extra["recipe"]["optimizer"] == "fused"       # B2 was not kept
    assert res.rung("B6").extra["kept"] and "kernels" in res.rung("B6").extra   # the fastest


def test_loss_gates_match_the_seed_recipe(res):
    """A few steps from the same init on the same batches: every beyond configuration's losses
    equal the seed recipe's (eager; and compiled R3 at the big batch) within LOSS_ATOL (see
    beyond.py for why 2e-2), while the loss itself moves by more than that."""
    for name in MEASURED:
        g = res.rung(name).extra["loss_gate"]
        assert g["steps"] == bz.GATE_STEPS == len(g["losses"]) and g["atol"] == bz.LOSS_ATOL
        assert set(g["max_abs_diff"]) >= {"seed recipe, eager"}
        if g["batch_size"] == CFG.big_batch:
            assert "R3 recipe, compiled" in g["max_abs_diff"], name
        assert all(0 <= d <= bz.LOSS_ATOL for d in g["max_abs_diff"].values()), (name, g)
        assert g["losses"][0] - g["losses"][-1] > bz.LOSS_ATOL, (name, g["losses"])


def test_the_loss_gate_can_fail(fresh):
    """A step that does not update (lr=0) or computes another model is refused before timing."""
    B = CFG.big_batch
    ok = fresh.fresh_step(compiled=False, bf16=True)
    assert bz.loss_gate(fresh, ok, B)["max_abs_diff"]["seed recipe, eager"] == 0.0
    frozen = fresh.make_model()
    step = make_step(frozen, torch.optim.AdamW(frozen.parameters(), lr=0.0), bf16=True)
    with pytest.raises(bz.LossGateError, match="differ from the seed recipe"):
        bz.loss_gate(fresh, step, B)
    other = fresh.make_model()
    with torch.no_grad():
        other.norm.weight.mul_(1.5)
    with pytest.raises(bz.LossGateError, match=r"> atol=0.02"):
        bz.loss_gate(fresh, make_step(other, make_optimizer(other, CFG.lr), bf16=True), B)


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


def test_embed_gate_passes_and_refuses(fresh, monkeypatch):
    X = bz.gate_batches(fresh, CFG.batch_size)[0][0]
    out = bz.embed_gate(fresh, X)
    assert out["logits_max_abs_diff"] <= bz.EMBED_ATOL and out["grad_max_rel_diff"] <= bz.EMBED_GRAD_RTOL
    right = GPT.embed_tokens

    def off_by_a_percent(self, X):       # a planted bug in the one-hot path only
        H = right(self, X)
        return H * 1.01 if self.embed == "onehot" else H
    monkeypatch.setattr(GPT, "embed_tokens", off_by_a_percent)
    with pytest.raises(MirrorError, match="one-hot embedding logits differ"):
        bz.embed_gate(fresh, X)


def test_b4_recorded_its_embed_gate(res):
    r = res.rung("B4")
    assert r.extra["recipe"]["embed"] == "onehot"
    assert r.extra["embed_gate"]["logits_max_abs_diff"] <= bz.EMBED_ATOL
    assert any("2*V*D" in n for n in r.notes)


# -- B5 / B6 / B7 -------------------------------------------------------------------------------------
def test_batch_rungs_scale_the_big_batch(res, fresh):
    assert res.rung("B5").batch_size == 2 * CFG.big_batch
    assert res.rung("B6").batch_size == 4 * CFG.big_batch
    for name in ("B5", "B6"):
        r = res.rung(name)
        assert r.extra["steps_per_window"] == bz.timed_steps(fresh, r.batch_size) >= 2


def test_b7_measured_every_backend_and_pinned_the_fastest(res):
    r = res.rung("B7")
    t = r.extra["attention_ms"]
    assert set(t) == {"default", *bz.BACKENDS}
    best = r.extra["attention_backend"]
    assert best == bz.pick_backend(t) == r.extra["recipe"]["attn_backend"] and best in r.label
    assert all(t[n]["ms"] >= t[best]["ms"] for n in bz.BACKENDS if t[n]["available"])
    assert r.extra["default_picks"] == t["default"]["picks"] in (*bz.BACKENDS, None)
    if r.kind == "skipped":        # PyTorch's own pick was the fastest: nothing to pin
        assert r.extra["default_picks"] == best and "already runs the fastest" in r.notes[0]
    else:
        assert r.kind == "rung" and r.extra["loss_gate"]["batch_size"] == r.batch_size
        assert max(r.extra["loss_gate"]["max_abs_diff"].values()) <= bz.LOSS_ATOL
    if not ON_GPU:
        assert t["math"]["available"] and t["flash"]["available"] and t["default"]["picks"] == "flash"
        assert not t["efficient"]["available"] and not t["cudnn"]["available"]
        assert "No viable backend" in t["cudnn"]["error"]
        assert any("'efficient' and 'cudnn' are CUDA kernels" in n for n in r.notes)


# -- the kernel report and the learning check -------------------------------------------------------
def test_kernel_report_on_the_fastest_rung(res):
    fastest = [r for r in res.rungs if r.name.startswith("B") and r.extra.get("kept")][-1]
    kb = KernelBreakdown.from_dict(fastest.extra["kernels"])
    assert kb.framework == "torch" and kb.total_us > 0 and kb.steps >= 1
    assert kb.device == ("gpu" if ON_GPU else "cpu")
    assert fastest.extra["kernels_recipe"] == {k: v for k, v in fastest.extra["recipe"].items()}
    assert "kernels" in res.rung("R3").extra          # the base profile the diagnoses quote
    assert "| category | ms/step | share |" in kb.markdown()
    others = [r.name for r in res.rungs if "kernels" in r.extra]
    assert others == ["R3", fastest.name]


def test_learning_check_trains_the_fastest_configuration(res):
    fastest = [r for r in res.rungs if r.name.startswith("B") and r.extra.get("kept")][-1]
    assert res.learning.passed and res.learning.steps == CFG.learn_steps
    assert any(n.startswith(f"learning check: {CFG.learn_steps} steps of {fastest.name}'s")
               for n in res.notes)


# -- the chain's bookkeeping on a full-config ladder (no model built) ----------------------------------
def test_a_slower_rung_is_negative_and_the_next_builds_on_the_winner():
    lad = Ladder(CFG.replace(name="full"))        # smoke sizes, but the numbers decide
    r3 = RungResult(name="R3", label="+batch", tokens_per_s=100.0, windows=[100.0], kind="rung")
    lad.result.add(r3)
    base = bz.seed_recipe(lad)
    lad.fastest = ("R3", base)
    slow = RungResult(name="B1", label="x", tokens_per_s=90.0, windows=[90.0], extra={})
    bz._record(lad, slow, base.replace(optimizer="fused"), "R3")
    assert slow.ratio_prev == pytest.approx(0.9) and slow.extra["kept"] is False
    assert lad.fastest == ("R3", base)
    fast = RungResult(name="B2", label="y", tokens_per_s=120.0, windows=[120.0], extra={})
    bz._record(lad, fast, base.replace(optimizer="compiled"), "R3")
    assert fast.ratio_prev == pytest.approx(1.2) and fast.extra["kept"] is True
    assert lad.fastest[0] == "B2" and lad.fastest[1].optimizer == "compiled"
    assert "not kept (0.900x R3)" in slow.notes[-1] and "kept (1.200x R3)" in fast.notes[-1]
    assert bz.keeps(lad, "B4", 1.0, 2.0) is False and bz.keeps(lad, "B4", 3.0, 2.0) is True
    smoke = Ladder(CFG)                 # smoke: the numbers do not decide
    assert bz.keeps(smoke, "B4", 1.0, 2.0) is True and bz.keeps(smoke, "B2", 3.0, 2.0) is False
    assert bz.keeps(smoke, "B7", 3.0, 2.0) is False


def test_timed_steps_keep_the_tokens_of_a_window():
    full = get_config("full")
    lad = Ladder(CFG.replace(timed=full.timed, big_batch=full.big_batch))
    assert bz.timed_steps(lad, 512) == 40 and bz.timed_steps(lad, 1024) == 20
    assert bz.timed_steps(lad, 2048) == 10 and bz.timed_steps(lad, 1 << 20) == 2


# -- bad inputs --------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_valid_choices():
    with pytest.raises(ValueError, match=r"embed='lookup' is not valid; valid choices: \('gather', 'onehot'\)"):
        GPT(CFG.gpt(), embed="lookup")
    with pytest.raises(ValueError, match="attn_backend='xformers'.*'flash'.*'cudnn'"):
        bz.Recipe(batch_size=8, attn_backend="xformers")
    with pytest.raises(ValueError, match="optimizer='adam8bit'.*'fused'"):
        bz.Recipe(batch_size=8, optimizer="adam8bit")
    with pytest.raises(ValueError, match="batch_size=0"):
        bz.Recipe(batch_size=0)
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
        bz.build_step(Ladder(CFG), {"batch_size": 8})
    with pytest.raises(ValueError, match="'B9'.*'B8'"):
        run_ladder(CFG, rungs=["B9"])
    with pytest.raises(RuntimeError, match="no attention backend"):
        bz.pick_backend({"flash": {"available": False, "error": "x"}, "default": {"available": True, "ms": 1}})


# -- on a GPU ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and Triton templates need a CUDA GPU")
def test_b3_b8_on_cuda():
    lad = Ladder(CFG)
    r3 = b3_cudagraphs(lad)
    assert r3.kind == "rung", r3.notes
    assert r3.extra["recipe"]["mode"] == "reduce-overhead" and r3.peak_mem_bytes > 0
    assert max(r3.extra["loss_gate"]["max_abs_diff"].values()) <= bz.LOSS_ATOL
    r8 = b8_max_autotune(lad)
    assert r8.kind == "rung", r8.notes
    assert r8.extra["recipe"]["mode"] in ("max-autotune", "max-autotune-no-cudagraphs")
    X = bz.gate_batches(lad, CFG.batch_size)[0][0]
    assert bz.embed_gate(lad, X)["logits_max_abs_diff"] <= bz.EMBED_ATOL   # TF32 off inside the gate


# -- failures are loud, not fatal; what is left out says why ------------------------------------------
def test_a_failing_rung_is_a_loud_skip(monkeypatch, capsys):
    lad = Ladder(CFG)
    lad.beyond["base"] = None                      # no base profile needed for this check

    def boom(*a, **kw):
        raise RuntimeError("CUDA out of memory (planted)")
    monkeypatch.setattr(bz, "measure_recipe", boom)
    r = bz.b1_fused_adamw(lad)
    assert r.kind == "skipped" and r.tokens_per_s is None
    assert r.notes[0].startswith("FAILED") and "planted" in r.notes[0] and "R3" in r.notes[0]
    assert "RuntimeError" in r.extra["error"] and "boom" in r.extra["traceback"]
    assert "B1 FAILED" in capsys.readouterr().err
    assert lad.fastest == ("R3", bz.seed_recipe(lad))          # nothing kept


def test_a_failing_profile_does_not_end_the_ladder(monkeypatch, capsys):
    lad = Ladder(CFG)

    def broken(*a, **kw):
        raise RuntimeError("the profile of 2 steps recorded no CUDA kernels (planted)")
    monkeypatch.setattr(bz, "kernel_breakdown", broken)
    assert bz.kernel_report(lad) is None and bz.base_profile(lad) is None
    assert any("kernel breakdown of R3" in n and "planted" in n for n in lad.result.notes)
    assert "planted" in lad.beyond["base_error"]
    assert "perfladder: kernel breakdown" in capsys.readouterr().err


def test_not_run_sizes_its_reasons_with_this_ladder(res, fresh):
    kb = KernelBreakdown.from_dict(res.rung("R3").extra["kernels"])
    lines = bz.not_run(fresh, kb)
    assert len(lines) == 4 and all(line.startswith("**") for line in lines)
    rows = CFG.big_batch * CFG.num_steps
    assert f"{rows:,} x 28 x 4 B" in lines[0] and "nothing to save" in lines[0]
    assert "Not attempted" in lines[1] and f"{100 * kb.share('matmul'):.0f}%" in lines[1]
    assert "beyond_autotune=True" in lines[2] and "B8" in lines[2]


def test_b7_does_not_remeasure_the_default_kernel(monkeypatch):
    lad = Ladder(CFG)
    lad.beyond["base"] = None
    fake = {"default": {"available": True, "ms": 1.0, "picks": "flash"},
            "flash": {"available": True, "ms": 1.0}, "math": {"available": True, "ms": 2.0},
            "efficient": {"available": False, "error": "x"}, "cudnn": {"available": False, "error": "y"}}
    monkeypatch.setattr(bz, "attention_backends", lambda *a, **kw: fake)
    monkeypatch.setattr(bz, "measure_recipe", lambda *a, **kw: pytest.fail("measured the default again"))
    r = bz.b7_attention_backend(lad)
    assert r.kind == "skipped" and "already runs the fastest kernel (flash)" in r.notes[0]
    assert r.extra["attention_ms"] is fake and r.extra["recipe"]["attn_backend"] == "flash"
