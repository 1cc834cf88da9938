"""perfladder.jax.fused.attention: the Pallas attention with RoPE on load against the model's own
ops (float64 and bf16), forward, logsumexp and d(qkv), at sequences of one token, of a length
that is no multiple of the blocks (padded), and of the model's length, under the default launch
configuration and under blocks of unequal sizes; the QKV bias added on load (``bias=``) against
the same kernels given the projection with its bias; its bad inputs; and the kernels' lowering
and compiling for the GPU (done on a CPU), with and without the bias. Without a GPU the kernels
run in Pallas's interpreter.
"""
import math
import shutil

from perfladder.jax.compiler import fast_cpu_compiles

if shutil.which("nvidia-smi") is None:   # CPU: cheap compiles, shared on-disk cache
    fast_cpu_compiles()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from _pallas_sm90 import catch_triton_modules, compile_for_sm90, cuobjdump  # noqa: E402

from perfladder.jax.fused import attention as fattn  # noqa: E402
from perfladder.jax.model import rope, rope_tables  # noqa: E402

ON_GPU = jax.default_backend() == "gpu"
# the kernel splits a head in halves and Triton's dots need K >= 16 on a GPU: heads of 32 there,
# of 16 in the interpreter
SMALL_DH = 32 if ON_GPU else 16
# fp32 against float64, ||diff|| / ||ref||: ~7e-7 in the interpreter; a GPU's exp2 and log2 are
# approximations (a few ulp), hence 1e-5 there
FP32_REL = 1e-5 if ON_GPU else 2e-6

# (T, forward blocks, backward blocks). One token (every block clamps to MIN_BLOCK and the
# sequence is padded to it); 40 tokens padded to 64 under blocks of unequal sizes both ways (the
# forward's key block longer than its query block, then shorter; the backward's inner tile
# shorter than a program's block, then longer: diagonal tiles cut at every offset); the model's
# 128 under the default configuration.
UNEVEN = (dict(block_m=16, block_n=32), dict(block=32, inner=16))
UNEVEN_OTHER_WAY = (dict(block_m=32, block_n=16), dict(block=16, inner=32))
CASES = {"T=1": (1, ({}, {})), "T=40 uneven": (40, UNEVEN),
         "T=40 uneven other way": (40, UNEVEN_OTHER_WAY), "T=128": (128, ({}, {}))}


@pytest.fixture
def launch(monkeypatch):
    """Sets the kernels' launch configuration for one test; both forwards (B8's, and B12's with
    the bias on load) get the same, so that comparing them compares the bias alone."""
    def use(fwd: dict, bwd: dict):
        for key, value in {**fattn.FWD, **fwd}.items():
            monkeypatch.setitem(fattn.FWD, key, value)
            monkeypatch.setitem(fattn.FWD_BIAS, key, value)
        for key, value in bwd.items():
            monkeypatch.setitem(fattn.BWD, key, value)
    return use


def _reference_attention(qkv, H):
    """The model's own ops: split, RoPE on q and k, causal attention (XLA's), heads merged."""
    B, T, D3 = qkv.shape
    q, k, v = (u.reshape(B, T, H, D3 // 3 // H) for u in jnp.split(qkv, 3, axis=-1))
    y = jax.nn.dot_product_attention(rope(q), rope(k), v, is_causal=True, implementation="xla")
    return y.reshape(B, T, D3 // 3)                                         # (B, T, D)


def _rel(a, b, scale=None):
    """||a - b|| / ||scale|| (``scale``: b)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b if scale is None else scale))


def _attention_case(dtype, T, H, Dh, B=1):
    k = jax.random.split(jax.random.key(3), 2)
    qkv = 2 * jax.random.normal(k[0], (B, T, 3 * H * Dh), jnp.float32)      # scores of std ~ 4
    return qkv.astype(dtype), jax.random.normal(k[1], (B, T, H * Dh), jnp.float32), rope_tables(T, Dh)


def _float64(f, *args):
    """``f`` in float64 (numpy inputs), in a scope with x64 on: its value and its vjp of the
    last argument."""
    with jax.enable_x64(True):
        out, vjp = jax.vjp(f, *(jnp.asarray(np.asarray(a, np.float64)) for a in args[:-1]))
        return np.asarray(out), np.asarray(vjp(jnp.asarray(np.asarray(args[-1], np.float64)))[0])


def _logsumexp2_float64(qkv, H, Dh):
    """The base-2 row logsumexp of the causal scores (B, H, T), in float64."""
    B, T, _ = qkv.shape
    with jax.enable_x64(True):
        x = jnp.asarray(np.asarray(qkv, np.float64))
        q, k, _ = (u.reshape(B, T, H, Dh) for u in jnp.split(x, 3, axis=-1))
        s = jnp.einsum("bthd,bshd->bhts", rope(q), rope(k)) / math.sqrt(Dh)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        return np.asarray(jax.nn.logsumexp(s, axis=-1) / math.log(2))


@pytest.mark.parametrize("case", CASES)
def test_fp32_matches_float64(case, launch):
    """fp32 against the model's ops in float64: y, the logsumexp and d(qkv), its q, k and v
    columns each (a wrong rotation, a dropped tile or a padded row leaking in shows in one)."""
    T, (fwd, bwd) = CASES[case]
    launch(fwd, bwd)
    H, Dh = 2, SMALL_DH
    qkv, g, (cos, sin) = _attention_case(jnp.float32, T, H, Dh)
    y, vjp = jax.vjp(lambda x: fattn.rope_attention(x, cos, sin, H), qkv)
    (dqkv,) = vjp(g)
    ry, rdqkv = _float64(lambda x: _reference_attention(x, H), qkv, g)
    assert y.dtype == dqkv.dtype == jnp.float32 and y.shape == g.shape and dqkv.shape == qkv.shape
    assert _rel(y, ry) < FP32_REL
    for part in range(3):      # against the whole gradient's size: at T=1 dq and dk are zero
        cols = slice(part * H * Dh, (part + 1) * H * Dh)
        assert _rel(dqkv[..., cols], rdqkv[..., cols], scale=rdqkv) < FP32_REL, part
    _, lse = fattn.forward_with_lse(qkv, cos, sin, H)
    np.testing.assert_allclose(np.asarray(lse, np.float64), _logsumexp2_float64(qkv, H, Dh),
                               atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("case", ["T=40 uneven", "T=128"])
def test_bf16_as_accurate_as_the_reference(case, launch):
    """bf16 in and out, fp32 accumulation: against float64 about as accurate as the model's own
    bf16 ops (XLA's attention), forward and backward. Measured in the interpreter: forward
    0.0045 vs 0.0046 (T=40) and 0.0050 vs 0.0051 (T=128), backward 0.0084 vs 0.0072 and 0.0076
    vs 0.0071 (the kernel rounds dS to bf16 for its two dots, as flash attention does)."""
    T, (fwd, bwd) = CASES[case]
    launch(fwd, bwd)
    H, Dh = 2, 32
    qkv, g, (cos, sin) = _attention_case(jnp.bfloat16, T, H, Dh)
    gb = g.astype(jnp.bfloat16)
    y, vjp = jax.vjp(lambda x: fattn.rope_attention(x, cos, sin, H), qkv)
    ry, rvjp = jax.vjp(lambda x: _reference_attention(x, H), qkv)
    ey, edqkv = _float64(lambda x: _reference_attention(x, H), qkv, gb)
    dqkv, rdqkv = vjp(gb)[0], rvjp(gb)[0]
    assert y.dtype == dqkv.dtype == jnp.bfloat16
    e_fwd, r_fwd, e_bwd, r_bwd = _rel(y, ey), _rel(ry, ey), _rel(dqkv, edqkv), _rel(rdqkv, edqkv)
    print(f"{case}: forward {e_fwd:.4f} vs {r_fwd:.4f}, backward {e_bwd:.4f} vs {r_bwd:.4f}")
    assert e_fwd < 1.25 * r_fwd + 1e-3 and e_fwd < 1e-2, (e_fwd, r_fwd)
    assert e_bwd < 1.25 * r_bwd + 1e-3 and e_bwd < 2e-2, (e_bwd, r_bwd)


def test_backward_under_other_blocks_than_its_forward(launch):
    """A backward traced after the launch parameters changed (a benchmark's sweep) takes the
    forward's logsumexp at its own padded length: T=40 padded to 48 forward, to 64 backward."""
    H, Dh, T = 2, SMALL_DH, 40
    qkv, g, (cos, sin) = _attention_case(jnp.float32, T, H, Dh)
    launch(dict(block_m=16, block_n=16), dict(block=16, inner=16))
    _, vjp = jax.vjp(lambda x: fattn.rope_attention(x, cos, sin, H), qkv)
    launch(dict(block_m=64, block_n=64), dict(block=64, inner=32))
    _, rdqkv = _float64(lambda x: _reference_attention(x, H), qkv, g)
    assert _rel(vjp(g)[0], rdqkv) < FP32_REL


def _biased_case(dtype, T, H, Dh, B=2):
    """The projection without its bias, a bias of the same size as its columns, a cotangent."""
    u, g, tables = _attention_case(dtype, T, H, Dh, B=B)
    bias = jax.random.normal(jax.random.key(5), (u.shape[-1],), jnp.float32).astype(dtype)
    return u, bias, g.astype(dtype), tables


@pytest.mark.parametrize("case", ["T=40 uneven other way", "T=128"])
def test_bias_on_load_is_the_bias_added_first(case, launch):
    """fp32: the kernels adding the bias where they load q, k and v give what they give on the
    projection with its bias added (y and d(qkv) to rounding), and the bias gradient is d(qkv)
    summed over the batch and the sequence -- two sequences and a padded length, so a row left
    out of the partial sums, a padded row counted or a head's sums in another head's columns
    shows."""
    T, (fwd, bwd) = CASES[case]
    launch(fwd, bwd)
    H, Dh = 2, SMALL_DH
    u, bias, g, (cos, sin) = _biased_case(jnp.float32, T, H, Dh)
    y, vjp = jax.vjp(lambda x, b: fattn.rope_attention(x, cos, sin, H, bias=b), u, bias)
    ry, rvjp = jax.vjp(lambda x, b: fattn.rope_attention(x + b, cos, sin, H), u, bias)
    (du, db), (rdu, rdb) = vjp(g), rvjp(g)
    assert db.shape == bias.shape and db.dtype == jnp.float32
    assert _rel(y, ry) < 1e-6 and _rel(du, rdu) < 1e-6
    assert _rel(db, rdb) < 1e-6 and _rel(db, np.asarray(du, np.float64).sum((0, 1))) < 1e-6
    _, lse = fattn.forward_with_lse(u, cos, sin, H, bias=bias)
    np.testing.assert_allclose(lse, fattn.forward_with_lse(u + bias, cos, sin, H)[1], rtol=1e-6)


def test_bias_on_load_in_bf16_as_accurate_as_the_reference():
    """bf16: y, d(qkv) and the bias gradient against float64 about as accurate as the model's
    own bf16 ops (the bias added by XLA, then its attention) are."""
    H, Dh, T = 2, 32, 128
    u, bias, g, (cos, sin) = _biased_case(jnp.bfloat16, T, H, Dh)
    got = jax.vjp(lambda x, b: fattn.rope_attention(x, cos, sin, H, bias=b), u, bias)
    ref = jax.vjp(lambda x, b: _reference_attention(x + b, H), u, bias)
    with jax.enable_x64(True):
        ey, evjp = jax.vjp(lambda x, b: _reference_attention(x + b, H),
                           *(jnp.asarray(np.asarray(a, np.float64)) for a in (u, bias)))
        exact = (ey, *evjp(jnp.asarray(np.asarray(g, np.float64))))
    for (y, vjp), name in ((got, "kernels"), (ref, "reference")):
        assert y.dtype == jnp.bfloat16 and all(d.dtype == jnp.bfloat16 for d in vjp(g)), name
    errs = {name: [_rel(a, e) for a, e in zip((y, *vjp(g)), exact)]
            for (y, vjp), name in ((got, "kernels"), (ref, "reference"))}
    print(errs)
    for e, r, what in zip(errs["kernels"], errs["reference"], ("y", "d(qkv)", "d(bias)")):
        assert e < 1.25 * r + 1e-3 and e < 2e-2, (what, e, r)


def test_rejects_bad_shapes_and_launch_configurations(monkeypatch):
    cos, sin = rope_tables(16, 16)
    with pytest.raises(ValueError, match="num_heads"):
        fattn.rope_attention(jnp.zeros((1, 16, 96)), cos, sin, 3)
    with pytest.raises(ValueError, match="tables"):
        fattn.rope_attention(jnp.zeros((1, 16, 96)), cos[:8], sin[:8], 2)
    with pytest.raises(ValueError, match="at least one token"):
        fattn.rope_attention(jnp.zeros((1, 0, 96)), cos[:0], sin[:0], 2)
    with pytest.raises(ValueError, match="head width >= 32"):
        fattn.rope_attention(jnp.zeros((1, 16, 96)), cos, sin, 2, interpret=False)
    for bias in (jnp.zeros(32), jnp.zeros(96, jnp.bfloat16)):
        with pytest.raises(ValueError, match=r"bias must be \(96,\) in qkv's dtype float32"):
            fattn.rope_attention(jnp.zeros((1, 16, 96)), cos, sin, 2, bias=bias)
    monkeypatch.setitem(fattn.BWD, "inner", 24)
    with pytest.raises(ValueError, match=r"BWD\['inner'\] must be a power of two >= 16; got 24"):
        fattn.rope_attention(jnp.zeros((1, 16, 96)), cos, sin, 2)


def _lowered_for_cuda(T: int, H: int = 8, Dh: int = 64, biased: bool = False) -> str:
    """The training step's attention (forward and backward) at batch 4, bf16, lowered on this
    machine for the CUDA platform (Pallas's Triton lowering: no GPU needed); ``biased``: with
    the bias added on load, and its gradient."""
    cos, sin = rope_tables(T, Dh)

    def loss(x, b):
        y = fattn.rope_attention(x, cos, sin, H, interpret=False, bias=b if biased else None)
        return y.astype(jnp.float32).sum()

    x = jax.ShapeDtypeStruct((4, T, 3 * H * Dh), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((3 * H * Dh,), jnp.bfloat16)
    return jax.jit(jax.grad(loss, argnums=(0, 1))).trace(x, b).lower(
        lowering_platforms=("cuda",)).as_text()


def test_lowers_for_cuda_and_pads_only_a_sequence_off_the_blocks():
    """Pallas's Triton lowering -- what a GPU runs, with its power-of-two and dot-shape rules --
    accepts both kernels at the model's shape (T=128, 8 heads of 64, bf16), with no padding
    copy around them; a sequence of 120 is padded (to 128) and lowers as well."""
    text = _lowered_for_cuda(128)
    assert text.count("__gpu$xla.gpu.triton") + text.count("triton_kernel_call") == 2
    assert "stablehlo.pad" not in text
    assert "stablehlo.pad" in _lowered_for_cuda(120)


def test_the_biased_forward_launches_with_its_own_parameters(monkeypatch):
    """B12's forward (the bias on load) takes ``FWD_BIAS``'s blocks and B8's ``FWD``'s: each
    kernel's score tile, (block_m, block_n) in fp32, is its own setting's; a bad block in
    either setting is named."""
    monkeypatch.setitem(fattn.FWD, "block_n", 16)
    monkeypatch.setitem(fattn.FWD_BIAS, "block_n", 128)
    modules = catch_triton_modules(monkeypatch)
    if not _lowered_for_cuda(128) or not modules:
        pytest.skip("this JAX has no hook for Pallas's Triton modules")
    plain_fwd = modules[0]
    _lowered_for_cuda(128, biased=True)
    biased_fwd = modules[2]
    assert "tensor<64x16xf32>" in plain_fwd and "tensor<64x128xf32>" not in plain_fwd
    assert "tensor<64x128xf32>" in biased_fwd and "tensor<64x16xf32>" not in biased_fwd
    monkeypatch.setitem(fattn.FWD_BIAS, "block_m", 24)
    cos, sin = rope_tables(16, 16)
    with pytest.raises(ValueError, match=r"FWD_BIAS\['block_m'\] must be a power of two"):
        fattn.rope_attention(jnp.zeros((1, 16, 96)), cos, sin, 2)


# Below one tile's share of a thread: a 64x64 fp32 score or accumulator tile over the 128
# threads of 4 warps is 128 bytes each. The backward's default (64/64/4/1) keeps 8 bytes on its
# stack, 56 with the bias, and was still the fastest configuration of the sweep both ways,
# every one without a spill included (benchmarks/results/h100-attention-sweep-2026-12-07).
SPILL_BYTES = 64


@pytest.mark.parametrize("biased", [False, True], ids=["plain", "bias on load"])
def test_compiles_for_sm90_without_spills(monkeypatch, tmp_path, biased):
    """Each kernel's TTIR, as Pallas lowers it at the model's shape, compiled by the triton
    package (its bundled ptxas; no GPU needed) to an sm_90a cubin under the module's launch
    configuration: Hopper's warp-group MMA for the dots, and no tile spilled to memory
    (cuobjdump's LOCAL zero, STACK at most ``SPILL_BYTES``) -- a spilled accumulator or score
    tile would turn into memory traffic on every tile. With the bias added on load too (its
    loads and the backward's sums hold registers of their own)."""
    cuobjdump()
    modules = catch_triton_modules(monkeypatch)
    _lowered_for_cuda(128, biased=biased)
    assert len(modules) == 2
    for name, text, cfg in zip(("fwd", "bwd"), modules, (fattn.forward_launch(biased), fattn.BWD)):
        asm, fields = compile_for_sm90(text, tmp_path / f"rope_attention_{name}",
                                       num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        assert int(fields["STACK"]) <= SPILL_BYTES and int(fields["LOCAL"]) == 0, (name, fields)
        assert "warp_group_dot" in asm["ttgir"], name


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [128, 120])
def test_full_shape_on_gpu_bf16(T):
    """The compiled kernels at the model's shape (8 heads of 64, bf16; T=120 padded to the
    blocks) against XLA's attention on the model's ops, as accurate as they are against the
    same ops computed in fp32."""
    H, Dh, B = 8, 64, 16
    qkv, g, (cos, sin) = _attention_case(jnp.bfloat16, T, H, Dh, B=B)
    gb = g.astype(jnp.bfloat16)
    y, vjp = jax.vjp(lambda x: fattn.rope_attention(x, cos, sin, H), qkv)
    ry, rvjp = jax.vjp(lambda x: _reference_attention(x, H), qkv)
    with jax.default_matmul_precision("highest"):
        ey, evjp = jax.vjp(lambda x: _reference_attention(x, H), qkv.astype(jnp.float32))
        edqkv = evjp(gb.astype(jnp.float32))[0]
    dqkv, rdqkv = vjp(gb)[0], rvjp(gb)[0]
    assert _rel(y, ey) < 1.5 * _rel(ry, ey) + 1e-3
    assert _rel(dqkv, edqkv) < 1.5 * _rel(rdqkv, edqkv) + 1e-3
    # the bias on load: the same kernels' outputs, given the bias apart from the projection
    bias = jax.random.normal(jax.random.key(5), (qkv.shape[-1],), jnp.bfloat16)
    by, bvjp = jax.vjp(lambda x, b: fattn.rope_attention(x, cos, sin, H, bias=b), qkv, bias)
    ay, avjp = jax.vjp(lambda x, b: fattn.rope_attention(x + b, cos, sin, H), qkv, bias)
    (bdu, bdb), (adu, adb) = bvjp(gb), avjp(gb)
    assert _rel(by, ay) < 1e-2 and _rel(bdu, adu) < 2e-2 and _rel(bdb, adb) < 2e-2
