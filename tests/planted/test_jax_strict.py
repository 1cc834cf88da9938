"""Planted bugs (tests/_planted_jax.py) that passed the JAX runtime gates before Gates II, each
now refused by a named gate at run time, and, where the old gate was the blind one, shown
passing that old form.

    bug                                            caught by
    cross entropy computed in bf16                 receipt (the loss dtype read from the traced step)
    targets shifted inside the step's loss         model gate (the step's own loss and gradients)
    a kernel derivative 5% off (GELU)              model gate, scale/ of dense1
    dropped residual                               model gate (the loss gate cannot: 0.4%)
    optimizer state discarded by the split step    optimizer gate of the step form, 3 steps
    wrong attention scale on one backend           attention parity at probe weights
"""
import _planted_jax as P  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _jax_gate_helpers import CFG, fixed, model  # first: cheap CPU compiles

from perfladder.jax import step as steps  # noqa: E402
from perfladder.jax.checks import _two_forwards_jit, check_attention_parity  # noqa: E402
from perfladder.jax.gates import check_receipt, model_gate  # noqa: E402
from perfladder.jax.lab import JaxLab  # noqa: E402
from perfladder.jax.recipe import Recipe  # noqa: E402
from perfladder.jax.trial import check_receipt as check_trial_receipt  # noqa: E402
from perfladder.jax.trial import step_form_gate  # noqa: E402
from perfladder.measure.gates import (  # noqa: E402
    LOSS_RTOL,
    SCALE_TOL,
    ModelGateError,
    OptimizerGateError,
    ReceiptError,
)

pytestmark = pytest.mark.planted
BF16 = jnp.bfloat16
MARGIN = 2.0


def test_a_bf16_loss_is_caught_by_the_receipt_of_the_traced_step(monkeypatch):
    X, Y = fixed(CFG.batch_size)[0]
    m = model(BF16)
    st = steps.TrainStep(m, steps.make_optimizer(m, CFG.lr), jit="nnx",
                         code={"train_step": P.bf16_loss_train_step})
    st(X, Y)
    assert st.observed["loss"] == "bfloat16" and st.observed["logits"] == "bfloat16"
    lab = JaxLab(CFG)
    recipe = Recipe(batch_size=CFG.batch_size, dtype="bfloat16")
    with pytest.raises(ReceiptError, match="'loss': 'bfloat16'") as e:
        check_trial_receipt(recipe, lab.receipt(recipe, st), {"bfloat16": 13}, st.observed["loss"])
    assert e.value.gate == "receipt"
    # the make_train_step receipt reads it too (one that wrote "float32" whatever ran would pass)
    monkeypatch.setattr(steps, "train_step", P.bf16_loss_train_step)
    jitted = steps.make_train_step()
    m = model(BF16)
    jitted(m, steps.make_optimizer(m, CFG.lr), X, Y)
    with pytest.raises(ReceiptError, match="'loss': 'bfloat16'"):
        check_receipt(jitted, "bf16", model=m, X=X)


def test_targets_shifted_inside_the_step_are_caught_by_the_model_gate_with_its_loss():
    batch = fixed(CFG.batch_size)
    cand = model(BF16)
    assert model_gate(model(), cand, batch, candidate_jit=False).passed    # the gate's own loss
    with pytest.raises(ModelGateError) as e:
        model_gate(model(), cand, batch, candidate_jit=False, step_fn=P.shifted_targets_train_step)
    r = e.value.result
    assert r.measured[r.worst] > MARGIN * r.tolerance[r.worst]
    assert r.measured["loss"] > r.tolerance["loss"] and r.measured["logits"] < r.tolerance["logits"]


def test_a_gelu_derivative_5_percent_off_is_caught_by_the_gradient_scale():
    # the seed's batch, as the tests above: its op-by-op candidate programs are compiled once
    # (the big batch compiled them all again for the same margin, 2.9x the tolerance either way)
    with pytest.raises(ModelGateError) as e:
        model_gate(model(), P.gelu_derivative_off(model(BF16)), fixed(CFG.batch_size),
                   candidate_jit=False, step_fn=steps.train_step)
    r = e.value.result
    assert r.worst.startswith("scale/")
    assert all(v <= r.tolerance[k] for k, v in r.measured.items() if k.startswith("grad/"))
    dense1 = [v for k, v in r.measured.items() if k.startswith("scale/") and "dense1" in k]
    assert min(dense1) > MARGIN * SCALE_TOL["bf16"]


def test_a_dropped_residual_is_caught_by_the_model_gate_not_the_loss_gate():
    with pytest.raises(ModelGateError) as e:
        model_gate(model(), P.drop_residual(model(BF16)), fixed(CFG.batch_size), candidate_jit=False)
    r = e.value.result
    assert r.measured["logits"] > MARGIN * r.tolerance["logits"]
    losses = []
    for m in (model(BF16), P.drop_residual(model(BF16))):
        st = steps.TrainStep(m, steps.make_optimizer(m, CFG.lr), jit="nnx")
        losses.append([float(st(X, Y)) for X, Y in fixed(CFG.big_batch, n=3, seed=11)])
    rel = max(abs(a - b) / b for a, b in zip(*losses))
    assert rel < LOSS_RTOL                        # under the GPU's honest noise: not its gate


def test_a_discarded_optimizer_state_is_caught_by_the_optimizer_gate_of_the_step_form(monkeypatch):
    lab = JaxLab(CFG)
    split = Recipe(batch_size=CFG.batch_size, jit="split")
    assert step_form_gate(lab, split).passed                                  # honest
    P.discard_optimizer_state(monkeypatch)
    lab = JaxLab(CFG)
    with pytest.raises(OptimizerGateError) as e:
        step_form_gate(lab, split)
    r = e.value.result
    assert r.measured[r.worst] > 100 * r.tolerance[r.worst] and r.details["steps"] == 3
    # after one step Adam's bias correction makes a fresh state indistinguishable
    from perfladder.jax import trial
    monkeypatch.setattr(trial, "gate_batches", lambda lab, b: fixed(b, n=1))
    assert step_form_gate(JaxLab(CFG), split).passed


def test_a_wrong_attention_scale_is_caught_by_the_parity_at_probe_weights():
    X, _ = fixed(CFG.batch_size)[0]
    ref, cand = model(BF16), P.swap_attention(model(BF16), P.WrongScaleAttention)
    got, want = _two_forwards_jit(cand, ref, X)                     # at the initial weights
    rel = float(np.max(np.abs(np.asarray(got, np.float32) - np.asarray(want, np.float32)))
                / np.max(np.abs(np.asarray(want, np.float32))))
    assert rel < 0.05                                                 # the old check passed it
    with pytest.raises(AssertionError, match="attention kernel parity"):
        check_attention_parity(cand, ref, X)
