"""perfladder.jax.gate_programs: the gates' programs compute what the model's own gradient does,
compile once per model structure, and carry the gate's compile options (no GEMM autotuning)."""
import jax  # noqa: E402
import numpy as np  # noqa: E402
from _jax_gate_helpers import fixed, model  # first: cheap CPU compiles
from flax import nnx  # noqa: E402

from perfladder.jax import gate_programs as gp  # noqa: E402
from perfladder.jax.step import train_step  # noqa: E402
from perfladder.jax.timer import compile_count  # noqa: E402


def test_compiled_gradients_are_the_models_and_compile_once_per_structure():
    X, Y = fixed(4)[0]
    m = model()
    logits, grads = gp.gradients(m, X, Y)
    op_logits, op_grads = gp.gradients(m, X, Y, jit=False)
    np.testing.assert_allclose(logits, op_logits, rtol=1e-4, atol=1e-5)
    for k, g in op_grads.items():
        np.testing.assert_allclose(grads[k], g, rtol=1e-3, atol=1e-6)
    before = compile_count()
    gp.gradients(model(), X, Y)                        # another model of the same structure
    assert compile_count() == before


def test_a_steps_own_gradients_through_the_gate_program():
    X, Y = fixed(4)[0]
    m = model()
    loss, logits, grads = gp.gradients(m, X, Y, step_fn=train_step, with_loss=True)
    ref_loss, ref_logits, ref_grads = gp.gradients(m, X, Y, with_loss=True)
    assert abs(loss - ref_loss) < 1e-5 and set(grads) == set(ref_grads)


def test_gate_programs_are_compiled_with_the_gate_options(monkeypatch):
    X, _ = fixed(4)[0]
    want = float(nnx.jit(lambda m, X: m(X).sum())(model(), X))
    seen = []
    real = jax.jit

    def spy(*args, **kw):
        seen.append(kw.get("compiler_options"))
        return real(*args, **kw)
    monkeypatch.setattr(gp.jax, "jit", spy)
    run = gp.gate_jit(lambda m, X: m(X).sum())                # jax.jit is looked up here
    assert float(run(model(), X)) == want
    assert seen == [gp.GATE_COMPILE] and gp.GATE_COMPILE == {"xla_gpu_autotune_level": 0}


def test_a_model_gate_compiled_ahead_compiles_nothing_when_it_runs():
    from perfladder.jax.gates import model_gate, model_gate_programs
    X, Y = fixed(3)[0]                     # a batch no other test here compiles for
    # the gate's own op-by-op work (clones, probe weights) compiles its operations once per
    # process: a gate at another batch size runs it first
    model_gate(model(), model(), fixed(2), reference_jit=True, step_fn=train_step)
    reference, candidate = model(), model()
    before = compile_count()
    for job in model_gate_programs(reference, candidate, X, Y, step_fn=train_step):
        job()
    assert compile_count() == before + 2                   # the reference's and the candidate's ...
    before = compile_count()
    res = model_gate(reference, candidate, [(X, Y)], reference_jit=True, step_fn=train_step)
    assert res.passed and compile_count() == before        # ... everything the gate then runs
