"""perfladder.torch.gates' model and optimizer gates, the receipt of the timed call, and the
learning check by the reference model: honest changes pass (the planted bugs that must not
are in test_planted_torch.py)."""
from __future__ import annotations

import pytest
import torch
from _torch_gate_helpers import CFG, DATA, GPT_CFG, fixed, model, one_thread, step  # noqa: F401

from perfladder.measure.gates import (
    BACKWARD_TOL,
    FORWARD_TOL,
    OPTIMIZER_TOL,
    SCALE_TOL,
    GateResult,
)
from perfladder.measure.learning import LearningCheck
from perfladder.torch import evaluate
from perfladder.torch.gates import (
    ModelGateError,
    PrecisionError,
    check_bf16,
    check_receipt,
    model_gate,
    optimizer_gate,
)
from perfladder.torch.model import GPT
from perfladder.torch.step import make_optimizer, make_step
from perfladder.torch.stream import batches

SMOKE_LEARN_STEPS = 150      # the learning check's calibrated length (perfladder.measure.learning)

HONEST = {
    "bf16 autocast": dict(bf16=True),
    "one-hot embedding": dict(model_kw=dict(embed="onehot")),
    "one-hot embedding, bf16": dict(model_kw=dict(embed="onehot"), bf16=True),
    "checkpointed, bf16": dict(model_kw=dict(checkpoint=True), bf16=True),
    "flash attention (CPU kernel)": dict(model_kw=dict(attn_backend="flash")),
    "math attention, bf16": dict(model_kw=dict(attn_backend="math"), bf16=True),
}


@pytest.mark.parametrize("name", list(HONEST))
def test_honest_changes_pass_the_model_gate(name):
    kw = dict(HONEST[name])
    cand = step(model(**kw.pop("model_kw", {})), **kw)
    res = model_gate(step(), cand, fixed(CFG.batch_size))
    assert isinstance(res, GateResult) and res.passed and res.gate == "model gate"
    p = res.precision["candidate"]
    assert res.precision == {"reference": "fp32", "candidate": "bf16" if cand.bf16 else "fp32"}
    params = dict(cand.model.named_parameters())
    assert set(res.measured) == ({"logits", "loss"} | {f"grad/{k}" for k in params}
                                 | {f"scale/{k}" for k, v in params.items() if v.dim() >= 2})
    assert res.tolerance["logits"] == res.tolerance["loss"] == FORWARD_TOL[p]
    assert {v for k, v in res.tolerance.items() if k.startswith("grad/")} == {BACKWARD_TOL[p]}
    assert {v for k, v in res.tolerance.items() if k.startswith("scale/")} == {SCALE_TOL[p]}
    # margin: honest differences sit at least 3x under what is allowed
    assert max(v / res.tolerance[k] for k, v in res.measured.items()) < 1 / 3, res.summary()
    if not cand.bf16:
        assert max(res.measured.values()) < 1e-5          # fp32 vs fp32: reassociation only


def test_a_bigger_batch_against_the_reference_in_chunks():
    """B5/B6: the gradient of the mean over 4x the batch == the mean of four batch gradients."""
    big = fixed(4 * CFG.batch_size)
    res = model_gate(step(), step(), big, reference_chunks=4)
    assert res.passed and max(res.measured.values()) < 1e-5 and res.details["reference_chunks"] == 4
    res = model_gate(step(), step(bf16=True), big, reference_chunks=4)
    assert res.passed
    with pytest.raises(ValueError, match="reference_chunks=3"):
        model_gate(step(), step(), big, reference_chunks=3)


def test_the_gates_leave_both_steps_as_they_found_them():
    ref, cand = step(), step(optimizer="fused", bf16=True)
    before = {k: p.detach().clone() for k, p in cand.model.named_parameters()}
    model_gate(ref, cand, fixed(CFG.batch_size))
    optimizer_gate(ref, cand, fixed(CFG.batch_size, n=2))
    assert all(torch.equal(before[k], p) for k, p in cand.model.named_parameters())
    assert all(p.grad is None for p in cand.model.parameters())
    # the next step starts from the initial weights and a fresh AdamW state
    X, Y = fixed(CFG.batch_size, seed=99)[0]
    fresh = step(optimizer="fused", bf16=True)
    assert cand(X, Y).item() == fresh(X, Y).item()
    assert all(torch.equal(p, q) for p, q in zip(cand.model.parameters(), fresh.model.parameters()))


def test_a_candidate_from_other_weights_is_refused():
    torch.manual_seed(CFG.seed + 1)
    other = GPT(GPT_CFG)
    with pytest.raises(ModelGateError, match="initial weights"):
        model_gate(step(), step(other), fixed(CFG.batch_size))


def test_optimizer_gate_passes_fused_and_foreach_adamw():
    res = optimizer_gate(step(), step(optimizer="fused"), fixed(CFG.batch_size, n=3))
    assert res.passed and res.gate == "optimizer gate" and res.details["steps"] == 3
    assert set(res.measured) == {f"update/{k}" for k, _ in model().named_parameters()}
    assert max(res.measured.values()) < OPTIMIZER_TOL / 10, res.summary()
    foreach = model()
    cand = make_step(foreach, torch.optim.AdamW(foreach.parameters(), lr=CFG.lr, foreach=True),
                     device_type="cpu")
    assert optimizer_gate(step(), cand, fixed(CFG.batch_size, n=3)).passed


def test_compiled_step_and_compiled_optimizer_pass_every_gate():
    """R1..R3 and B2 in one step: torch.compile-d bf16 model, torch.compile-d AdamW step."""
    cand = step(optimizer="compiled", compiled=True, bf16=True)
    res = model_gate(step(), cand, fixed(CFG.batch_size))
    assert res.passed and max(v / res.tolerance[k] for k, v in res.measured.items()) < 1 / 3
    opt = optimizer_gate(step(), cand, fixed(CFG.batch_size, n=3))
    assert opt.passed and max(opt.measured.values()) < OPTIMIZER_TOL / 3, opt.summary()
    assert check_receipt(cand, "bf16")["logits"] == "bfloat16"   # recorded by the gate's call


# -- receipts ---------------------------------------------------------------------------------------
def test_the_receipt_is_written_by_the_timed_call():
    X, Y = fixed(CFG.batch_size)[0]
    s = step(bf16=True)
    with pytest.raises(PrecisionError, match="recorded no receipt"):
        check_receipt(s, "bf16")
    s.logits(X)                                       # a side path writes no receipt
    assert s.receipt == {}
    s(X, Y)
    r = check_receipt(s, "bf16")
    assert r == {"logits": "bfloat16", "loss": "float32", "grad": "float32",       # normalised once,
                 "calls": 1}                                                     # where written
    s(X, Y)
    assert s.receipt["calls"] == 2
    fp32 = step()
    fp32(X, Y)
    assert check_receipt(fp32, "fp32")["logits"] == "float32"
    with pytest.raises(PrecisionError, match="claims bf16 but computed"):
        check_receipt(fp32, "bf16")
    assert check_bf16(s.logits(X).detach()) == "torch.bfloat16"      # the older side-path check


# -- the learning check ---------------------------------------------------------------------------
def test_reference_model_evaluates_the_trained_weights():
    cand = model(embed="onehot", checkpoint=True)
    ref = evaluate.reference_model(cand)
    assert type(ref) is GPT and ref.embed == "gather" and not ref.checkpoint
    assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), cand.parameters()))
    assert ref.token_emb.weight.data_ptr() != cand.token_emb.weight.data_ptr()     # a copy
    X, Y = DATA.val_arrays()
    assert evaluate.mean_loss(ref, X, Y) == pytest.approx(evaluate.mean_loss(cand, X, Y), rel=1e-5)
    assert evaluate.mean_loss(ref, X, Y, batch_size=7) == pytest.approx(
        evaluate.mean_loss(ref, X, Y), rel=1e-6)


def test_an_honest_step_passes_the_learning_check():
    s = step(bf16=True)
    check = evaluate.learning_check(s, batches(DATA, CFG.big_batch, "cpu", seed=1000), DATA,
                                    steps=SMOKE_LEARN_STEPS)
    assert isinstance(check, LearningCheck) and check.passed and check.steps == SMOKE_LEARN_STEPS
    assert check.val_before > 3.0 and check.val_after < check.threshold - 0.1, check
    assert check.last < check.first and "plain eager fp32" in check.evaluated_with
    assert check.rows == {"train": [0, DATA.num_train],                    # held out, recorded
                          "val": [DATA.num_train, DATA.num_train + DATA.num_val]}
    assert LearningCheck.from_dict(check.to_dict()) == check


# -- on a GPU: the kernels that exist only there -------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn", "math"])
def test_attention_backends_and_cuda_graphs_pass_on_cuda(backend):
    torch.manual_seed(CFG.seed)
    ref_model = GPT(GPT_CFG).cuda()
    torch.manual_seed(CFG.seed)
    cand_model = GPT(GPT_CFG, attn_backend=backend).cuda()
    s = batches(DATA, CFG.big_batch, "cuda", seed=7)
    fixed_cuda = [next(s)]
    ref = make_step(ref_model, make_optimizer(ref_model, CFG.lr))
    cand = make_step(cand_model, make_optimizer(cand_model, CFG.lr, "fused"), compiled=True,
                     bf16=True, mode="reduce-overhead")
    try:
        res = model_gate(ref, cand, fixed_cuda)
    except RuntimeError as e:             # a backend that refuses this shape or GPU
        pytest.skip(f"{backend} attention not available here: {e}")
    assert res.passed and res.precision == {"reference": "fp32", "candidate": "bf16"}, res.summary()
    assert optimizer_gate(ref, cand, [next(s) for _ in range(3)]).passed
    assert check_receipt(cand, "bf16")
