"""The JAX rungs beyond the seed (B1...B11), the kernel report and the model changes behind them.

The ladder run is shared with tests/jax/test_rungs.py (conftest.jax_smoke_ladder); everything else
here reuses its compiled programs (same structures, same batch shape) so the module stays cheap.
"""
import re
import shutil
import warnings

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import GPT, RUNGS, JaxLab, Ladder, Recipe, has_gpu, run_ladder  # noqa: E402
from perfladder.jax.compile_options import COMMAND_BUFFER_TYPES  # noqa: E402
from perfladder.jax.fused import FUSED  # noqa: E402
from perfladder.jax.model import EMBEDS  # noqa: E402
from perfladder.jax.profile import step_stats  # noqa: E402
from perfladder.jax.step import loss_fn  # noqa: E402
from perfladder.jax.trial import LOSS_TOL  # noqa: E402
from perfladder.kernels import KernelBreakdown  # noqa: E402
from perfladder.ladder.engine import keeps  # noqa: E402

CFG = get_config("smoke")
# the smoke sizes with head width 32: a GPU's Triton dots need K >= 16 for the fused attention
# kernel's rotate-half halves (the smoke config's 16 runs only in the interpreter)
GPU_KERNEL_CFG = CFG.replace(num_hiddens=64)
B_NAMES = ["B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10", "B11", "B12"]
# what each B rung changes in the recipe it builds on
CHANGES = {"B1": {"embed_fp32": True}, "B2": {"embed": "onehot"}, "B3": {"jit": "split"},
           "B4": {"attn_impl": "cudnn"}, "B5": {"batch_size": 2 * CFG.big_batch},
           "B6": {"batch_size": 4 * CFG.big_batch}, "B7": {"fused": ["addnorm"]},
           "B8": lambda base: {"fused": [*base["fused"], "attention"], "attn_impl": None},
           "B9": lambda base: {"xla_options": {**base["xla_options"], "xla_gpu_enable_cublaslt": True}},
           "B10": lambda base: {"fused": [*base["fused"], "gelu_bias_grad"]},
           "B11": lambda base: {"xla_options": {**base["xla_options"], "xla_gpu_graph_min_graph_size": 1,
                                                "xla_gpu_enable_command_buffer": COMMAND_BUFFER_TYPES}},
           "B12": lambda base: {"fused": sorted({*base["fused"], "attention", "attention_bias"},
                                                key=FUSED.index), "attn_impl": None}}
GPU_ONLY = {"B4": "cuDNN", "B7": "interpreter", "B8": "interpreter", "B9": "XLA's GPU compiler options",
            "B10": "interpreter", "B11": "XLA's GPU compiler options", "B12": "interpreter"}


@pytest.fixture(scope="module")
def run(jax_smoke_ladder):
    return jax_smoke_ladder


def _b(res):
    return [res.rung(n) for n in B_NAMES]


def _best(res) -> str:
    """The configuration the chain ended on (the last kept B rung; R3 when none was)."""
    kept = [r.name for r in _b(res) if r.kept]
    return kept[-1] if kept else "R3"


def test_b_rungs_follow_the_seed_and_are_well_formed(run):
    res = run.result
    names = [r.name for r in res.rungs]
    assert names[names.index("R4") + 1:names.index("R5")] == B_NAMES
    for r in _b(res):
        assert r.stage == "beyond" and r.section == RUNGS[r.name].section
        if r.name in GPU_ONLY and not has_gpu():
            assert r.kind == "skipped" and r.tokens_per_s is None and r.kept is False
            assert "not applicable on CPU" in r.error and GPU_ONLY[r.name] in r.error
            continue
        assert r.kind == "rung", (r.name, r.error)                  # no run-time failure on CPU
        assert r.tokens_per_s > 0 and r.timing.settled == CFG.windows and r.precision == "bf16"
        assert r.batch_size == r.recipe["batch_size"] and r.seq_len == CFG.num_steps
        # windows of about the big batch's tokens (fewer steps past it), as in PyTorch
        assert r.timing.steps_per_window == CFG.timed_steps(r.batch_size)
        assert r.timing.warmup == CFG.warmup_steps(r.batch_size)
        assert r.receipt.ok and r.receipt.observed["logits"] == "bfloat16"
        assert r.details["matmul_dtypes"].get("bfloat16", 0) > 0 and isinstance(r.kept, bool)
        assert r.memory.bytes > 0 and r.profile.device_ms > 0 and r.gate("fp32 masters").passed
    assert res.rung("B5").batch_size == 2 * CFG.big_batch
    assert res.rung("B6").batch_size == 4 * CFG.big_batch


def test_each_rung_changes_one_thing_and_builds_on_the_winner_so_far(run):
    """The chain moves to a kept rung; in smoke every added technique is kept, the
    alternative (B2) is not."""
    res = run.result
    best, recipe = "R3", res.rung("R3").recipe
    for r in _b(res):
        assert r.builds_on == best, r.name
        change = CHANGES[r.name]
        assert r.recipe == {**recipe, **(change(recipe) if callable(change) else change)}, r.name
        if r.kind == "skipped":
            continue
        assert r.ratio_prev == pytest.approx(r.tokens_per_s / res.rung(best).tokens_per_s)
        assert r.kept == keeps(RUNGS[r.name], r, smoke=True) == (not RUNGS[r.name].alternative)
        if r.kept:
            best, recipe = r.name, r.recipe
    assert best == _best(res) and res.learning.configuration == best
    assert res.rung("R5x").recipe == recipe


def test_every_b_rung_is_gated_against_its_base(run):
    res = run.result
    for r in _b(res):
        if r.kind == "skipped":
            continue
        if r.name in ("B5", "B6"):
            g = r.gate("batch only")
            assert g.detail["changed"] == ["batch_size"] and g.values["batch_size"] == r.batch_size
            continue
        g = r.gate("loss over steps")
        assert g.passed and g.values["max_rel_diff"] <= g.tolerances["max_rel_diff"] <= LOSS_TOL
        assert len(g.detail["losses"]) == len(g.detail["reference_losses"]) == 3
        assert "plain bf16 recipe" in g.reference          # one reference, as PyTorch's


def test_anomaly_evidence_is_recorded(run):
    res = run.result
    r3, r3c, b1, b2 = (res.rung(n) for n in ("R3", "R3c", "B1", "B2"))
    # the program asks for the embedding's scatter-add in bf16; B1 moves it to fp32
    assert b1.details["before"]["jaxpr_embedding_scatter_add"] == {"bfloat16": 1}
    assert r3.details["jaxpr_embedding_scatter_add"] == {"bfloat16": 1}
    assert b1.details["jaxpr_embedding_scatter_add"] == {"float32": 1}
    for r in (r3, r3c, b1):
        assert r.details["hlo_embedding_scatter"]["count"] >= 1
    assert b1.details["before"]["hlo_embedding_scatter"] == r3.details["hlo_embedding_scatter"]
    assert r3c.details["hlo_embedding_scatter"]["types"] == ["f32"]
    assert b1.details["hlo_embedding_scatter"]["types"] == ["f32"]
    # B2 removes the scatter altogether, with exactly the gathered rows
    assert b2.details["hlo_embedding_scatter"] == {"count": 0, "types": []}
    assert b2.details["jaxpr_embedding_scatter_add"] == {}
    assert b2.gate("lookup parity").values["rel_diff"] == 0.0
    for stats in (b1.details["before"]["per_step"], b1.details["per_step"], b2.details["per_step"]):
        assert stats["n"] == CFG.timed and stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
        assert stats["spread"] == pytest.approx((stats["max_ms"] - stats["min_ms"]) / stats["median_ms"])
    assert "openxla/xla#26371" in b1.notes[0] and "jax-ml/jax#38806" in b2.notes[0]


def test_split_rung_gates_and_measures_host_overhead(run):
    b3 = run.result.rung("B3")
    assert b3.gate("loss over steps").values["max_rel_diff"] <= LOSS_TOL
    for kind in ("base", "split"):
        h = b3.details["host_overhead"][kind]
        # three separate timings of one step: each present and positive (their order is the
        # machine's to say, and a loaded CPU reorders them: no wall-clock comparison here)
        assert h["n"] >= 1
        assert h["dispatch_ms_per_step"] > 0 and h["unsynced_ms_per_step"] > 0 and h["synced_median_ms"] > 0


def test_kernel_report_is_stored_on_the_fastest_rung(run):
    res = run.result
    best = _best(res)
    assert [r.name for r in res.rungs if r.kernels] == [best]
    kb = KernelBreakdown.from_dict(res.rung(best).kernels)
    assert kb.framework == "jax" and kb.device == "cpu" and kb.total_us > 0
    assert "| category |" in kb.markdown()
    assert any("matched ops of HLO module" in n for n in kb.notes)   # hlo_text was passed


# -- the model changes ------------------------------------------------------------------------
@nnx.jit
def _grads(g, o, X, Y):
    return nnx.grad(loss_fn)(g, X, Y), nnx.grad(loss_fn)(o, X, Y)


def test_onehot_lookup_equals_gather_forward_and_gradient():
    cfg = CFG.gpt()
    X = jax.random.randint(jax.random.key(3), (4, 16), 0, cfg.vocab_size)
    Y = jnp.roll(X, -1, axis=1)
    for dtype, fp32 in ((jnp.float32, False), (jnp.bfloat16, False), (jnp.bfloat16, True)):
        g = GPT(cfg, rngs=nnx.Rngs(0), dtype=dtype, embed_fp32=fp32)
        o = GPT(cfg, rngs=nnx.Rngs(0), dtype=dtype, embed_fp32=fp32, embed="onehot")
        assert o.token_emb.embedding.shape == g.token_emb.embedding.shape      # same parameter
        assert jnp.array_equal(o.embed(X), g.embed(X)) and o.embed(X).dtype == dtype
        if dtype == jnp.float32:   # gradients: a matmul vs a scatter-add, same sums
            dg, do = _grads(g, o, X, Y)
            a, b = do["token_emb"]["embedding"][...], dg["token_emb"]["embedding"][...]
            assert jnp.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bad_embed_and_recipe_inputs_are_clear_errors():
    with pytest.raises(ValueError, match=r"embed='lookup' is not valid; valid choices: \('gather', 'onehot'\)"):
        GPT(CFG.gpt(), rngs=nnx.Rngs(0), embed="lookup")
    assert EMBEDS == ("gather", "onehot")
    lab = JaxLab(CFG)
    assert Ladder(CFG).chain.recipe_of("R3") == Recipe(batch_size=CFG.big_batch, dtype="bfloat16")
    with pytest.raises(TypeError, match="recipe must be a perfladder.jax.Recipe"):
        lab.build_step({"batch_size": 8})
    with pytest.raises(ValueError, match=r"'B99'.*valid choices: .*B7, B8, B9, B10, B11, B12, R5"):
        run_ladder(CFG, rungs=["B1", "B99"])
    with pytest.raises(ValueError, match="at least one"):
        step_stats([])


def test_b12_is_not_measured_on_a_configuration_without_b8s_kernels():
    """B12 changes where B8's kernels add the QKV bias: built on cuDNN's attention (B8 not
    kept) it measures nothing and says why; its change alone names the kernels it needs."""
    from perfladder.jax.rungs.beyond import bias_on_load_rung
    from perfladder.ladder.rung import Given, NotMeasured
    base = Recipe(batch_size=8, jit="split", dtype="bfloat16", attn_impl="cudnn")
    recipe = RUNGS["B12"].change(base, CFG)
    assert recipe.fused == ("attention", "attention_bias") and recipe.attn_impl is None
    given = Given(rung=RUNGS["B12"], recipe=recipe, base_name="B6", base_recipe=base)
    with pytest.raises(NotMeasured, match="B12 adds the QKV bias inside B8's attention kernels, "
                                          "and B6, which it builds on, does not run them"):
        bias_on_load_rung(JaxLab(CFG), given)


def test_rope_tables_are_constants_of_the_compiled_program():
    """cos/sin must not be recomputed inside the step (per element, B*H times over)."""
    model = GPT(CFG.gpt(), rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    X = jnp.zeros((2, CFG.num_steps), jnp.int32)
    graphdef, state = nnx.split(model)
    text = jax.jit(lambda s, X: nnx.merge(graphdef, s)(X)).lower(state, X).compile().as_text()
    assert not re.search(r"\b(cosine|sine)\(", text)
    assert re.search(r"\bconcatenate\(", text)          # the rotation itself is still there


def test_a_failing_technique_is_a_loud_skip_and_the_ladder_goes_on(monkeypatch, capsys):
    run = Ladder(CFG)

    def broken(*a, **k):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while trying to allocate")

    monkeypatch.setattr(run.lab, "build_step", broken)
    r = run.run("B5")
    assert r.kind == "skipped" and r.tokens_per_s is None and r.kept is False
    assert r.error.startswith("RuntimeError: RESOURCE_EXHAUSTED")
    assert "B5" in capsys.readouterr().err                       # said loudly
    assert r.builds_on == "R3" and "RuntimeError" in r.details["traceback"]
    assert r.recipe == Recipe(batch_size=2 * CFG.big_batch, dtype="bfloat16").to_dict()
    assert run.fastest() == ("R3", Recipe(batch_size=CFG.big_batch, dtype="bfloat16"))   # nothing adopted
    assert run.kernel_report() is None                                   # the report says why
    assert any("kernel breakdown of R3" in n and "RESOURCE_EXHAUSTED" in n for n in run.result.notes)


# -- numerics: every beyond configuration trains like R3 -------------------------------------
# Three AdamW steps from the same init on the same three batches, within the loss gate's
# tolerance (perfladder.jax.trial.LOSS_TOL says why that tolerance).
def _three_steps(lab, recipe, batches):
    step = lab.build_step(recipe)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        losses = [float(step(X, Y)) for X, Y in batches]
    step.commit()
    return losses


def test_beyond_configurations_train_like_r3():
    lab = JaxLab(CFG)
    stream = lab.stream(CFG.big_batch)
    batches = [next(stream) for _ in range(3)]
    seed = Ladder(CFG).chain.recipe_of("R3")
    ref = _three_steps(lab, seed, batches)
    assert ref[-1] < ref[0]                                # it trains
    # the ladder's loss gates cover each B rung against its base; this is the bf16 one-hot
    # lookup, which the smoke chain (B2 on B1's fp32 lookup) does not run
    for change in ({"embed": "onehot"},):
        got = _three_steps(lab, seed.replace(**change), batches)
        assert got[0] == pytest.approx(ref[0], rel=1e-2), change     # same init, same forward
        assert got[-1] == pytest.approx(ref[-1], rel=LOSS_TOL), change


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU")
def test_cudnn_attention_matches_xla_attention_on_gpu():
    from perfladder.jax.checks import PARITY_TOL, _compare
    cfg = get_config("full").gpt()
    X = jax.random.randint(jax.random.key(0), (8, 128), 0, cfg.vocab_size)
    xla = GPT(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    cud = GPT(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, attn_impl="cudnn")
    fwd = nnx.jit(lambda m, X: m(X))
    assert _compare(fwd(cud, X), fwd(xla, X), PARITY_TOL["bfloat16"], "cudnn vs xla") <= PARITY_TOL["bfloat16"]
    graphdef, state = nnx.split(cud)
    text = jax.jit(lambda s, X: nnx.merge(graphdef, s)(X)).lower(state, X).compile().as_text()
    assert "__cudnn$fmha" in text


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="the Pallas kernels compile for a CUDA GPU")
def test_kernel_rungs_on_gpu():
    """The Pallas rungs build, pass every gate and are timed on a GPU; the fused attention
    kernel replaces the attention implementation (none is chosen)."""
    run = Ladder(GPU_KERNEL_CFG)
    for name in ("B7", "B8", "B12"):
        r = run.run(name)
        assert r.kind == "rung", (name, r.error)
        assert r.gates and all(g.passed for g in r.gates) and r.receipt.ok, name
        assert r.tokens_per_s > 0 and r.precision == "bf16", name
    assert run.result.rung("B8").recipe["attn_impl"] is None
    assert run.result.rung("B12").recipe["fused"] == ["addnorm", "attention", "attention_bias"]
