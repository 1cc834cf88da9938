"""perfladder.jax.fused.gelu_bias_grad: FC1's bias and GELU, whose backward (GELU's derivative and
the bias gradient's partial sums) is one Pallas kernel, against the reference ops, and the
model option. Without a GPU the kernel runs in Pallas's interpreter.

Tolerances as tests/jax/test_fused.py's: fp32 ~1e-6 relative (the same fp32 operations in
another order); bf16 one rounding step of the output (the kernel computes the derivative in
fp32, the reference in bf16); a bf16 bias gradient, a sum over all rows, to its own rounding.
"""
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _pallas_sm90 import assert_matches_reference, catch_triton_modules, compile_for_sm90, rel  # noqa: E402
from flax import nnx  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import GPT, has_gpu  # noqa: E402
from perfladder.jax.fused import check_fused  # noqa: E402
from perfladder.jax.fused.gelu_bias_grad import NUM_WARPS, gelu_bias, gelu_grad  # noqa: E402

SMOKE = get_config("smoke").gpt()
FP32 = dict(atol=2e-6, rtol=1e-5)
BF16 = dict(atol=1e-2, rtol=1.6e-2)


def close(a, b, tol):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)


def _reference(u, b):
    return jax.nn.gelu(u + b, approximate=True)


@pytest.mark.parametrize("dtype,tol,shape", [(jnp.float32, FP32, (3, 16, 64)),
                                             (jnp.bfloat16, BF16, (2, 24, 2048))])
def test_gelu_bias_matches_the_reference_forward_and_gradients(dtype, tol, shape):
    k = jax.random.split(jax.random.key(0), 3)
    F = shape[-1]
    u = jax.random.normal(k[0], shape, dtype)
    b = (0.1 * jax.random.normal(k[1], (F,))).astype(dtype)
    yr, vjp_r = jax.vjp(jax.jit(_reference), u, b)
    yf, vjp_f = jax.vjp(jax.jit(gelu_bias), u, b)
    close(yf, yr, FP32)              # the forward is the reference's own ops, compiled alike
    g = jax.random.normal(k[2], yr.shape, dtype)
    (du_f, db_f), (du_r, db_r) = vjp_f(g), vjp_r(g)
    # the fp32 truth at the same pre-activation (u + b, rounded to the dtype as both keep it):
    # the kernel's derivative is fp32, rounded once at the end; the bf16 reference rounds at
    # every op (several times the kernel's error, measured)
    h = (u + b).astype(jnp.float32)
    _, vjp_t = jax.vjp(lambda h: jax.nn.gelu(h, approximate=True), h)
    dh_t = vjp_t(g.astype(jnp.float32))[0]
    du_t, db_t = dh_t.astype(dtype), dh_t.reshape(-1, F).sum(0).astype(dtype)
    close(du_f, du_t, tol)
    close(db_f, db_t, tol if dtype == jnp.float32 else dict(atol=0.0, rtol=1e-2))
    assert rel(du_f, du_t) <= rel(du_r, du_t) + 1e-7 and rel(db_f, db_t) <= rel(db_r, db_t) + 1e-7
    # against the reference itself, the model gate's metric and tolerance
    assert rel(du_f, du_r) < (1e-5 if dtype == jnp.float32 else 2e-2)
    assert rel(db_f, db_r) < (1e-5 if dtype == jnp.float32 else 2e-2)


def test_the_derivative_is_gelus_and_the_bias_gradient_sums_every_row():
    h = jnp.linspace(-6.0, 6.0, 97)
    auto = jax.vmap(jax.grad(lambda x: jax.nn.gelu(x, approximate=True)))(h)
    close(gelu_grad(h), auto, FP32)
    # 48 rows of 32: row chunks of several programs, each summing its own rows
    u = jnp.zeros((48, 32))
    _, vjp = jax.vjp(gelu_bias, u, jnp.zeros(32))
    du, db = vjp(jnp.ones((48, 32)))
    close(du, jnp.full((48, 32), 0.5), FP32)                   # gelu'(0) = 1/2
    close(db, jnp.full((32,), 24.0), FP32)                     # 48 rows of 1/2


def test_bad_shapes_and_the_option():
    assert check_fused(("gelu_bias_grad", "addnorm")) == ("addnorm", "gelu_bias_grad")
    with pytest.raises(ValueError, match=r"bias must be \(64,\).*got \(32,\)"):
        gelu_bias(jnp.zeros((2, 64)), jnp.zeros(32))
    with pytest.raises(ValueError, match="width divisible by 16.*got 40"):
        gelu_bias(jnp.zeros((2, 40)), jnp.zeros(40))


def _lowered_for_cuda(modules=None) -> str:
    """FC1's bias + GELU, forward and backward, at the full config's step (batch 2048, T 128,
    hidden 2048, bf16), lowered on this machine for CUDA (Pallas's Triton lowering: no GPU)."""
    full = get_config("full")
    F = full.gpt().ffn_mult * full.num_hiddens
    u = jax.ShapeDtypeStruct((4 * full.big_batch, full.num_steps, F), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((F,), jnp.bfloat16)

    def loss(u, b):
        return gelu_bias(u, b, interpret=False).astype(jnp.float32).sum()
    return jax.jit(jax.grad(loss, argnums=(0, 1))).trace(u, b).lower(lowering_platforms=("cuda",)).as_text()


def test_lowers_for_cuda_at_the_model_shape_and_compiles_for_sm90_without_spills(monkeypatch, tmp_path):
    """The backward kernel as a GPU gets it: Pallas's Triton lowering at the full config's
    shape, one kernel call; its TTIR compiled by the triton package (bundled ptxas, no GPU) to
    an sm_90a cubin with no register spills (cuobjdump's STACK and LOCAL zero)."""
    modules = catch_triton_modules(monkeypatch)
    text = _lowered_for_cuda()
    assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") == 1
    pytest.importorskip("triton")
    if not modules:
        pytest.skip("no Triton module caught from this JAX's Pallas lowering")
    _, fields = compile_for_sm90(modules[0], tmp_path / "gelu_bias_grad_bwd", num_warps=NUM_WARPS)
    assert int(fields["STACK"]) == 0 and int(fields["LOCAL"]) == 0, fields


@pytest.mark.parametrize("dtype,fused", [(jnp.float32, ("gelu_bias_grad",)),
                                         (jnp.bfloat16, ("addnorm", "gelu_bias_grad"))])
def test_fused_gelu_model_matches_reference(dtype, fused):
    """The model option: the same logits and every parameter's gradient (FC1's kernel and bias
    included, read from the same parameters), to the gate's metric."""
    X = jax.random.randint(jax.random.key(1), (2, 16), 0, SMOKE.vocab_size)
    ref = GPT(SMOKE, rngs=nnx.Rngs(0), dtype=dtype)
    model = GPT(SMOKE, rngs=nnx.Rngs(0), dtype=dtype, fused=fused)
    assert model.blks[0].ffn.fused_gelu and not ref.blks[0].ffn.fused_gelu
    assert_matches_reference(ref, model, X, dtype)


@pytest.mark.gpu
@pytest.mark.skipif(not has_gpu(), reason="the Pallas kernel compiles for a CUDA GPU")
def test_fused_gelu_rung_on_gpu():
    """B10 at the full config's width (the smoke depth and steps), after B8's kernels: it
    compiles for the GPU, passes every gate and is timed."""
    from perfladder.jax import Ladder
    full = get_config("full")
    run = Ladder(get_config("smoke").replace(num_hiddens=full.num_hiddens, num_heads=full.num_heads))
    for name in ("B7", "B8", "B10"):
        r = run.run(name)
        assert r.kind == "rung", (name, r.error)
        assert r.gates and all(g.passed for g in r.gates) and r.receipt.ok, name
    assert "gelu_bias_grad" in run.result.rung("B10").recipe["fused"]
