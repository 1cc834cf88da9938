"""Planted bugs (tests/_planted_torch.py) that passed the runtime gates before Gates II, each
now refused by a named gate at run time -- asserted by the error class, the gate's name and
its numbers -- and, where the old gate was the blind one, shown passing that old form.

    bug                                            caught by
    forward in fp32, logits cast to bf16           receipt (matmul operands of the arithmetic)
    the same, in a compiled step                   receipt (the step's code, compiled module swapped)
    cross entropy computed in bf16                 receipt (the loss op's input)
    a kernel derivative 5% off (GELU)              model gate, scale/ of dense1
    dropped residual                               model gate (the loss gate cannot: 0.4%)
    AdamW beta1 = 0.8                              optimizer gate over 3 steps (1 step passes)
    one-hot lookup rounded by autocast             one-hot gate inside the rung's step
    checkpoint that runs its block in fp32         checkpointed mirror in the rung's precision
    wrong attention scale in the compiled graph    compiled-vs-eager parity at probe weights
"""
from __future__ import annotations

import _planted_torch as P
import pytest
import torch
from _torch_gate_helpers import CFG, fixed, model, one_thread, step  # noqa: F401

from perfladder.config import get_config
from perfladder.measure.gates import MIRROR_ATOL, SCALE_TOL, ModelGateError, OptimizerGateError
from perfladder.torch import TorchLab
from perfladder.torch.checks import (
    CorrectnessError,
    MirrorError,
    check_compiled,
    check_mirror,
    lookup_in_step,
)
from perfladder.torch.gates import (
    PrecisionError,
    check_receipt,
    model_gate,
    optimizer_gate,
)
from perfladder.torch.program import arithmetic
from perfladder.torch.recipe import Recipe
from perfladder.torch.step import make_step

pytestmark = pytest.mark.planted
MARGIN = 2.0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_fp32_forward_cast_to_bf16_is_caught_by_the_receipt(compiled):
    s = step(bf16=True, compiled=compiled, code={"autocast_bf16": P.autocast_then_fp32})
    X, Y = fixed(CFG.batch_size)[0]
    s(X, Y)
    assert s.receipt["logits"] == "bfloat16"                       # what the old receipt read
    check_receipt(s, "bf16")                                       # ... and passed
    with pytest.raises(PrecisionError, match="matmul_operands") as e:
        check_receipt(s, "bf16", arithmetic(s, X, Y))
    assert e.value.gate == "receipt" and "'float32': 27" in str(e.value)


def test_a_bf16_cross_entropy_is_caught_by_the_receipt():
    s = step(bf16=True, code={"loss_and_grads": P.bf16_loss_and_grads})
    X, Y = fixed(CFG.batch_size)[0]
    s(X, Y)
    assert s.receipt["loss"] == "float32"                          # returned as fp32
    with pytest.raises(PrecisionError, match="loss_ops") as e:
        check_receipt(s, "bf16", arithmetic(s, X, Y))
    assert e.value.gate == "receipt" and "bfloat16" in str(e.value)


def test_the_receipt_leaves_a_compiled_step_compiled():
    """The honest side of the compiled receipt: reading it does not switch dynamo off for the
    model (a dispatch mode around the compiled call would, for every later call)."""
    s = step(bf16=True, compiled=True)
    X, Y = fixed(CFG.batch_size)[0]
    s(X, Y)
    check_receipt(s, "bf16", arithmetic(s, X, Y))
    with torch.profiler.profile() as prof:
        s(X, Y)
    assert any("Torch-Compiled Region" in e.name for e in prof.events())


def test_a_gelu_derivative_5_percent_off_is_caught_by_the_gradient_scale():
    with pytest.raises(ModelGateError) as e:
        model_gate(step(), step(P.gelu_derivative_off(model()), bf16=True), fixed(CFG.big_batch))
    r = e.value.result
    assert e.value.gate == "model gate" and r.worst.startswith("scale/")
    grads = {k: v for k, v in r.measured.items() if k.startswith("grad/")}
    assert all(v <= r.tolerance[k] for k, v in grads.items())     # every gradient within 0.125
    dense1 = [v for k, v in r.measured.items() if k.startswith("scale/") and "dense1" in k]
    assert min(dense1) > MARGIN * SCALE_TOL["bf16"]


def test_a_dropped_residual_is_caught_by_the_model_gate():
    from perfladder.torch.trial import LOSS_TOL
    with pytest.raises(ModelGateError) as e:
        model_gate(step(), step(P.drop_residual(model()), bf16=True), fixed(CFG.batch_size))
    r = e.value.result
    assert r.measured["logits"] > MARGIN * r.tolerance["logits"]
    # the loss gate's steps from the initial weights hardly see it (logits near zero there)
    batches = fixed(CFG.big_batch, n=3, seed=11)
    honest, planted = step(bf16=True), step(P.drop_residual(model()), bf16=True)
    rel = max(abs(planted(X, Y).item() / honest(X, Y).item() - 1) for X, Y in batches)
    assert rel < LOSS_TOL


def test_another_beta1_is_caught_by_the_optimizer_gate_over_three_steps():
    m = model()
    cand = make_step(m, P.adamw_other_beta1(m, CFG.lr), device_type="cpu")
    assert optimizer_gate(step(), cand, fixed(CFG.batch_size, n=1)).passed   # one step hides it
    with pytest.raises(OptimizerGateError) as e:
        optimizer_gate(step(), cand, fixed(CFG.batch_size, n=3))
    r = e.value.result
    assert e.value.gate == "optimizer gate" and r.measured[r.worst] > 10 * r.tolerance[r.worst]


def test_a_onehot_lookup_rounded_by_autocast_is_caught_inside_the_step():
    X, _ = fixed(CFG.batch_size)[0]
    honest = step(model(embed="onehot"), bf16=True)
    values, tol = lookup_in_step(honest, X)
    assert max(values.values()) <= tol
    planted = step(P.onehot_left_to_autocast(model(embed="onehot")), bf16=True)
    with pytest.raises(MirrorError, match="bfloat16") as e:
        lookup_in_step(planted, X)
    assert "precision that is timed" in str(e.value)


def test_a_checkpoint_in_fp32_is_caught_by_the_mirror_in_the_rungs_precision():
    lab = TorchLab(get_config("smoke"))
    recipe = Recipe(batch_size=CFG.batch_size, bf16=True, checkpoint=True)
    lab.use(checkpoint_block=P.checkpoint_in_fp32)
    planted = lab.build_step(recipe)
    plain = lab.make_model(recipe.replace(checkpoint=False))
    X, _ = fixed(CFG.batch_size)[0]
    assert check_mirror(plain, planted.model, X) <= MIRROR_ATOL       # the fp32 check: exact
    wrap = lambda m: lab.code["autocast_bf16"](m, "cpu")             # noqa: E731
    with pytest.raises(MirrorError) as e, torch.no_grad():
        check_mirror(plain, planted.model, X, wrap=wrap, dtype=torch.bfloat16)
    assert e.value.gate is None or "mirror" in str(e.value)


def test_a_wrong_attention_scale_is_caught_by_the_compiled_parity_at_probe_weights():
    m = model()
    X, _ = fixed(CFG.batch_size)[0]
    wrong = P.with_attention(m, P.WrongScaleAttention)
    ref, got = m(X).detach(), wrong(X).detach()
    assert torch.allclose(got, ref, atol=1e-2, rtol=1e-3)           # initial weights: it passes
    with pytest.raises(CorrectnessError, match="compiled logits differ"):
        check_compiled(m, wrong, X)
