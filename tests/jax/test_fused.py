"""perfladder.jax.fused: the Pallas residual-add + LayerNorm against flax's LayerNorm, forward
and gradients, and the model options (the attention kernel: test_fused_attention.py). Without a
GPU the kernels run in Pallas's interpreter.

Tolerances: fp32 ~1e-6 relative (the same fp32 operations in another order); bf16 one
rounding step of the output (relative 2^-8..2^-7, rtol 1.6e-2).
"""
import dataclasses
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import flax.linen as linen  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _pallas_sm90 import assert_matches_reference, logits_and_grads  # noqa: E402
from flax import nnx  # noqa: E402

from perfladder.config import get_config  # noqa: E402
from perfladder.jax import GPT  # noqa: E402
from perfladder.jax.fused import check_fused  # noqa: E402
from perfladder.jax.fused.add_layer_norm import add_layer_norm, layer_norm  # noqa: E402

SMOKE = get_config("smoke").gpt()
# the attention kernel splits a head in halves and Triton's dots need K >= 16 on a GPU: there
# the model with fused attention has heads of 32 (the smoke model: one head), in the interpreter 16
SMALL_DH = 32 if jax.default_backend() == "gpu" else 16
FP32 = dict(atol=2e-6, rtol=1e-5)
BF16 = dict(atol=1e-2, rtol=1.6e-2)


def close(a, b, tol):
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tol)


def _inputs(dtype, shape=(4, 16, 64)):
    k = jax.random.split(jax.random.key(0), 4)
    D = shape[-1]
    return (jax.random.normal(k[0], shape, dtype), jax.random.normal(k[1], shape, dtype),
            1 + 0.1 * jax.random.normal(k[2], (D,)), 0.1 * jax.random.normal(k[3], (D,)))


def _flax_ln(dtype):
    L = linen.LayerNorm(epsilon=1e-5, dtype=dtype, param_dtype=jnp.float32)
    return lambda h, w, b: L.apply({"params": {"scale": w, "bias": b}}, h)


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, FP32), (jnp.bfloat16, BF16)])
def test_add_layer_norm_matches_flax(dtype, tol):
    x, br, w, b = _inputs(dtype)
    ln = _flax_ln(dtype)

    def ref(x, br, w, b):
        h = x + br
        return h, ln(h, w, b)

    def fused(x, br, w, b):      # the model casts scale/bias to the compute dtype, as flax does
        return add_layer_norm(x, br, w.astype(dtype), b.astype(dtype), 1e-5)

    (hr, yr), vjp_r = jax.vjp(ref, x, br, w, b)
    (hf, yf), vjp_f = jax.vjp(jax.jit(fused), x, br, w, b)
    close(hf, hr, FP32)                       # the add is exact in either dtype
    close(yf, yr, tol)
    cot = (jax.random.normal(jax.random.key(5), hr.shape, dtype),
           jax.random.normal(jax.random.key(6), yr.shape, dtype))
    for name, gf, gr in zip(("x", "branch", "scale", "bias"), vjp_f(cot), vjp_r(cot)):
        # scale/bias gradients are sums over all rows: their bf16 rounding step is of their size
        close(gf, gr, tol if name in ("x", "branch") or dtype == jnp.float32
              else dict(atol=0.0, rtol=1e-2))


def test_layer_norm_without_add_matches_flax():
    x, _, w, b = _inputs(jnp.float32, (6, 8, 32))       # 48 rows: row blocks of 8 and 16 programs
    ln = _flax_ln(jnp.float32)
    yr, vjp_r = jax.vjp(ln, x, w, b)
    yf, vjp_f = jax.vjp(lambda x, w, b: layer_norm(x, w, b, 1e-5), x, w, b)
    close(yf, yr, FP32)
    g = jax.random.normal(jax.random.key(7), yr.shape)
    for gf, gr in zip(vjp_f(g), vjp_r(g)):
        close(gf, gr, dict(atol=2e-5, rtol=1e-5))


def test_bad_options_and_shapes():
    assert check_fused(()) == () and check_fused("addnorm") == ("addnorm",)
    assert check_fused(("attention", "addnorm")) == ("addnorm", "attention")
    with pytest.raises(ValueError, match="valid choices"):
        check_fused(("rope",))
    with pytest.raises(ValueError, match="attn_impl must be None"):
        GPT(SMOKE, rngs=nnx.Rngs(0), fused=("attention",), attn_impl="xla")
    with pytest.raises(ValueError, match="pos='rope'"):
        GPT(dataclasses.replace(SMOKE, pos="learned"), rngs=nnx.Rngs(0), fused=("attention",))
    with pytest.raises(ValueError, match="valid choices"):
        GPT(SMOKE, rngs=nnx.Rngs(0), fused=("gelu",))
    with pytest.raises(ValueError, match="'attention_bias' adds the QKV bias inside the fused "
                                         "attention kernel, so it needs 'attention' too"):
        GPT(SMOKE, rngs=nnx.Rngs(0), fused=("addnorm", "attention_bias"))
    x = jnp.zeros((2, 48))
    with pytest.raises(ValueError, match="power-of-two width"):
        layer_norm(x, jnp.ones(48), jnp.zeros(48))
    with pytest.raises(ValueError, match="branch shape"):
        add_layer_norm(jnp.zeros((2, 32)), jnp.zeros((3, 32)), jnp.ones(32), jnp.zeros(32))


@pytest.mark.parametrize("dtype,checkpoint", [(jnp.float32, False), (jnp.bfloat16, True)])
def test_fused_model_matches_reference(dtype, checkpoint):
    X = jax.random.randint(jax.random.key(1), (2, 16), 0, SMOKE.vocab_size)
    ref = GPT(SMOKE, rngs=nnx.Rngs(0), dtype=dtype, checkpoint=checkpoint)
    fused = GPT(SMOKE, rngs=nnx.Rngs(0), dtype=dtype, checkpoint=checkpoint, fused=("addnorm",))
    # true fp32 matmuls: on a GPU, XLA's default runs fp32 dots as TF32, whose rounding
    # (~1e-3 relative) would swamp the fp32 comparison (seen on the H200)
    with jax.default_matmul_precision("highest"):
        lr, gr = logits_and_grads(ref, X)
        lf, gf = logits_and_grads(fused, X)
    assert lf.dtype == lr.dtype == dtype and gf.keys() == gr.keys()
    if dtype == jnp.float32:
        close(lf, lr, dict(atol=1e-5, rtol=1e-5))
        for n in gr:
            close(gf[n], gr[n], dict(atol=1e-5, rtol=1e-4))
    else:                        # bf16 activations: agreement to bf16 precision of each scale
        close(lf, lr, dict(atol=3e-2, rtol=3e-2))
        for n in gr:
            scale = float(jnp.abs(gr[n]).max())
            assert float(jnp.abs(gf[n].astype(jnp.float32) - gr[n].astype(jnp.float32)).max()) \
                <= 3e-2 * scale + 1e-6, n


@pytest.mark.parametrize("dtype,fused,checkpoint", [
    (jnp.float32, ("attention",), False), (jnp.bfloat16, ("addnorm", "attention"), True),
    (jnp.float32, ("attention", "attention_bias"), False),
    (jnp.bfloat16, ("addnorm", "attention", "attention_bias"), True)])
def test_fused_attention_model_matches_reference(dtype, fused, checkpoint):
    cfg = dataclasses.replace(SMOKE, num_heads=SMOKE.num_hiddens // SMALL_DH)
    X = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
    ref = GPT(cfg, rngs=nnx.Rngs(0), dtype=dtype, checkpoint=checkpoint)
    model = GPT(cfg, rngs=nnx.Rngs(0), dtype=dtype, checkpoint=checkpoint, fused=fused)
    for m in (ref, model):     # QKV biases that are not zero (they start at zero): a bias left
        for i, blk in enumerate(m.blks):        # out of the forward would show
            blk.attn.W_qkv.bias[...] = jax.random.normal(jax.random.key(i), (3 * cfg.num_hiddens,))
    assert_matches_reference(ref, model, X, dtype)
