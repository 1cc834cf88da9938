"""Planted bugs for the JAX gates: each breaks the model (or its training) in one way that a
rung could plausibly introduce, while looking right from the outside. Used by
tests/test_planted_jax.py; nothing here is imported by the library."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from perfladder.jax.model import FFN, GPT, Block, CausalAttention, rope


class NonCausalAttention(CausalAttention):
    """Attention that also sees the future (``is_causal=False``): the next token leaks in."""
    causal = False
    rope_k = True

    def __call__(self, x):
        B, T, D = x.shape
        qkv = self.W_qkv(x)
        heads = (B, T, self.num_heads, self.head_dim)
        q, k, v = (part.reshape(heads) for part in jnp.split(qkv, 3, axis=-1))
        q = rope(q, self.rope_base)
        if self.rope_k:
            k = rope(k, self.rope_base)
        out = jax.nn.dot_product_attention(q, k, v, implementation=self.attn_impl,
                                           is_causal=self.causal)
        return self.W_o(out.reshape(B, T, D))


class NoRopeOnKAttention(NonCausalAttention):
    """RoPE applied to q only: k keeps no position."""
    causal = True
    rope_k = False


def swap_attention(model: GPT, cls) -> GPT:
    for blk in model.blks:
        blk.attn.__class__ = cls
    return model


@jax.custom_vjp
def _scale_grad(x, scale):
    return x


def _fwd(x, scale):
    return x, scale


def _bwd(scale, g):
    return g * scale, None


_scale_grad.defvjp(_fwd, _bwd)


class ScaledLookupGPT(GPT):
    """The embedding lookup's gradient scaled by ``lookup_grad_scale`` (0.5: halved; 0: dropped);
    the tied output projection's share of the table's gradient is untouched."""
    lookup_grad_scale = 0.5

    def embed(self, X):
        return _scale_grad(super().embed(X), self.lookup_grad_scale)


def scaled_lookup(model: GPT, scale: float) -> GPT:
    model.__class__ = type(f"ScaledLookupGPT_{scale}", (ScaledLookupGPT,),
                           {"lookup_grad_scale": scale})
    return model


class FrozenBlocksGPT(GPT):
    """Every block runs on ``stop_gradient``-ed parameters: the blocks never learn."""

    def __call__(self, X):
        H = self.embed(X)
        for blk in self.blks:
            graphdef, state = nnx.split(blk)
            H = nnx.merge(graphdef, jax.lax.stop_gradient(state))(H)
        return self.token_emb.attend(self.norm(H))


def freeze_blocks(model: GPT) -> GPT:
    model.__class__ = FrozenBlocksGPT
    return model


def adamw_skipping_norms(model: GPT, lr: float) -> nnx.Optimizer:
    """AdamW over every parameter but the LayerNorms' (their updates set to zero)."""
    def labels(state):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "skip" if any("norm" in str(getattr(k, "key", k)) for k in path) else "train",
            state)
    tx = optax.multi_transform({"train": optax.adamw(lr), "skip": optax.set_to_zero()}, labels)
    return nnx.Optimizer(model, tx, wrt=nnx.Param)


def as_fp32(model: GPT) -> GPT:
    """A view that hands the step an fp32-computing copy of a bf16 model: the rung is labelled
    bf16, the model says bf16, and the program that is timed computes in fp32."""
    copy = nnx.merge(*nnx.split(model))
    for _, node in nnx.iter_graph(copy):
        if isinstance(node, nnx.Module) and hasattr(node, "dtype"):
            node.dtype = jnp.float32
    return copy


# -- Gates II: the step's own loss, scale errors, the step form, parity at probe weights ----------
def _nll(logits, targets):
    """Mean negative log-likelihood of ``targets`` (B, T) under ``logits`` (B, T, V), in the
    logits' own dtype."""
    logp = jax.nn.log_softmax(logits, axis=-1)                              # (B, T, V)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def _planted_step(loss_of):
    """A ``train_step`` (same signature as the ladder's) whose loss is ``loss_of(model, X, Y)``."""
    def step(model, optimizer, X, Y, view=None):
        loss, grads = nnx.value_and_grad(loss_of)(model, X, Y)
        optimizer.update(model, grads)
        return loss
    return step


# the cross entropy left in the model's dtype (bf16): no fp32 cast before the loss
bf16_loss_train_step = _planted_step(lambda m, X, Y: _nll(m(X), Y))
# the targets read one position late inside the step: a model gate computing its own loss
# would never see it
shifted_targets_train_step = _planted_step(
    lambda m, X, Y: _nll(m(X).astype(jnp.float32), jnp.roll(Y, 1, axis=1)))


@jax.custom_vjp
def _gelu_off(x):
    return jax.nn.gelu(x, approximate=True)


def _gelu_fwd(x):
    return _gelu_off(x), x


def _gelu_bwd(x, g):
    _, vjp = jax.vjp(lambda t: jax.nn.gelu(t, approximate=True), x)
    return (vjp(g)[0] * 1.05,)


_gelu_off.defvjp(_gelu_fwd, _gelu_bwd)


class GeluDerivativeOffFFN(FFN):
    """tanh GELU whose derivative is 5% too large (a fused kernel's backward)."""

    def __call__(self, x):
        return self.dense2(_gelu_off(self.dense1(x)))


def gelu_derivative_off(model: GPT) -> GPT:
    for blk in model.blks:
        blk.ffn.__class__ = GeluDerivativeOffFFN
    return model


class DroppedResidualBlock(Block):
    """The attention branch's output never reaches the stream (a fused add+LayerNorm that
    returns its input instead of the sum); the FFN still sees norm2(H + attn)."""

    def __call__(self, H):
        H2 = H + self.attn(self.norm1(H))
        return H + self.ffn(self.norm2(H2))


def drop_residual(model: GPT) -> GPT:
    for blk in model.blks:
        blk.__class__ = DroppedResidualBlock
    return model


class WrongScaleAttention(CausalAttention):
    """Attention scaled by 1/Dh instead of 1/sqrt(Dh) (one backend's bug)."""

    def __call__(self, x):
        B, T, D = x.shape
        qkv = self.W_qkv(x)
        heads = (B, T, self.num_heads, self.head_dim)
        q, k, v = (part.reshape(heads) for part in jnp.split(qkv, 3, axis=-1))
        q, k = rope(q, self.rope_base), rope(k, self.rope_base)
        out = jax.nn.dot_product_attention(q, k, v, implementation=self.attn_impl, is_causal=True,
                                           scale=1.0 / self.head_dim)
        return self.W_o(out.reshape(B, T, D))


def discard_optimizer_state(monkeypatch) -> None:
    """Every split/merge step hands back the optimizer state it was given: Adam's moments and
    step count never advance (a fresh AdamW each step -- its first step is the true one)."""
    from perfladder.jax import step as steps
    real = steps._pure_step

    def pure_step(graphdef, view, state, X, Y, observe=None):
        _, before = nnx.split(nnx.merge(graphdef, state)[1])
        before = jax.tree.map(jnp.copy, before)        # merge may share the Variables it is given
        loss, after = real(graphdef, view, state, X, Y, observe)
        model, optimizer = nnx.merge(graphdef, after)
        nnx.update(optimizer, before)
        return loss, nnx.state((model, optimizer))
    monkeypatch.setattr(steps, "_pure_step", pure_step)
