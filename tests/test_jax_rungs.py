"""The JAX ladder in the smoke config: one run of every rung, shared by the tests below
(and by test_jax_beyond.py, which checks the B rungs of the same run)."""
import shutil
import warnings

from perfladder.jax.timer import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import RUNGS, Ladder, learning_check, make_split_step, run_ladder  # noqa: E402
from perfladder.jax.ladder import EAGER_WINDOWS  # noqa: E402
from perfladder.jax.rungs import r5_data_parallel  # noqa: E402
from perfladder.jax.steps import assert_fp32_masters  # noqa: E402
from perfladder.results import KINDS, LadderResult, LearningCheck, RungResult, validate  # noqa: E402
from _jax_smoke import smoke_run  # noqa: E402

CFG = get_config("smoke")
SEED = ["R0", "R1", "R2a", "R2", "R3c", "R3", "R4", "R5"]


@pytest.fixture(scope="module")
def run():
    """(ladder, progress events) after every rung and the learning check."""
    return smoke_run()


def test_every_rung_is_a_well_formed_result(run):
    ladder, _ = run
    res = ladder.result
    assert [r.name for r in res.rungs] == list(RUNGS)
    assert res.framework == "jax" and res.baseline == "R1" and res.device == "cpu"
    assert [r.name for r in res.rungs][:len(SEED)] == SEED
    for r in res.rungs[:len(SEED)]:            # the B rungs: test_jax_beyond.py
        assert isinstance(r, RungResult) and r.kind in KINDS
        if r.kind == "skipped":
            assert r.tokens_per_s is None and r.notes
            continue
        assert r.tokens_per_s > 0 and len(r.windows) == (EAGER_WINDOWS if r.name == "R0" else CFG.windows)
        assert r.seq_len == CFG.num_steps
        assert r.batch_size == (CFG.batch_size if r.name in ("R0", "R1", "R2a", "R2") else CFG.big_batch)
        assert r.tflops > 0 and r.mfu is None                      # CPU: no peak known
        assert any("MFU not applicable" in n for n in r.notes)
        if r.name != "R0":
            assert isinstance(r.peak_mem_bytes, int) and r.peak_mem_bytes > 0
            assert any("planned temporaries" in n for n in r.notes)
    kinds = {r.name: r.kind for r in res.rungs if r.name in SEED}
    assert kinds == {"R0": "rung", "R1": "rung", "R2a": "control", "R2": "rung", "R3c": "control",
                     "R3": "rung", "R4": "rung", "R5": "skipped"}
    precision = {r.name: r.precision for r in res.rungs if r.kind != "skipped" and r.name in SEED}
    assert precision == {"R0": "fp32", "R1": "fp32", "R2a": "fp32", "R2": "bf16", "R3c": "fp32",
                         "R3": "bf16", "R4": "bf16"}
    validate(res.to_dict())


def test_ratios_are_to_the_jitted_step(run):
    res = run[0].result
    r0, r1, r2 = res.rung("R0"), res.rung("R1"), res.rung("R2")
    assert r1.ratio_base == 1.0
    assert r0.ratio_base == pytest.approx(r0.tokens_per_s / r1.tokens_per_s)
    assert r1.ratio_prev == pytest.approx(r1.tokens_per_s / r0.tokens_per_s)
    assert r2.ratio_prev == pytest.approx(r2.tokens_per_s / r1.tokens_per_s)   # R2a is a control
    assert res.rung("R3").ratio_prev == pytest.approx(res.rung("R3").tokens_per_s / r2.tokens_per_s)
    assert res.rung("R3c").ratio_prev is None


def test_r1_records_the_step_accounting(run):
    r1 = run[0].result.rung("R1")
    x = r1.extra
    assert x["parity_rel_diff"] < 1e-4                         # CPU fp32: no TF32
    assert x["first_call_s"] > 0 and x["first_call_compilations"] >= 1
    assert x["traced_tflops"] == pytest.approx(x["traced_flops_per_step"] / x["step_ms"] / 1e9)
    assert x["planned_temp_bytes"] == r1.peak_mem_bytes
    # the traced step's matmuls and the 6N + 12LTD model agree; 6N also counts the norm and bias
    # parameters, a few % of N at the smoke width (0.2% at the full one: test_jax_model.py)
    assert 0.93 < x["traced_flops_per_step"] / x["model_flops_per_step"] <= 1.0


def test_precision_receipts(run):
    res = run[0].result
    r2a, r2 = res.rung("R2a"), res.rung("R2")
    assert r2a.extra["receipt"] == "float32" and set(r2a.extra["matmul_dtypes"]) == {"float32"}
    assert r2.extra["receipt"] == "bfloat16" and set(r2.extra["matmul_dtypes"]) == {"bfloat16"}
    assert "silently computed in fp32" in " ".join(r2a.notes)
    assert r2.extra["temp_bytes_R1"] == res.rung("R1").peak_mem_bytes


def test_fp32_masters_survive_the_bf16_rungs(run):
    model, opt = run[0].models["bf16"]
    assert model.dtype == jnp.bfloat16
    assert_fp32_masters(model, opt)          # raises if a parameter or Adam moment is not fp32


def test_checkpoint_rung_gated_and_planned(run):
    res = run[0].result
    r4 = res.rung("R4")
    assert r4.extra["mirror_rel_diff"] <= 1e-2
    assert r4.extra["temp_bytes_R3"] == res.rung("R3").peak_mem_bytes
    assert 1.2 < r4.extra["flops_ratio_vs_R3"] < 1.34         # the backward pass recomputes
    assert res.rung("R3").extra["temp_bytes_R3c"] == res.rung("R3c").peak_mem_bytes


def test_learning_check_and_progress(run):
    ladder, events = run
    check = ladder.result.learning
    assert isinstance(check, LearningCheck) and check.passed and check.steps == CFG.learn_steps
    names = [n for e, n, _ in events if e == "start"]
    assert names == list(RUNGS) + ["learning"]
    ends = {n: p for e, n, p in events if e == "end"}
    assert ends["R3"] is ladder.result.rung("R3") and ends["learning"] is check


def test_results_round_trip(run, tmp_path):
    res = run[0].result
    back = LadderResult.read(res.write(tmp_path / "jax.json"))
    assert [r.name for r in back.rungs] == list(RUNGS)
    assert back.learning.passed and back.versions["jax"] == jax.__version__


def test_r5_on_one_device_is_skipped_and_k_too_large_is_an_error(run):
    ladder = run[0]
    r5 = ladder.result.rung("R5")
    assert r5.kind == "skipped" and "one device" in r5.notes[0]
    with pytest.raises(ValueError, match=r"k=\d+ devices requested but only 1"):
        r5_data_parallel(ladder, k=jax.device_count() + 1)


def test_unknown_rung_is_an_error_listing_the_valid_names():
    with pytest.raises(ValueError, match=r"'R9'.*valid choices: R0, R1, R2a, R2, R3c, R3, R4, R5"):
        run_ladder(CFG, rungs=["R1", "R9"])


def test_big_batch_larger_than_the_data_is_a_clear_error():
    ladder = Ladder(CFG.replace(big_batch=CFG.num_train + 1))
    with pytest.raises(ValueError, match="larger than the data"):
        RUNGS["R3"](ladder)


def test_learning_check_fails_loudly_when_the_loss_does_not_fall(run):
    ladder = Ladder(CFG.replace(lr=-CFG.lr))              # gradient ascent: the loss rises
    ladder.step = run[0].step
    with pytest.raises(AssertionError, match="not speed"):
        learning_check(ladder, steps=10, window=5)


def test_split_step_matches_the_nnx_jit_step(run):
    """The split/merge step with donated state computes the same training trajectory."""
    ladder = run[0]
    X, Y = next(ladder.stream(CFG.batch_size))
    m1, o1 = ladder.build(jnp.float32)
    ref = [float(ladder.step(m1, o1, X, Y)) for _ in range(3)]
    m2, o2 = ladder.build(jnp.float32)
    step = make_split_step(m2, o2)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable.*")
        got = [float(step(X, Y)) for _ in range(3)]
    assert got == pytest.approx(ref, rel=1e-5)
    model, opt = step.commit()
    assert model is m2 and opt is o2
    assert jnp.allclose(model.norm.scale[...], m1.norm.scale[...], atol=1e-6)
