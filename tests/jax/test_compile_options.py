"""perfladder.jax.compile_options and ``Recipe.xla_options``: XLA debug options that reach one
step's compile (and its gate programs'), not the process's ``XLA_FLAGS``; the B9 / B11 rung
function run on a CPU, where XLA's GPU options compile and change nothing.
"""
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import JaxLab, Recipe, has_gpu  # noqa: E402
from perfladder.jax.compile_options import COMMAND_BUFFERS, CUBLASLT, check_xla_options  # noqa: E402
from perfladder.jax.gates import model_gate  # noqa: E402
from perfladder.jax.rungs import RUNGS  # noqa: E402
from perfladder.jax.rungs import changes as ch  # noqa: E402
from perfladder.jax.rungs.beyond import compiled_calls  # noqa: E402
from perfladder.ladder.rung import Given  # noqa: E402

# the smoke config at a shorter context: none of these programs is one the smoke ladder's tests
# (test_rungs.py) count as compiled beside a rung, should they share this process
CFG = get_config("smoke").replace(num_steps=8, num_blks=1)   # one block: every parameter kind
SPLIT = Recipe(batch_size=CFG.batch_size, dtype="bfloat16", jit="split")
WIDE = CFG.replace(num_hiddens=get_config("full").num_hiddens, num_heads=get_config("full").num_heads)
BOGUS = {"xla_gpu_no_such_option_at_all": True}


def test_recipe_xla_options_are_checked_sorted_and_round_trip():
    r = SPLIT.replace(xla_options={"xla_b": 1, "xla_a": "x"})
    assert r.xla_options == (("xla_a", "x"), ("xla_b", 1))
    assert r.to_dict()["xla_options"] == {"xla_a": "x", "xla_b": 1}
    assert Recipe.from_dict(r.to_dict()) == r
    assert Recipe.from_dict({k: v for k, v in SPLIT.to_dict().items() if k != "xla_options"}) == SPLIT
    assert "XLA xla_a=x xla_b=1" in str(r) and "XLA" not in str(SPLIT)
    with pytest.raises(ValueError, match=r"'gpu_enable_cublaslt' is not an XLA debug option.*'xla_'"):
        SPLIT.replace(xla_options={"gpu_enable_cublaslt": True})
    with pytest.raises(ValueError, match=r"xla_a=\[1\] must be a bool, int, float or str"):
        SPLIT.replace(xla_options={"xla_a": [1]})
    with pytest.raises(ValueError, match="must be a dict"):
        SPLIT.replace(xla_options="xla_a=1")
    with pytest.raises(ValueError, match="jit must be 'nnx' or 'split', got 'none'"):
        Recipe(batch_size=8, jit="none", xla_options=CUBLASLT)
    with pytest.raises(ValueError, match="twice"):
        check_xla_options([("xla_a", 1), ("xla_a", 2)])


def test_the_changes_merge_their_options_into_the_base_recipes():
    b9 = ch.xla_cublaslt(SPLIT, CFG)
    assert dict(b9.xla_options) == {"xla_gpu_enable_cublaslt": True}
    b11 = ch.command_buffers(b9, CFG)
    assert dict(b11.xla_options)["xla_gpu_enable_cublaslt"] is True
    assert dict(b11.xla_options)["xla_gpu_graph_min_graph_size"] == 1
    # the page shows the changes' literals: they are the module's named options
    assert dict(ch.command_buffers(SPLIT, CFG).xla_options) == COMMAND_BUFFERS
    assert dict(b9.xla_options) == CUBLASLT
    assert ch.fused_gelu_bias_grad(SPLIT, CFG).fused == ("gelu_bias_grad",)
    for name in ("B9", "B10", "B11"):
        assert RUNGS[name].stage == "beyond" and RUNGS[name].needs_gpu


@pytest.mark.parametrize("jit", ["split", "nnx"])
def test_a_steps_options_reach_its_compile_and_its_gate_programs(jit):
    """XLA refuses an option name it does not know when the program compiles: the refusal
    proves the option was handed to that compile (and to no other program), whether the step
    is called, compiled ahead or planned, in either jitted step form."""
    lab = JaxLab(CFG, probe=False)
    X, Y = next(lab.stream(SPLIT.batch_size))
    step = lab.build_step(SPLIT.replace(jit=jit, xla_options=BOGUS))
    for compile_it in (lambda: step.lower(X, Y).compile(), lambda: step.compile_ahead(X, Y),
                       lambda: step(X, Y)):
        with pytest.raises(Exception, match="No such compile option: 'xla_gpu_no_such_option_at_all'"):
            compile_it()
    plain = lab.build_step(SPLIT.replace(jit=jit))
    plain.lower(X, Y).compile()                     # the same step without it compiles
    ref = lab.model(Recipe(batch_size=SPLIT.batch_size), plain_code=True)
    with pytest.raises(Exception, match="No such compile option"):
        model_gate(ref, step.model, [(X[:2], Y[:2])], reference_jit=True,
                   step_fn=lab.code["train_step"], xla_options=tuple(BOGUS.items()))


def test_gpu_options_compile_on_cpu_and_train_the_same():
    lab = JaxLab(CFG, probe=False)
    stream = lab.stream(SPLIT.batch_size)
    batches = [next(stream) for _ in range(2)]
    losses = {}
    for jit in ("split", "nnx"):
        for name, options in (("plain", ()), ("cublaslt", CUBLASLT)):
            step = lab.build_step(SPLIT.replace(jit=jit, xla_options=options))
            if name == "cublaslt":
                step.compile_ahead(*batches[0])     # the program the calls then run
            losses[jit, name] = [float(step(*b)) for b in batches]
            model, _ = step.commit()                # trained in place, as without options
            losses[jit, name, "trained"] = float(jnp.abs(model.blks[0].ffn.dense1.kernel[...]).sum())
    for jit in ("split", "nnx"):
        if not has_gpu():                           # the CPU compiler ignores GPU options
            assert losses[jit, "cublaslt"] == losses[jit, "plain"]
            assert losses[jit, "cublaslt", "trained"] == losses[jit, "plain", "trained"]
        np.testing.assert_allclose(losses[jit, "cublaslt"], losses[jit, "plain"], rtol=2e-2)


def test_the_options_rung_gates_records_and_refuses_other_changes():
    """B9's rung function on a CPU (the engine skips it there: a GPU option changes nothing):
    every gate passes, the options are recorded, and a change beyond the options is refused."""
    lab = JaxLab(CFG, probe=False)
    rung, base = RUNGS["B9"], SPLIT.replace(jit="nnx")      # the H200 chain's step form
    recipe = rung.change(base, CFG)
    ev = rung.fn(lab, Given(rung=rung, recipe=recipe, base_name="B8", base_recipe=base))
    assert ev.details["xla_options"] == {"xla_gpu_enable_cublaslt": True}
    assert {"cublaslt_calls", "cublas_calls", "gemm_epilogues", "command_buffers"} <= set(ev.details)
    names = [g.name for g in ev.gates]
    assert {"XLA options", "loss over steps", "model gate"} <= set(names), names
    assert all(g.passed for g in ev.gates) and min(ev.timing.windows) > 0
    with pytest.raises(AssertionError, match=r"XLA options alone; changed \['batch_size', 'xla_options'\]"):
        rung.fn(lab, Given(rung=rung, recipe=recipe.replace(batch_size=2 * base.batch_size),
                           base_name="B8", base_recipe=base))


def test_compiled_calls_reads_gemms_epilogues_and_command_buffers():
    text = """
%command_buffer.2 (p: bf16[8]) -> bf16[8] { ... }
%command_buffer.7 (p: bf16[8]) -> bf16[8] { ... }
  %a = custom-call(%x, %w), custom_call_target="__cublas$lt$matmul", backend_config={"epilogue":"BIAS_GELU"}
  %b = custom-call(%y, %v), custom_call_target="__cublas$lt$matmul", backend_config={"epilogue":"DEFAULT"}
  %c = custom-call(%y, %v), custom_call_target="__cublas$gemm", backend_config={"epilogue":"DEFAULT"}
  %d = call(%a), to_apply=%command_buffer.2
  %e = call(%b), to_apply=%command_buffer.7
"""
    assert compiled_calls(text) == {"cublaslt_calls": 2, "cublas_calls": 1,
                                    "gemm_epilogues": {"BIAS_GELU": 1, "DEFAULT": 2},
                                    "command_buffers": 2}
    assert compiled_calls("") == {"cublaslt_calls": 0, "cublas_calls": 0, "gemm_epilogues": {},
                                  "command_buffers": 0}


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="XLA's cuBLASLt rewrite and command buffers are GPU options")
def test_option_rungs_on_gpu():
    """B9 and B11 at the full config's width (the smoke depth and steps): each passes its gates
    and records its compile."""
    from perfladder.jax import Ladder
    run = Ladder(WIDE)
    for name in ("B9", "B11"):
        r = run.run(name)
        assert r.kind == "rung", (name, r.error)
        assert r.gates and all(g.passed for g in r.gates), name
    details = run.result.rung("B9").details
    assert details["xla_options"]["xla_gpu_enable_cublaslt"] is True
    # which library runs the GEMMs also depends on XLA_FLAGS (Triton GEMMs unless the full
    # config's cublas_gemms() turned them off before JAX started): the count is recorded, and
    # test_a_compile_option_changes_what_the_gpu_compiler_emits proves the option is honoured
    assert isinstance(details["cublaslt_calls"], int) and isinstance(details["cublas_calls"], int)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="XLA's GEMM libraries are GPU options")
def test_a_compile_option_changes_what_the_gpu_compiler_emits():
    """One matmul lowered once and compiled with XLA's Triton GEMMs on and off: the GPU compiler
    emits a Triton fusion for one and a cuBLASLt call for the other, so an option given per
    compile (B9's, B11's) reaches it. (``xla_gpu_enable_cublaslt`` itself would not tell: on
    jax 0.11.2 XLA calls cuBLASLt for every GEMM on an H100 whatever it says.)"""
    import jax

    x, w = jnp.ones((256, 512), jnp.bfloat16), jnp.ones((512, 2048), jnp.bfloat16)
    lowered = jax.jit(lambda x, w: x @ w).lower(x, w)
    texts = {on: lowered.compile({"xla_gpu_enable_triton_gemm": on}).as_text() for on in (True, False)}
    on, off = compiled_calls(texts[True]), compiled_calls(texts[False])
    assert "triton" in texts[True] and on["cublaslt_calls"] + on["cublas_calls"] == 0, on
    assert "triton" not in texts[False] and off["cublaslt_calls"] + off["cublas_calls"] > 0, off
