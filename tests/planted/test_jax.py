"""Planted bugs (tests/_planted_jax.py) against the JAX gates: each is caught, and by the gate
that claims to guard it (asserted by the error class and the gate's name).

    bug                                     caught by
    non-causal attention                    model gate (and the learning check)
    RoPE left off k                         model gate
    embedding-lookup gradient halved        model gate, grad/token_emb.embedding (forward bit-exact)
    embedding-lookup gradient dropped       model gate, grad/token_emb.embedding
    frozen blocks (stop_gradient)           model gate (and the learning check)
    silent fp32 step under a bf16 label     the receipt the compiled step recorded
    AdamW skipping a parameter group        optimizer gate
"""
import _planted_jax as P  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from _jax_gate_helpers import CFG, DATA, fixed, model  # first: cheap CPU compiles
from _planted_data import TrainRowsAsValidation  # noqa: E402
from flax import nnx  # noqa: E402

from perfladder.jax import evaluate  # noqa: E402
from perfladder.jax.gates import check_receipt, model_gate, named, optimizer_gate  # noqa: E402
from perfladder.jax.step import make_optimizer, make_train_step, receipt  # noqa: E402
from perfladder.jax.stream import batches  # noqa: E402
from perfladder.measure.gates import ModelGateError, OptimizerGateError, ReceiptError  # noqa: E402
from perfladder.measure.learning import HeldOutRowsError, LearningError  # noqa: E402

pytestmark = pytest.mark.planted
BF16 = jnp.bfloat16
MARGIN = 2.0           # every planted bug misses its tolerance by at least this factor
LEARN_STEPS = 60       # enough for both bugs to show; the honest run is in test_jax_model_gates.py


def caught_by_model_gate(candidate, worst_prefix=""):
    with pytest.raises(ModelGateError) as e:
        model_gate(model(), candidate, fixed(CFG.batch_size))
    r = e.value.result
    assert e.value.gate == "model gate" and not r.passed
    assert r.worst.split("/", 1)[-1].startswith(worst_prefix), r.summary()   # grad/ or scale/
    assert r.measured[r.worst] > MARGIN * r.tolerance[r.worst], r.summary()
    assert r.worst in str(e.value)
    return r


def test_non_causal_attention():
    r = caught_by_model_gate(P.swap_attention(model(BF16), P.NonCausalAttention))
    assert r.measured["logits"] > 0.1


def test_rope_left_off_k():
    r = caught_by_model_gate(P.swap_attention(model(BF16), P.NoRopeOnKAttention))
    assert r.measured["logits"] > MARGIN * r.tolerance["logits"]


@pytest.mark.parametrize("scale, dtype", [(0.5, jnp.float32), (0.0, BF16)],
                         ids=["halved-fp32", "dropped-bf16"])
def test_embedding_lookup_gradient_scaled(scale, dtype):
    r = caught_by_model_gate(P.scaled_lookup(model(dtype), scale),
                             worst_prefix="token_emb.embedding")
    if dtype == jnp.float32:
        assert r.measured["logits"] < 1e-6        # the forward is the reference's (jit vs jit)
    assert all(v <= r.tolerance[k] for k, v in r.measured.items() if not k.endswith("token_emb.embedding"))


def test_frozen_blocks():
    r = caught_by_model_gate(P.freeze_blocks(model(BF16)), worst_prefix="blks.")
    frozen = [k for k, v in r.measured.items() if v > r.tolerance[k]]
    assert frozen and all(k.startswith(("grad/blks.", "scale/blks.")) for k in frozen)
    assert r.measured[r.worst] == pytest.approx(1.0)      # zero gradient: off by all of it


def test_silent_fp32_step_under_a_bf16_label():
    X, Y = fixed(CFG.batch_size)[0]
    m = model(BF16)
    assert receipt(m, X) == "bfloat16"                     # the model and a side path say bf16
    silent = make_train_step(view=P.as_fp32)
    silent(m, make_optimizer(m, CFG.lr), X, Y)             # ... the timed program computes fp32
    with pytest.raises(ReceiptError, match="claims bf16 but computed") as e:
        check_receipt(silent, "bf16", model=m, X=X)
    assert e.value.gate == "receipt" and "float32" in str(e.value)


@pytest.mark.parametrize("step", [None, "nnx.jit"])
def test_adamw_skipping_a_parameter_group(step):
    m = model(BF16)
    norms = {k for k in named(nnx.state(m, nnx.Param)) if "norm" in k}
    with pytest.raises(OptimizerGateError) as e:
        optimizer_gate(m, P.adamw_skipping_norms(m, CFG.lr), fixed(CFG.batch_size, n=3), lr=CFG.lr,
                       step=step)
    r = e.value.result
    assert e.value.gate == "optimizer gate"
    # fed the same gradients, exactly the skipped group fails: it did not move at all
    assert {k for k, v in r.measured.items() if k.startswith("update/") and v > r.tolerance[k]} == {
        f"update/{k}" for k in norms}
    assert all(r.measured[f"update/{k}"] == pytest.approx(1.0) for k in norms)
    if step is not None:      # through the step, the other parameters then diverge too
        assert all(r.measured[f"step/{k}"] == pytest.approx(1.0) for k in norms)
    # the model gate is not the one that guards this: the model is right
    assert model_gate(model(), m, fixed(CFG.batch_size)).passed


def learn(m):
    opt = make_optimizer(m, CFG.lr)
    step = make_train_step()
    return lambda: evaluate.learning_check(lambda X, Y: step(m, opt, X, Y),
                                           batches(DATA, CFG.big_batch, seed=1000), DATA,
                                           model=m, steps=LEARN_STEPS)


def test_non_causal_attention_fails_the_learning_check_by_the_reference():
    m = P.swap_attention(model(BF16), P.NonCausalAttention)
    with pytest.raises(LearningError) as e:
        learn(m)()
    c = e.value.check
    assert e.value.gate == "learning check" and c.last < c.first and c.val_after > c.threshold
    assert evaluate.mean_loss(m, *DATA.val_arrays()) < c.threshold   # by itself it would pass


def test_validation_on_training_rows_is_refused_by_the_held_out_rows_gate():
    data = TrainRowsAsValidation(CFG.batch_size, CFG.num_steps, num_train=CFG.num_train,
                                 num_val=CFG.num_val)
    m = model(BF16)
    opt, step = make_optimizer(m, CFG.lr), make_train_step()
    with pytest.raises(HeldOutRowsError, match="overlap the training rows") as e:
        evaluate.learning_check(lambda X, Y: step(m, opt, X, Y),
                                batches(data, CFG.big_batch, seed=1000), data, model=m,
                                steps=4, window=2)
    assert e.value.gate == "held-out rows"
    assert e.value.check.rows == {"train": [0, CFG.num_train], "val": [0, CFG.num_val]}


def test_frozen_blocks_fail_the_learning_check():
    with pytest.raises(LearningError, match="above the threshold") as e:
        learn(P.freeze_blocks(model(BF16)))()
    c = e.value.check
    assert c.last < c.first and c.val_after < c.val_before   # what the old check saw
