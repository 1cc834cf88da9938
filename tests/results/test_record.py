"""perfladder.results.record (v2): derived ratios and verdicts, JSON round trip, the committed
version-1 files, schema errors, hostile files, the learning check."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import make_result, timing_of

from perfladder.measure.evidence import Gate, ProfileSummary, Receipt, Timing
from perfladder.measure.learning import LearningCheck, check_learning
from perfladder.measure.timing import Throughput
from perfladder.measure.verdict import MIN_EFFECT, VERDICTS, regime, verdict
from perfladder.pages.report import text_table
from perfladder.results import SCHEMA_VERSION, ResultsError
from perfladder.results.record import LadderResult, RungResult
from perfladder.results.schema import MAX_DEPTH, validate

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p for fw in ("torch", "jax") for p in ROOT.glob(f"benchmarks/results/*/{fw}.json"))
V1_FILES = [p for p in COMMITTED if json.loads(p.read_text())["schema_version"] == 1]
V2_FILES = [p for p in COMMITTED if json.loads(p.read_text())["schema_version"] == 2]


# -- derived numbers: ratios, verdicts, regimes -----------------------------------------------------
def test_add_derives_ratios_against_builds_on_and_baseline(synthetic_result):
    r = synthetic_result
    assert r.rung("R0").ratio_base == 1.0 and r.rung("R0").ratio_prev is None
    assert r.rung("R1").ratio_prev == pytest.approx(2.5) and r.rung("R1").ratio_base == pytest.approx(2.5)
    assert r.rung("R2").ratio_prev == pytest.approx(0.8)           # the negative rung
    assert r.rung("R3").ratio_prev == pytest.approx(3.0) and r.rung("R3").ratio_base == pytest.approx(6.0)
    # a control builds on the baseline, and stays out of the waterfall
    assert r.rung("R3c").ratio_base == pytest.approx(1.5) and r.rung("R3c").ratio_prev == pytest.approx(1.5)
    assert r.rung("R5").ratio_base is None and r.rung("R5").verdict is None
    assert [x.name for x in r.waterfall()] == ["R0", "R1", "R2", "R3"]
    assert r.best().name == "R3"


def test_verdicts_judge_window_ranges(synthetic_result):
    r = synthetic_result
    assert r.rung("R0").verdict is None                            # the baseline builds on nothing
    v = {n: r.rung(n).verdict for n in ("R1", "R2", "R3")}
    assert [v[n]["verdict"] for n in ("R1", "R2", "R3")] == ["faster", "slower", "faster"]
    assert v["R1"]["against"] == "R0" and v["R1"]["ratio"] == pytest.approx(2.5)
    assert v["R1"]["range"] == pytest.approx([0.99 * 250_000, 1.01 * 250_000])
    assert v["R1"]["against_range"] == pytest.approx([99_000, 101_000]) and v["R1"]["why"]


def _pair(before_windows, after_windows, *, stable=(True, True)):
    res = LadderResult(framework="torch", device="cpu", config={"name": "full"}, baseline="A")
    for name, w, s, on in (("A", before_windows, stable[0], None), ("B", after_windows, stable[1], "A")):
        res.add(RungResult(name=name, key=name.lower(), label=name, builds_on=on,
                           tokens_per_s=sorted(w)[len(w) // 2], timing=timing_of(w, stable=s)))
    return res.rung("B")


@pytest.mark.parametrize("before, after, stable, expected", [
    ([100, 101, 102], [110, 111, 112], (True, True), "faster"),
    ([100, 101, 102], [90, 91, 92], (True, True), "slower"),
    ([100, 105, 110], [104, 108, 112], (True, True), "within noise"),      # ranges overlap
    # ranges apart, but by less than MIN_EFFECT: two runs of one program differ by that much
    ([100.0, 100.1, 100.2], [100.3, 100.4, 100.5], (True, True), "within noise"),
    # far faster, but a measurement that did not settle credits nothing
    ([100, 101, 102], [200, 300, 400], (True, False), "unsettled"),
    ([100, 150, 200], [400, 401, 402], (False, True), "unsettled"),
])
def test_verdict_rules(before, after, stable, expected):
    b = _pair(before, after, stable=stable)
    assert b.verdict["verdict"] == expected and expected in VERDICTS
    assert b.verdict["min_effect"] == MIN_EFFECT
    if expected == "unsettled":
        assert "did not settle" in b.verdict["why"]
        assert b.ratio_prev == pytest.approx(b.tokens_per_s / sorted(before)[1])   # still shown


def test_a_legacy_rung_without_stability_is_judged_by_its_spread():
    """Version-1 files carry no 'stable': a spread within LEGACY_TARGET_SPREAD counts as settled."""
    def legacy(name, w):
        return RungResult(name=name, key=name.lower(), label=name, tokens_per_s=sorted(w)[1],
                          timing=timing_of(w, stable=None))
    base = legacy("A", [100, 101, 102])
    assert verdict(legacy("B", [110, 111, 112]), base)["verdict"] == "faster"
    assert verdict(legacy("C", [90, 111, 140]), base)["verdict"] == "unsettled"


def _profiled(device_ms, shares, *, tokens_per_s=1000.0, tflops=None):
    return RungResult(name="X", key="x", label="x", tokens_per_s=tokens_per_s, batch_size=10,
                      seq_len=10, tflops=tflops, timing=timing_of([tokens_per_s]),
                      profile=ProfileSummary(tool="test", steps=2, device_ms=device_ms, shares=shares))


def test_regimes_from_the_profile():
    # 100 tokens per step at 1000 tokens/s: a 100 ms step
    assert regime(_profiled(10.0, {"matmul": 0.9}))["regime"] == "host-bound"          # busy 10%
    assert regime(_profiled(95.0, {"matmul": 0.7}))["regime"] == "compute-bound"
    assert regime(_profiled(95.0, {"matmul": 0.7}, tflops=10.0), roof_tflops=100.0)["regime"] == "mixed"
    assert regime(_profiled(95.0, {"elementwise": 0.3, "optimizer": 0.2}))["regime"] == "memory-bound"
    assert regime(_profiled(95.0, {"matmul": 0.3, "elementwise": 0.1}))["regime"] == "mixed"
    out = regime(_profiled(95.0, {"matmul": 0.7}))
    assert out["busy"] == pytest.approx(0.95) and out["step_ms"] == pytest.approx(100.0) and out["why"]
    no = regime(RungResult(name="Y", key="y", label="y", tokens_per_s=1.0, timing=timing_of([1.0])))
    assert no["regime"] == "not profiled"


def test_finalize_is_idempotent_and_follows_the_facts(synthetic_result):
    r = synthetic_result
    before = r.to_dict()
    assert r.finalize().to_dict() == before
    r.rung("R1").tokens_per_s = 50_000.0                  # facts change: derived numbers follow
    r.rung("R1").timing = timing_of([49_000, 50_000, 51_000])
    r.finalize()
    assert r.rung("R1").ratio_prev == pytest.approx(0.5) and r.rung("R1").verdict["verdict"] == "slower"
    assert r.rung("R2").ratio_prev == pytest.approx(4.0)


def test_a_rung_whose_base_did_not_run_has_no_ratio_prev():
    r = make_result(rates=(100.0,))
    r.add(RungResult(name="B1", key="b1", label="x", tokens_per_s=150.0, builds_on="R3",
                     timing=timing_of([150.0])))
    assert r.rung("B1").ratio_prev is None and r.rung("B1").verdict is None
    assert r.rung("B1").ratio_base == pytest.approx(1.5)


def test_duplicates_and_lookups():
    r = make_result(rates=(100.0, 300.0))
    with pytest.raises(ValueError, match="already in this ladder"):
        r.add(RungResult(name="R1", key="again", label="again", tokens_per_s=1.0))
    with pytest.raises(KeyError, match="no rung 'R9'"):
        r.rung("R9")
    assert r.by_key("fp32_control").name == "R3c" and r.by_key("nope") is None
    with pytest.raises(KeyError, match="no gate 'mirror'"):
        r.rung("R1").gate("mirror")


def test_best_prefers_settled_rungs():
    r = make_result(rates=(100.0, 300.0, 200.0))
    r.rung("R1").timing.stable = False
    assert r.best().name == "R2"


# -- JSON --------------------------------------------------------------------------------------------
def test_round_trip_keeps_every_slot(tmp_path, synthetic_result):
    r = synthetic_result
    r1 = r.rung("R1")
    r1.gates = [Gate(name="compiled vs eager logits", passed=True, values={"max_abs_diff": 1e-6},
                     tolerances={"atol": 1e-2})]
    r1.receipt = Receipt(claimed="bf16", observed={"logits": "bfloat16"}, where="TrainStep.__call__")
    r1.profile = ProfileSummary(tool="torch.profiler", steps=2, device_ms=3.0, shares={"matmul": 0.5},
                                rows=[{"name": "mm", "device_ms": 1.5}])
    r1.details = {"attention_ms": {"flash": {"available": True, "ms": 0.1}}}
    r.learning = check_learning([3.0] * 20 + [2.0] * 20)
    r.peak_tflops = {"bf16": 989.5, "tf32": 494.7}
    r.finalize()                       # slots set after add(): derive again (R1 is profiled now)
    path = r.write(tmp_path / "sub" / "torch.json")
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 2
    assert not list(path.parent.glob("*.tmp"))
    back = LadderResult.read(path)
    assert back.to_dict() == r.to_dict()
    b1 = back.rung("R1")
    assert isinstance(b1.timing, Timing) and isinstance(b1.receipt, Receipt) and b1.receipt.ok
    assert isinstance(b1.gates[0], Gate) and b1.gate("compiled vs eager logits").passed
    assert isinstance(b1.profile, ProfileSummary) and b1.regime["regime"] != "not profiled"
    assert back.rung("R2").ratio_prev == pytest.approx(0.8) and back.rung("R2").verdict["verdict"] == "slower"
    assert back.learning.passed and back.learning.first == 3.0 and back.schema_read == 2


def test_unknown_fields_of_a_newer_file_are_ignored():
    data = make_result().to_dict()
    data["rungs"][1]["timing"]["from_the_future"] = 1
    data["rungs"][1]["from_the_future"] = {"x": 1}
    back = LadderResult.from_dict(data)
    assert back.rung("R1").windows == data["rungs"][1]["timing"]["windows"]


def test_partial_run_without_baseline_is_valid():
    r = LadderResult(framework="jax", device="cpu", config={"name": "smoke"}, baseline="R0")
    r.add(RungResult(name="R1", key="compile", label="jit", tokens_per_s=10.0, builds_on="R0",
                     timing=timing_of([10.0])))
    assert r.rung("R1").ratio_base is None and r.rung("R1").ratio_prev is None
    LadderResult.from_dict(r.to_dict())


def test_framework_must_be_known():
    with pytest.raises(ResultsError, match=r"framework='mxnet'.*valid choices"):
        LadderResult(framework="mxnet", device="cpu", config={}, baseline="R0")


# -- the committed version-1 files -----------------------------------------------------------------------
def test_there_are_committed_v1_files():
    assert len(V1_FILES) >= 6


@pytest.mark.parametrize("path", V2_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_v2_files_validate_and_round_trip(path, tmp_path):
    """Every committed GPU run written by the engine validates against the schema, carries
    typed evidence, and survives a write and a read unchanged."""
    res = LadderResult.read(path)
    assert res.schema_read == 2 and res.framework == path.stem and res.roofs
    measured = [r for r in res.rungs if r.measured]
    assert measured and all(r.timing is not None and r.key for r in measured)
    back = LadderResult.read(res.write(tmp_path / path.name))
    assert back.to_dict() == res.to_dict()


@pytest.mark.parametrize("path", V1_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_v1_file_upgrades(path, tmp_path):
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1
    res = LadderResult.read(path)
    assert res.schema_read == 1 and res.framework == raw["framework"] == path.stem
    assert [r.name for r in res.rungs] == [r["name"] for r in raw["rungs"]]
    for old, new in zip(raw["rungs"], res.rungs):
        measured = old.get("tokens_per_s") is not None and old["kind"] != "skipped"
        assert new.tokens_per_s == (old["tokens_per_s"] if measured else None), new.name
        assert new.kind == old["kind"] and new.label == old["label"]
        if measured:
            assert new.windows == (old.get("windows") or [old["tokens_per_s"]]), new.name
            assert new.stable is None                      # the v1 timer did not settle windows
        else:
            assert new.error, new.name
    assert len({r.key for r in res.rungs}) == len(res.rungs)          # technique keys are unique
    if any(r.name == res.baseline and r.measured for r in res.rungs):
        assert all(r.ratio_base is not None for r in res.waterfall())
    # written back as version 2, it reads the same
    again = LadderResult.read(res.write(tmp_path / path.name))
    assert again.schema_read == 2 and again.to_dict() == res.to_dict()


def test_v1_evidence_moves_into_the_typed_slots():
    res = LadderResult.read(ROOT / "benchmarks/results/h200-book/torch.json")
    assert res.rung("R1").key == "compile" and res.rung("B4").key == "onehot_embedding"
    r2 = res.rung("R2")
    assert r2.receipt.claimed == "bf16" and "version-1" in r2.receipt.where
    assert r2.builds_on == "R1" and r2.ratio_prev == pytest.approx(
        r2.tokens_per_s / res.rung("R1").tokens_per_s)
    assert any(r.gates for r in res.rungs) and any(r.profile is not None for r in res.rungs)


def test_v1_without_framework_is_a_clean_error(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 1, "rungs": []}))
    with pytest.raises(ResultsError, match=f"{path}.*needs 'framework'"):
        LadderResult.read(path)


# -- what a bad file says -----------------------------------------------------------------------------
def _broken(fn):
    d = make_result().to_dict()
    fn(d)
    return d


@pytest.mark.parametrize("mutate, msg", [
    (lambda d: d.pop("rungs"), r"\(top level\): 'rungs' is a required property"),
    (lambda d: d.pop("framework"), "'framework' is a required property"),
    (lambda d: d.update(device=3), "device: 3 is not of type 'string'"),
    (lambda d: d.update(config=[]), "config: .* is not of type 'object'"),
    (lambda d: d.update(schema_version=3), r"schema_version 3 is not supported \(expected 2\)"),
    (lambda d: d.update(framework="tf"), "framework: 'tf' is not one of"),
    (lambda d: d["rungs"][1].update(kind="bonus"), r"rungs\[1\]\.kind \(rung R1\): 'bonus' is not one of"),
    (lambda d: d["rungs"][1].pop("label"), r"rungs\[1\] \(rung R1\): 'label' is a required property"),
    (lambda d: d["rungs"][2].update(key="Fast-Path"), r"rungs\[2\]\.key \(rung R2\): 'Fast-Path' does not match"),
    (lambda d: d["rungs"][1].update(tokens_per_s="fast"), r"rungs\[1\]\.tokens_per_s \(rung R1\): 'fast' is not of type 'number'"),
    (lambda d: d["rungs"][1].update(tokens_per_s=-5), r"rungs\[1\]\.tokens_per_s \(rung R1\): -5 is less than"),
    (lambda d: d["rungs"][3]["timing"].update(windows=[1.0, -2.0]),
     r"rungs\[3\]\.timing\.windows\[1\] \(rung R3\): -2.0 is less than"),
    (lambda d: d["rungs"][1]["timing"].update(stable="yes"), r"rungs\[1\]\.timing\.stable \(rung R1\): 'yes'"),
    (lambda d: d["rungs"][1].update(precision="fp64"), r"rungs\[1\]\.precision \(rung R1\): 'fp64' is not one of"),
    (lambda d: d["rungs"][1].update(mfu="12%"), r"rungs\[1\]\.mfu \(rung R1\): '12%' is not of type 'number'"),
    (lambda d: d["rungs"][1].update(batch_size=64.5), r"rungs\[1\]\.batch_size \(rung R1\): 64.5 is not of type"),
    (lambda d: d["rungs"][1].update(receipt={"claimed": "fp64", "observed": {}, "where": "x"}),
     r"rungs\[1\]\.receipt\.claimed \(rung R1\): 'fp64' is not one of"),
    (lambda d: d["rungs"][1].update(gates=[{"name": "x"}]), r"rungs\[1\]\.gates\[0\] \(rung R1\): 'passed' is a required"),
    (lambda d: d["rungs"][-1].update(tokens_per_s=5.0), r"rungs\[5\] \(R5\) is 'skipped' but has tokens_per_s"),
    (lambda d: d["rungs"][1].update(tokens_per_s=None), r"rungs\[1\] \(R1\) is 'rung' but has no tokens_per_s"),
    (lambda d: d["rungs"][1].update(timing=None), r"rungs\[1\] \(R1\) has tokens_per_s but no timing windows"),
    (lambda d: d["rungs"][2].update(name="R1"), "rung names repeat"),
    (lambda d: d.update(learning={"steps": 40, "first": 3.0}), "learning: 'window' is a required property"),
    (lambda d: d.update(learning={"steps": 40, "window": 20, "first": "3", "last": 2.0}),
     "learning.first: '3' is not of type 'number'"),
    (lambda d: d.update(notes="none"), "notes: 'none' is not of type 'array'"),
])
def test_malformed_results_name_file_field_and_rung(tmp_path, mutate, msg):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_broken(mutate)))
    with pytest.raises(ResultsError, match=msg) as e:
        LadderResult.read(path)
    assert str(e.value).startswith(f"{path}: ")              # says which file
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("where, put", [
    ("rungs[1].tokens_per_s", lambda d, x: d["rungs"][1].update(tokens_per_s=x)),
    ("rungs[2].timing.windows[0]", lambda d, x: d["rungs"][2]["timing"]["windows"].__setitem__(0, x)),
    ("rungs[0].tflops", lambda d, x: d["rungs"][0].update(tflops=x)),
    ("peak_tflops.bf16", lambda d, x: d.update(peak_tflops={"bf16": x})),
])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused_naming_the_field(tmp_path, where, put, bad):
    d = make_result().to_dict()
    put(d, bad)
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(d))                          # Python writes NaN / Infinity literals
    with pytest.raises(ResultsError, match="finite numbers only") as e:
        LadderResult.read(path)
    assert str(path) in str(e.value) and f"results.{where} is {bad!r}" in str(e.value)


def test_write_refuses_non_finite_and_leaves_no_file(tmp_path):
    r = make_result()
    r.rung("R1").tflops = float("nan")
    with pytest.raises(ResultsError, match=r"rungs\[1\]\.tflops is nan"):
        r.write(tmp_path / "x.json")
    assert not list(tmp_path.iterdir())


def test_write_refuses_an_invalid_result(tmp_path):
    r = make_result()
    r.rungs[1].kind = "bonus"
    with pytest.raises(ResultsError, match="'bonus' is not one of"):
        r.write(tmp_path / "x.json")
    assert not list(tmp_path.iterdir())


def test_a_file_is_checked_once_for_each_text_it_has_held(tmp_path, monkeypatch):
    """Reading the same text again skips the schema check (the pages read the committed files
    many times); the same file holding another text is checked again, and an invalid text is
    refused however often a valid one was read from that path before."""
    import perfladder.results.schema as schema
    checked = []
    real = schema._check
    monkeypatch.setattr(schema, "_check", lambda data, source: (checked.append(source), real(data, source)))
    path = tmp_path / "run.json"
    make_result().write(path)
    checked.clear()                                   # the write checks what it writes
    LadderResult.read(path)
    LadderResult.read(path)
    assert checked == [str(path)]
    r = make_result()
    r.rung("R1").notes.append("another text")
    r.write(path)
    checked.clear()
    assert LadderResult.read(path).rung("R1").notes[-1] == "another text"
    assert checked == [str(path)]
    data = json.loads(path.read_text())
    data["rungs"][1]["kind"] = "bonus"
    path.write_text(json.dumps(data))
    for _ in range(2):
        with pytest.raises(ResultsError, match="'bonus' is not one of"):
            LadderResult.read(path)


def test_deeply_nested_json_is_a_clean_error(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)         # past the parser's recursion limit
    with pytest.raises(ResultsError, match="nested too deeply") as e:
        LadderResult.read(path)
    assert str(path) in str(e.value)
    # deep enough to parse, deeper than any results file
    d = make_result().to_dict()
    nest = {}
    d["rungs"][1]["details"] = nest
    for _ in range(MAX_DEPTH + 5):
        nest["x"] = {}
        nest = nest["x"]
    path.write_text(json.dumps(d))
    with pytest.raises(ResultsError, match=f"nested deeper than {MAX_DEPTH} levels at results.rungs"):
        LadderResult.read(path)


def test_deep_v1_file_is_a_clean_error(tmp_path):
    d = {"schema_version": 1, "framework": "torch", "rungs": []}
    nest = d
    for _ in range(MAX_DEPTH + 5):
        nest["x"] = {}
        nest = nest["x"]
    path = tmp_path / "deep1.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ResultsError, match="nested deeper"):
        LadderResult.read(path)


@pytest.mark.parametrize("cut", [1, 20, 500])
def test_truncated_json_is_a_clean_error(tmp_path, cut):
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(make_result().to_dict())[:-cut])
    with pytest.raises(ResultsError, match="not valid JSON") as e:
        LadderResult.read(path)
    assert str(path) in str(e.value)


def test_not_an_object_missing_unreadable(tmp_path):
    with pytest.raises(ResultsError, match="x.json: top level must be a JSON object, got list"):
        validate([1, 2], source="x.json")
    with pytest.raises(ResultsError, match="no such results file"):
        LadderResult.read(tmp_path / "nope.json")
    with pytest.raises(ResultsError, match="is a directory"):
        LadderResult.read(tmp_path)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ResultsError, match="not a text file"):
        LadderResult.read(binary)
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(ResultsError, match="not valid JSON"):
        LadderResult.read(empty)


# -- the learning check --------------------------------------------------------------------------------
def test_check_learning_falling_curve():
    losses = [3.3 - 0.02 * i for i in range(60)]
    c = check_learning(losses, window=10)
    assert isinstance(c, LearningCheck) and c.passed
    assert c.first == pytest.approx(3.3 - 0.02 * 4.5) and c.last == pytest.approx(3.3 - 0.02 * 54.5)
    assert c.to_dict()["passed"] is True and str(c).endswith("-- passed")


def test_check_learning_raises_on_rising_or_flat_curve():
    with pytest.raises(AssertionError, match="breaks the model.*FAILED"):
        check_learning([2.0 + 0.01 * i for i in range(40)])
    with pytest.raises(AssertionError):
        check_learning([2.0] * 40)
    with pytest.raises(AssertionError):                    # a NaN loss is not learning
        check_learning([3.0] * 20 + [float("nan")] * 20)


def test_check_learning_bad_arguments():
    with pytest.raises(ValueError, match="need at least 40 losses"):
        check_learning([1.0] * 39)
    with pytest.raises(ValueError, match="window=0"):
        check_learning([1.0] * 10, window=0)


def test_learning_check_needs_the_validation_threshold():
    ok = LearningCheck(steps=40, first=3.0, last=2.0, window=20, val_before=3.3, val_after=2.0,
                       threshold=2.5)
    assert ok.passed and "must be < 2.500" in str(ok)
    falls_but_guesses = LearningCheck(steps=40, first=3.0, last=2.0, window=20, val_before=3.3,
                                      val_after=2.9, threshold=2.5)
    assert not falls_but_guesses.passed and str(falls_but_guesses).endswith("FAILED")
    back = LearningCheck.from_dict(falls_but_guesses.to_dict())      # 'passed' is derived, not read
    assert back.passed is False and back.to_dict() == falls_but_guesses.to_dict()


def test_a_diverged_learning_check_is_written_as_failed(tmp_path):
    """NaN losses cannot go into JSON; the run is still written (as a failed check), not lost."""
    r = make_result()
    r.learning = LearningCheck(steps=4, first=3.0, last=float("nan"), window=2,
                               losses=[3.0, 3.0, float("nan"), float("inf")], val_before=3.3,
                               val_after=float("nan"), threshold=2.5)
    assert not r.learning.passed
    back = LadderResult.read(r.write(tmp_path / "diverged.json"))
    assert back.learning.passed is False and back.learning.last is None
    assert back.learning.losses == [3.0, 3.0, None, None] and "FAILED" in str(back.learning)


def test_table_mentions_every_rung(synthetic_result):
    text = text_table(synthetic_result)
    assert "torch on NVIDIA H200 (full config)" in text
    for name in ("R0", "R1", "R2", "R3", "R3c", "R5"):
        assert f"\n{name} " in text
    assert "slower" in text and "faster" in text
    assert str(RungResult(name="R5", key="dp", label="dp", kind="skipped",
                          error="one device")) == "R5 dp: skipped (one device)"
    s = str(synthetic_result.rung("R2"))
    assert "200,000 tokens/s" in s and "0.80x R1" in s and "slower" in s


def test_timing_evidence():
    t = Timing(windows=[50.0, 98.0, 100.0, 102.0], seconds=[2.0, 1.0, 1.0, 1.0], settled=3,
               stable=True, target_spread=0.05, steps_per_window=4, warmup=1)
    assert t.settled_windows == [98.0, 100.0, 102.0] and (t.low, t.high) == (98.0, 102.0)
    assert t.spread == pytest.approx(0.04) and t.step_time_s == pytest.approx(0.25)
    assert not math.isnan(Timing.from_dict(t.to_dict()).spread)
    # an even number of settled windows: the stored record reads the step time as the live
    # measurement does (the median of the two middle windows), from the one definition
    even = dict(windows=[90.0, 100.0, 110.0, 120.0], seconds=[1.0, 2.0, 3.0, 4.0], settled=4,
                steps_per_window=2, warmup=1)
    live = Throughput(tokens_per_s=105.0, tokens_per_window=8, **even)
    stored = Timing(stable=True, target_spread=0.5, **even)
    assert stored.step_time_s == live.step_time_s == pytest.approx(1.25)
    assert (stored.low, stored.high, stored.spread) == (live.low, live.high, live.spread)
    assert Receipt("bf16", {"logits": "bfloat16"}, "x").ok
    assert not Receipt("bf16", {"logits": "float32"}, "x").ok and not Receipt("bf16", {}, "x").ok
