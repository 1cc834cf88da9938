"""perfladder.results: ratios, JSON round trip, schema errors, the learning check."""
from __future__ import annotations

import json

import pytest
from conftest import make_result

from perfladder.results import (LadderResult, LearningCheck, ResultsError, RungResult, smoothed_check,
                                validate)


def test_add_fills_ratios(synthetic_result):
    r = synthetic_result
    assert r.rung("R0").ratio_base == 1.0 and r.rung("R0").ratio_prev is None
    assert r.rung("R1").ratio_prev == pytest.approx(2.5) and r.rung("R1").ratio_base == pytest.approx(2.5)
    assert r.rung("R2").ratio_prev == pytest.approx(0.8)           # the negative rung
    assert r.rung("R3").ratio_prev == pytest.approx(3.0) and r.rung("R3").ratio_base == pytest.approx(6.0)
    # a control is measured against the baseline only, and stays out of the waterfall
    assert r.rung("R3c").ratio_base == pytest.approx(1.5) and r.rung("R3c").ratio_prev is None
    assert r.rung("R5").ratio_base is None
    assert [x.name for x in r.waterfall()] == ["R0", "R1", "R2", "R3"]
    assert r.best().name == "R3"


def test_add_with_explicit_prev_and_duplicates():
    r = make_result(rates=(100.0, 300.0))
    b = r.add(RungResult(name="B1", label="beyond", tokens_per_s=150.0), prev="R0")
    assert b.ratio_prev == pytest.approx(1.5)
    with pytest.raises(ValueError, match="already in this ladder"):
        r.add(RungResult(name="B1", label="again", tokens_per_s=1.0))
    with pytest.raises(KeyError, match="no rung 'R9'"):
        r.rung("R9")


def test_round_trip(tmp_path, synthetic_result):
    r = synthetic_result
    r.learning = smoothed_check([3.0] * 20 + [2.0] * 20)
    r.peak_tflops = {"bf16": 989.5, "tf32": 494.7}
    path = r.write(tmp_path / "sub" / "torch.json")
    back = LadderResult.read(path)
    assert back.to_dict() == r.to_dict()
    assert back.rung("R2").ratio_prev == pytest.approx(0.8)
    assert back.learning.passed and back.learning.first == 3.0
    assert json.loads(path.read_text())["schema_version"] == 1


def test_partial_run_without_baseline_is_valid():
    r = LadderResult(framework="jax", device="cpu", config={"name": "smoke"}, baseline="R0")
    r.add(RungResult(name="R1", label="jit", tokens_per_s=10.0, windows=[10.0]))
    assert r.rung("R1").ratio_base is None
    LadderResult.from_dict(r.to_dict())


def test_framework_must_be_known():
    with pytest.raises(ResultsError, match=r"framework='mxnet'.*valid choices"):
        LadderResult(framework="mxnet", device="cpu", config={}, baseline="R0")


def _data():
    return make_result().to_dict()


def _break(fn):
    d = _data()
    fn(d)
    return d


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d.pop("rungs"), "missing required key 'rungs'"),
    (lambda d: d.pop("framework"), "missing required key 'framework'"),
    (lambda d: d.update(device=3), "'device' must be str, got int"),
    (lambda d: d.update(config=[]), "'config' must be dict, got list"),
    (lambda d: d.update(schema_version=2), "schema_version 2 is not supported"),
    (lambda d: d.update(framework="tf"), "framework 'tf' is not one of"),
    (lambda d: d["rungs"][1].update(kind="bonus"), r"rungs\[1\]\.kind 'bonus' is not one of"),
    (lambda d: d["rungs"][1].pop("label"), r"rungs\[1\] is missing 'label'"),
    (lambda d: d["rungs"][1].update(tokens_per_s="fast"), r"rungs\[1\]\.tokens_per_s must be a positive"),
    (lambda d: d["rungs"][1].update(tokens_per_s=float("nan")), r"rungs\[1\]\.tokens_per_s"),
    (lambda d: d["rungs"][1].update(windows=[1.0, -2.0]), r"rungs\[1\]\.windows must hold positive"),
    (lambda d: d["rungs"][1].update(precision="fp64"), r"precision 'fp64' is not one of"),
    (lambda d: d["rungs"][1].update(mfu="12%"), r"rungs\[1\]\.mfu must be a number or null"),
    (lambda d: d["rungs"][1].update(batch_size=64.5), r"rungs\[1\]\.batch_size must be an integer"),
    (lambda d: d["rungs"][-1].update(tokens_per_s=5.0), r"is 'skipped' but has tokens_per_s"),
    (lambda d: d["rungs"][2].update(name="R1"), "rung names repeat"),
    (lambda d: d.update(baseline="R7"), r"baseline 'R7' is not among the rungs.*carry ratio_base"),
    (lambda d: d.update(learning={"steps": 40, "first": 3.0}), "learning is missing 'window'"),
    (lambda d: d.update(learning={"steps": 40, "window": 20, "first": "3", "last": 2.0}),
     "learning.first must be a number"),
    (lambda d: d.update(notes="none"), "'notes' must be list"),
])
def test_malformed_results_name_the_problem(tmp_path, mutate, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_break(mutate)))
    with pytest.raises(ResultsError, match=msg) as e:
        LadderResult.read(path)
    assert str(path) in str(e.value)                       # says which file


def test_not_an_object():
    with pytest.raises(ResultsError, match="top level must be a JSON object, got list"):
        validate([1, 2], source="x.json")


def test_invalid_json(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(_data())[:-20])
    with pytest.raises(ResultsError, match="not valid JSON"):
        LadderResult.read(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ResultsError, match="no such results file"):
        LadderResult.read(tmp_path / "nope.json")
    with pytest.raises(ResultsError, match="cannot read results file"):
        LadderResult.read(tmp_path)


def test_write_refuses_an_invalid_result(tmp_path):
    r = make_result()
    r.rungs[1].kind = "bonus"
    with pytest.raises(ResultsError, match="kind 'bonus'"):
        r.write(tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_smoothed_check_falling_curve():
    losses = [3.3 - 0.02 * i for i in range(60)]
    c = smoothed_check(losses, window=10)
    assert isinstance(c, LearningCheck) and c.passed
    assert c.first == pytest.approx(3.3 - 0.02 * 4.5) and c.last == pytest.approx(3.3 - 0.02 * 54.5)
    assert c.to_dict()["passed"] is True and "falls" in str(c)


def test_smoothed_check_raises_on_rising_or_flat_curve():
    with pytest.raises(AssertionError, match="DOES NOT FALL"):
        smoothed_check([2.0 + 0.01 * i for i in range(40)])
    with pytest.raises(AssertionError):
        smoothed_check([2.0] * 40)
    with pytest.raises(AssertionError):                    # a NaN loss is not learning
        smoothed_check([3.0] * 20 + [float("nan")] * 20)


def test_smoothed_check_bad_arguments():
    with pytest.raises(ValueError, match="need at least 40 losses"):
        smoothed_check([1.0] * 39)
    with pytest.raises(ValueError, match="window=0"):
        smoothed_check([1.0] * 10, window=0)


def test_table_mentions_every_rung(synthetic_result):
    text = synthetic_result.table()
    assert "torch on NVIDIA H200 (full config), ratios to R0" in text
    for name in ("R0", "R1", "R2", "R3", "R3c", "R5"):
        assert f"\n{name} " in text
    assert str(RungResult(name="R5", label="dp", tokens_per_s=None, kind="skipped",
                          notes=["one device"])) == "R5 dp: skipped (one device)"


def test_set_learning_keeps_one_note_and_checks_its_prefix():
    res = make_result()
    check = smoothed_check([3.0] * 20 + [1.0] * 20)
    res.notes.append("unrelated")
    res.set_learning(check, "learning check: first")
    assert res.set_learning(check, "learning check: again") is check and res.learning is check
    assert res.notes == ["unrelated", "learning check: again"]
    with pytest.raises(ValueError, match="'learning check: '"):
        res.set_learning(check, "trained for a while")
