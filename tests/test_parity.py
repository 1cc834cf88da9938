"""Cross-framework parity: the same weights give the same logits in PyTorch and Flax NNX.

``perfladder.parity.torch_to_jax`` copies a torch GPT into a flax GPT (built abstractly with
``nnx.eval_shape``, so no initialiser runs and any parameter the copy missed would stay a
shape-only placeholder). Also here: the 6N + 12LTD FLOP formula, checked term by term
against an explicit count over the model's own layers.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

from perfladder.config import (
    GPTConfig,
    expected_num_params,
    flops_per_token,
    get_config,
)
from perfladder.jax.model import GPT as JaxGPT
from perfladder.parity import torch_to_jax
from perfladder.torch.model import GPT as TorchGPT

T = 16                                        # sequence length of the parity batch
BF16_UNIT_ROUNDOFF = 2.0 ** -8                # 8 significant bits: <= 3.9e-3 relative per rounding


def tiny(pos: str = "rope", **kw) -> GPTConfig:
    args = dict(num_hiddens=32, num_blks=2, num_heads=2, max_len=32, pos=pos) | kw
    return GPTConfig(**args)


def torch_model(cfg: GPTConfig, seed: int = 0) -> TorchGPT:
    """A torch GPT whose every parameter is moved off its init value.

    The default init leaves biases at 0 and LayerNorm scales at 1; a copy that dropped or
    swapped those would go unnoticed, so each parameter gets its own random offset.
    """
    torch.manual_seed(seed)
    m = TorchGPT(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def abstract_jax(cfg: GPTConfig, **kw) -> JaxGPT:
    return nnx.eval_shape(lambda: JaxGPT(cfg, rngs=nnx.Rngs(0), **kw))


def params_of(model) -> dict:
    return {tuple(p): n for p, n in nnx.iter_graph(model) if isinstance(n, nnx.Param)}


def value(param):
    return param.get_value() if hasattr(param, "get_value") else param.value


@nnx.jit
def jax_forward(model, X):
    return model(X)


@contextlib.contextmanager
def highest_precision():
    """True fp32 matmuls in both frameworks (no TF32 / bf16 passes on a GPU)."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        with jax.default_matmul_precision("highest"):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old[0]
        torch.set_float32_matmul_precision(old[1])


@pytest.fixture(scope="module")
def batch():
    return np.random.default_rng(0).integers(0, 28, size=(2, T))


@pytest.fixture(scope="module", params=["rope", "learned"])
def pair(request, batch):
    """(config, torch model, converted fp32 jax model, fp32 torch logits)."""
    cfg = tiny(request.param)
    tm = torch_model(cfg)
    jm = abstract_jax(cfg)
    n = torch_to_jax(tm, jm)
    with highest_precision(), torch.no_grad():
        ref = tm(torch.from_numpy(batch)).numpy()
    return cfg, tm, jm, n, ref


def test_every_parameter_copied_once(pair):
    cfg, tm, jm, n, _ = pair
    torch_params = list(tm.parameters())
    flax_params = params_of(jm)
    assert n == len(torch_params) == len(flax_params)
    assert n == 12 * cfg.num_blks + 3 + (cfg.pos == "learned")
    # nothing is left shape-only: every flax parameter now holds a concrete array
    assert all(isinstance(value(p), jax.Array) for p in flax_params.values())
    assert jm.num_params() == tm.num_params() == expected_num_params(cfg)


def test_layouts(pair):
    cfg, tm, jm, _, _ = pair
    t = lambda x: x.detach().numpy()                                   # noqa: E731
    np.testing.assert_array_equal(jm.blks[1].attn.W_qkv.kernel[...], t(tm.blks[1].attn.W_qkv.weight).T)
    np.testing.assert_array_equal(jm.blks[1].attn.W_qkv.bias[...], t(tm.blks[1].attn.W_qkv.bias))
    np.testing.assert_array_equal(jm.blks[0].ffn.dense2.kernel[...], t(tm.blks[0].ffn.dense2.weight).T)
    np.testing.assert_array_equal(jm.blks[0].norm2.scale[...], t(tm.blks[0].norm2.weight))
    np.testing.assert_array_equal(jm.norm.bias[...], t(tm.norm.bias))
    np.testing.assert_array_equal(jm.token_emb.embedding[...], t(tm.token_emb.weight))
    if cfg.pos == "learned":
        np.testing.assert_array_equal(jm.pos_emb.embedding[...], t(tm.pos_emb.weight))


def test_fp32_logits_agree(pair, batch):
    cfg, _, jm, _, ref = pair
    with highest_precision():
        out = np.asarray(jax_forward(jm, jnp.asarray(batch)))
    assert out.shape == ref.shape == (2, T, cfg.vocab_size) and out.dtype == np.float32
    assert np.abs(ref).max() > 0.1                 # real logits, not a degenerate all-zero pair
    assert np.abs(out - ref).max() <= 1e-4


def test_bf16_logits_agree(pair, batch):
    """torch autocast(bf16) on CPU vs a flax model built with dtype=bfloat16.

    Tolerance: bf16 keeps 8 significant bits, so one rounding is off by up to u = 2**-8
    (~3.9e-3) relative. On the way to a logit an activation is rounded about ten times per
    block (LayerNorm out, QKV, RoPE, attention, W_o, residual sum, LayerNorm out, dense1,
    GELU, dense2) plus the final LayerNorm and the logits themselves, and the two frameworks
    round at different places (autocast keeps LayerNorm and softmax in fp32; flax rounds
    every layer's output). Worst case that is (10 L + 2) u relative to the logit scale:
    22u (~8.6% of the largest logit) for L = 2; measured differences sit at 2-5u. A wrong
    weight layout or a RoPE mismatch moves the logits by their own size, far outside this.
    An fp32 run would pass numerically, so the dtypes are asserted as well.
    """
    cfg, tm, _, _, ref = pair
    jb = abstract_jax(cfg, dtype=jnp.bfloat16)
    torch_to_jax(tm, jb)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        tb = tm(torch.from_numpy(batch))
    jbo = jax_forward(jb, jnp.asarray(batch))
    assert tb.dtype == torch.bfloat16 and jbo.dtype == jnp.bfloat16
    tb = tb.float().numpy()
    jbo = np.asarray(jbo.astype(jnp.float32))
    tol = (10 * cfg.num_blks + 2) * BF16_UNIT_ROUNDOFF * np.abs(ref).max()
    assert np.abs(tb - jbo).max() <= tol
    for low in (tb, jbo):                          # each bf16 run is near fp32, and not fp32
        assert 0 < np.abs(low - ref).max() <= tol


def test_compiled_torch_model_is_unwrapped():
    """``torch.compile(m)`` returns a wrapper holding ``m`` as ``_orig_mod``; the converter
    looks through it. (A stand-in wrapper: importing dynamo here would cost ~10 s.)"""
    cfg = tiny()
    tm = torch_model(cfg)

    class Compiled:
        _orig_mod = tm
    assert torch_to_jax(Compiled(), abstract_jax(cfg)) == len(list(tm.parameters()))


@pytest.mark.parametrize("jax_cfg, expect", [
    (tiny(num_heads=4), "num_heads: torch 2 vs jax 4"),
    (tiny("learned"), "pos: torch 'rope' vs jax 'learned'"),
])
def test_mismatched_configs(jax_cfg, expect):
    with pytest.raises(ValueError, match="different configs") as e:
        torch_to_jax(torch_model(tiny()), abstract_jax(jax_cfg))
    assert expect in str(e.value)


def test_shape_mismatch_names_parameter_and_writes_nothing():
    cfg = tiny()
    tm = torch_model(cfg)
    tm.norm = nn.LayerNorm(33)                       # a torch model that lies about its config
    jm = abstract_jax(cfg)
    with pytest.raises(ValueError, match=r"'norm\.weight'.*\(33,\).*\(32,\)"):
        torch_to_jax(tm, jm)
    assert not any(isinstance(value(p), jax.Array) for p in params_of(jm).values())


def test_jax_parameter_without_torch_counterpart():
    cfg = tiny("learned")
    tm = torch_model(cfg)
    tm.pos_emb = None                                # the learned table is gone on the torch side
    with pytest.raises(ValueError, match=r"1 jax parameter.*pos_emb\.embedding"):
        torch_to_jax(tm, abstract_jax(cfg))


@pytest.mark.parametrize("extra, expect", [
    (lambda m: setattr(m, "scale", nn.Parameter(torch.ones(()))), "no rule for torch parameter 'scale'"),
    (lambda m: setattr(m, "head", nn.Linear(32, 28)), "'head.weight' maps to 'head.kernel'"),
])
def test_torch_parameter_without_jax_counterpart(extra, expect):
    cfg = tiny()
    tm = torch_model(cfg)
    extra(tm)
    with pytest.raises(ValueError) as e:
        torch_to_jax(tm, abstract_jax(cfg))
    assert expect in str(e.value)


def test_wrong_model_types():
    with pytest.raises(TypeError, match="torch_model"):
        torch_to_jax(object(), abstract_jax(tiny()))
    with pytest.raises(TypeError, match="jax_model"):
        torch_to_jax(torch_model(tiny()), object())


# -- FLOPs: 6N + 12LTD, term by term ------------------------------------------------------
def explicit_flops_per_token(model: TorchGPT, seq_len: int) -> int:
    """Training FLOPs per token counted layer by layer from the torch model's modules.

    Forward matmuls: each Linear 2*in*out; per block attention's two T x T products
    (scores q k^T and the weighted sum of v), 2*T*D each; the tied logits 2*D*V. Backward
    costs twice the forward (gradients w.r.t. inputs and weights): x3 in all. Every
    parameter that is not a matmul weight (biases, LayerNorm scale/bias, the learned
    position table) is charged 6 FLOPs, as the 6N convention does.
    """
    cfg = model.config
    D, V, L = cfg.num_hiddens, cfg.vocab_size, cfg.num_blks
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 * L                     # W_qkv, W_o, dense1, dense2 per block
    fwd = sum(2 * m.in_features * m.out_features for m in linears)
    fwd += L * 2 * (2 * seq_len * D)                 # q k^T and (scores) v, per layer
    fwd += 2 * D * V                                 # logits against the tied embedding
    matmul_weights = {id(m.weight) for m in linears} | {id(model.token_emb.weight)}
    other = sum(p.numel() for p in model.parameters() if id(p) not in matmul_weights)
    return 3 * fwd + 6 * other


@pytest.mark.parametrize("cfg, seq_len", [
    (get_config("full").gpt(), 128),
    (get_config("smoke").gpt(), 16),
    (tiny("learned"), 24),
])
def test_flops_per_token_term_by_term(cfg, seq_len):
    tm = TorchGPT(cfg)
    jm = abstract_jax(cfg)
    want = explicit_flops_per_token(tm, seq_len)
    N = expected_num_params(cfg)
    assert tm.num_params() == jm.num_params() == N
    assert tm.flops_per_token(seq_len) == jm.flops_per_token(seq_len) == want
    assert flops_per_token(N, cfg.num_blks, seq_len, cfg.num_hiddens) == want


def test_full_model_size():
    assert expected_num_params(get_config("full").gpt()) == 18_929_664      # the ~18.93M of the text
