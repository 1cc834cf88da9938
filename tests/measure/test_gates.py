"""perfladder.measure.gates: the tolerance table, GateResult, the errors and the receipt check (no framework)."""
from __future__ import annotations

import json
import math

import pytest

from perfladder.hardware import PRECISIONS
from perfladder.measure import gates as g


def test_tolerances_follow_the_coarser_precision_and_grow_with_the_unit_roundoff():
    for a in PRECISIONS:
        for b in PRECISIONS:
            assert g.tolerances(a, b) == g.tolerances(b, a) == g.tolerances(g.coarser(a, b),
                                                                          g.coarser(a, b))
    assert g.coarser("fp32", "bf16") == "bf16" and g.coarser("tf32", "fp32") == "tf32"
    fwd = [g.FORWARD_TOL[p] for p in ("fp32", "tf32", "bf16")]
    bwd = [g.BACKWARD_TOL[p] for p in ("fp32", "tf32", "bf16")]
    assert fwd == sorted(fwd) and bwd == sorted(bwd)
    assert all(g.BACKWARD_TOL[p] >= g.FORWARD_TOL[p] for p in PRECISIONS)
    # the reduced-precision rows are a fixed multiple of their format's unit roundoff
    for p in ("tf32", "bf16"):
        assert g.FORWARD_TOL[p] == 16 * g.UNIT_ROUNDOFF[p]
        assert g.BACKWARD_TOL[p] == 32 * g.UNIT_ROUNDOFF[p]
    # the mildest planted bug (lookup gradient halved: ~0.33) stays well above every tolerance
    assert max(bwd) <= 0.33 / 2
    # the optimizer gate: no tighter than the fp32 forward's, and the mildest planted optimizer
    # bug (beta1 = 0.8 moves a parameter by 0.019 at least) over 10x above it
    assert g.FORWARD_TOL["fp32"] <= g.OPTIMIZER_TOL <= 0.019 / 10


def test_bad_precision_is_refused():
    with pytest.raises(ValueError, match="'fp16'.*valid choices"):
        g.tolerances("fp32", "fp16")


def test_rel_diff_edge_cases():
    assert g.rel_diff(1.0, 4.0) == 0.25
    assert g.rel_diff(0.0, 0.0) == 0.0
    assert g.rel_diff(1e-9, 0.0) == math.inf                  # reference zero, candidate not
    assert g.rel_diff(float("nan"), 1.0) == math.inf          # NaN can never pass a <= check


def test_probe_std_gives_the_score_std():
    # a score's std is D * s^2 for projection weights of std s
    for D in (32, 512):
        s = g.probe_qk_std(D)
        assert D * s * s == pytest.approx(g.PROBE_SCORE_STD)
    with pytest.raises(ValueError, match="num_hiddens"):
        g.probe_qk_std(0)


def _result(**measured):
    tol = {k: 0.1 for k in measured}
    return g.GateResult.judge("model gate", "ref", "cand", {"reference": "fp32", "candidate": "bf16"},
                              measured, tol, details={"batches": 1})


def test_gate_result_judges_and_round_trips():
    ok = _result(logits=0.01, **{"grad/a": 0.05})
    assert ok.passed and ok.worst == "grad/a"
    bad = _result(logits=0.01, **{"grad/a": 0.05, "grad/b": float("inf"), "grad/c": float("nan")})
    assert not bad.passed and bad.worst in ("grad/b", "grad/c")
    assert bad.measured["grad/c"] == math.inf                 # NaN is stored as inf
    d = json.loads(json.dumps(bad.to_dict()))                 # JSON-safe: inf as "inf"
    assert d["measured"]["grad/b"] == "inf"
    back = g.GateResult.from_dict(d)
    assert back.measured["grad/b"] == math.inf and back.passed is False and back.worst == bad.worst
    assert g.GateResult.from_dict(ok.to_dict()) == ok
    with pytest.raises(ValueError, match="same quantities"):
        g.GateResult.judge("x", "r", "c", {}, {"logits": 0.0}, {"grad/a": 1.0})


def test_fail_if_raises_the_named_error_with_the_numbers():
    bad = _result(logits=0.5)
    with pytest.raises(g.ModelGateError, match=r"model gate FAILED.*worst logits.*0\.5.*allowed 0\.1") as e:
        g.fail_if(bad, g.ModelGateError)
    assert e.value.gate == "model gate" and e.value.result is bad
    assert isinstance(e.value, g.GateError) and isinstance(e.value, AssertionError)
    ok = _result(logits=0.01)
    assert g.fail_if(ok, g.ModelGateError) is ok


def test_receipt_check():
    bf16 = {"logits": "torch.bfloat16", "grad": "torch.float32"}
    assert g.check_receipt(bf16, "bf16") is bf16
    with pytest.raises(g.ReceiptError, match="claims bf16 but computed"):
        g.check_receipt({"logits": "torch.float32"}, "bf16")
    with pytest.raises(g.ReceiptError, match="grad"):                 # masters must stay fp32
        g.check_receipt({"logits": "bfloat16", "grad": "bfloat16"}, "bf16")
    with pytest.raises(g.ReceiptError, match="recorded no receipt"):
        g.check_receipt({}, "bf16")
    jax_like = {"logits": "bfloat16", "first_activation": "bfloat16", "matmul_operands": {"bfloat16": 13}}
    assert g.check_receipt(jax_like, "bf16")
    mixed = {**jax_like, "matmul_operands": {"bfloat16": 13, "float32": 1}}
    with pytest.raises(g.ReceiptError, match="matmul_operands"):
        g.check_receipt(mixed, "bf16")
    assert g.check_receipt(mixed, "bf16", allow_fp32_matmuls=1)         # an fp32 one-hot lookup
    with pytest.raises(g.ReceiptError):
        g.check_receipt({**jax_like, "first_activation": "float32"}, "bf16")
    assert g.check_receipt({"logits": "float32", "matmul_operands": {"float32": 13}}, "fp32")
    with pytest.raises(ValueError, match="'fp16'.*valid choices"):
        g.check_receipt(bf16, "fp16")


def test_the_loss_gate_is_one_relative_rule_for_both_frameworks():
    ok = g.loss_gate([3.30, 3.25, 3.20], [3.30, 3.26, 3.21], "the plain bf16 recipe")
    assert ok.passed and ok.tolerances == {"max_rel_diff": g.LOSS_RTOL}
    assert ok.values["max_rel_diff"] == pytest.approx(0.01 / 3.21)
    assert ok.detail == {"steps": 3, "losses": [3.30, 3.25, 3.20], "reference_losses": [3.30, 3.26, 3.21]}
    with pytest.raises(g.LossGateError, match=r"differ from the plain bf16 recipe's .* > rtol=0.01") as e:
        g.loss_gate([3.30, 3.30, 3.30], [3.30, 3.20, 3.10], "the plain bf16 recipe")   # never stepped
    assert e.value.gate == "loss over steps" and isinstance(e.value, g.GateError)
    with pytest.raises(g.LossGateError):
        g.loss_gate([float("nan")] * 3, [3.3] * 3, "x")                                # NaN fails too
