"""perfladder.torch.model: parameter names and count, FLOPs, shapes, backends, checkpointing."""
from __future__ import annotations

import pytest
import torch

from perfladder.config import (
    GPTConfig,
    expected_num_params,
    flops_per_token,
    get_config,
)
from perfladder.torch import GPT
from perfladder.torch.model import ATTN_BACKENDS, RoPE, apply_rope

SMOKE = get_config("smoke").gpt()


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(SMOKE, **kw)


def test_full_size_param_count_matches_contract():
    model = GPT(GPTConfig())
    assert model.num_params() == 18_929_664 == expected_num_params(GPTConfig())


def test_learned_positions_add_their_table():
    cfg = GPTConfig(num_hiddens=64, num_blks=1, num_heads=4, max_len=128, pos="learned")
    model = GPT(cfg)
    assert model.num_params() == expected_num_params(cfg)
    assert tuple(model.pos_emb.weight.shape) == (128, 64)
    assert not hasattr(GPT(SMOKE), "pos_emb")


def test_flops_per_token_is_6n_plus_12ltd():
    model = GPT(GPTConfig())
    N, L, T, D = 18_929_664, 6, 128, 512
    assert model.flops_per_token(T) == 6 * N + 12 * L * T * D == flops_per_token(N, L, T, D)
    assert "6N + 12" in GPT.flops_per_token.__doc__


def test_parameter_names_follow_contributing():
    names = {n: tuple(p.shape) for n, p in GPT(SMOKE).named_parameters()}
    V, D = SMOKE.vocab_size, SMOKE.num_hiddens
    expected = {"token_emb.weight": (V, D), "norm.weight": (D,), "norm.bias": (D,)}
    for i in range(SMOKE.num_blks):
        b = f"blks.{i}."
        expected |= {b + "norm1.weight": (D,), b + "norm1.bias": (D,),
                     b + "norm2.weight": (D,), b + "norm2.bias": (D,),
                     b + "attn.W_qkv.weight": (3 * D, D), b + "attn.W_qkv.bias": (3 * D,),
                     b + "attn.W_o.weight": (D, D), b + "attn.W_o.bias": (D,),
                     b + "ffn.dense1.weight": (4 * D, D), b + "ffn.dense1.bias": (4 * D,),
                     b + "ffn.dense2.weight": (D, 4 * D), b + "ffn.dense2.bias": (D,)}
    assert names == expected                     # no extra parameter: logits are tied


def test_layernorm_eps_and_init():
    m = tiny()
    assert all(mod.eps == 1e-5 for mod in m.modules() if isinstance(mod, torch.nn.LayerNorm))
    assert torch.count_nonzero(m.blks[0].attn.W_qkv.bias) == 0
    std = GPT(GPTConfig()).blks[0].ffn.dense1.weight.std().item()
    assert abs(std - 0.02) < 0.001
    assert torch.equal(tiny(seed=3).token_emb.weight, tiny(seed=3).token_emb.weight)
    assert not torch.equal(tiny(seed=3).token_emb.weight, tiny(seed=4).token_emb.weight)


def test_forward_shape_and_tied_logits():
    m = tiny()
    X = torch.randint(0, SMOKE.vocab_size, (3, 16))
    logits = m(X)
    assert logits.shape == (3, 16, SMOKE.vocab_size) and logits.dtype == torch.float32
    # tied: the output layer is the embedding matrix itself
    with torch.no_grad():
        m.token_emb.weight[5] += 1.0
    assert not torch.allclose(m(X)[..., 5], logits[..., 5])


def test_causal():
    m = tiny()
    X = torch.randint(0, SMOKE.vocab_size, (2, 12))
    X2 = X.clone()
    X2[:, 8:] = (X2[:, 8:] + 1) % SMOKE.vocab_size   # change the future only
    torch.testing.assert_close(m(X)[:, :8], m(X2)[:, :8])
    assert not torch.allclose(m(X)[:, 8:], m(X2)[:, 8:])


def test_rope_is_fp32_inside_and_keeps_dtype():
    x = torch.randn(2, 5, 2, 8)
    out = apply_rope(x.bfloat16(), 10000.0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), apply_rope(x, 10000.0), atol=2e-2, rtol=2e-2)
    assert torch.equal(apply_rope(x, 10000.0)[:, 0], x[:, 0])     # position 0: no rotation
    # rotation preserves the norm of every (i, i + Dh/2) pair
    torch.testing.assert_close(apply_rope(x, 10000.0).norm(dim=-1), x.norm(dim=-1))


def test_rope_tables_built_once_match_the_reference():
    rope = RoPE(head_dim=8, max_len=6, base=10000.0)
    for T in (3, 6, 9):                                          # 9 > max_len: computed on the spot
        x = torch.randn(2, T, 2, 8)
        torch.testing.assert_close(rope(x), apply_rope(x, 10000.0), atol=1e-6, rtol=1e-6)
    assert rope.cos.dtype == torch.float32 and tuple(rope.cos.shape) == (6, 8)
    m = tiny()
    assert not any("cos" in k or "sin" in k for k in m.state_dict())   # buffers, not weights
    assert m.blks[0].attn.rope is not None and GPT(
        GPTConfig(num_hiddens=32, num_blks=1, num_heads=2, pos="learned")).blks[0].attn.rope is None


def test_bf16_autocast_logits():
    m = tiny()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(torch.randint(0, 28, (2, 8))).dtype == torch.bfloat16


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_pinned_backend_computes_the_same(backend):
    ref = tiny()
    pinned = tiny(attn_backend=backend)
    X = torch.randint(0, 28, (2, 16))
    torch.testing.assert_close(pinned(X), ref(X), atol=1e-5, rtol=1e-5)


def test_unknown_attn_backend_lists_choices():
    with pytest.raises(ValueError) as e:
        GPT(SMOKE, attn_backend="flashy")
    msg = str(e.value)
    assert "'flashy'" in msg and all(repr(k) in msg for k in ATTN_BACKENDS)


def test_config_type_checked():
    with pytest.raises(TypeError, match="GPTConfig"):
        GPT({"num_hiddens": 32})


def test_checkpointed_model_same_logits_and_grads():
    plain, ck = tiny(), tiny(checkpoint=True)
    X = torch.randint(0, 28, (2, 16))
    lp, lc = plain(X), ck(X)
    assert torch.equal(lp, lc)
    lp.square().mean().backward()
    lc.square().mean().backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), ck.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=n)
