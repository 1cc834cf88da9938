"""Correctness gates refuse planted wrong models before anything is timed."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import get_config
from perfladder.ladder.engine import record
from perfladder.ladder.rung import Evidence, Given
from perfladder.measure.evidence import Receipt, Timing
from perfladder.measure.gates import ReceiptError
from perfladder.torch import (
    GPT,
    CorrectnessError,
    GateError,
    MirrorError,
    PrecisionError,
)
from perfladder.torch.checks import check_compiled as compile_gate
from perfladder.torch.checks import check_mirror as mirror_gate
from perfladder.torch.gates import check_bf16
from perfladder.torch.lab import TorchLab
from perfladder.torch.recipe import Recipe
from perfladder.torch.rungs.seed import SEED
from perfladder.torch.step import make_optimizer, make_step

CFG = get_config("smoke").gpt()
X = torch.randint(0, CFG.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(CFG, **kw)


def test_gate_errors_are_assertion_errors():
    for err in (CorrectnessError, MirrorError, PrecisionError):
        assert issubclass(err, GateError) and issubclass(err, AssertionError)


def test_compile_gate_passes_the_same_model():
    m = model()
    assert compile_gate(m, m, X) == 0.0


def test_compile_gate_refuses_a_planted_wrong_model():
    right = model()
    wrong = model()
    with torch.no_grad():                      # one small, plausible bug: a LayerNorm off by 10%
        wrong.norm.weight.mul_(1.1)
    with pytest.raises(CorrectnessError, match="max \\|diff\\|"):
        compile_gate(right, wrong, X)


def test_compile_gate_refuses_other_weights():
    with pytest.raises(CorrectnessError):
        compile_gate(model(0), model(1), X)


def test_mirror_gate_passes_a_true_mirror():
    plain, ck = model(), model(checkpoint=True)
    ck.load_state_dict(plain.state_dict())
    assert mirror_gate(plain, ck, X) == 0.0


def test_mirror_gate_refuses_planted_drift():
    plain, ck = model(), model(checkpoint=True)
    ck.load_state_dict(plain.state_dict())
    with torch.no_grad():
        ck.blks[1].ffn.dense2.weight[0].add_(1e-3)   # drift far below the compile tolerance
    with pytest.raises(MirrorError, match="not an exact mirror"):
        mirror_gate(plain, ck, X)
    assert compile_gate(plain, ck, X) < 1e-2     # the looser compile gate would have let it by


def test_mirror_gate_runs_in_fp32_even_inside_autocast():
    plain = model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mirror_gate(plain, plain, X) == 0.0


def test_bf16_receipt_comes_from_the_timed_call():
    """``TrainStep.__call__`` notes the dtype its own logits came out in; nothing else writes it."""
    m = model()
    step = make_step(m, make_optimizer(m, 1e-3), bf16=True, device_type="cpu")
    assert step.receipt == {}
    step.logits(X)                                    # a side path leaves no receipt
    assert step.receipt == {}
    step(X, X)
    assert step.receipt["logits"] == "bfloat16" and step.receipt["calls"] == 1
    assert step.receipt["loss"] == step.receipt["grad"] == "float32"   # fp32 by design
    fp32 = make_step(m, make_optimizer(m, 1e-3), bf16=False, device_type="cpu")
    fp32(X, X)
    assert fp32.receipt["logits"] == "float32"
    with pytest.raises(PrecisionError):
        check_bf16(torch.zeros(2, dtype=torch.float16))
    assert check_bf16(torch.zeros(2, dtype=torch.bfloat16)) == "torch.bfloat16"


def test_a_bf16_rung_whose_timed_step_ran_fp32_is_refused():
    lab = TorchLab(get_config("smoke"))
    recipe = Recipe(batch_size=8, bf16=True)
    fp32 = lab.build_step(recipe.replace(bf16=False))          # the wrong step for this recipe
    m = lab.measure(fp32, 8, warmup=1, timed=1, windows=1)
    t, again, mem = m.throughput, m.remeasured, m.memory
    with pytest.raises(PrecisionError, match="claims bf16 but computed"):
        lab.receipt(fp32, recipe)                      # the timed call's own receipt refuses it
    assert lab.receipt(fp32, recipe.replace(bf16=False)).observed == {"logits": "float32"}
    receipt = Receipt(claimed="bf16", observed={"logits": "float32"}, where="TrainStep.__call__")
    assert not receipt.ok
    r2 = next(r for r in SEED if r.name == "R2")
    given = Given(rung=r2, recipe=recipe)
    with pytest.raises(ReceiptError, match="claims bf16 but its timed step computed in"):
        record(r2, given, Evidence(timing=Timing.of(t, again), receipt=receipt, memory=mem), lab)
    ok = lab.build_step(recipe)
    m = lab.measure(ok, 8, warmup=1, timed=1, windows=1)
    t, again = m.throughput, m.remeasured
    r = record(r2, given, Evidence(timing=Timing.of(t, again), receipt=lab.receipt(ok, recipe)), lab)
    assert r.receipt.ok and r.precision == "bf16"


def test_step_returns_device_loss_and_updates_weights():
    m = model()
    step = make_step(m, make_optimizer(m, 1e-2), bf16=True, device_type="cpu")
    w0 = m.blks[0].attn.W_qkv.weight.detach().clone()
    loss = step(X, X)
    assert loss.dtype == torch.float32 and loss.ndim == 0 and not loss.requires_grad
    assert not torch.equal(w0, m.blks[0].attn.W_qkv.weight)
    assert all(p.dtype == torch.float32 for p in m.parameters())    # fp32 masters


def test_autocast_device_type_checked():
    m = model()
    with pytest.raises(ValueError, match="'mps'.*cuda.*cpu"):
        make_step(m, make_optimizer(m, 1e-3), bf16=True, device_type="mps")


# -- R4's checkpoint gate: what the checkpointed forward saves for the backward ----------------------
def _step_of(m, bf16=False):
    return make_step(m, make_optimizer(m, 1e-3), device_type="cpu", bf16=bf16)


@pytest.mark.parametrize("bf16", [False, True])
def test_checkpoint_gate_passes_a_checkpoint_that_recomputes(bf16):
    from perfladder.torch.checks import checkpoint_saves
    from perfladder.torch.step import autocast_bf16
    wrap = (lambda m: autocast_bf16(m, "cpu")) if bf16 else None
    g = checkpoint_saves(model(), _step_of(model(checkpoint=True), bf16), X, wrap=wrap)
    assert g.name == "checkpoint gate" and g.passed
    assert 0 < g.values["saved_ratio"] <= g.tolerances["saved_ratio"] == 0.5
    assert g.detail["saved_bytes"] < g.detail["base_saved_bytes"]


def test_checkpoint_gate_refuses_a_checkpoint_that_calls_each_block_directly():
    from perfladder.measure.checkpointing import CheckpointGateError
    from perfladder.torch.checks import checkpoint_saves

    def run_block(block, *inputs):            # the planted R4: no recomputation at all
        return block(*inputs)
    fake = model(checkpoint=run_block)
    assert fake.checkpoint and mirror_gate(model(), fake, X) == 0.0     # the mirror passes it
    with pytest.raises(CheckpointGateError, match="recomputes nothing") as e:
        checkpoint_saves(model(), _step_of(fake), X)
    assert e.value.gate == "checkpoint gate" and isinstance(e.value, GateError)
