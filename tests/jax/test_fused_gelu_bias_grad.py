"""perfladder.jax.fused.gelu_bias_grad: FC1's bias and GELU, whose backward (GELU's derivative and
the bias gradient's partial sums) is one Pallas kernel, against the reference ops, and the
model option. Without a GPU the kernel runs in Pallas's interpreter.

Tolerances as tests/jax/test_fused.py's: fp32 ~1e-6 relative (the same fp32 operations in
another order); bf16 one rounding step of the output (the kernel computes the derivative in
fp32, the reference in bf16); a bf16 bias gradient, a sum over all rows, to its own rounding.
"""
import shutil
import subprocess
from pathlib import Path

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
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
    assert _rel(du_f, du_t) <= _rel(du_r, du_t) + 1e-7 and _rel(db_f, db_t) <= _rel(db_r, db_t) + 1e-7
    # against the reference itself, the model gate's metric and tolerance
    assert _rel(du_f, du_r) < (1e-5 if dtype == jnp.float32 else 2e-2)
    assert _rel(db_f, db_r) < (1e-5 if dtype == jnp.float32 else 2e-2)


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
    modules = []
    try:
        from jax._src.pallas.triton import pallas_call_registration as registration
        lower = registration.lowering.lower_jaxpr_to_triton_module

        def keep(*args, **kwargs):              # the Triton module Pallas hands to XLA, as text
            result = lower(*args, **kwargs)
            modules.append(result.module.operation.get_asm(enable_debug_info=False))
            return result
        monkeypatch.setattr(registration.lowering, "lower_jaxpr_to_triton_module", keep)
    except (ImportError, AttributeError):
        pass
    text = _lowered_for_cuda()
    assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") == 1
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not modules or not cuobjdump.exists():
        pytest.skip("no Triton module caught, or no cuobjdump to read the register use")
    src = tmp_path / "gelu_bias_grad_bwd.ttir"
    src.write_text(modules[0])
    compiled = triton.compile(str(src), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=NUM_WARPS))
    cubin = tmp_path / "gelu_bias_grad_bwd.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True,
                           text=True, timeout=60).stdout
    line = next(ln for ln in usage.splitlines() if "REG:" in ln)
    fields = dict(f.split(":") for f in line.split() if ":" in f)
    assert int(fields["STACK"]) == 0 and int(fields["LOCAL"]) == 0, line


def _logits_and_grads(model, X):
    def loss(m):
        logits = m(X)
        lp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(lp, X[..., None], axis=-1).mean(), logits
    (_, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return logits, {"/".join(map(str, p)): v for p, v in nnx.to_flat_state(grads)}


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("dtype,fused", [(jnp.float32, ("gelu_bias_grad",)),
                                         (jnp.bfloat16, ("addnorm", "gelu_bias_grad"))])
def test_fused_gelu_model_matches_reference(dtype, fused):
    """The model option: the same logits and every parameter's gradient (FC1's kernel and bias
    included, read from the same parameters), to the gate's metric."""
    X = jax.random.randint(jax.random.key(1), (2, 16), 0, SMOKE.vocab_size)
    ref = GPT(SMOKE, rngs=nnx.Rngs(0), dtype=dtype)
    model = GPT(SMOKE, rngs=nnx.Rngs(0), dtype=dtype, fused=fused)
    assert model.blks[0].ffn.fused_gelu and not ref.blks[0].ffn.fused_gelu
    with jax.default_matmul_precision("highest"):
        lr, gr = _logits_and_grads(ref, X)
        lf, gf = _logits_and_grads(model, X)
    assert lf.dtype == lr.dtype == dtype and gf.keys() == gr.keys()
    for n in ("logits", *gr):
        a, b = (lf, lr) if n == "logits" else (gf[n], gr[n])
        assert a.dtype == b.dtype, n
        assert _rel(a, b) < (1e-5 if dtype == jnp.float32 else 2e-2), n


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
