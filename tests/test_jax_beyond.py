"""The JAX rungs beyond the seed (B1...B6), the kernel report and the model changes behind them.

The ladder run is shared with test_jax_rungs.py (tests/_jax_smoke.py); everything else here
reuses its compiled programs (same structures, same batch shape) so the module stays cheap.
"""
import re
import shutil
import warnings

from perfladder.jax.timer import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import GPT, RUNGS, Ladder, Recipe, fastest, has_gpu, kernel_report, run_ladder  # noqa: E402
from perfladder.jax import beyond  # noqa: E402
from perfladder.jax.model import EMBEDS  # noqa: E402
from perfladder.jax.steps import loss_fn  # noqa: E402
from perfladder.kernels import KernelBreakdown  # noqa: E402
from perfladder.results import validate  # noqa: E402
from _jax_smoke import smoke_run  # noqa: E402

CFG = get_config("smoke")
B_NAMES = ["B1", "B2", "B3", "B4", "B5", "B6"]
# what each B rung changes in the recipe it builds on
CHANGES = {"B1": {"embed_fp32": True}, "B2": {"embed": "onehot"}, "B3": {"split": True},
           "B4": {"attn_impl": "cudnn"}, "B5": {"batch_size": 2 * CFG.big_batch},
           "B6": {"batch_size": 4 * CFG.big_batch}}


@pytest.fixture(scope="module")
def run():
    return smoke_run()


def _b(run):
    res = run[0].result
    return [r for r in res.rungs if r.name.startswith("B")]


def test_b_rungs_follow_the_seed_and_are_well_formed(run):
    ladder, events = run
    res = ladder.result
    names = [r.name for r in res.rungs]
    assert names == list(RUNGS) and names[names.index("R5") + 1:] == B_NAMES
    assert [n for e, n, _ in events if e == "start"] == list(RUNGS) + ["learning"]
    for r in _b(run):
        if r.name == "B4" and not has_gpu():
            assert r.kind == "skipped" and r.tokens_per_s is None
            assert "not applicable on CPU" in r.notes[0] and "CUDA GPU" in r.notes[0]
            continue
        assert r.kind == "rung", (r.name, r.notes)                  # no run-time failure on CPU
        assert r.tokens_per_s > 0 and len(r.windows) == CFG.windows and r.precision == "bf16"
        assert r.batch_size == r.extra["recipe"]["batch_size"] and r.seq_len == CFG.num_steps
        assert r.notes[0].startswith("regime: ") and isinstance(r.extra["kept"], bool)
        assert r.extra["receipt"] == "bfloat16" and r.extra["matmul_dtypes"].get("bfloat16", 0) > 0
        assert isinstance(r.peak_mem_bytes, int) and r.peak_mem_bytes > 0
    assert res.rung("B5").batch_size == 2 * CFG.big_batch
    assert res.rung("B6").batch_size == 4 * CFG.big_batch
    validate(res.to_dict())


def test_each_rung_changes_one_thing_and_builds_on_the_winner_so_far(run):
    """The waterfall chains on the best configuration so far; losers do not carry forward."""
    res = run[0].result
    best, recipe = "R3", Recipe(batch_size=CFG.big_batch).to_dict()
    for r in _b(run):
        assert r.extra["builds_on"] == best, r.name
        assert r.extra["recipe"] == {**recipe, **CHANGES[r.name]}, r.name
        if r.kind == "skipped":
            continue
        base = res.rung(best).tokens_per_s
        assert r.ratio_prev == pytest.approx(r.tokens_per_s / base)
        assert r.extra["kept"] == (r.tokens_per_s > base)
        if r.extra["kept"]:
            best, recipe = r.name, r.extra["recipe"]
    name, kept = fastest(run[0])
    assert name == best and kept.to_dict() == recipe
    assert res.best().tokens_per_s >= res.rung(best).tokens_per_s


def test_anomaly_evidence_is_recorded(run):
    res = run[0].result
    r3, r3c, b1, b2 = (res.rung(n) for n in ("R3", "R3c", "B1", "B2"))
    # the program asks for the embedding's scatter-add in bf16; B1 moves it to fp32
    assert b1.extra["before"]["jaxpr_embedding_scatter_add"] == {"bfloat16": 1}
    assert b1.extra["jaxpr_embedding_scatter_add"] == {"float32": 1}
    for r in (r3, r3c, b1):
        assert r.extra["hlo_embedding_scatter"]["count"] >= 1
    assert r3c.extra["hlo_embedding_scatter"]["types"] == ["f32"]
    assert b1.extra["hlo_embedding_scatter"]["types"] == ["f32"]
    # B2 removes the scatter altogether, with exactly the gathered rows
    assert b2.extra["hlo_embedding_scatter"] == {"count": 0, "types": []}
    assert b2.extra["jaxpr_embedding_scatter_add"] == {}
    assert b2.extra["lookup_rel_diff"] == 0.0
    for stats in (b1.extra["before"]["per_step"], b1.extra["per_step"], b2.extra["per_step"]):
        assert stats["n"] == CFG.timed and stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
        assert stats["spread"] == pytest.approx((stats["max_ms"] - stats["min_ms"]) / stats["median_ms"])
    assert "openxla/xla#26371" in b1.notes[0] and "jax-ml/jax#38806" in b2.notes[0]


def test_split_rung_gates_and_measures_host_overhead(run):
    b3 = run[0].result.rung("B3")
    assert b3.extra["gate_loss_rel_diff"] <= beyond.SPLIT_LOSS_TOL
    for kind in ("nnx.jit", "split"):
        h = b3.extra["host_overhead"][kind]
        assert h["dispatch_ms_per_step"] > 0 and h["unsynced_ms_per_step"] >= h["dispatch_ms_per_step"]
        assert h["synced_median_ms"] > 0
    assert "nnx.jit" in b3.notes[1] and "split" in b3.notes[1]


def test_kernel_report_is_stored_on_the_fastest_rung(run):
    ladder = run[0]
    name, _ = fastest(ladder)
    d = ladder.result.rung(name).extra["kernels"]
    kb = KernelBreakdown.from_dict(d)
    assert kb.framework == "jax" and kb.device == "cpu" and kb.total_us > 0
    assert "| category |" in kb.markdown()
    assert any("matched ops of HLO module" in n for n in kb.notes)   # hlo_text was passed
    assert ladder.result.rung(name).extra["kernels_recipe"] == fastest(ladder)[1].to_dict()


def test_learning_check_trained_the_fastest_configuration(run):
    ladder = run[0]
    name, recipe = fastest(ladder)
    assert ladder.result.learning.passed
    notes = [n for n in ladder.result.notes if n.startswith("learning check: trained ")]
    assert notes == [f"learning check: trained {name}'s configuration ({recipe}), "
                     f"{CFG.learn_steps} steps from a fresh init"]


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
    ladder = Ladder(CFG)
    assert fastest(ladder) == ("R3", Recipe(batch_size=CFG.big_batch))
    with pytest.raises(TypeError, match="recipe must be a perfladder.jax.beyond.Recipe"):
        beyond.Runner(ladder, {"batch_size": 8})
    with pytest.raises(ValueError, match="embed='sparse' is not valid"):
        beyond.Runner(ladder, Recipe(batch_size=8, embed="sparse"))
    with pytest.raises(ValueError, match=r"'B9'.*valid choices: .*R5, B1, B2, B3, B4, B5, B6"):
        run_ladder(CFG, rungs=["B1", "B9"])
    with pytest.raises(ValueError, match="at least one"):
        beyond.step_stats([])


def test_rope_tables_are_constants_of_the_compiled_program():
    """cos/sin must not be recomputed inside the step (per element, B*H times over)."""
    model = GPT(CFG.gpt(), rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    X = jnp.zeros((2, CFG.num_steps), jnp.int32)
    graphdef, state = nnx.split(model)
    text = jax.jit(lambda s, X: nnx.merge(graphdef, s)(X)).lower(state, X).compile().as_text()
    assert not re.search(r"\b(cosine|sine)\(", text)
    assert re.search(r"\bconcatenate\(", text)          # the rotation itself is still there


def test_a_failing_technique_is_a_loud_skip_and_the_ladder_goes_on(monkeypatch):
    ladder = Ladder(CFG)

    def broken(*a, **k):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory while trying to allocate")

    monkeypatch.setattr(beyond, "Runner", broken)
    r = RUNGS["B5"](ladder)
    assert r.kind == "skipped" and r.tokens_per_s is None
    assert "FAILED at run time" in r.notes[0] and "RESOURCE_EXHAUSTED" in r.notes[0]
    assert r.extra["builds_on"] == "R3" and "RuntimeError" in r.extra["traceback"]
    assert r.extra["base_recipe"] == Recipe(batch_size=CFG.big_batch).to_dict()
    assert ladder.fastest is None                      # nothing adopted
    assert kernel_report(ladder) is None               # and the report says why, not crash
    assert any("kernel breakdown of R3" in n and "RESOURCE_EXHAUSTED" in n for n in ladder.result.notes)


# -- numerics: every beyond configuration trains like R3 -------------------------------------
# Three AdamW steps from the same init on the same three batches. The configurations differ
# only in how the embedding gradient is accumulated (bf16 atomics, fp32 atomics, a matmul
# with fp32 accumulation) and in which compiled program runs the step, so their losses after
# three steps must agree with R3's to within bf16 resolution of the loss: bf16 keeps 8
# significant bits (relative step 2**-8 ~ 4e-3), the logits carry a few such roundings, and
# three updates of lr 3e-3 move the loss by ~1e-2 relative at most from that; 2e-2 leaves
# room for the difference without admitting a wrong embedding (which moves it by far more).
NUMERICS_TOL = 2e-2


def _three_steps(ladder, recipe, batches):
    runner = beyond.Runner(ladder, recipe)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        losses = [float(runner.step(X, Y)) for X, Y in batches]
    runner.commit()
    return losses


def test_beyond_configurations_train_like_r3(run):
    ladder = run[0]
    stream = ladder.stream(CFG.big_batch)
    batches = [next(stream) for _ in range(3)]
    seed = beyond.seed_recipe(ladder)
    ref = _three_steps(ladder, seed, batches)
    assert ref[-1] < ref[0]                                # it trains
    for change in ({"embed_fp32": True}, {"embed": "onehot"}, {"embed": "onehot", "embed_fp32": True},
                   {"split": True}, {"split": True, "embed": "onehot", "embed_fp32": True}):
        got = _three_steps(ladder, seed.replace(**change), batches)
        assert got[0] == pytest.approx(ref[0], rel=1e-2), change     # same init, same forward
        assert got[-1] == pytest.approx(ref[-1], rel=NUMERICS_TOL), change


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="needs a CUDA GPU")
def test_cudnn_attention_matches_xla_attention_on_gpu():
    from perfladder.jax.steps import PARITY_TOL, _compare
    cfg = get_config("full").gpt()
    X = jax.random.randint(jax.random.key(0), (8, 128), 0, cfg.vocab_size)
    xla = GPT(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
    cud = GPT(cfg, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, attn_impl="cudnn")
    fwd = nnx.jit(lambda m, X: m(X))
    assert _compare(fwd(cud, X), fwd(xla, X), PARITY_TOL["bfloat16"], "cudnn vs xla") <= PARITY_TOL["bfloat16"]
    graphdef, state = nnx.split(cud)
    text = jax.jit(lambda s, X: nnx.merge(graphdef, s)(X)).lower(state, X).compile().as_text()
    assert "__cudnn$fmha" in text
