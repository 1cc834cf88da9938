"""Planted bugs (tests/_planted_torch.py) against the PyTorch gates: each is caught, and by the
gate that claims to guard it (asserted by the error class and the gate's name).

    bug                                     caught by
    non-causal attention                    model gate (and the learning check)
    RoPE left off k                         model gate
    embedding-lookup gradient halved        model gate, grad/token_emb.weight (forward bit-exact)
    embedding-lookup gradient dropped       model gate, grad/token_emb.weight (forward bit-exact)
    frozen blocks                           model gate (and the learning check)
    silent fp32 step under a bf16 label     the receipt of the timed call
    AdamW skipping a parameter group        optimizer gate
"""
from __future__ import annotations

import _planted_torch as P
import pytest
import torch
from _planted_data import TrainRowsAsValidation
from _torch_gate_helpers import CFG, DATA, fixed, model, one_thread, step  # noqa: F401

from perfladder.measure.gates import (
    BACKWARD_TOL,
    GateError,
    ModelGateError,
    OptimizerGateError,
)
from perfladder.measure.learning import HeldOutRowsError, LearningError
from perfladder.torch import evaluate
from perfladder.torch.gates import (
    PrecisionError,
    check_bf16,
    check_receipt,
    model_gate,
    optimizer_gate,
)
from perfladder.torch.step import make_step
from perfladder.torch.stream import batches

pytestmark = pytest.mark.planted
# Every planted bug misses its tolerance by at least this factor.
MARGIN = 2.0


def caught_by_model_gate(candidate, worst_prefix=""):
    with pytest.raises(ModelGateError) as e:
        model_gate(step(), candidate, fixed(CFG.batch_size))
    r = e.value.result
    assert e.value.gate == "model gate" and not r.passed
    assert r.worst.split("/", 1)[-1].startswith(worst_prefix), r.summary()   # grad/ or scale/
    assert r.measured[r.worst] > MARGIN * r.tolerance[r.worst], r.summary()
    assert r.worst in str(e.value) and "FAILED" in str(e.value)
    return r


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_non_causal_attention(bf16):
    r = caught_by_model_gate(step(P.swap_attention(model(), P.NonCausalAttention), bf16=bf16))
    assert r.measured["logits"] > 0.1                     # at probe weights the forward shows it


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_rope_left_off_k(bf16):
    r = caught_by_model_gate(step(P.swap_attention(model(), P.NoRopeOnKAttention), bf16=bf16))
    assert r.measured["logits"] > MARGIN * r.tolerance["logits"]


@pytest.mark.parametrize("scale", [0.5, 0.0], ids=["halved", "dropped"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_embedding_lookup_gradient_scaled(scale, bf16):
    r = caught_by_model_gate(step(P.scaled_lookup(model(), scale), bf16=bf16),
                             worst_prefix="token_emb.weight")
    if not bf16:
        assert r.measured["logits"] == 0.0                # the forward is bit-exact
    # only the table's gradient is wrong: everything upstream of the lookup is right
    assert all(v <= r.tolerance[k] for k, v in r.measured.items() if not k.endswith("token_emb.weight"))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_frozen_blocks(bf16):
    r = caught_by_model_gate(step(P.freeze_blocks(model()), bf16=bf16), worst_prefix="blks.")
    missing = [k for k, v in r.measured.items() if v == float("inf")]
    assert missing and all(k.startswith(("grad/blks.", "scale/blks.")) for k in missing)


@pytest.mark.parametrize("cls, why", [(P.SilentFP32Step, "claims bf16 but computed"),
                                      (P.ReceiptlessFP32Step, "recorded no receipt")])
def test_silent_fp32_step_under_a_bf16_label(cls, why):
    X, Y = fixed(CFG.batch_size)[0]
    m = model()
    s = cls(m, torch.optim.AdamW(m.parameters(), lr=CFG.lr), bf16=True, device_type="cpu")
    assert s.bf16 and check_bf16(s.logits(X).detach())   # the label and the side path say bf16
    s(X, Y)                                               # ... the timed call computes fp32
    with pytest.raises(PrecisionError, match=why) as e:
        check_receipt(s, "bf16")
    assert e.value.gate == "receipt"


def test_adamw_skipping_a_parameter_group():
    m = model()
    cand = make_step(m, P.adamw_skipping_norms(m, CFG.lr), bf16=True, device_type="cpu")
    assert model_gate(step(), cand, fixed(CFG.batch_size)).passed     # not the model gate's bug
    with pytest.raises(OptimizerGateError) as e:
        optimizer_gate(step(), cand, fixed(CFG.batch_size, n=3))
    r = e.value.result
    assert e.value.gate == "optimizer gate" and "norm" in r.worst
    skipped = {k for k, v in r.measured.items() if v > r.tolerance[k]}
    assert skipped == {f"update/{k}" for k, _ in m.named_parameters() if "norm" in k}
    assert all(r.measured[k] == pytest.approx(1.0) for k in skipped)   # they did not move at all


def test_another_learning_rate_is_caught_by_the_optimizer_gate():
    m = model()
    cand = make_step(m, torch.optim.AdamW(m.parameters(), lr=CFG.lr * 1.1), device_type="cpu")
    with pytest.raises(OptimizerGateError):
        optimizer_gate(step(), cand, fixed(CFG.batch_size, n=2))


# -- the learning check, evaluated by the reference model -------------------------------------------
LEARN_STEPS = 60       # enough for both bugs to show; the honest run is in tests/torch/test_model_gates.py


def learn(m):
    s = step(m, bf16=True)
    return s, lambda: evaluate.learning_check(
        s, batches(DATA, CFG.big_batch, "cpu", seed=1000), DATA, steps=LEARN_STEPS)


def test_non_causal_attention_fails_the_learning_check_by_the_reference():
    s, run = learn(P.swap_attention(model(), P.NonCausalAttention))
    with pytest.raises(LearningError) as e:
        run()
    c = e.value.check
    assert e.value.gate == "learning check" and c.last < c.first   # it "learned"
    assert c.val_after > c.threshold
    # evaluated by itself, the cheat would have passed: it reads the next token
    assert evaluate.mean_loss(s.model, *DATA.val_arrays()) < c.threshold


def test_validation_on_training_rows_is_refused_by_the_held_out_rows_gate():
    data = TrainRowsAsValidation(CFG.batch_size, CFG.num_steps, num_train=CFG.num_train,
                                 num_val=CFG.num_val)
    with pytest.raises(HeldOutRowsError, match="overlap the training rows") as e:
        evaluate.learning_check(step(bf16=True), batches(data, CFG.big_batch, "cpu", seed=1000),
                                data, steps=4, window=2)
    assert e.value.gate == "held-out rows"
    assert e.value.check.rows == {"train": [0, CFG.num_train], "val": [0, CFG.num_val]}


def test_frozen_blocks_fail_the_learning_check():
    _, run = learn(P.freeze_blocks(model()))
    with pytest.raises(LearningError, match="above the threshold") as e:
        run()
    c = e.value.check
    assert c.last < c.first and c.val_after < c.val_before    # what the old check saw
    assert isinstance(e.value, GateError)


def test_planted_margins_are_real():
    """The planted bugs' measured values, not only their failure: the mildest one (the halved
    lookup gradient) is the one the tolerance table is judged against."""
    with pytest.raises(ModelGateError) as e:
        model_gate(step(), step(P.scaled_lookup(model(), 0.5), bf16=True), fixed(CFG.batch_size))
    assert e.value.result.measured["grad/token_emb.weight"] > MARGIN * BACKWARD_TOL["bf16"]
