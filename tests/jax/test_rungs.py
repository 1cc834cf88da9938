"""The JAX ladder in the smoke config: the seed rungs, the registry and the engine's rules on
the JAX lab. The whole ladder is shared with tests/jax/test_beyond.py (conftest.jax_smoke_ladder: the
one the book build ran, or one run in-process)."""
import math
import shutil
import statistics
import warnings

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import pytest  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import RUNGS, JaxLab, Ladder, Recipe, run_ladder  # noqa: E402
from perfladder.jax.lab import EAGER_WINDOWS  # noqa: E402
from perfladder.measure.evidence import ProfileSummary  # noqa: E402
from perfladder.measure.learning import LearningCheck, val_threshold  # noqa: E402
from perfladder.multigpu.costmodel import PREDICT_KS  # noqa: E402
from perfladder.results.record import KINDS, LadderResult, RungResult  # noqa: E402
from perfladder.results.schema import validate  # noqa: E402

CFG = get_config("smoke")
SEED = ["R0", "R1", "R2a", "R2", "R3c", "R3", "R4"]
MULTI = ["R5", "R5x", "R5f"]
KEYS = {"R0": "eager", "R1": "compile", "R2a": "bf16_naive_cast", "R2": "bf16", "R3c": "fp32_control",
        "R3": "batch_up", "R4": "checkpoint", "B1": "embed_fp32_lookup", "B2": "onehot_embedding",
        "B3": "split_jit", "B4": "attention_kernel", "B5": "batch_x2", "B6": "batch_x4",
        "B7": "fused_addnorm", "B8": "fused_attention", "B9": "xla_cublaslt",
        "B10": "fused_gelu_bias_grad", "B11": "command_buffers", "B12": "attention_bias",
        "R5": "data_parallel", "R5x": "data_parallel_fast", "R5f": "fsdp"}


@pytest.fixture(scope="module")
def run(jax_smoke_ladder):
    return jax_smoke_ladder


@pytest.fixture(scope="module")
def small_run():
    """A real ladder of a few rungs -- named out of ladder order, one of each stage -- with its
    ``progress`` events, still in memory: ``(LadderResult, events)``. Its learning check is
    short (its verdict is read off the whole ladder); here only its event and record matter."""
    events = []
    res = run_ladder(CFG.replace(learn_steps=40), rungs=["R5", "B4", "R3"],
                     progress=lambda *e: events.append(e), command="pytest")
    return res, events


def test_registry_names_keys_and_declarations():
    assert {n: r.key for n, r in RUNGS.items()} == KEYS
    assert list(RUNGS) == list(KEYS)                                  # ladder order
    for r in RUNGS.values():
        assert r.label and r.section and r.gate and r.attacks, r.name
    assert [n for n, r in RUNGS.items() if r.alternative] == ["B2", "B9", "B10", "B11", "B12"]
    assert [n for n, r in RUNGS.items() if r.needs_gpu] == ["B4", "B7", "B8", "B9", "B10", "B11", "B12"]
    assert {n: r.builds_on for n, r in RUNGS.items() if r.stage == "seed"} == {
        "R0": None, "R1": "R0", "R2a": "R1", "R2": "R1", "R3c": "R1", "R3": "R2", "R4": "R3"}
    assert RUNGS["R5"].builds_on == "R1" and RUNGS["R5x"].builds_on is None
    assert [n for n, r in RUNGS.items() if r.stage == "multi-gpu"] == MULTI


def test_every_rung_is_a_well_formed_result(run):
    res = run.result
    assert [r.name for r in res.rungs] == list(RUNGS)
    assert res.framework == "jax" and res.baseline == "R1" and res.device == "cpu"
    assert res.config["name"] == "smoke" and res.command == run.command
    assert res.peak_tflops is None and res.roofs is None and any("no device probe" in n for n in res.notes)
    for r in (res.rung(n) for n in SEED):
        assert isinstance(r, RungResult) and r.kind in KINDS and r.key == KEYS[r.name]
        t = r.timing
        assert r.tokens_per_s > 0 and t.settled == (EAGER_WINDOWS if r.name == "R0" else CFG.windows)
        assert len(t.windows) >= t.settled and isinstance(r.stable, bool)
        assert r.tokens_per_s == pytest.approx(statistics.median(t.settled_windows))
        assert r.seq_len == CFG.num_steps
        assert r.batch_size == (CFG.batch_size if r.name in ("R0", "R1", "R2a", "R2") else CFG.big_batch)
        assert r.batch_size == r.recipe["batch_size"]
        assert r.tflops > 0 and r.mfu is None                           # CPU: no peak known
        if r.name == "R0":
            assert r.memory.bytes is None and r.memory.kind == "n/a"
            assert r.compile.first_call_s > 0              # un-jitted: the first call is timed too
        else:
            assert r.memory.kind == "planned temporaries" and r.memory.bytes > 0
    kinds = {n: res.rung(n).kind for n in SEED + MULTI}
    assert kinds == {"R0": "rung", "R1": "rung", "R2a": "control", "R2": "rung", "R3c": "control",
                     "R3": "rung", "R4": "rung", "R5": "skipped", "R5x": "skipped", "R5f": "skipped"}
    precision = {n: res.rung(n).precision for n in SEED}
    assert precision == {"R0": "fp32", "R1": "fp32", "R2a": "fp32", "R2": "bf16", "R3c": "fp32",
                         "R3": "bf16", "R4": "bf16"}
    validate(res.to_dict())


def test_stable_verdict_and_profile_on_every_measured_rung(run):
    res = run.result
    for r in res.rungs:
        if not r.measured:
            continue
        assert isinstance(r.stable, bool), r.name
        if r.builds_on is not None:
            assert r.verdict["verdict"] in ("faster", "slower", "within noise", "unsettled"), r.name
            assert r.verdict["against"] == r.builds_on
        if r.recipe["jit"] == "none":
            assert r.profile is None and r.regime["regime"] == "not profiled"
            continue
        p = r.profile
        assert isinstance(p, ProfileSummary) and p.tool == "jax.profiler" and p.steps == 2, r.name
        assert p.host_ms > 0 and p.device_ms > 0 and p.rows
        assert math.isclose(sum(p.shares.values()), 1.0, rel_tol=1e-6)
        assert r.regime["regime"] in ("host-bound", "compute-bound", "memory-bound", "mixed")


def test_ratios_are_derived_from_the_rungs_they_build_on(run):
    res = run.result
    t = {r.name: r.tokens_per_s for r in res.rungs if r.measured}
    assert res.rung("R1").ratio_base == 1.0
    assert res.rung("R0").ratio_base == pytest.approx(t["R0"] / t["R1"])
    for name, prev in (("R1", "R0"), ("R2a", "R1"), ("R2", "R1"), ("R3c", "R1"), ("R3", "R2"), ("R4", "R3")):
        assert res.rung(name).builds_on == prev
        assert res.rung(name).ratio_prev == pytest.approx(t[name] / t[prev])
    assert [r.name for r in res.waterfall()][:5] == ["R0", "R1", "R2", "R3", "R4"]   # controls are not


def test_r1_records_the_step_accounting(run):
    r1 = run.result.rung("R1")
    gate = r1.gate("jit parity")
    assert gate.passed and gate.values["rel_diff"] < 1e-4 <= gate.tolerances["rel_diff"]   # CPU: no TF32
    assert r1.compile.first_call_s > 0 and r1.compile.compilations >= 1
    x = r1.details
    assert x["traced_tflops"] == pytest.approx(x["traced_flops_per_step"] / x["step_ms"] / 1e9)
    # the traced step's matmuls and the 6N + 12LTD model agree; 6N also counts the norm and bias
    # parameters, a few % of N at the smoke width (0.2% at the full one: test_jax_model.py)
    assert 0.93 < x["traced_flops_per_step"] / x["model_flops_per_step"] <= 1.0


def test_precision_receipts_are_read_from_the_timed_step(run):
    res = run.result
    r2a, r2 = res.rung("R2a"), res.rung("R2")
    assert r2a.receipt.claimed == "bf16" and not r2a.receipt.ok                 # the lesson
    assert r2a.receipt.observed == {"first_activation": "float32", "logits": "float32"}
    assert set(r2a.details["matmul_dtypes"]) == {"float32"}
    assert r2a.recipe["naive_cast"] and r2a.recipe["dtype"] == "float32"
    assert r2.receipt.ok and r2.receipt.observed == {"first_activation": "bfloat16", "logits": "bfloat16"}
    assert set(r2.details["matmul_dtypes"]) == {"bfloat16"}
    assert "traced" in r2.receipt.where
    for name in ("R2", "R3", "R4"):                      # fp32 masters after the timed steps
        assert res.rung(name).gate("fp32 masters").passed


def test_checkpoint_rung_gated_and_its_recomputation_counted(run):
    res = run.result
    r3, r4 = res.rung("R3"), res.rung("R4")
    assert r4.gate("checkpoint mirror").values["rel_diff"] <= 1e-2
    saved = r4.gate("checkpoint gate")        # and it dropped activations: fewer residuals saved
    assert saved.passed and saved.values["saved_ratio"] <= saved.tolerances["saved_ratio"] < 1
    assert r4.recipe == {**r3.recipe, "checkpoint": True}
    ratio = r4.details["traced_flops_per_step"] / r3.details["traced_flops_per_step"]
    assert 1.2 < ratio < 1.34                                # the backward pass recomputes
    assert r3.memory.bytes > 0 and r4.memory.bytes > 0 and res.rung("R3c").memory.bytes > 0


def test_learning_check_and_progress(run, small_run):
    res = run.result
    check = res.learning
    assert isinstance(check, LearningCheck) and check.passed and check.steps == CFG.learn_steps
    assert check.val_after < check.val_before
    data = JaxLab(CFG, probe=False).data
    assert check.threshold == pytest.approx(val_threshold(data.train_arrays()[1], len(data.vocab)))
    assert check.threshold < math.log(len(data.vocab))
    assert "plain fp32" in check.evaluated_with and check.configuration in RUNGS
    assert set(check.phases) == {"data", "build", "val before", "train", "val after"}
    assert sum(check.phases.values()) <= check.seconds and check.phases["train"] > 0
    n = CFG.learn_num_train                              # held out: the windows after training's
    assert check.rows == {"train": [0, n], "val": [n, n + CFG.num_val]}
    small, events = small_run
    assert [n for e, n, _ in events if e == "start"] == ["R3", "B4", "R5", "learning"]   # ladder order
    assert [(e, n) for e, n, _ in events] == [(e, n) for n in ["R3", "B4", "R5", "learning"]
                                              for e in ("start", "end")]
    ends = {n: p for e, n, p in events if e == "end"}
    assert ends["R3"] is small.rung("R3") and ends["learning"] is small.learning
    assert [ends[r.name] for r in small.rungs] == small.rungs and ends["B4"].kind == "skipped"


def test_each_gate_records_its_seconds_inside_the_gates_phase(run):
    from _ladders import gate_clocks
    want = {"gates/model", "gates/step form", "gates/loss steps", "gates/loss reference"}
    assert want <= gate_clocks(run.result)


def test_jitted_rungs_compile_their_step_with_the_model_gates_programs_beside_it(run):
    res = run.result
    assert "compile" not in res.rung("R0").details["seconds"]            # nothing to compile
    for r in res.rungs:
        if r.measured and r.name != "R0" and r.name not in MULTI:
            beside = r.details["compiled beside the step"]
            assert "compile" in r.details["seconds"] and "error" not in beside, r.name
            assert r.compile.first_call_s > 0 and r.compile.compilations >= 1
    # R2 is the first rung with a model gate: its two programs and the step-form gate's
    # reference step were compiled beside its step; later rungs find that reference run
    # already; R2a (the naive cast) has no model gate, so nothing beside it
    beside = res.rung("R2").details["compiled beside the step"]
    assert beside["jobs"] == 3 and beside["compilations"] >= 3
    assert res.rung("R3").details["compiled beside the step"]["jobs"] == 2
    assert res.rung("R2a").details["compiled beside the step"]["jobs"] == 0
    # a rung's own check compiles beside it too: R1's jit parity (R1 has no model gate), and
    # R4's mirror next to its model gate's two programs
    assert res.rung("R1").details["compiled beside the step"]["jobs"] == 1
    assert res.rung("R4").details["compiled beside the step"]["jobs"] == 3


def test_results_round_trip(run, small_run, tmp_path):
    res = run.result
    back = LadderResult.read(res.write(tmp_path / "jax.json"))
    assert [r.name for r in back.rungs] == list(RUNGS)
    assert back.learning.passed and back.versions["jax"] == jax.__version__
    assert back.rung("R2a").receipt == res.rung("R2a").receipt
    assert back.rung("R1").profile == res.rung("R1").profile
    # a run straight from memory (its kernel report included) comes back as it went in
    small = small_run[0]
    back = LadderResult.read(small.write(tmp_path / "small.json"))
    assert back.to_dict() == small.to_dict() and back.learning == small.learning
    assert back.rung("R3").kernels == small.rung("R3").kernels is not None
    assert back.rung("R3").receipt == small.rung("R3").receipt and back.rung("R3").recipe == small.rung("R3").recipe


def test_multi_gpu_rungs_on_one_device_store_their_prediction(run):
    res = run.result
    for name in MULTI:
        r = res.rung(name)
        assert r.kind == "skipped" and r.tokens_per_s is None and "one device" in r.error
        p = r.prediction
        assert [pt["k"] for pt in p.points] == list(PREDICT_KS)
        assert p.predicted_tokens_per_s == p.points[0]["predicted_tokens_per_s"] and p.measured_tokens_per_s is None
        assert all(pt["predicted_tokens_per_s"] <= pt["linear_tokens_per_s"] for pt in p.points)
    assert res.rung("R5").builds_on == "R1" and res.rung("R5").recipe == res.rung("R1").recipe
    assert res.rung("R5").prediction.assumptions["single_device_source"] == "R1"
    assert res.rung("R5x").builds_on == res.rung("R5f").builds_on == res.learning.configuration
    assert res.rung("R5f").prediction.assumptions["link"]["name"] == "gloo-loopback"


def test_unknown_rung_is_an_error_listing_the_valid_names():
    with pytest.raises(ValueError, match=r"'R9'.*valid choices: R0, R1, R2a, R2, R3c, R3, R4, B1"):
        run_ladder(CFG, rungs=["R1", "R9"])


def test_a_failing_rung_is_a_skipped_entry_and_the_ladder_goes_on():
    run = Ladder(CFG.replace(big_batch=CFG.num_train + 1))
    r = run.run("R3")
    assert r.kind == "skipped" and r.tokens_per_s is None and "larger than the data" in r.error
    assert r.builds_on == "R2" and r.recipe["batch_size"] == CFG.num_train + 1
    assert "Traceback" in r.details["traceback"] and r.key == "batch_up"
    assert run.result.rungs == [r]
    again = run.run("R3")                          # run again: tried again, in its place
    assert run.result.rungs == [again] and again.replaces["outcome"] == r.result_kind


def test_a_failed_learning_check_is_recorded_as_failed():
    lab = JaxLab(CFG.replace(lr=-CFG.lr, learn_steps=40))   # gradient ascent: the loss rises
    check = lab.learning_check("R1", Recipe(batch_size=CFG.batch_size))
    assert not check.passed and check.last > check.first and check.val_after > check.threshold


def test_split_step_matches_the_nnx_jit_step():
    """The split/merge step with donated state computes the same training trajectory."""
    lab = JaxLab(CFG)
    X, Y = next(lab.stream(CFG.batch_size))
    ref = lab.build_step(Recipe(batch_size=CFG.batch_size))
    want = [float(ref(X, Y)) for _ in range(3)]
    split = lab.build_step(Recipe(batch_size=CFG.batch_size, jit="split"))
    model_before = split.model
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        got = [float(split(X, Y)) for _ in range(3)]
    assert got == pytest.approx(want, rel=1e-5)
    model, _ = split.commit()
    assert model is model_before
    assert jax.numpy.allclose(model.norm.scale[...], ref.model.norm.scale[...], atol=1e-6)
    assert split.observed == ref.observed == {"first_activation": "float32", "logits": "float32",
                                              "loss": "float32"}       # read from the traced step


@pytest.mark.parametrize("kw, match", [
    ({"batch_size": 0}, "batch_size=0 must be a positive integer"),
    ({"batch_size": 8, "jit": "pjit"}, r"jit='pjit' is not valid; valid choices: \('none', 'nnx', 'split'\)"),
    ({"batch_size": 8, "dtype": "float16"}, "dtype='float16' is not valid"),
    ({"batch_size": 8, "naive_cast": True, "dtype": "bfloat16"}, "naive_cast=True casts the fp32 model"),
    ({"batch_size": 8, "attn_impl": "cudnn"}, "attn_impl='cudnn' needs dtype='bfloat16'"),
    ({"batch_size": 8, "embed": "sparse"}, "embed='sparse' is not valid"),
])
def test_bad_recipes_are_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        Recipe(**kw)


def test_recipe_round_trip_and_text():
    r = Recipe(batch_size=32, dtype="bfloat16", embed="onehot", embed_fp32=True, jit="split")
    assert Recipe.from_dict(r.to_dict()) == r and r.replace(batch_size=64).batch_size == 64
    assert str(r) == ("bf16, batch 32, onehot embedding (fp32 lookup), xla attention, "
                      "split/merge jax.jit step")
    with pytest.raises(ValueError, match=r"no field\(s\) \['split'\]"):
        Recipe.from_dict({**r.to_dict(), "split": True})
    with pytest.raises(ValueError, match=r"no field\(s\) \['batch'\]"):
        r.replace(batch=3)
